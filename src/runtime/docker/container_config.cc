#include "runtime/docker/container_config.h"

#include <unistd.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::runtime::docker {
namespace {

constexpr uint64_t kMinShmBytes = 64ull << 20;  // Docker's own default; less breaks PyTorch loaders

std::string JoinInts(const std::vector<int>& values) {
  std::string out;
  for (int v : values) {
    if (!out.empty()) out += ',';
    out += std::to_string(v);
  }
  return out;
}

// The container's view of CUDA_VISIBLE_DEVICES: the engine exposes exactly the instance's GPUs
// and CUDA numbers what it sees from 0, so host indices ("3,5") would name devices that do not
// exist inside.
std::string RenumberedCudaDevices(size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    if (!out.empty()) out += ',';
    out += std::to_string(i);
  }
  return out;
}

uint64_t ShmBytes(const InstanceSpec& spec, const ContainerSettings& settings) {
  uint64_t bytes = settings.shm_default_bytes;
  if (spec.memory_limit_bytes > 0 && settings.shm_fraction > 0) {
    bytes = static_cast<uint64_t>(static_cast<double>(spec.memory_limit_bytes) * settings.shm_fraction);
  }
  return std::max(bytes, kMinShmBytes);
}

// The list sent as HostConfig.Ulimits: the defaults, each replaced by a configured entry of the
// same name, configured extras after them. Never a partial list: Podman drops its own defaults
// once any list is given, and crun then fails setting RLIMIT_NPROC unless nproc is in it.
std::vector<Ulimit> EffectiveUlimits(const std::vector<Ulimit>& configured) {
  std::vector<Ulimit> out = DefaultUlimits();
  for (const Ulimit& u : configured) {
    auto it = std::find_if(out.begin(), out.end(), [&](const Ulimit& d) { return d.name == u.name; });
    if (it != out.end()) {
      *it = u;
    } else {
      out.push_back(u);
    }
  }
  return out;
}

int64_t LimitValue(rlim_t value) {
  if (value == RLIM_INFINITY) return -1;
  return static_cast<int64_t>(value);
}

}  // namespace

std::vector<Ulimit> DefaultUlimits() {
  struct Named {
    const char* name;
    int resource;
  };
  static constexpr Named kLimits[] = {
      {"nofile", RLIMIT_NOFILE},
      {"nproc", RLIMIT_NPROC},
      {"memlock", RLIMIT_MEMLOCK},
      {"stack", RLIMIT_STACK},
  };
  std::vector<Ulimit> out;
  for (const Named& n : kLimits) {
    rlimit limit{};
    if (getrlimit(n.resource, &limit) != 0) continue;  // never fails for these on Linux
    // What a process-runtime instance inherits from the server: its soft and hard limits (the
    // server raises nofile's soft limit to the hard one at start, cli/kiln_main.cc). Not soft =
    // hard for all: an unlimited soft stack (the usual hard limit) switches the kernel to the
    // legacy mmap layout and glibc to other default thread stacks than a process-runtime instance.
    // The hard limit is the most the engine may grant without privileges the server lacks too.
    out.push_back(Ulimit{n.name, LimitValue(std::min(limit.rlim_cur, limit.rlim_max)), LimitValue(limit.rlim_max)});
  }
  return out;
}

