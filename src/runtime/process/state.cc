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

std::string EncodeSpec(const InstanceSpec& spec) {
  json mounts = json::array();
  for (const BindMount& m : spec.extra_mounts) {
    mounts.push_back({{"host_path", m.host_path}, {"sandbox_path", m.sandbox_path}, {"read_only", m.read_only}});
  }
  json j = {
      {"instance_id", spec.instance_id},
      {"opt_ml_dir", spec.opt_ml_dir},
      {"extra_mounts", mounts},
      {"hostname", spec.hostname},
      {"hosts_file_lines", spec.hosts_file_lines},
      {"argv", spec.argv},
      {"env", spec.env},
      {"working_dir", spec.working_dir},
      {"cpus", spec.cpus},
      {"memory_limit_bytes", spec.memory_limit_bytes},
      {"gpus", spec.gpus},
  };
  if (!spec.network_namespace.empty()) j["network_namespace"] = spec.network_namespace;
  if (spec.network) {
    const NetworkAttachment& n = *spec.network;
    j["network"] = {{"network", n.network},
                    {"bridge", n.bridge},
                    {"host_veth", n.host_veth},
                    {"address", n.address},
                    {"prefix_length", n.prefix_length},
                    {"gateway", n.gateway},
                    {"isolated", n.isolated},
                    {"interface_name", n.interface_name},
                    {"loopback_forwards", n.loopback_forwards}};
  }
  return j.dump();
}

Result<InstanceSpec> DecodeSpec(std::string_view text) {
  return DecodeJson(text, "instance spec", [](const json& j) {
    InstanceSpec spec;
    spec.instance_id = j.at("instance_id").get<std::string>();
    spec.opt_ml_dir = j.at("opt_ml_dir").get<std::string>();
    for (const json& m : j.at("extra_mounts")) {
      spec.extra_mounts.push_back({m.at("host_path").get<std::string>(), m.at("sandbox_path").get<std::string>(),
                                   m.at("read_only").get<bool>()});
    }
    spec.hostname = j.at("hostname").get<std::string>();
    spec.hosts_file_lines = j.at("hosts_file_lines").get<std::vector<std::string>>();
    spec.argv = j.at("argv").get<std::vector<std::string>>();
    spec.env = j.at("env").get<std::map<std::string, std::string>>();
    spec.working_dir = j.at("working_dir").get<std::string>();
    spec.cpus = j.at("cpus").get<std::vector<int>>();
    spec.memory_limit_bytes = j.at("memory_limit_bytes").get<uint64_t>();
    spec.gpus = j.at("gpus").get<std::vector<int>>();
    spec.network_namespace = j.value("network_namespace", "");
    // Absent in specs written before per-instance networks: the node's network, as then.
    if (auto it = j.find("network"); it != j.end() && !it->is_null()) {
      const json& n = *it;
      NetworkAttachment a;
      a.network = n.at("network").get<std::string>();
      a.bridge = n.at("bridge").get<std::string>();
      a.host_veth = n.at("host_veth").get<std::string>();
      a.address = n.at("address").get<std::string>();
      a.prefix_length = n.at("prefix_length").get<int>();
      a.gateway = n.at("gateway").get<std::string>();
      a.isolated = n.at("isolated").get<bool>();
      a.interface_name = n.at("interface_name").get<std::string>();
      a.loopback_forwards = n.at("loopback_forwards").get<std::vector<int>>();
      spec.network = std::move(a);
    }
    return spec;
  });
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
