#include "runtime/slurm/node_agent.h"

#include <archive.h>
#include <archive_entry.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "agent/tar_extract.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"
#include "runtime/process/process_runtime.h"
#include "runtime/slurm/spec_json.h"

namespace kiln::runtime::slurm {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kApiPrefix = "/_kiln/node/v1/instances/";

// Errors after which retrying cannot help: the server no longer knows the instance (404) or the
// token (401/403), or what it sent cannot be used (a bad spec).
bool IsFinal(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnauthenticated ||
         s.code() == StatusCode::kPermissionDenied || s.code() == StatusCode::kInvalidArgument;
}

std::string AlgoName(size_t k) { return "algo-" + std::to_string(k + 1); }

// ---- HTTP to the server (libcurl: streams the large bodies, opt-ml and file pushes, through
// files in scratch instead of memory, and resolves host names, which net::HttpClient does not).

struct Response {
  long status = 0;
  std::string body;  // empty when the body went to a file
};

size_t AppendToString(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t WriteToFile(char* data, size_t size, size_t n, void* user) {
  return std::fwrite(data, size, n, static_cast<FILE*>(user)) * size;
}

size_t ReadFromFile(char* data, size_t size, size_t n, void* user) {
  return std::fread(data, size, n, static_cast<FILE*>(user));
}

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

// What an error answer says: the server's JSON {"error", "message"} or the first bytes.
std::string ErrorText(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return std::string(Trim(body.substr(0, 300)));
}

class ServerClient {
 public:
  ServerClient(std::string base_url, std::string token) : base_(std::move(base_url)), token_(std::move(token)) {
    static CurlGlobal global;
    while (!base_.empty() && base_.back() == '/') base_.pop_back();
    curl_ = curl_easy_init();
  }
  ~ServerClient() {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
  }
  ServerClient(const ServerClient&) = delete;
  ServerClient& operator=(const ServerClient&) = delete;

  // One request. `upload_file` (POST body from a file) or `body`; `download_file`: the body of a
  // 200 goes there instead of Response::body. `large`: no overall time limit, only a stall limit
  // (60 s without a byte). Unavailable when no HTTP answer came (connection, timeout).
  Result<Response> Call(const char* method, const std::string& path, std::string_view body,
                        const std::string& content_type, const std::string& upload_file = "",
                        const std::string& download_file = "", bool large = false) {
    if (curl_ == nullptr) return Status::Internal("curl_easy_init failed");
    curl_easy_reset(curl_);
    const std::string url = base_ + path;
    Response response;
    struct curl_slist* headers = nullptr;
    const std::string auth = "Authorization: Bearer " + token_;
    headers = curl_slist_append(headers, auth.c_str());
    // No "Expect: 100-continue" round trip before large bodies.
    headers = curl_slist_append(headers, "Expect:");
    std::string type_header;
    if (!content_type.empty()) {
      type_header = "Content-Type: " + content_type;
      headers = curl_slist_append(headers, type_header.c_str());
    }
    FILE* in = nullptr;
    FILE* out = nullptr;
    std::string error_body;  // a non-200 answer to a download is read here, not into the file
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    // Slurm exports the submitter's environment: an http_proxy of the server's user must not
    // send node traffic elsewhere.
    curl_easy_setopt(curl_, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    if (large) {
      curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_TIME, 60L);
    } else {
      curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, 30000L);
    }
    if (std::string_view(method) == "GET") {
      curl_easy_setopt(curl_, CURLOPT_HTTPGET, 1L);
    } else if (!upload_file.empty()) {
      in = std::fopen(upload_file.c_str(), "rb");
      if (in == nullptr) {
        curl_slist_free_all(headers);
        return ErrnoStatus("open " + upload_file, errno);
      }
      struct stat st {};
      fstat(fileno(in), &st);
      curl_easy_setopt(curl_, CURLOPT_POST, 1L);
      curl_easy_setopt(curl_, CURLOPT_READFUNCTION, ReadFromFile);
      curl_easy_setopt(curl_, CURLOPT_READDATA, in);
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(st.st_size));
    } else {
      curl_easy_setopt(curl_, CURLOPT_POST, 1L);
      // Never null: curl would read the body from stdin.
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body.empty() ? "" : body.data());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    if (!download_file.empty()) {
      out = std::fopen(download_file.c_str(), "wb");
      if (out == nullptr) {
        if (in != nullptr) std::fclose(in);
        curl_slist_free_all(headers);
        return ErrnoStatus("create " + download_file, errno);
      }
      curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, WriteToFile);
      curl_easy_setopt(curl_, CURLOPT_WRITEDATA, out);
    } else {
      curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, AppendToString);
      curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &response.body);
    }
    CURLcode rc = curl_easy_perform(curl_);
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &response.status);
    curl_slist_free_all(headers);
    if (in != nullptr) std::fclose(in);
    bool write_failed = false;
    if (out != nullptr) write_failed = std::fclose(out) != 0;
    if (rc != CURLE_OK) {
      if (rc == CURLE_WRITE_ERROR || write_failed) {
        return Status::ResourceExhausted("writing " + download_file + " failed (disk full?) during " + method + " " +
                                         url);
      }
      return Status::Unavailable(std::string(method) + " " + url + ": " + curl_easy_strerror(rc));
    }
    if (!download_file.empty() && response.status != 200) {
      error_body = ReadFile(download_file).value_or("");
      response.body = error_body;
    }
    return response;
  }

  // A non-200 answer as a Status: 401/403/404 final, 400 InvalidArgument, the rest Unavailable
  // (retryable: the server is restarting, overloaded, or answered 5xx).
  static Status ToStatus(const char* what, const Response& r) {
    std::string m = std::string(what) + ": the server answered " + std::to_string(r.status) + " " + ErrorText(r.body);
    switch (r.status) {
      case 401: return Status::Unauthenticated(m);
      case 403: return Status::PermissionDenied(m);
      case 404: return Status::NotFound(m);
      case 400: return Status::InvalidArgument(m);
      default: return Status::Unavailable(m);
    }
  }

 private:
  std::string base_;
  std::string token_;
  CURL* curl_ = nullptr;
};