nlohmann::json BuildCreateBody(const InstanceSpec& spec, const ContainerSettings& settings,
                               const std::string& netns_path, const std::string& hosts_file) {
  nlohmann::json body = nlohmann::json::object();
  body["Image"] = spec.container ? spec.container->reference : std::string();
  // No "Entrypoint" key at all unless overridden: the image's ENTRYPOINT then runs with Cmd as its
  // arguments (`docker run IMAGE train`). An override that is an empty list clears the image's
  // ENTRYPOINT: sent as [""], what `docker run --entrypoint ""` sends (Podman's compat API reads
  // an empty list as "the image's").
  if (spec.container && spec.container->entrypoint) {
    const auto& entrypoint = *spec.container->entrypoint;
    body["Entrypoint"] = entrypoint.empty() ? nlohmann::json::array({""}) : nlohmann::json(entrypoint);
  }
  body["Cmd"] = spec.argv;

  nlohmann::json env = nlohmann::json::array();
  for (const auto& [key, value] : spec.env) {
    if (key == "CUDA_VISIBLE_DEVICES" && !spec.gpus.empty()) {
      env.push_back(key + "=" + RenumberedCudaDevices(spec.gpus.size()));
    } else {
      env.push_back(key + "=" + value);
    }
  }
  body["Env"] = std::move(env);
  if (!spec.working_dir.empty()) body["WorkingDir"] = spec.working_dir;
  if (!spec.hostname.empty()) body["Hostname"] = spec.hostname;
  body["Labels"] = {{"kiln.instance", spec.instance_id}, {"kiln.server", settings.server_label}};
  body["StopSignal"] = "SIGTERM";
  body["StopTimeout"] = settings.stop_timeout_seconds;
  body["AttachStdin"] = false;
  body["AttachStdout"] = false;
  body["AttachStderr"] = false;
  body["Tty"] = false;
  body["OpenStdin"] = false;

  nlohmann::json host = nlohmann::json::object();
  nlohmann::json binds = nlohmann::json::array();
  binds.push_back(spec.opt_ml_dir + ":/opt/ml");
  for (const BindMount& m : spec.extra_mounts) {
    binds.push_back(m.host_path + ":" + m.sandbox_path + (m.read_only ? ":ro" : ""));
  }
  if (!hosts_file.empty()) binds.push_back(hosts_file + ":/etc/hosts:ro");
  host["Binds"] = std::move(binds);
  host["NetworkMode"] = netns_path.empty() ? std::string("host") : "ns:" + netns_path;
  if (!spec.cpus.empty()) host["CpusetCpus"] = JoinInts(spec.cpus);
  if (spec.memory_limit_bytes > 0) {
    host["Memory"] = spec.memory_limit_bytes;
    host["MemorySwap"] = spec.memory_limit_bytes;  // equal to Memory: no swap on top
  }
  host["ShmSize"] = ShmBytes(spec, settings);
  nlohmann::json ulimits = nlohmann::json::array();
  for (const Ulimit& u : EffectiveUlimits(settings.ulimits)) {
    ulimits.push_back({{"Name", u.name}, {"Soft", u.soft}, {"Hard", u.hard}});
  }
  host["Ulimits"] = std::move(ulimits);
  if (!spec.gpus.empty()) {
    nlohmann::json ids = nlohmann::json::array();
    switch (settings.gpu_mode) {
      case GpuRequestMode::kDeviceRequests:
        for (int gpu : spec.gpus) ids.push_back(std::to_string(gpu));
        host["DeviceRequests"] = nlohmann::json::array(
            {{{"Driver", "nvidia"}, {"DeviceIDs", ids}, {"Capabilities", nlohmann::json::array({{"gpu"}})}}});
        break;
      case GpuRequestMode::kCdi: {
        // Measured on Podman 4.3.1 with a CDI spec in /etc/cdi: HostConfig.Devices with a CDI name
        // fails ("stat nvidia.com/gpu=0: no such file or directory": the compat API turns each
        // entry into "host:container:perms", which is no CDI name); DeviceRequests with Driver
        // "cdi" is what newer Podman and Docker 25+ map to CDI devices (Podman 4.3 accepts and
        // ignores it). The names are the CDI spec's device names, the GPU index for NVIDIA's.
        for (int gpu : spec.gpus) ids.push_back("nvidia.com/gpu=" + std::to_string(gpu));
        host["DeviceRequests"] = nlohmann::json::array({{{"Driver", "cdi"}, {"DeviceIDs", ids}}});
        break;
      }
      case GpuRequestMode::kDevices: {
        nlohmann::json devices = nlohmann::json::array();
        const auto add = [&](const std::string& path) {
          devices.push_back({{"PathOnHost", path}, {"PathInContainer", path}, {"CgroupPermissions", "rwm"}});
        };
        for (int gpu : spec.gpus) add("/dev/nvidia" + std::to_string(gpu));
        for (const std::string& path : settings.gpu_control_devices) add(path);
        host["Devices"] = std::move(devices);
        break;
      }
    }
  }
  if (!settings.log_driver.empty()) {
    host["LogConfig"] = {{"Type", settings.log_driver}, {"Config", nlohmann::json::object()}};
  }
  // PID 1 is the image's entrypoint, as on SageMaker: no init process in between (signals go to
  // the program itself), and no restart policy (Kiln decides what happens after an exit).
  host["Init"] = false;
  host["RestartPolicy"] = {{"Name", "no"}};
  body["HostConfig"] = std::move(host);
  return body;
}

std::string ContainerName(const std::string& server_label, const std::string& instance_id) {
  std::string name = "kiln-" + server_label + "-" + instance_id;
  for (char& c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) c = '-';
  }
  return name;
}

std::vector<std::string> NvidiaControlDevices() {
  std::vector<std::string> present;
  for (const char* path : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}) {
    if (access(path, F_OK) == 0) present.emplace_back(path);
  }
  return present;
}

}  // namespace kiln::runtime::docker
