#include "runtime/process/state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "base/encoding.h"
#include "base/fs.h"
#include "base/hash.h"
#include "runtime/instance_spec_json.h"

namespace kiln::runtime::process_state {

using nlohmann::json;

namespace {

// Parses `text` as JSON and returns read(document). Errors: DataLoss("bad <what>: ...") when the
// text is not JSON or lacks a field of the type `read` asks for (any json::exception).
template <typename Read>
auto DecodeJson(std::string_view text, const char* what, Read read) -> Result<decltype(read(json()))> {
  try {
    return read(json::parse(text));
  } catch (const json::exception& e) {
    return Status::DataLoss(std::string("bad ") + what + ": " + e.what());
  }
}

}  // namespace

bool ValidInstanceId(std::string_view id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string Join(const std::string& dir, std::string_view name) {
  std::string out = dir;
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

std::string SocketPath(const std::string& instance_dir) {
  std::string in_dir = Join(instance_dir, kSocketFile);
  if (in_dir.size() < sizeof(sockaddr_un{}.sun_path)) return in_dir;
  // Too long for sun_path: a short, deterministic name in /tmp (the host's /tmp: the shim stays
  // in the host's mount namespace).
  return "/tmp/kiln-" + Sha256Hex(instance_dir).substr(0, 24) + ".sock";
}

// One JSON form for every backend (runtime/instance_spec_json.h); the lenient decoder also reads
// the specs earlier Kilns wrote here.
std::string EncodeSpec(const InstanceSpec& spec) { return ::kiln::runtime::EncodeSpec(spec); }

// DataLoss, as for every state file: what the shim wrote cannot be read back.
Result<InstanceSpec> DecodeSpec(std::string_view text) {
  Result<InstanceSpec> spec = ::kiln::runtime::DecodeSpec(text);
  if (!spec.ok()) return Status::DataLoss(spec.status().message());
  return spec;
}

std::string EncodeExit(const ExitRecord& r) {
  json j = {{"exit_code", r.exit_code},
            {"term_signal", r.term_signal},
            {"started_millis", r.started_millis},
            {"finished_millis", r.finished_millis},
            {"stop_requested", r.stop_requested}};
  return j.dump() + "\n";
}

Result<ExitRecord> DecodeExit(std::string_view text) {
  return DecodeJson(text, "exit record", [](const json& j) {
    ExitRecord r;
    r.exit_code = j.at("exit_code").get<int>();
    r.term_signal = j.at("term_signal").get<int>();
    r.started_millis = j.at("started_millis").get<int64_t>();
    r.finished_millis = j.at("finished_millis").get<int64_t>();
    r.stop_requested = j.at("stop_requested").get<bool>();
    return r;
  });
}

std::string EncodeStarted(const StartedRecord& r) {
  json j = {{"started_millis", r.started_millis}, {"shim_pid", r.shim_pid}, {"pid", r.pid}, {"socket", r.socket}};
  return j.dump() + "\n";
}

Result<StartedRecord> DecodeStarted(std::string_view text) {
  return DecodeJson(text, "started record", [](const json& j) {
    StartedRecord r;
    r.started_millis = j.at("started_millis").get<int64_t>();
    r.shim_pid = j.at("shim_pid").get<int>();
    r.pid = j.at("pid").get<int>();
    r.socket = j.at("socket").get<std::string>();
    return r;
  });
}

Status WriteFileRenamed(const std::string& path, std::string_view content) {
  std::string tmp = path + ".tmp";
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("open " + tmp, errno);
  RETURN_IF_ERROR(WriteAll(fd.get(), content));
  fd.Reset();
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename " + tmp, errno);
  return Status::Ok();
}

bool ShimAlive(const std::string& instance_dir) {
  UniqueFd fd(open(Join(instance_dir, kLockFile).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  // flock locks belong to open file descriptions, so this conflicts with the shim's lock even
  // inside the process that launched it. Succeeding means nobody holds it: release at once.
  if (flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return false;
  return errno == EWOULDBLOCK;
}

namespace {

std::optional<ExitRecord> TryReadExit(const std::string& instance_dir) {
  Result<std::string> text = ReadFile(Join(instance_dir, kExitFile));
  if (!text.ok()) return std::nullopt;
  Result<ExitRecord> record = DecodeExit(*text);
  if (!record.ok()) return std::nullopt;
  return *record;
}

}  // namespace

Result<InstanceStatus> ReadStatus(const std::string& instance_dir, const std::string& instance_id) {
  struct stat st;
  if (stat(instance_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::NotFound("instance " + instance_id + " not found");
  }
  InstanceStatus status;
  status.instance_id = instance_id;
  auto from_exit = [&](const ExitRecord& r) {
    status.state = InstanceState::kExited;
    status.exit_code = r.exit_code;
    status.term_signal = r.term_signal;
    status.started_millis = r.started_millis;
    status.finished_millis = r.finished_millis;
    status.stop_requested = r.stop_requested;
    return status;
  };
  if (std::optional<ExitRecord> r = TryReadExit(instance_dir)) return from_exit(*r);
  bool alive = ShimAlive(instance_dir);
  // The shim writes exit.json before it exits (and so before the lock goes): look again after
  // seeing the lock free, or an exit between the two checks would read as kLost.
  if (!alive) {
    if (std::optional<ExitRecord> r = TryReadExit(instance_dir)) return from_exit(*r);
  }
  status.state = alive ? InstanceState::kRunning : InstanceState::kLost;
  if (Result<std::string> text = ReadFile(Join(instance_dir, kStartedFile)); text.ok()) {
    if (Result<StartedRecord> started = DecodeStarted(*text); started.ok()) {
      status.started_millis = started->started_millis;
    }
  }
  status.stop_requested = PathExists(Join(instance_dir, kStopFile));
  return status;
}

}  // namespace kiln::runtime::process_state
