#pragma once
// GPU discovery: which NVIDIA GPUs this node has, so the scheduler can hand them out by index
// (DESIGN.md §5, training-contract.md §13).
//
// Sources, in order:
//   1. `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv,noheader,nounits`
//      when nvidia-smi is on PATH (or in /usr/bin), bounded by a timeout (a wedged driver must not
//      hang the server's start);
//   2. /proc/driver/nvidia/gpus/<pci bus id>/information (driver loaded, no nvidia-smi): GPUs are
//      numbered 0..n-1 in PCI bus order, which is nvidia-smi's (and CUDA_DEVICE_ORDER=PCI_BUS_ID)
//      numbering;
//   3. otherwise none.
// The parsers are pure functions so that tests feed them sample text.
//
// Thread-safety: all functions may be called from any thread.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <optional>
#include <vector>

#include "base/status.h"

namespace kiln::runtime {

struct GpuInfo {
  int index = 0;              // nvidia-smi's index: what CUDA_VISIBLE_DEVICES names
  std::string uuid;           // "GPU-8c6d..."; what NVIDIA_VISIBLE_DEVICES names
  std::string name;           // "NVIDIA H200"
  uint64_t memory_bytes = 0;  // total device memory; 0 when unknown
  std::string pci_bus_id;     // "0000:19:00.0" (4-digit domain, lower case); empty when unknown
  int minor = -1;             // /dev/nvidia<minor>; -1 when unknown
};

// Discovers the node's GPUs (sources above). Never fails: a source that errors is logged and
// the next one is tried; no GPUs is an empty vector. `timeout` bounds the nvidia-smi run.
std::vector<GpuInfo> DiscoverGpus(std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Parses nvidia-smi CSV (noheader, nounits) with the columns index, uuid, name, memory.total
// [MiB] and optionally pci.bus_id. Lines that do not parse are skipped; "[N/A]" memory is 0.
// The result is sorted by index.
std::vector<GpuInfo> ParseNvidiaSmiCsv(std::string_view text);

// Parses one /proc/driver/nvidia/gpus/<bus id>/information file ("Model:", "GPU UUID:",
// "Bus Location:", "Device Minor:" lines). `index` is left 0; memory is not in that file (0).
// False if the text has neither a model nor a UUID.
bool ParseProcGpuInformation(std::string_view text, GpuInfo* out);

// "00000000:19:00.0" (nvidia-smi) or "0000:19:00.0" -> "0000:19:00.0" (the /proc directory name).
std::string NormalizePciBusId(std::string_view bus_id);

// Reads every <dir>/*/information (dir defaults to /proc/driver/nvidia/gpus) and numbers the GPUs
// 0..n-1 in bus order. Empty if the directory does not exist.
std::vector<GpuInfo> ReadProcGpus(const std::string& dir = "/proc/driver/nvidia/gpus");

// One GPU's utilization now (instance metrics, serving-contract.md §15.3). A value the driver
// does not report ("[N/A]", "[Not Supported]") is nullopt.
struct GpuUsage {
  int index = 0;
  std::optional<double> utilization_percent;  // utilization.gpu: 0–100
  std::optional<double> memory_percent;       // memory.used / memory.total × 100
};

// The nvidia-smi query that ParseNvidiaSmiUsageCsv reads:
//   nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits
std::vector<std::string> DefaultGpuUsageCommand();

// Parses that CSV (one "index, util, used MiB, total MiB" line per GPU). Lines that do not
// parse are skipped; the result is sorted by index.
std::vector<GpuUsage> ParseNvidiaSmiUsageCsv(std::string_view text);

// Runs `command` (argv; argv[0] absolute, or looked up as DiscoverGpus does) and parses its
// output with ParseNvidiaSmiUsageCsv. NotFound when argv[0] is not installed (a node without
// NVIDIA's tools: callers publish no GPU metrics); Unavailable when it fails, exits non-zero or
// runs past `timeout` (it is killed then). Blocks up to `timeout`.
Result<std::vector<GpuUsage>> SampleGpuUsage(const std::vector<std::string>& command,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace kiln::runtime
