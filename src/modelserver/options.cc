#include "modelserver/options.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/fs.h"
#include "base/strings.h"

extern char** environ;

namespace kiln::modelserver {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

const std::string* Find(const std::map<std::string, std::string>& env, std::string_view name) {
  auto it = env.find(std::string(name));
  return it == env.end() ? nullptr : &it->second;
}

// An integer variable within [min, max]; `fallback` when unset. An empty value counts as unset
// (an image that writes `ENV X=` means "no value").
Result<int64_t> IntVar(const std::map<std::string, std::string>& env, std::string_view name, int64_t fallback,
                       int64_t min, int64_t max) {
  const std::string* value = Find(env, name);
  if (value == nullptr || Trim(*value).empty()) return fallback;
  std::optional<int64_t> parsed = ParseInt64(Trim(*value));
  if (!parsed || *parsed < min || *parsed > max) {
    return Status::InvalidArgument(std::string(name) + "=\"" + *value + "\" is not valid: give a whole number from " +
                                   std::to_string(min) + " to " + std::to_string(max) + ".");
  }
  return *parsed;
}

Result<bool> BoolVar(const std::map<std::string, std::string>& env, std::string_view name, bool fallback) {
  const std::string* value = Find(env, name);
  if (value == nullptr || Trim(*value).empty()) return fallback;
  std::string v = ToLower(Trim(*value));
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  return Status::InvalidArgument(std::string(name) + "=\"" + *value + "\" is not valid: give true or false.");
}

std::string StringVar(const std::map<std::string, std::string>& env, std::string_view name, std::string fallback) {
  const std::string* value = Find(env, name);
  return value == nullptr || value->empty() ? fallback : *value;
}

int CountNvidiaDevices() {
  DIR* dir = opendir("/dev");
  if (dir == nullptr) return 0;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    std::string_view name = entry->d_name;
    if (!StartsWith(name, "nvidia") || name.size() == 6) continue;
    if (std::all_of(name.begin() + 6, name.end(), [](char c) { return c >= '0' && c <= '9'; })) ++count;
  }
  closedir(dir);
  return count;
}

}  // namespace

std::string_view BackendKindName(BackendKind kind) {
  return kind == BackendKind::kTorchScript ? "torchscript" : "python";
}

uint64_t ModelServerOptions::max_payload_mb() const { return std::max<uint64_t>(1, max_payload_bytes / kMiB); }

std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text) {
  std::string_view value = Trim(text);
  if (value == "max") return std::nullopt;
  std::optional<uint64_t> bytes = ParseUint64(value);
  // cgroup v1 writes "no limit" as a huge page-aligned number (0x7FFFFFFFFFFFF000).
  if (!bytes || *bytes == 0 || *bytes >= (1ull << 62)) return std::nullopt;
  return bytes;
}

std::optional<uint64_t> ParseMemTotal(std::string_view meminfo) {
  for (std::string_view line : Split(meminfo, '\n')) {
    if (!StartsWith(line, "MemTotal:")) continue;
    std::string_view rest = Trim(line.substr(9));
    size_t space = rest.find(' ');
    std::optional<uint64_t> kib = ParseUint64(rest.substr(0, space));
    if (!kib) return std::nullopt;
    return *kib * 1024;
  }
  return std::nullopt;
}

std::optional<std::string> ParseCgroupV2Path(std::string_view proc_self_cgroup) {
  for (std::string_view line : Split(proc_self_cgroup, '\n')) {
    if (StartsWith(line, "0::")) return std::string(Trim(line.substr(3)));
  }
  return std::nullopt;
}

int CountVisibleGpus(std::string_view nvidia_visible_devices, int gpus_all) {
  std::string v = ToLower(Trim(nvidia_visible_devices));
  if (v.empty() || v == "void" || v == "none") return 0;
  if (v == "all") return gpus_all;
  int count = 0;
  for (std::string_view entry : Split(v, ',')) {
    if (!Trim(entry).empty()) ++count;
  }
  return count;
}

SystemInfo ProbeSystem() {
  SystemInfo info;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) info.cpus = std::max(1, CPU_COUNT(&set));
  info.gpus_all = CountNvidiaDevices();
  // cgroup v2: this process's own cgroup (a container's is usually the root of its namespace),
  // then the root; v1: the memory controller's root as mounted in containers.
  std::vector<std::string> candidates;
  if (auto cgroup = ReadFile("/proc/self/cgroup"); cgroup.ok()) {
    if (std::optional<std::string> path = ParseCgroupV2Path(*cgroup); path && *path != "/") {
      candidates.push_back("/sys/fs/cgroup" + *path + "/memory.max");
    }
  }
  candidates.push_back("/sys/fs/cgroup/memory.max");
  candidates.push_back("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  for (const std::string& path : candidates) {
    auto text = ReadFile(path);
    if (!text.ok()) continue;
    info.cgroup_memory_limit = ParseCgroupMemoryLimit(*text);
    break;
  }
  if (auto meminfo = ReadFile("/proc/meminfo"); meminfo.ok()) info.mem_total = ParseMemTotal(*meminfo).value_or(0);
  return info;
}

std::map<std::string, std::string> EnvironmentMap() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char* eq = std::strchr(*entry, '=');
    if (eq == nullptr) continue;
    env.emplace(std::string(*entry, eq - *entry), std::string(eq + 1));
  }
  return env;
}