// ---- files under /opt/ml: what changed since the last push.

struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

int64_t MtimeNs(const struct stat& st) { return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

// Regular files under root/<dir> for each dir, keyed by their path relative to root.
std::map<std::string, FileStamp> ScanFiles(const std::string& root, const std::vector<std::string>& dirs) {
  namespace fs = std::filesystem;
  std::map<std::string, FileStamp> out;
  for (const std::string& dir : dirs) {
    std::error_code ec;
    fs::recursive_directory_iterator it(root + "/" + dir, fs::directory_options::skip_permission_denied, ec);
    if (ec) continue;
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      struct stat st {};
      if (lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      std::string rel = it->path().string().substr(root.size() + 1);
      out[rel] = {static_cast<uint64_t>(st.st_size), MtimeNs(st)};
    }
  }
  return out;
}

// Writes `files` (paths relative to root) as a pax tar at `tar_path`; each file's stamp as it was
// read goes to `written` (a file that vanished meanwhile is left out).
Status WriteTar(const std::string& root, const std::vector<std::string>& files, const std::string& tar_path,
                std::map<std::string, FileStamp>* written) {
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (archive_write_open_filename(a, tar_path.c_str()) != ARCHIVE_OK) {
    Status s = Status::Internal("cannot write " + tar_path + ": " + agent::ArchiveErrorText(a));
    archive_write_free(a);
    return s;
  }
  Status result;
  std::vector<char> buf(64 * 1024);
  for (const std::string& rel : files) {
    int fd = open((root + "/" + rel).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      continue;
    }
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, rel.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, st.st_mode & 07777);
    archive_entry_set_size(e, st.st_size);
    archive_entry_set_mtime(e, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    if (archive_write_header(a, e) != ARCHIVE_OK) {
      result = Status::Internal("tar " + rel + ": " + agent::ArchiveErrorText(a));
      archive_entry_free(e);
      close(fd);
      break;
    }
    archive_entry_free(e);
    // Exactly st_size bytes: a file growing meanwhile is pushed again next time; one shrinking
    // is padded by libarchive.
    uint64_t left = static_cast<uint64_t>(st.st_size);
    while (left > 0) {
      ssize_t n = read(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
      if (n <= 0) break;
      if (archive_write_data(a, buf.data(), static_cast<size_t>(n)) < 0) {
        result = Status::ResourceExhausted("tar " + rel + ": " + agent::ArchiveErrorText(a));
        break;
      }
      left -= static_cast<uint64_t>(n);
    }
    close(fd);
    if (!result.ok()) break;
    (*written)[rel] = {static_cast<uint64_t>(st.st_size), MtimeNs(st)};
  }
  if (archive_write_close(a) != ARCHIVE_OK && result.ok()) {
    result = Status::ResourceExhausted("cannot finish " + tar_path + ": " + agent::ArchiveErrorText(a));
  }
  archive_write_free(a);
  return result;
}

// Reaps the shims this process adopted as a child subreaper (RunNodeMain); the process runtime
// learns of exits from its state directory, not from waitpid.
void ReapChildren() {
  int st;
  while (waitpid(-1, &st, WNOHANG) > 0) {
  }
}

}  // namespace

// ---- Step 3 and 4 helpers.

std::vector<std::string> NodeHostsLines(const std::vector<std::string>& spec_lines, const std::string& hostname,
                                        size_t instance_count, const std::vector<std::string>& node_addresses) {
  std::vector<std::string> out;
  if (instance_count <= 1) {
    bool named = false;
    for (const std::string& line : spec_lines) {
      std::vector<std::string_view> words;
      for (std::string_view w : Split(line, ' ')) {
        if (!w.empty()) words.push_back(w);
      }
      for (size_t i = 1; i < words.size(); ++i) named = named || words[i] == hostname;
      out.push_back(line);
    }
    if (out.empty()) out = {"127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"};
    if (!named && !hostname.empty()) out.push_back("127.0.0.1 " + hostname);
    return out;
  }
  std::set<std::string> moved;
  for (size_t k = 0; k < instance_count && k < node_addresses.size(); ++k) moved.insert(AlgoName(k));
  for (const std::string& line : spec_lines) {
    std::vector<std::string> words;
    for (std::string_view w : Split(line, ' ')) {
      if (!w.empty()) words.emplace_back(w);
    }
    if (words.empty()) continue;
    std::string kept = words[0];
    size_t names = 0;
    for (size_t i = 1; i < words.size(); ++i) {
      if (moved.count(words[i]) != 0) continue;
      kept += " " + words[i];
      ++names;
    }
    if (names > 0) out.push_back(kept);
  }
  if (out.empty()) out = {"127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"};
  for (size_t k = 0; k < instance_count && k < node_addresses.size(); ++k) {
    out.push_back(node_addresses[k] + " " + AlgoName(k));
  }
  return out;
}

InstanceSpec NodeSpec(const InstanceSpec& server_spec, const NodeAgentOptions& options, const std::string& opt_ml_dir,
                      std::vector<std::string>* dropped) {
  InstanceSpec spec = server_spec;
  spec.opt_ml_dir = opt_ml_dir;
  spec.hosts_file_lines = NodeHostsLines(server_spec.hosts_file_lines, server_spec.hostname,
                                         options.instance_ids.size(), options.node_addresses);
  // Slurm's allocation is the limit (its cgroups, where configured); the server's view of CPUs,
  // memory and networks is its own machine's.
  spec.cpus.clear();
  spec.memory_limit_bytes = 0;
  spec.network.reset();
  spec.network_namespace.clear();
  spec.gpus = options.gpus;
  std::vector<std::string> indices;
  for (int g : options.gpus) indices.push_back(std::to_string(g));
  if (options.gpus.empty()) {
    if (spec.env.count("NVIDIA_VISIBLE_DEVICES") != 0) spec.env["NVIDIA_VISIBLE_DEVICES"] = "void";
    spec.env.erase("CUDA_VISIBLE_DEVICES");
  } else {
    // The server set these for a training host (CUDA_*) or an endpoint (NVIDIA_* only); keep
    // which, with Slurm's devices.
    if (spec.env.count("CUDA_VISIBLE_DEVICES") != 0) {
      spec.env["CUDA_VISIBLE_DEVICES"] =
          options.cuda_visible_devices.empty() ? Join(indices, ",") : options.cuda_visible_devices;
    }
    spec.env["NVIDIA_VISIBLE_DEVICES"] = Join(indices, ",");
  }
  // Binds of the server's paths (a script under its /tmp, say) exist on a node only with a shared
  // file system; the others are left out rather than failing the launch.
  std::vector<BindMount> mounts;
  for (const BindMount& m : server_spec.extra_mounts) {
    if (PathExists(m.host_path)) {
      mounts.push_back(m);
    } else if (dropped != nullptr) {
      dropped->push_back(m.host_path);
    }
  }
  spec.extra_mounts = std::move(mounts);
  return spec;
}

// ---- The agent.

class NodeAgent::Impl {
 public:
  Impl(NodeAgentOptions options, std::atomic<bool>* stop)
      : options_(std::move(options)),
        stop_(stop),
        client_(options_.server_url, options_.token),
        id_(options_.instance_ids[options_.task_index]),
        base_(options_.scratch_dir + "/kiln-" + options_.job_id + "/" + id_),
        opt_ml_(base_ + "/opt_ml"),
        address_(options_.task_index < options_.node_addresses.size() ? options_.node_addresses[options_.task_index]
                                                                      : ""),
        grace_(options_.default_stop_grace) {}

  int Run() {
    started_ = Clock::now();
    int code = RunSteps();
    if (!options_.keep_scratch) {
      if (runtime_ != nullptr) runtime_->Remove(id_).ok();
      RemoveAll(base_).ok();
      rmdir((options_.scratch_dir + "/kiln-" + options_.job_id).c_str());  // when the last instance is done
    }
    return code;
  }

 private:
  std::string Path(const std::string& what) const { return kApiPrefix + id_ + "/" + what; }

  // Calls `fn` until it succeeds, fails for good (IsFinal), or `deadline` passes, sleeping with
  // backoff between tries. The last error is returned.
  Status Retry(Clock::time_point deadline, const char* what, const std::function<Status()>& fn) {
    auto delay = options_.backoff_min;
    for (int attempt = 1;; ++attempt) {
      Status s = fn();
      if (s.ok() || IsFinal(s) || Clock::now() + delay > deadline) return s;
      if (attempt == 1 || attempt % 10 == 0) {
        KLOG(warn, "node: retrying", {{"call", what}, {"attempt", std::to_string(attempt)}, {"error", s.message()}});
      }
      std::this_thread::sleep_for(delay);
      delay = std::min(delay * 2, options_.backoff_max);
    }
  }

  Clock::time_point GiveUpFrom(Clock::time_point t) const { return t + options_.give_up_after; }

  Status FetchSpec(InstanceSpec* spec) {
    ASSIGN_OR_RETURN(Response r, client_.Call("GET", Path("spec"), "", ""));
    if (r.status != 200) return ServerClient::ToStatus("GET spec", r);
    ASSIGN_OR_RETURN(*spec, DecodeSpec(r.body));
    return Status::Ok();
  }

  Status DownloadOptMl() {
    RETURN_IF_ERROR(RemoveAll(opt_ml_));
    RETURN_IF_ERROR(MakeDirs(opt_ml_));
    const std::string tar = base_ + "/opt-ml.tar";
    auto r = client_.Call("GET", Path("opt-ml"), "", "", "", tar, /*large=*/true);
    if (!r.ok()) {
      unlink(tar.c_str());
      return r.status();
    }
    if (r->status != 200) {
      unlink(tar.c_str());
      return ServerClient::ToStatus("GET opt-ml", *r);
    }
    // TODO(N): extract while downloading (a pipe into libarchive) instead of through a file:
    // today a large staged data set needs twice its size in scratch for a moment.
    agent::ArchiveReadPtr reader = agent::NewTarReader();
    Status s;
    if (archive_read_open_filename(reader.get(), tar.c_str(), 64 * 1024) != ARCHIVE_OK) {
      s = Status::DataLoss("the opt-ml tar cannot be read: " + agent::ArchiveErrorText(reader.get()));
    } else {
      agent::ExtractOptions eo;
      eo.dest_name = "/opt/ml (node scratch " + opt_ml_ + ")";
      eo.archive_name = "the server's /opt/ml";
      s = agent::ExtractTar(
          reader.get(), opt_ml_, eo,
          [](const std::string& why) { return Status::InvalidArgument("the opt-ml tar: " + why); }, nullptr);
    }
    unlink(tar.c_str());
    // A transfer cut short is an error of the download itself (curl sees the incomplete body) and
    // is retried; an archive that was received whole but cannot be used would fail again (final).
    if (s.code() == StatusCode::kDataLoss) return Status::InvalidArgument(s.message());
    return s;
  }

  // New output since the last push, at most max_output_chunk per request; with `to_end`, until
  // everything the file holds now has been accepted.
  Status PushOutput(bool to_end) {
    const std::string path = runtime_->OutputPath(id_);
    for (;;) {
      struct stat st {};
      if (stat(path.c_str(), &st) != 0) return Status::Ok();  // nothing captured yet
      uint64_t size = static_cast<uint64_t>(st.st_size);
      if (output_offset_ >= size) return Status::Ok();
      size_t n = static_cast<size_t>(std::min<uint64_t>(size - output_offset_, options_.max_output_chunk));
      std::string chunk(n, '\0');
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return ErrnoStatus("open " + path, errno);
      auto got = PreadSome(fd, chunk.data(), n, output_offset_);
      close(fd);
      if (!got.ok()) return got.status();
      chunk.resize(*got);
      ASSIGN_OR_RETURN(Response r, client_.Call("POST", Path("output?offset=" + std::to_string(output_offset_)), chunk,
                                                "application/octet-stream"));
      if (r.status == 409) {
        // The server holds `size` bytes: resend from there (it restarted, or an answer was lost).
        json j = json::parse(r.body, nullptr, false);
        if (!j.is_object() || !j.contains("size") || !j["size"].is_number_unsigned()) {
          return Status::Unavailable("POST output: 409 without a size: " + r.body);
        }
        output_offset_ = j["size"].get<uint64_t>();
        continue;
      }
      if (r.status != 200) return ServerClient::ToStatus("POST output", r);
      output_offset_ += chunk.size();
      if (!to_end) return Status::Ok();
    }
  }

  // Files under `dirs` changed since they were last pushed (or since the download).
  Status PushFiles(const std::vector<std::string>& dirs) {
    std::map<std::string, FileStamp> now = ScanFiles(opt_ml_, dirs);
    std::vector<std::string> changed;
    for (const auto& [rel, stamp] : now) {
      auto it = pushed_.find(rel);
      if (it == pushed_.end() || !(it->second == stamp)) changed.push_back(rel);
    }
    if (changed.empty()) return Status::Ok();
    const std::string tar = base_ + "/push.tar";
    std::map<std::string, FileStamp> written;
    Status s = WriteTar(opt_ml_, changed, tar, &written);
    if (s.ok()) {
      auto r = client_.Call("POST", Path("files"), "", "application/x-tar", tar, "", /*large=*/true);
      if (!r.ok()) {
        s = r.status();
      } else if (r->status != 200) {
        s = ServerClient::ToStatus("POST files", *r);
      }
    }
    unlink(tar.c_str());
    if (!s.ok()) return s;
    for (auto& [rel, stamp] : written) pushed_[rel] = stamp;
    return Status::Ok();
  }

  Status SendReport(const NodeReport& report, NodeReportAnswer* answer) {
    ASSIGN_OR_RETURN(Response r, client_.Call("POST", Path("report"), ReportToJson(report).dump(), "application/json"));
    if (r.status != 200) return ServerClient::ToStatus("POST report", r);
    if (answer == nullptr) return Status::Ok();
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded()) return Status::Unavailable("POST report: the answer is not JSON: " + r.body.substr(0, 200));
    ASSIGN_OR_RETURN(*answer, AnswerFromJson(j));
    return Status::Ok();
  }

  NodeReport BaseReport(const char* state) const {
    NodeReport report;
    report.state = state;
    report.node = options_.node_name;
    report.address = address_;
    return report;
  }

  // The program never ran: deliver what output there is (none) and an "exited" report saying why.
  int FinishWithoutProgram(const std::string& error, int term_signal = 0) {
    KLOG(error, "node: the program did not run", {{"instance", id_}, {"error", error}});
    NodeReport report = BaseReport("exited");
    report.error = error;
    report.term_signal = term_signal;
    report.finished_millis = NowMillis();
    Status s = Retry(GiveUpFrom(Clock::now()), "report", [&] { return SendReport(report, nullptr); });
    if (!s.ok()) KLOG(error, "node: the exit report did not reach the server", {{"error", s.message()}});
    return 1;
  }

  void ApplyAnswer(const NodeReportAnswer& answer) {
    if (answer.stop_grace_seconds) {
      grace_ = std::chrono::seconds(std::max<int64_t>(0, *answer.stop_grace_seconds));
      Status s = runtime_->Stop(id_, grace_);
      if (!s.ok()) KLOG(warn, "node: stop failed", {{"error", s.message()}});
    }
    for (int sig : answer.signals) {
      Status s = runtime_->Signal(id_, sig);
      if (!s.ok()) KLOG(warn, "node: signal failed", {{"signal", std::to_string(sig)}, {"error", s.message()}});
    }
  }

  int RunSteps() {
    // 1. The spec.
    InstanceSpec server_spec;
    Status s = Retry(GiveUpFrom(started_), "spec", [&] {
      if (stop_->load()) return Status::Aborted("stopped");
      return FetchSpec(&server_spec);
    });
    if (stop_->load()) return FinishWithoutProgram("", SIGTERM);
    if (!s.ok()) {
      if (s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnauthenticated) {
        KLOG(error, "node: the server does not know this instance; giving up", {{"error", s.message()}});
        return 1;
      }
      return FinishWithoutProgram("the instance spec could not be fetched: " + s.message());
    }
    KLOG(info, "node: starting", {{"instance", id_}, {"node", options_.node_name}, {"address", address_}});
    NodeReport starting = BaseReport("starting");
    if (Status r = SendReport(starting, nullptr); !r.ok()) {
      KLOG(warn, "node: starting report failed", {{"error", r.message()}});
    }

    // 2. /opt/ml.
    if (Status m = MakeDirs(base_); !m.ok()) return FinishWithoutProgram("scratch " + base_ + ": " + m.message());
    s = Retry(GiveUpFrom(started_), "opt-ml", [&] {
      if (stop_->load()) return Status::Aborted("stopped");
      return DownloadOptMl();
    });
    if (stop_->load()) return FinishWithoutProgram("", SIGTERM);
    if (!s.ok()) return FinishWithoutProgram("/opt/ml could not be downloaded to the node: " + s.message());
    // What came from the server is not pushed back (checkpoints restored from S3, model data).
    pushed_ = ScanFiles(opt_ml_, {"model", "output", "checkpoints", "processing"});

    // 3, 4. Launch under the local process runtime.
    ProcessRuntimeOptions ro;
    ro.state_dir = base_ + "/state";
    ro.shim_command = options_.shim_command;
    auto runtime = OpenProcessRuntime(ro);
    if (!runtime.ok()) return FinishWithoutProgram("the node's process runtime: " + runtime.status().message());
    runtime_ = std::move(runtime).value();
    std::vector<std::string> dropped;
    InstanceSpec spec = NodeSpec(server_spec, options_, opt_ml_, &dropped);
    for (const std::string& d : dropped) {
      KLOG(warn, "node: a bind mount's host path does not exist on this node; left out", {{"path", d}});
    }
    if (Status l = runtime_->Launch(spec); !l.ok()) {
      runtime_.reset();  // nothing of it is left (Launch's contract); Remove would find nothing
      return FinishWithoutProgram(l.message());
    }
    KLOG(info, "node: program started", {{"instance", id_}});

    // 5. The loop.
    InstanceStatus status;
    bool stop_applied = false;
    Clock::time_point next_call = Clock::now();
    auto delay = options_.backoff_min;
    bool server_gone = false;
    int wait_failures = 0;
    for (;;) {
      auto waited = runtime_->Wait(id_, options_.tick);
      ReapChildren();
      if (waited.ok()) {
        status = *waited;
        wait_failures = 0;
        if (status.state != InstanceState::kRunning) break;
      } else {
        // The local state cannot be read (scratch removed under us, say): not a busy loop, and
        // after a minute the instance counts as lost.
        std::this_thread::sleep_for(options_.tick);
        if (++wait_failures * options_.tick > std::chrono::seconds(60)) {
          KLOG(error, "node: the local instance cannot be read; giving it up", {{"error", waited.status().message()}});
          runtime_->Stop(id_, std::chrono::seconds(0)).ok();
          status.state = InstanceState::kLost;
          status.lost_reason = "its state on the node cannot be read: " + waited.status().message();
          break;
        }
      }
      if (stop_->load() && !stop_applied) {
        stop_applied = true;
        std::chrono::seconds grace = grace_;
        if (options_.slurm_kill_wait > std::chrono::seconds(3)) {
          grace = std::min(grace, options_.slurm_kill_wait - std::chrono::seconds(3));
        }
        KLOG(info, "node: SIGTERM: stopping the program", {{"grace_seconds", std::to_string(grace.count())}});
        runtime_->Stop(id_, grace).ok();
      }
      if (server_gone || Clock::now() < next_call) continue;
      NodeReport report = BaseReport("running");
      report.started_millis = status.started_millis;
      if (auto usage = runtime_->Usage(id_); usage.ok()) report.usage = *usage;
      NodeReportAnswer answer;
      Status c = PushOutput(false);
      if (c.ok()) c = PushFiles({"checkpoints", "output"});
      if (c.ok()) c = SendReport(report, &answer);
      if (c.ok()) {
        ApplyAnswer(answer);
        delay = options_.backoff_min;
        next_call = Clock::now();
      } else if (IsFinal(c) && c.code() != StatusCode::kInvalidArgument) {
        // The server forgot the instance: nothing will read what it does; end it now.
        KLOG(error, "node: the server no longer knows this instance; stopping it", {{"error", c.message()}});
        runtime_->Stop(id_, std::chrono::seconds(0)).ok();
        server_gone = true;
      } else {
        KLOG(warn, "node: call failed; retrying", {{"error", c.message()}});
        next_call = Clock::now() + delay;
        delay = std::min(delay * 2, options_.backoff_max);
      }
    }
    int code = status.state == InstanceState::kExited
                   ? (status.term_signal != 0 ? 128 + status.term_signal : std::max(status.exit_code, 0))
                   : 1;
    KLOG(info, "node: program ended",
         {{"instance", id_},
          {"exit_code", std::to_string(status.exit_code)},
          {"signal", std::to_string(status.term_signal)}});
    if (server_gone) return 1;

    // 6. The exit sequence: output, files, then the report that makes the server see the exit.
    const Clock::time_point deadline = GiveUpFrom(Clock::now());
    s = Retry(deadline, "output", [&] { return PushOutput(true); });
    // processing/ (a processing job's output LocalPaths) only here: while running it would mean
    // scanning the job's input data every second.
    if (s.ok()) {
      s = Retry(deadline, "files", [&] { return PushFiles({"model", "output", "checkpoints", "processing"}); });
    }
    if (s.ok()) {
      NodeReport report = BaseReport("exited");
      report.started_millis = status.started_millis;
      report.finished_millis = status.finished_millis != 0 ? status.finished_millis : NowMillis();
      report.exit_code = status.exit_code;
      report.term_signal = status.term_signal;
      report.oom_killed = status.oom_killed;
      if (status.state == InstanceState::kLost) {
        report.error = "the node's shim vanished without recording the exit" +
                       (status.lost_reason.empty() ? std::string() : ": " + status.lost_reason);
      }
      s = Retry(deadline, "report", [&] { return SendReport(report, nullptr); });
    }
    if (!s.ok()) {
      KLOG(error, "node: the exit sequence did not reach the server; giving up", {{"error", s.message()}});
      return 1;
    }
    KLOG(info, "node: done", {{"instance", id_}, {"exit_status", std::to_string(code)}});
    return code;
  }

  NodeAgentOptions options_;
  std::atomic<bool>* stop_;
  ServerClient client_;
  const std::string id_;
  const std::string base_;
  const std::string opt_ml_;
  const std::string address_;
  Clock::time_point started_;
  std::unique_ptr<Runtime> runtime_;
  uint64_t output_offset_ = 0;
  std::map<std::string, FileStamp> pushed_;
  // The stop grace: the default until the server names one (SIGTERM uses the latest).
  std::chrono::seconds grace_;
};

