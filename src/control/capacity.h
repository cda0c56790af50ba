#pragma once
// HostCapacity: what this node can give to instances (CPUs by index, memory, GPUs by index), as
// discovered at server start (DESIGN.md §5). The scheduler hands these out; the runtime enforces
// them (cpuset, memory limit, visible GPUs).
//
// Thread-safety: plain values and free functions; callable from any thread.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/gpus.h"

namespace kiln::control {

struct HostCapacity {
  std::vector<int> cpus;  // CPU indices this process may run on, ascending
  uint64_t memory_bytes = 0;
  std::vector<runtime::GpuInfo> gpus;  // ascending index
};

// CPUs from sched_getaffinity; memory from /proc/meminfo MemTotal, lowered to the cgroup's memory
// limit (v2 memory.max, or v1 memory.limit_in_bytes) when that is lower; GPUs from
// runtime::DiscoverGpus(). Never fails: an unreadable source leaves that dimension at what the
// others found (and logs a warning).
HostCapacity DiscoverHostCapacity();

// Pure parsers, exposed for tests.
// MemTotal of /proc/meminfo in bytes; nullopt if absent.
std::optional<uint64_t> ParseMemInfoTotal(std::string_view meminfo);
// A cgroup memory limit file ("max", or bytes); nullopt for "max", junk, or the v1 "unlimited"
// sentinel (values >= 2^62).
std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text);
// The v2 cgroup path ("0::/system.slice/kiln.service" -> "/system.slice/kiln.service") of
// /proc/self/cgroup, or nullopt on a v1-only host.
std::optional<std::string> ParseCgroupV2Path(std::string_view proc_self_cgroup);

}  // namespace kiln::control