Result<ModelServerOptions> ParseModelServerOptions(const std::map<std::string, std::string>& env,
                                                   const SystemInfo& system) {
  ModelServerOptions options;
  ASSIGN_OR_RETURN(int64_t port, IntVar(env, "SAGEMAKER_BIND_TO_PORT", 8080, 1, 65535));
  options.port = static_cast<uint16_t>(port);
  options.base_dir = StringVar(env, "SAGEMAKER_BASE_DIR", "/opt/ml");
  while (options.base_dir.size() > 1 && options.base_dir.back() == '/') options.base_dir.pop_back();
  ASSIGN_OR_RETURN(options.multi_model, BoolVar(env, "SAGEMAKER_MULTI_MODEL", false));

  int default_workers = 1;
  if (!options.multi_model) {
    const std::string* visible = Find(env, "NVIDIA_VISIBLE_DEVICES");
    int gpus = visible == nullptr ? 0 : CountVisibleGpus(*visible, system.gpus_all);
    default_workers = gpus > 0 ? gpus : std::max(1, system.cpus);
  }
  ASSIGN_OR_RETURN(int64_t workers, IntVar(env, "SAGEMAKER_MODEL_SERVER_WORKERS", default_workers, 1, 1024));
  options.workers = static_cast<int>(workers);

  // A day bounds the budget: past it the number is a mistake (a value in milliseconds).
  ASSIGN_OR_RETURN(int64_t timeout_s, IntVar(env, "SAGEMAKER_MODEL_SERVER_TIMEOUT", 60, 1, 86400));
  ASSIGN_OR_RETURN(timeout_s, IntVar(env, "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", timeout_s, 1, 86400));
  options.timeout = std::chrono::seconds(timeout_s);

  // One request travels to a worker in one frame (frame.h: at most 1 GiB with its meta).
  ASSIGN_OR_RETURN(int64_t payload_mb, IntVar(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 0, 1, 1000));
  if (payload_mb > 0) options.max_payload_bytes = static_cast<uint64_t>(payload_mb) * kMiB;

  ASSIGN_OR_RETURN(int64_t batch_size, IntVar(env, "SAGEMAKER_TS_BATCH_SIZE", 1, 1, 1024));
  options.batch_size = static_cast<int>(batch_size);
  ASSIGN_OR_RETURN(int64_t batch_delay, IntVar(env, "SAGEMAKER_TS_MAX_BATCH_DELAY", 100, 0, 60000));
  options.batch_delay = std::chrono::milliseconds(batch_delay);

  options.python = StringVar(env, "KILN_MODEL_SERVER_PYTHON", "/usr/bin/python3");
  options.worker_script = StringVar(env, "KILN_MODEL_SERVER_WORKER", "");
  options.framework = ToLower(Trim(StringVar(env, "KILN_MODEL_SERVER_FRAMEWORK", "")));
  static constexpr std::string_view kFrameworks[] = {"",        "pytorch",     "tensorflow", "sklearn",
                                                     "xgboost", "huggingface", "mxnet"};
  if (std::find(std::begin(kFrameworks), std::end(kFrameworks), options.framework) == std::end(kFrameworks)) {
    return Status::InvalidArgument("KILN_MODEL_SERVER_FRAMEWORK=\"" + options.framework +
                                   "\" is not valid: give pytorch, tensorflow, sklearn, xgboost, huggingface, "
                                   "mxnet, or leave it unset for the generic handlers.");
  }
  std::string backend = ToLower(Trim(StringVar(env, "KILN_MODEL_SERVER_BACKEND", "python")));
  if (backend == "python") {
    options.backend = BackendKind::kPython;
  } else if (backend == "torchscript") {
    options.backend = BackendKind::kTorchScript;
  } else {
    return Status::InvalidArgument("KILN_MODEL_SERVER_BACKEND=\"" + backend +
                                   "\" is not valid: give python or torchscript.");
  }
  if (options.backend == BackendKind::kPython && options.worker_script.empty()) {
    return Status::InvalidArgument(
        "KILN_MODEL_SERVER_WORKER is not set: give the path of python/kiln_toolkit/serve_worker.py (the Python "
        "backend runs it in every worker).");
  }

  ASSIGN_OR_RETURN(int64_t queue_size, IntVar(env, "KILN_MODEL_SERVER_QUEUE_SIZE", 100, 0, 1'000'000));
  options.queue_size = static_cast<size_t>(queue_size);

  // Unknown everywhere (no cgroup limit, no /proc/meminfo): no bound.
  uint64_t default_limit = std::numeric_limits<uint64_t>::max();
  if (system.mem_total > 0) default_limit = system.mem_total;
  if (system.cgroup_memory_limit) default_limit = std::min(default_limit, *system.cgroup_memory_limit);
  ASSIGN_OR_RETURN(int64_t limit_mb, IntVar(env, "KILN_MODEL_SERVER_MEMORY_LIMIT_MB", 0, 1, int64_t{1} << 30));
  options.memory_limit_bytes = limit_mb > 0 ? static_cast<uint64_t>(limit_mb) * kMiB : default_limit;
  return options;
}

}  // namespace kiln::modelserver
