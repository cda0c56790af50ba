#pragma once
// The body of POST /containers/create for one instance (Docker Engine API v1.41), a pure function
// of the InstanceSpec and the runtime's settings, so that every rule is unit-tested without an
// engine. What SageMaker's container contract asks (training-contract.md §2, serving-contract.md
// §2), as the process runtime gives it:
//   Image        spec.container->reference; Entrypoint only when container->entrypoint is set;
//                Cmd = spec.argv ("train" / "serve"); WorkingDir only when spec.working_dir is set.
//   Env          spec.env as "K=V" (the image's own variables stay unless named here);
//                CUDA_VISIBLE_DEVICES renumbered 0..n-1 (only the instance's GPUs are visible
//                inside, numbered from 0), NVIDIA_VISIBLE_DEVICES as given.
//   Hostname     spec.hostname (algo-N); Labels kiln.instance=<id>, kiln.server=<server label>.
//   Binds        spec.opt_ml_dir at /opt/ml (rw), each extra mount, the hosts file at /etc/hosts
//                (ro) when spec.hosts_file_lines is not empty.
//   Network      NetworkMode "ns:<netns path>" when the instance has its own network (Podman; the
//                namespace is built by a holder, docker_runtime.h), "host" otherwise.
//   Resources    CpusetCpus from spec.cpus, Memory (+ MemorySwap = Memory: no swap) from
//                memory_limit_bytes, ShmSize (settings), Ulimits (settings; always the whole list,
//                since Podman replaces its defaults with whatever list is given), PidsLimit none.
//   GPUs         none: no device; else DeviceRequests [{Driver:"nvidia", DeviceIDs:[indices],
//                Capabilities:[["gpu"]]}] (Docker) or Devices [{PathOnHost:"nvidia.com/gpu=<i>"}]
//                (CDI), or Devices /dev/nvidia<i> + the control nodes (kDevices, Podman 4).
//   Logging      LogConfig {Type: settings.log_driver} when set (engine default otherwise).
//   Stop         StopSignal SIGTERM, StopTimeout as given (Kiln sends the signals itself).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/runtime.h"

namespace kiln::runtime::docker {

enum class GpuRequestMode {
  kDeviceRequests,  // Docker with the NVIDIA runtime: DeviceRequests [{Driver:"nvidia", DeviceIDs}]
  kCdi,             // CDI names through DeviceRequests Driver "cdi" (Docker 25+, Podman 5)
  // The device nodes themselves (HostConfig.Devices: /dev/nvidia<i> and the control nodes), with
  // NVIDIA_VISIBLE_DEVICES (set by the controllers) for an installed NVIDIA OCI hook to add the
  // driver's libraries. Podman 4's compat API ignores CDI requests (measured), so "auto" picks this
  // on Podman: only the instance's GPUs are visible either way.
  kDevices,
};

struct Ulimit {
  std::string name;  // "nofile", "nproc", "memlock", "stack", ...
  int64_t soft = 0;  // -1: unlimited
  int64_t hard = 0;
};

struct ContainerSettings {
  std::string server_label;  // kiln.server=<this>: which server's containers these are
  // ShmSize: this fraction of the instance's memory limit (SageMaker's instances give /dev/shm
  // about half of memory), or shm_default_bytes when the instance has no limit. At least 64 MiB.
  double shm_fraction = 0.5;
  uint64_t shm_default_bytes = 1ull << 30;
  std::vector<Ulimit> ulimits;  // DefaultUlimits() unless configured
  GpuRequestMode gpu_mode = GpuRequestMode::kDeviceRequests;
  // kDevices: the NVIDIA control nodes present on the node (/dev/nvidiactl, /dev/nvidia-uvm,
  // /dev/nvidia-uvm-tools, /dev/nvidia-modeset), added for instances with GPUs (NvidiaControlDevices()).
  std::vector<std::string> gpu_control_devices;
  std::string log_driver;  // "" = engine default
  int stop_timeout_seconds = 30;
};

// The server's own hard limits for nofile, nproc, memlock and stack (soft = hard), so that an
// instance gets what a process-runtime instance inherits, and never more than the engine may give.
std::vector<Ulimit> DefaultUlimits();

// `netns_path`: the network namespace to join ("" = the node's network). `hosts_file`: the host
// path of the /etc/hosts to bind ("" = none).
nlohmann::json BuildCreateBody(const InstanceSpec& spec, const ContainerSettings& settings,
                               const std::string& netns_path, const std::string& hosts_file);

// The NVIDIA control device nodes that exist on this node (for ContainerSettings::gpu_control_devices).
std::vector<std::string> NvidiaControlDevices();

// "kiln-<server label>-<instance id>" (Docker names: [a-zA-Z0-9][a-zA-Z0-9_.-]+).
std::string ContainerName(const std::string& server_label, const std::string& instance_id);

}  // namespace kiln::runtime::docker
