#include "serving/data_capture.h"

#include <time.h>

#include <algorithm>
#include <cstdio>

#include "base/encoding.h"
#include "base/ids.h"
#include "base/log.h"
#include "serving/shadow_variants.h"

namespace kiln::serving {

namespace {

// The writer looks for new records this often (the invoke path never signals it: no syscall
// there), and for files whose time has come.
constexpr std::chrono::milliseconds kPoll{50};

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string LowerTrim(std::string_view text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && (text[begin] == ' ' || text[begin] == '\t')) ++begin;
  while (end > begin && (text[end - 1] == ' ' || text[end - 1] == '\t')) --end;
  std::string out(text.substr(begin, end - begin));
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The media type of a Content-Type value: before any ';', trimmed, lower-case.
std::string MediaType(std::string_view content_type) {
  return LowerTrim(content_type.substr(0, std::min(content_type.find(';'), content_type.size())));
}

bool ValidUtf8(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= n) return false;  // cut short
    for (size_t k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      code = (code << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((extra == 1 && code < 0x80) || (extra == 2 && code < 0x800) || (extra == 3 && code < 0x10000) ||
        (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// Appends `text` as a JSON string (quotes included); `text` is valid UTF-8. Runs of characters
// that need no escape are appended whole (the writer's cost is mostly this loop).
void AppendJsonString(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  size_t run = 0;  // start of the pending run of plain characters
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(text.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      default:
        out.append("\\u00");
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 0xF]);
    }
  }
  out.append(text.data() + run, text.size() - run);
  out.push_back('"');
}

void AppendCaptured(std::string& out, const DataCaptureSettings& settings, std::string_view content_type,
                    std::string_view mode, std::string_view data) {
  std::string_view encoding = CaptureEncoding(settings, content_type);
  if (encoding != "BASE64" && !ValidUtf8(data)) encoding = "BASE64";
  out.append("{\"observedContentType\":");
  AppendJsonString(out, ValidUtf8(content_type) ? content_type : std::string_view());
  out.append(",\"mode\":\"").append(mode).append("\",\"data\":");
  if (encoding == "BASE64") {
    out.push_back('"');
    out.append(Base64Encode(data));
    out.push_back('"');
  } else {
    AppendJsonString(out, data);
  }
  out.append(",\"encoding\":\"").append(encoding).append("\"}");
}

struct Utc {
  int year, month, day, hour, minute, second, millis;
};

Utc ToUtc(int64_t epoch_millis) {
  time_t seconds = static_cast<time_t>(epoch_millis / 1000);
  struct tm t {};
  gmtime_r(&seconds, &t);
  return {
      t.tm_year + 1900, t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, static_cast<int>(epoch_millis % 1000)};
}

std::string InferenceTime(int64_t epoch_millis) {
  Utc u = ToUtc(epoch_millis);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", u.year, u.month, u.day, u.hour, u.minute, u.second);
  return buf;
}

// <prefix>/<endpoint>/<variant>/<yyyy>/<mm>/<dd>/<hh>/<mm>-<ss>-<mmm>-<uuid>.jsonl
std::string CaptureKey(const std::string& prefix, std::string_view endpoint, std::string_view variant,
                       int64_t epoch_millis) {
  Utc u = ToUtc(epoch_millis);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d/%02d/%02d/%02d/%02d-%02d-%03d-", u.year, u.month, u.day, u.hour, u.minute,
                u.second, u.millis);
  std::string key = prefix.empty() ? std::string() : prefix + "/";
  key.append(endpoint).append("/").append(variant).append("/").append(buf).append(NewUuid()).append(".jsonl");
  return key;
}

}  // namespace

Result<std::shared_ptr<const DataCaptureSettings>> ParseDataCaptureConfig(const nlohmann::json& config) {
  if (!config.is_object()) return Status::InvalidArgument("DataCaptureConfig must be an object");
  if (config.contains("EnableCapture") && config["EnableCapture"].is_boolean() &&
      !config["EnableCapture"].get<bool>()) {
    return std::shared_ptr<const DataCaptureSettings>();
  }
  auto settings = std::make_shared<DataCaptureSettings>();
  if (config.contains("InitialSamplingPercentage") && config["InitialSamplingPercentage"].is_number_integer()) {
    settings->sampling_percentage = std::clamp(config["InitialSamplingPercentage"].get<int>(), 0, 100);
  }
  const std::string uri = config.value("DestinationS3Uri", "");
  if (uri.rfind("s3://", 0) != 0 || uri.size() <= 5 || uri[5] == '/') {
    return Status::InvalidArgument("DestinationS3Uri \"" + uri + "\" is not an S3 URI (s3://bucket/prefix)");
  }
  std::string_view rest = std::string_view(uri).substr(5);
  const size_t slash = rest.find('/');
  settings->bucket = std::string(rest.substr(0, slash));
  std::string prefix = slash == std::string_view::npos ? std::string() : std::string(rest.substr(slash + 1));
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  settings->prefix = std::move(prefix);
  if (config.contains("CaptureOptions") && config["CaptureOptions"].is_array()) {
    for (const nlohmann::json& option : config["CaptureOptions"]) {
      const std::string mode = option.is_object() ? option.value("CaptureMode", "") : "";
      if (mode == "Input" || mode == "InputAndOutput") settings->capture_input = true;
      if (mode == "Output" || mode == "InputAndOutput") settings->capture_output = true;
    }
  }
  if (!settings->capture_input && !settings->capture_output) {
    return Status::InvalidArgument("DataCaptureConfig.CaptureOptions names no CaptureMode");
  }
  if (config.contains("CaptureContentTypeHeader") && config["CaptureContentTypeHeader"].is_object()) {
    const nlohmann::json& header = config["CaptureContentTypeHeader"];
    for (auto [member, list] :
         {std::pair{"CsvContentTypes", &settings->csv_types}, std::pair{"JsonContentTypes", &settings->json_types}}) {
      if (!header.contains(member) || !header[member].is_array()) continue;
      for (const nlohmann::json& type : header[member]) {
        if (type.is_string()) list->push_back(MediaType(type.get<std::string>()));
      }
    }
  }
  return std::shared_ptr<const DataCaptureSettings>(std::move(settings));
}

std::string_view CaptureEncoding(const DataCaptureSettings& settings, std::string_view content_type) {
  const std::string media = MediaType(content_type);
  if (std::find(settings.csv_types.begin(), settings.csv_types.end(), media) != settings.csv_types.end()) {
    return "CSV";
  }
  if (std::find(settings.json_types.begin(), settings.json_types.end(), media) != settings.json_types.end()) {
    return "JSON";
  }
  return "BASE64";
}

DataCapture::DataCapture(DataCaptureOptions options, CaptureUploader* uploader)
    : options_(std::move(options)), uploader_(uploader) {
  MutexLock lock(mu_);
  pending_.reserve(1024);
  spare_.reserve(1024);
}

DataCapture::~DataCapture() { Stop(); }

void DataCapture::Start() {
  if (writer_.joinable()) return;
  writer_ = std::thread([this] { Run(); });
}

void DataCapture::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    cv_.NotifyAll();
  }
  if (writer_.joinable()) writer_.join();
}