NodeAgent::NodeAgent(NodeAgentOptions options) : impl_(std::make_unique<Impl>(std::move(options), &stop_requested_)) {}

NodeAgent::~NodeAgent() = default;

Result<std::unique_ptr<NodeAgent>> NodeAgent::Create(NodeAgentOptions options) {
  if (options.server_url.empty()) return Status::InvalidArgument("kiln node: --server is required");
  if (!StartsWith(options.server_url, "http://")) {
    return Status::InvalidArgument("kiln node: --server must be an http:// URL, not " + options.server_url);
  }
  if (options.token.empty()) return Status::InvalidArgument("kiln node: KILN_NODE_TOKEN is not set");
  if (options.instance_ids.empty()) return Status::InvalidArgument("kiln node: --instances is required");
  if (options.task_index >= options.instance_ids.size()) {
    return Status::InvalidArgument("kiln node: task " + std::to_string(options.task_index) + " but only " +
                                   std::to_string(options.instance_ids.size()) +
                                   " instances (--instances): srun must start one task per instance");
  }
  for (const std::string& id : options.instance_ids) {
    if (id.empty() || id.find('/') != std::string::npos || id == "." || id == "..") {
      return Status::InvalidArgument("kiln node: bad instance id '" + id + "'");
    }
  }
  if (options.shim_command.empty()) return Status::InvalidArgument("kiln node: no shim command");
  if (options.job_id.empty()) options.job_id = "local";
  return std::unique_ptr<NodeAgent>(new NodeAgent(std::move(options)));
}

