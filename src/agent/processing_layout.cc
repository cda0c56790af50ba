#include "agent/processing_layout.h"

#include <fcntl.h>

#include <algorithm>

#include "agent/errors.h"
#include "agent/training_layout.h"
#include "base/fs.h"

namespace kiln::agent {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr size_t kExitMessageMax = 1024;
// Read of one host's message file: enough for the 1 KiB kept plus a sequence cut at its end.
constexpr size_t kMessageReadMax = 4096;

// The LocalPath of every input (S3Input) and output (S3Output) that names one.
std::vector<std::string> LocalPaths(const json& request) {
  std::vector<std::string> out;
  auto add = [&](const json& holder, const char* member) {
    if (!holder.is_object() || !holder.contains(member) || !holder[member].is_object()) return;
    const json& io = holder[member];
    if (io.contains("LocalPath") && io["LocalPath"].is_string()) out.push_back(io["LocalPath"].get<std::string>());
  };
  if (request.contains("ProcessingInputs") && request["ProcessingInputs"].is_array()) {
    for (const json& input : request["ProcessingInputs"]) add(input, "S3Input");
  }
  const json config = request.value("ProcessingOutputConfig", json::object());
  if (config.is_object() && config.contains("Outputs") && config["Outputs"].is_array()) {
    for (const json& output : config["Outputs"]) add(output, "S3Output");
  }
  return out;
}

// Length of the valid UTF-8 prefix of `s` (RFC 3629: no overlongs, surrogates or code points
// above U+10FFFF). `*incomplete_tail` is set when the rest is only a sequence cut short at the end.
size_t ValidUtf8Prefix(std::string_view s, bool* incomplete_tail) {
  *incomplete_tail = false;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = p[i];
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (need == 0) return i;
    if (i + need > s.size()) {
      bool continuation = true;
      for (size_t k = i + 1; k < s.size(); ++k) continuation &= (p[k] & 0xc0) == 0x80;
      *incomplete_tail = continuation;
      return i;
    }
    uint32_t cp = need == 1 ? c : need == 2 ? (c & 0x1f) : need == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < need; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[need] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += need;
  }
  return i;
}

// Up to `max` bytes of the file (no symlink followed); "" when it is missing.
std::string ReadHead(const std::string& path, size_t max, bool* truncated) {
  *truncated = false;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return "";
  std::string out(max + 1, '\0');
  size_t len = 0;
  while (len < out.size()) {
    auto n = PreadSome(fd.get(), out.data() + len, out.size() - len, len);
    if (!n.ok() || *n == 0) break;
    len += *n;
  }
  if (len > max) {
    *truncated = true;
    len = max;
  }
  out.resize(len);
  return out;
}

}  // namespace

std::string ProcessingJobConfigJson(const json& request, const std::string& job_arn) {
  static constexpr const char* kMembers[] = {"ProcessingJobName",   "AppSpecification", "Environment",
                                             "NetworkConfig",       "ProcessingInputs", "ProcessingOutputConfig",
                                             "ProcessingResources", "RoleArn",          "StoppingCondition"};
  ordered_json out = ordered_json::object();
  out["ProcessingJobArn"] = job_arn;
  const json empty = json::object();
  const json& r = request.is_object() ? request : empty;
  for (const char* member : kMembers) {
    out[member] = r.contains(member) ? ordered_json::parse(r[member].dump()) : ordered_json(nullptr);
  }
  for (const auto& [key, value] : r.items()) {
    if (out.contains(key) || key == "Tags") continue;
    out[key] = ordered_json::parse(value.dump());
  }
  return out.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string ProcessingResourceConfigJson(const std::string& current_host, std::vector<std::string> hosts) {
  std::sort(hosts.begin(), hosts.end());
  ordered_json out = ordered_json::object();
  out["current_host"] = current_host;
  out["hosts"] = hosts;
  return out.dump();
}

Status WriteProcessingLayout(const std::string& opt_ml, const json& request, const std::string& job_arn,
                             const std::string& current_host, const std::vector<std::string>& hosts) {
  for (const char* dir : {"config", "output", "processing"}) RETURN_IF_ERROR(MakeDirs(opt_ml + "/" + dir));
  for (const std::string& local_path : LocalPaths(request)) {
    ASSIGN_OR_RETURN(std::string dir, SandboxPathToHost(opt_ml, local_path));
    RETURN_IF_ERROR(MakeDirs(dir));
  }
  const std::string config = opt_ml + "/config/";
  RETURN_IF_ERROR(
      WriteFileAtomic(config + "processingjobconfig.json", ProcessingJobConfigJson(request, job_arn), 0444));
  RETURN_IF_ERROR(
      WriteFileAtomic(config + "resourceconfig.json", ProcessingResourceConfigJson(current_host, hosts), 0444));
  return Status::Ok();
}

Status WriteInterpreterShims(const std::string& opt_ml, const std::string& interpreter) {
  if (interpreter.empty() || interpreter.front() != '/') {
    return Status::InvalidArgument("the interpreter '" + interpreter + "' is not an absolute path");
  }
  // Single-quoted for /bin/sh: a quote inside becomes '\''.
  std::string quoted = "'";
  for (char c : interpreter) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string dir = opt_ml + "/.kiln/bin";
  RETURN_IF_ERROR(MakeDirs(dir));
  for (const char* name : {"python", "python3"}) {
    RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + name, "#!/bin/sh\nexec " + quoted + " \"$@\"\n", 0755));
  }
  for (const char* name : {"pip", "pip3"}) {
    RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + name, "#!/bin/sh\nexec " + quoted + " -m pip \"$@\"\n", 0755));
  }
  return Status::Ok();
}

Result<std::string> ReadExitMessage(const std::vector<std::string>& opt_ml_dirs,
                                    const std::vector<std::string>& host_names) {
  std::string message;
  for (size_t i = 0; i < opt_ml_dirs.size() && message.size() < kExitMessageMax; ++i) {
    bool truncated = false;
    std::string text = ReadHead(opt_ml_dirs[i] + "/output/message", kMessageReadMax, &truncated);
    bool incomplete_tail = false;
    const size_t valid = ValidUtf8Prefix(text, &incomplete_tail);
    // A sequence cut by our own read limit is not the program's fault; anything else is.
    if (valid < text.size() && !(truncated && incomplete_tail)) {
      const std::string host = i < host_names.size() ? " of " + host_names[i] : std::string();
      return ClientError("/opt/ml/output/message" + host +
                         " is not valid UTF-8; the ExitMessage must be UTF-8 text. Please write the message as UTF-8.");
    }
    text.resize(valid);
    message += text;
  }
  if (message.size() > kExitMessageMax) {
    size_t cut = kExitMessageMax;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
    message.resize(cut);
  }
  return message;
}

}  // namespace kiln::agent