DataCapture::Stats DataCapture::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

void DataCapture::FlushForTest() {
  MutexLock lock(mu_);
  flush_all_ = true;
  const uint64_t target = ++flush_requests_;
  cv_.NotifyAll();
  while (flushes_done_ < target && !stop_) cv_.Wait(mu_);
}

void DataCapture::Invoked(const ObservedInvocation& invocation) {
  const std::shared_ptr<const EndpointRoute>& route = *invocation.route;
  const aws::WireResponse& answer = *invocation.answer;
  if (route->data_capture != nullptr && answer.status >= 200 && answer.status <= 299) {
    const std::string* input_type = FindHeader(*invocation.forward, "Content-Type");
    const std::string* output_type = FindHeader(answer.headers, "Content-Type");
    const std::string* inference_id = FindHeader(*invocation.forward, "X-Amzn-SageMaker-Inference-Id");
    CaptureInput input;
    input.endpoint = route->name;
    input.variant = invocation.variant->name;
    input.input = invocation.body;
    input.input_content_type = input_type != nullptr ? std::string_view(*input_type) : "application/octet-stream";
    input.output = answer.body;
    input.output_content_type = output_type != nullptr ? std::string_view(*output_type) : "application/octet-stream";
    input.inference_id = inference_id != nullptr ? std::string_view(*inference_id) : std::string_view();
    input.epoch_millis = invocation.epoch_millis;
    Capture(route->data_capture, input);
  }
  if (shadows_ != nullptr && !route->shadow_variants.empty())
    shadows_->Copy(route, *invocation.forward, invocation.body);
}