int NodeAgent::Run() { return impl_->Run(); }

// ---- `kiln node`.

namespace {

std::atomic<NodeAgent*> g_agent{nullptr};

void OnStopSignal(int) {
  if (NodeAgent* a = g_agent.load()) a->RequestStop();
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::vector<int> ParseGpuList(const std::string& text) {
  std::vector<int> out;
  for (std::string_view part : Split(text, ',')) {
    auto v = ParseInt64(Trim(part));
    if (v && *v >= 0 && *v < 4096) out.push_back(static_cast<int>(*v));
  }
  return out;
}

// stdout of `argv` (no shell), or an error naming the command.
Result<std::string> CommandOutput(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return ErrnoStatus("fork", errno);
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return Status::Unavailable(Join(argv, " ") + " failed");
  return out;
}

// The IPv4 address of a Slurm node: its name resolved (getaddrinfo), else its NodeAddr from
// `scontrol show node`.
Result<std::string> NodeAddress(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &res) == 0 && res != nullptr) {
    char host[NI_MAXHOST];
    int rc = getnameinfo(res->ai_addr, res->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
    freeaddrinfo(res);
    if (rc == 0 && !StartsWith(host, "127.")) return std::string(host);
  } else if (res != nullptr) {
    freeaddrinfo(res);
  }
  ASSIGN_OR_RETURN(std::string text, CommandOutput({"scontrol", "show", "node", "-o", name}));
  size_t at = text.find("NodeAddr=");
  if (at == std::string::npos) return Status::NotFound("node " + name + " has no address");
  size_t end = text.find_first_of(" \n", at);
  std::string addr = text.substr(at + 9, end == std::string::npos ? std::string::npos : end - at - 9);
  if (addr.empty() || addr == name) return Status::NotFound("node " + name + " has no resolvable address");
  return addr;
}

std::string SelfExecutable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "kiln";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

int RunNodeMain(int argc, char** argv) {
  NodeAgentOptions options;
  std::string instances;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    bool ok = true;
    if (a == "--server") {
      ok = value(&options.server_url);
    } else if (a == "--instances") {
      ok = value(&instances);
    } else if (a == "--scratch") {
      ok = value(&options.scratch_dir);
    } else if (a == "--keep-scratch") {
      options.keep_scratch = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: kiln node --server URL --instances ID[,ID...] [--scratch DIR] [--keep-scratch]\n"
                   "  (started by srun inside a Slurm job the Kiln server submitted; KILN_NODE_TOKEN in the "
                   "environment)\n");
      return 2;
    }
  }
  InitLogging(Env("KILN_NODE_LOG_LEVEL").empty() ? "info" : Env("KILN_NODE_LOG_LEVEL"));
  for (std::string_view id : Split(instances, ',')) {
    if (!id.empty()) options.instance_ids.emplace_back(id);
  }
  options.token = Env("KILN_NODE_TOKEN");
  // The program gets only its spec's environment; nothing below needs the token in ours.
  unsetenv("KILN_NODE_TOKEN");
  options.task_index = static_cast<size_t>(ParseInt64(Env("SLURM_PROCID")).value_or(0));
  options.job_id = Env("SLURM_JOB_ID");
  options.node_name = Env("SLURMD_NODENAME");
  if (options.node_name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.node_name = host;
  }
  const std::string nodelist = Env("SLURM_JOB_NODELIST");
  std::vector<std::string> names;
  if (!nodelist.empty()) {
    auto text = CommandOutput({"scontrol", "show", "hostnames", nodelist});
    if (!text.ok()) {
      std::fprintf(stderr, "kiln node: cannot expand SLURM_JOB_NODELIST=%s: %s\n", nodelist.c_str(),
                   text.status().message().c_str());
      return 1;
    }
    for (std::string_view n : Split(*text, '\n')) {
      if (!Trim(n).empty()) names.emplace_back(Trim(n));
    }
  } else {
    names.push_back(options.node_name);
  }
  for (const std::string& name : names) {
    auto addr = NodeAddress(name);
    if (!addr.ok()) {
      // Only this node's own address is indispensable (the server routes to it); a peer's
      // missing address breaks only its algo-N name.
      KLOG(warn, "node: cannot resolve a node of the job", {{"node", name}, {"error", addr.status().message()}});
      options.node_addresses.push_back("127.0.0.1");
    } else {
      options.node_addresses.push_back(*addr);
    }
  }
  std::string gpus = Env("SLURM_STEP_GPUS");
  if (gpus.empty()) gpus = Env("SLURM_JOB_GPUS");
  options.gpus = ParseGpuList(gpus);
  options.cuda_visible_devices = Env("CUDA_VISIBLE_DEVICES");
  options.shim_command = {SelfExecutable(), "shim"};
  if (auto config = CommandOutput({"scontrol", "show", "config"}); config.ok()) {
    // "KillWait                = 30 sec"
    size_t at = config->find("KillWait");
    if (at != std::string::npos) {
      size_t eq = config->find('=', at);
      if (eq != std::string::npos) {
        std::string_view rest = Trim(std::string_view(*config).substr(eq + 1, 20));
        std::string digits;
        for (char c : rest) {
          if (c < '0' || c > '9') break;
          digits += c;
        }
        if (auto v = ParseInt64(digits)) options.slurm_kill_wait = std::chrono::seconds(*v);
      }
    }
  }

  auto agent = NodeAgent::Create(std::move(options));
  if (!agent.ok()) {
    std::fprintf(stderr, "%s\n", agent.status().message().c_str());
    return 2;
  }
  // The local shims double-fork; as a subreaper this process stays their ancestor, so Slurm's
  // process tracking (proctrack/linuxproc walks the tree) still finds and ends them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  g_agent.store(agent->get());
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  int code = (*agent)->Run();
  g_agent.store(nullptr);
  spdlog::default_logger()->flush();
  return code;
}

}  // namespace kiln::runtime::slurm
