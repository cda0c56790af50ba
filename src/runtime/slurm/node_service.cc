#include "runtime/slurm/node_service.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "base/fs.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/query_string.h"
#include "base/strings.h"

namespace kiln::runtime::slurm {

using json = nlohmann::json;

namespace {

constexpr std::string_view kInstancesPrefix = "/_kiln/node/v1/instances/";
constexpr size_t kMaxOutputChunk = 8 * 1024 * 1024;
constexpr size_t kMaxReportBytes = 64 * 1024;

void SendJson(net::ResponseWriter& response, int status, const json& body) {
  (void)response.Send(status, {{"Content-Type", "application/json"}}, body.dump());
}

void SendError(net::ResponseWriter& response, int status, std::string_view code, const std::string& message) {
  SendJson(response, status, {{"error", code}, {"message", message}});
}

void SendStatus(net::ResponseWriter& response, const Status& s) {
  switch (s.code()) {
    case StatusCode::kNotFound: SendError(response, 404, "NotFound", s.message()); break;
    case StatusCode::kUnauthenticated: SendError(response, 401, "Unauthenticated", s.message()); break;
    case StatusCode::kInvalidArgument: SendError(response, 400, "InvalidArgument", s.message()); break;
    case StatusCode::kResourceExhausted: SendError(response, 507, "ResourceExhausted", s.message()); break;
    case StatusCode::kUnavailable: SendError(response, 503, "Unavailable", s.message()); break;
    case StatusCode::kFailedPrecondition: SendError(response, 409, "FailedPrecondition", s.message()); break;
    default: SendError(response, 500, std::string(StatusCodeName(s.code())), s.message()); break;
  }
}

std::string TokenOf(const net::HttpRequest& request) {
  if (const std::string* auth = request.Header("Authorization")) {
    std::string_view v = Trim(*auth);
    if (v.size() > 7 && ToLower(std::string(v.substr(0, 7))) == "bearer ") return std::string(Trim(v.substr(7)));
  }
  if (const std::string* token = request.Header("X-Kiln-Node-Token")) return std::string(Trim(*token));
  return "";
}

// libarchive write callback into the response (chunked).
struct ResponseSink {
  net::ResponseWriter* response = nullptr;
  Status error;
};

la_ssize_t WriteToResponse(struct archive* a, void* opaque, const void* data, size_t n) {
  auto* sink = static_cast<ResponseSink*>(opaque);
  Status s = sink->response->Write(std::string_view(static_cast<const char*>(data), n));
  if (!s.ok()) {
    sink->error = s;
    archive_set_error(a, EIO, "%s", s.message().c_str());
    return -1;
  }
  return static_cast<la_ssize_t>(n);
}

// Writes `root`'s tree as a tar into `a`: directories, regular files and symlinks, paths
// relative to `root`; FIFOs, sockets and devices are left out (they cannot travel).
Status WriteTree(struct archive* a, const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::unique_ptr<archive_entry, void (*)(archive_entry*)> entry(archive_entry_new(), archive_entry_free);
  std::vector<char> buf(1 << 16);
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string path = it->path().string();
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) continue;  // vanished meanwhile
    const std::string rel = path.substr(root.size() + 1);
    archive_entry_clear(entry.get());
    archive_entry_set_pathname(entry.get(), rel.c_str());
    archive_entry_set_mode(entry.get(), st.st_mode);
    archive_entry_set_mtime(entry.get(), st.st_mtime, 0);
    if (S_ISDIR(st.st_mode)) {
      archive_entry_set_size(entry.get(), 0);
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = readlink(path.c_str(), target.data(), target.size());
      if (n < 0) continue;
      target.resize(static_cast<size_t>(n));
      archive_entry_set_symlink(entry.get(), target.c_str());
      archive_entry_set_size(entry.get(), 0);
    } else if (S_ISREG(st.st_mode)) {
      archive_entry_set_size(entry.get(), st.st_size);
    } else {
      continue;
    }
    UniqueFd fd;
    if (S_ISREG(st.st_mode)) {
      fd.Reset(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (!fd.valid()) return ErrnoStatus("open " + path, errno);
    }
    if (archive_write_header(a, entry.get()) != ARCHIVE_OK) {
      return Status::Unavailable(std::string("tar of /opt/ml: ") + archive_error_string(a));
    }
    if (fd.valid()) {
      // Exactly the size in the header, even if the file changes while read.
      uint64_t left = static_cast<uint64_t>(st.st_size);
      uint64_t offset = 0;
      while (left > 0) {
        ASSIGN_OR_RETURN(size_t n, PreadSome(fd.get(), buf.data(), std::min<uint64_t>(left, buf.size()), offset));
        if (n == 0) {
          std::fill(buf.begin(), buf.end(), 0);
          n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
        }
        if (archive_write_data(a, buf.data(), n) < 0) {
          return Status::Unavailable(std::string("tar of /opt/ml: ") + archive_error_string(a));
        }
        left -= n;
        offset += n;
      }
    }
  }
  if (ec) return Status::Internal("cannot read " + root + ": " + ec.message());
  return Status::Ok();
}

void ServeOptMl(SlurmRuntime* runtime, const std::string& id, net::ResponseWriter& response) {
  Result<InstanceSpec> spec = runtime->NodeSpec(id);
  if (!spec.ok()) return SendStatus(response, spec.status());
  std::string root = spec->opt_ml_dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root.empty() || !PathExists(root)) {
    return SendStatus(response, Status::NotFound("the opt_ml_dir of " + id + " does not exist"));
  }
  if (!response.Start(200, {{"Content-Type", "application/x-tar"}}, std::nullopt).ok()) return;
  std::unique_ptr<struct archive, int (*)(struct archive*)> a(archive_write_new(), archive_write_free);
  ResponseSink sink{&response, Status::Ok()};
  archive_write_set_format_pax_restricted(a.get());
  archive_write_set_bytes_in_last_block(a.get(), 1);
  Status s;
  if (archive_write_open(a.get(), &sink, nullptr, WriteToResponse, nullptr) != ARCHIVE_OK) {
    s = Status::Internal(std::string("tar: ") + archive_error_string(a.get()));
  }
  if (s.ok()) s = WriteTree(a.get(), root);
  if (s.ok() && archive_write_close(a.get()) != ARCHIVE_OK) s = Status::Unavailable("tar close failed");
  if (!s.ok()) {
    // The status line is sent: the node sees a truncated body (no final chunk) and retries.
    KLOG(warn, "opt-ml download failed", {{"instance", id}, {"error", s.ToString()}});
    response.CloseAfterResponse();
    return;
  }
  (void)response.Finish();
}

}  // namespace