bool DataCapture::Capture(const std::shared_ptr<const DataCaptureSettings>& settings, const CaptureInput& input) {
  if (settings == nullptr || settings->sampling_percentage <= 0) return false;
  if (settings->sampling_percentage < 100 && ThreadUniform() * 100.0 >= settings->sampling_percentage) return false;
  const size_t bytes = input.endpoint.size() + input.variant.size() + input.inference_id.size() +
                       (settings->capture_input ? input.input.size() + input.input_content_type.size() : 0) +
                       (settings->capture_output ? input.output.size() + input.output_content_type.size() : 0) + 256;
  MutexLock lock(mu_);
  if (stop_ || pending_bytes_ + bytes > options_.max_pending_bytes) {
    ++stats_.dropped;
    return false;
  }
  Record& record = pending_.emplace_back();
  record.settings = settings;
  const std::string_view fields[Record::kFields] = {
      input.endpoint,
      input.variant,
      settings->capture_input ? input.input : std::string_view(),
      settings->capture_input ? input.input_content_type : std::string_view(),
      settings->capture_output ? input.output : std::string_view(),
      settings->capture_output ? input.output_content_type : std::string_view(),
      input.inference_id};
  size_t total = 0;
  for (std::string_view field : fields) total += field.size();
  record.data.reserve(total);
  for (int f = 0; f < Record::kFields; ++f) {
    record.data.append(fields[f]);
    record.ends[f] = record.data.size();
  }
  record.epoch_millis = input.epoch_millis;
  record.bytes = bytes;
  pending_bytes_ += bytes;
  ++stats_.captured;
  return true;
}

void DataCapture::Run() {
  while (true) {
    std::vector<Record>& batch = spare_;
    bool all = false;
    bool stopping = false;
    uint64_t requests = 0;
    {
      MutexLock lock(mu_);
      if (pending_.empty() && !stop_ && !flush_all_) {
        cv_.WaitFor(mu_, kPoll);
      }
      batch.swap(pending_);
      pending_bytes_ = 0;
      stopping = stop_;
      all = flush_all_ || stop_;
      requests = flush_requests_;
      flush_all_ = false;
    }
    for (const Record& record : batch) Append(record);
    batch.clear();
    FlushDue(all);
    if (all) {
      MutexLock lock(mu_);
      flushes_done_ = std::max(flushes_done_, requests);
      cv_.NotifyAll();
    }
    if (stopping) break;
  }
}

void DataCapture::Append(const Record& record) {
  const DataCaptureSettings& settings = *record.settings;
  const std::string_view endpoint = record.Get(Record::kEndpoint);
  const std::string_view variant = record.Get(Record::kVariant);
  std::string id = settings.bucket + "/" + settings.prefix + "/";
  id.append(endpoint).append("/").append(variant);
  const int64_t hour = record.epoch_millis / 3600000;
  auto it = files_.find(id);
  if (it != files_.end() && it->second.hour != hour) {
    WriteFile(it->second);
    files_.erase(it);
    it = files_.end();
  }
  if (it == files_.end()) {
    OpenFile file;
    file.bucket = settings.bucket;
    file.key = CaptureKey(settings.prefix, endpoint, variant, record.epoch_millis);
    file.opened_steady_ms = SteadyMillis();
    file.hour = hour;
    it = files_.emplace(std::move(id), std::move(file)).first;
  }
  std::string& out = it->second.content;
  out.append("{\"captureData\":{");
  bool first = true;
  if (settings.capture_input) {
    out.append("\"endpointInput\":");
    AppendCaptured(out, settings, record.Get(Record::kInputType), "INPUT", record.Get(Record::kInput));
    first = false;
  }
  if (settings.capture_output) {
    if (!first) out.push_back(',');
    out.append("\"endpointOutput\":");
    AppendCaptured(out, settings, record.Get(Record::kOutputType), "OUTPUT", record.Get(Record::kOutput));
  }
  out.append("},\"eventMetadata\":{\"eventId\":\"").append(NewUuid()).append("\"");
  if (const std::string_view inference_id = record.Get(Record::kInferenceId); !inference_id.empty()) {
    out.append(",\"inferenceId\":");
    AppendJsonString(out, inference_id);  // printable ASCII (the router checked it)
  }
  out.append(",\"inferenceTime\":\"")
      .append(InferenceTime(record.epoch_millis))
      .append("\"},\"eventVersion\":\"0\"}\n");
  if (out.size() >= options_.max_file_bytes) {
    WriteFile(it->second);
    files_.erase(it);
  }
}

void DataCapture::FlushDue(bool all) {
  const int64_t now = SteadyMillis();
  for (auto it = files_.begin(); it != files_.end();) {
    if (all || now - it->second.opened_steady_ms >= options_.flush_interval.count()) {
      WriteFile(it->second);
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
}

void DataCapture::WriteFile(OpenFile& file) {
  if (file.content.empty()) return;
  Status written = uploader_->Upload(file.bucket, file.key, file.content);
  if (!written.ok()) {
    KLOG(warn, "data capture file lost", {{"bucket", file.bucket}, {"key", file.key}, {"error", written.ToString()}});
  }
  MutexLock lock(mu_);
  ++(written.ok() ? stats_.files_written : stats_.upload_failures);
}

}  // namespace kiln::serving
