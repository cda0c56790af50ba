#pragma once
// ModelServerOptions: the model server's settings, read from its environment (README.md,
// "Environment"). Parsing is pure (an environment map and a SystemInfo in, options or an error
// out) so every default and every refusal has a unit test; ProbeSystem() and EnvironmentMap()
// read the real machine for main.
//
//   auto options = ParseModelServerOptions(EnvironmentMap(), ProbeSystem());
//   if (!options.ok()) { /* print options.status().message(), exit 2 */ }
//
// Thread-safety: the functions are thread-safe (ProbeSystem reads files only).

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kiln::modelserver {

enum class BackendKind {
  kPython,       // WorkerPool: Python workers running the user's handlers
  kTorchScript,  // libtorch in process (<model>/model.pt)
};

std::string_view BackendKindName(BackendKind kind);

// The MMS default request size limit, used when SAGEMAKER_MAX_PAYLOAD_IN_MB is unset.
inline constexpr uint64_t kDefaultMaxPayloadBytes = 6'553'500;

struct ModelServerOptions {
  uint16_t port = 8080;              // SAGEMAKER_BIND_TO_PORT
  std::string base_dir = "/opt/ml";  // SAGEMAKER_BASE_DIR
  bool multi_model = false;          // SAGEMAKER_MULTI_MODEL
  // Worker processes per model (SAGEMAKER_MODEL_SERVER_WORKERS). Default: GPUs listed in
  // NVIDIA_VISIBLE_DEVICES, else the CPUs this process may run on; 1 in multi-model mode.
  int workers = 1;
  // One request's budget, queue wait included (SAGEMAKER_MODEL_SERVER_TIMEOUT[_SECONDS]).
  std::chrono::milliseconds timeout{60'000};
  // Largest request body (SAGEMAKER_MAX_PAYLOAD_IN_MB × 1,048,576); larger → 413.
  uint64_t max_payload_bytes = kDefaultMaxPayloadBytes;
  int batch_size = 1;                          // SAGEMAKER_TS_BATCH_SIZE; 1: no batching
  std::chrono::milliseconds batch_delay{100};  // SAGEMAKER_TS_MAX_BATCH_DELAY
  std::string python = "/usr/bin/python3";     // KILN_MODEL_SERVER_PYTHON
  std::string worker_script;                   // KILN_MODEL_SERVER_WORKER (required for kPython)
  std::string framework;                       // KILN_MODEL_SERVER_FRAMEWORK; empty: generic
  BackendKind backend = BackendKind::kPython;  // KILN_MODEL_SERVER_BACKEND
  size_t queue_size = 100;                     // KILN_MODEL_SERVER_QUEUE_SIZE, per model
  // Multi-model memory bound (KILN_MODEL_SERVER_MEMORY_LIMIT_MB; default the cgroup's limit, else
  // MemTotal): a load that would pass 90 % of it answers 507.
  uint64_t memory_limit_bytes = UINT64_MAX;

  // <base>/model: the single model's directory.
  std::string model_dir() const { return base_dir + "/model"; }
  // MaxPayloadInMB for GET /execution-parameters: whole MiB, at least 1.
  uint64_t max_payload_mb() const;
};

// What the defaults depend on, measured from the machine (ProbeSystem) or given by tests.
struct SystemInfo {
  int cpus = 1;                                 // CPUs in this process's affinity mask
  int gpus_all = 0;                             // GPUs present (/dev/nvidia<N>), for NVIDIA_VISIBLE_DEVICES=all
  std::optional<uint64_t> cgroup_memory_limit;  // bytes; nullopt when unlimited or unknown
  uint64_t mem_total = 0;                       // MemTotal, bytes (0: unknown)
};

// Reads sched_getaffinity, /dev/nvidia*, the cgroup memory limit (v2 memory.max of this process's
// cgroup, else v1 memory.limit_in_bytes) and /proc/meminfo.
SystemInfo ProbeSystem();

// The process environment as a map.
std::map<std::string, std::string> EnvironmentMap();

// Builds the options from `env` (variable → value; absent variables take their defaults).
// Errors (InvalidArgument, the message names the variable, the value and what is accepted):
// a number that does not parse or is out of range, a boolean other than true/false/1/0/yes/no, an
// unknown KILN_MODEL_SERVER_BACKEND or KILN_MODEL_SERVER_FRAMEWORK, and KILN_MODEL_SERVER_WORKER
// unset for the Python backend. Empty values count as unset. With no memory limit to be found
// (no cgroup limit, no MemTotal) memory_limit_bytes is UINT64_MAX: no bound.
Result<ModelServerOptions> ParseModelServerOptions(const std::map<std::string, std::string>& env,
                                                   const SystemInfo& system);

// The pieces of ProbeSystem, pure for tests.
// cgroup v2 memory.max ("max" → nullopt) or v1 memory.limit_in_bytes (values of 2^62 and above
// mean "no limit" → nullopt).
std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text);
// MemTotal from /proc/meminfo text, in bytes; nullopt when absent.
std::optional<uint64_t> ParseMemTotal(std::string_view meminfo);
// The cgroup v2 path of this process from /proc/self/cgroup text ("0::/a/b" → "/a/b"); nullopt
// for cgroup v1 only.
std::optional<std::string> ParseCgroupV2Path(std::string_view proc_self_cgroup);
// GPUs named by NVIDIA_VISIBLE_DEVICES: 0 for unset, empty, "void" or "none"; `gpus_all` for
// "all"; else the number of comma-separated entries.
int CountVisibleGpus(std::string_view nvidia_visible_devices, int gpus_all);

}  // namespace kiln::modelserver