void NodeService::Handle(net::HttpRequest& request, net::ResponseWriter& response) {
  std::string_view path = request.raw_path;
  if (!StartsWith(path, kInstancesPrefix)) {
    return SendError(response, 404, "NotFound", "no node route " + std::string(path.substr(0, 256)));
  }
  path.remove_prefix(kInstancesPrefix.size());
  const size_t slash = path.find('/');
  if (slash == std::string_view::npos || slash == 0) {
    return SendError(response, 404, "NotFound", "no node route " + request.raw_path.substr(0, 256));
  }
  const std::string id(path.substr(0, slash));
  const std::string_view op = path.substr(slash + 1);
  // The token first: nothing about an instance is told to a caller without its token.
  if (Status auth = runtime_->Authenticate(id, TokenOf(request)); !auth.ok()) {
    response.CloseAfterResponse();
    return SendStatus(response, auth);
  }
  if (request.method == "GET" && op == "spec") {
    Result<InstanceSpec> spec = runtime_->NodeSpec(id);
    if (!spec.ok()) return SendStatus(response, spec.status());
    return SendJson(response, 200, SpecToJson(*spec));
  }
  if (request.method == "GET" && op == "opt-ml") return ServeOptMl(runtime_, id, response);
  if (request.method == "POST" && op == "output") {
    Result<std::vector<QueryParam>> query = ParseQueryString(request.raw_query);
    const std::string* offset_text = query.ok() ? FindQueryParam(*query, "offset") : nullptr;
    char* end = nullptr;
    const unsigned long long offset = offset_text ? std::strtoull(offset_text->c_str(), &end, 10) : 0;
    if (offset_text == nullptr || offset_text->empty() || *end != '\0') {
      response.CloseAfterResponse();
      return SendError(response, 400, "InvalidArgument", "output needs ?offset=<bytes the server holds>");
    }
    Result<std::string> body = ReadAll(*request.body, kMaxOutputChunk);
    if (!body.ok()) {
      response.CloseAfterResponse();
      return SendError(response, 413, "TooLarge", "an output chunk is at most 8 MiB: " + body.status().message());
    }
    uint64_t size = 0;
    Status appended = runtime_->AppendOutput(id, offset, *body, &size);
    if (appended.code() == StatusCode::kAborted) {
      return SendJson(response, 409, {{"error", "Conflict"}, {"message", appended.message()}, {"size", size}});
    }
    if (!appended.ok()) return SendStatus(response, appended);
    return SendJson(response, 200, {{"size", size}});
  }
  if (request.method == "POST" && op == "files") {
    Status applied = runtime_->ApplyFiles(id, *request.body);
    if (!applied.ok()) {
      response.CloseAfterResponse();
      return SendStatus(response, applied);
    }
    return SendJson(response, 200, json::object());
  }
  if (request.method == "POST" && op == "report") {
    Result<std::string> body = ReadAll(*request.body, kMaxReportBytes);
    if (!body.ok()) {
      response.CloseAfterResponse();
      return SendError(response, 400, "InvalidArgument", "report: " + body.status().message());
    }
    Result<json> doc = ParseJsonBounded(*body, {.max_depth = 8});
    if (!doc.ok()) return SendError(response, 400, "InvalidArgument", "report: " + doc.status().message());
    Result<NodeReport> report = ReportFromJson(*doc);
    if (!report.ok()) return SendStatus(response, report.status());
    Result<NodeReportAnswer> answer = runtime_->Report(id, *report);
    if (answer.status().code() == StatusCode::kFailedPrecondition) {
      // Written off here: whatever still runs there must stop.
      NodeReportAnswer stop;
      stop.stop_grace_seconds = 0;
      return SendJson(response, 200, AnswerToJson(stop));
    }
    if (!answer.ok()) return SendStatus(response, answer.status());
    return SendJson(response, 200, AnswerToJson(*answer));
  }
  SendError(response, 404, "NotFound",
            "no node route " + request.method + " " + request.raw_path.substr(0, 256) +
                " (spec, opt-ml, output, files, report)");
}

}  // namespace kiln::runtime::slurm
