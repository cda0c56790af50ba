#pragma once
// Runtime: runs instances (SageMaker "ML instances": a training host, an endpoint instance) on this
// node (DESIGN.md §6). One implementation per backend; the process backend (runtime/process/) runs
// each instance in a sandbox of Linux namespaces owned by a `kiln shim` process that outlives the
// server, so restarting or killing `kiln server` never kills an instance: a new server finds the
// instance again by id (List/Inspect) and goes on managing it.
//
// An instance's observable state lives on disk under the runtime's state dir, one directory per
// instance id: the shim's socket, its pid, the captured output and the exit status. Everything
// here is therefore valid across server restarts.
//
// Captured output (OutputPath): one record per line the instance wrote, in the order read:
//     <unix millis when read> <SP> <'o' stdout | 'e' stderr> <SP> <line without its newline> <LF>
// A line longer than kMaxOutputLineBytes is split into several records; a final line without a
// newline is recorded when the stream closes. Readers may tail the file while it grows; a record
// is complete once its LF is written.
//
// Thread-safety: every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace kiln::runtime {

inline constexpr size_t kMaxOutputLineBytes = 256 * 1024;

struct BindMount {
  std::string host_path;
  std::string sandbox_path;
  bool read_only = false;
};

// One instance's place on a network (DESIGN.md §6): its own network namespace, joined to a
// per-job (per-endpoint) bridge by a veth pair. Produced by InstanceNetworks::Attach; the process
// runtime's shim builds it (runtime/process/netlink.h).
struct NetworkAttachment {
  std::string network;                  // the InstanceNetworks name (a job's, an endpoint's)
  std::string bridge;                   // host bridge the veth's host end joins, e.g. "kb-12"
  std::string host_veth;                // the veth's host-side name, e.g. "kv12-2" (unique per address)
  std::string address;                  // the instance's IPv4 address, e.g. "10.213.12.2"
  int prefix_length = 24;               // of the network's subnet
  std::string gateway;                  // the bridge's address: the default route unless isolated
  bool isolated = false;                // EnableNetworkIsolation: no default route, the node refuses it
  std::string interface_name = "eth0";  // resourceconfig.json's network_interface_name
  // TCP ports on 127.0.0.1 inside the namespace that the shim forwards to the same port on the
  // node's 127.0.0.1 (Kiln's endpoint, so that AWS_ENDPOINT_URL=http://127.0.0.1:<port> works
  // unchanged inside). Empty for isolated instances.
  std::vector<int> loopback_forwards;
};

// An OCI image run through a container engine (runtime/docker/). Set on InstanceSpec only when the
// image URI resolved to the engine (ImageResolution::Kind::kContainerImage); the process runtime
// refuses specs that carry one.
struct ContainerImage {
  // The request's image URI (TrainingImage, a model's Image).
  std::string requested;
  // What the engine runs. Empty: the runtime derives it from `requested` (ECR-style URIs map to
  // the operator's mirror, runtime/docker/images.h). Must be present in the engine (PrepareImage).
  std::string reference;
  // ContainerEntrypoint: replaces the image's ENTRYPOINT when set. Unset: the image's own
  // ENTRYPOINT runs with InstanceSpec::argv as its arguments (CMD), exactly as
  // `docker run IMAGE train`.
  std::optional<std::vector<std::string>> entrypoint;
};

struct InstanceSpec {
  // Unique on this node; [A-Za-z0-9._-]{1,128}. Names the instance's state directory.
  std::string instance_id;
  // Host directory bound at /opt/ml inside the sandbox (read-write).
  std::string opt_ml_dir;
  // Further binds (e.g. a read-only dataset directory); sandbox paths are created as needed.
  std::vector<BindMount> extra_mounts;
  // UTS hostname inside the sandbox, e.g. "algo-1".
  std::string hostname;
  // Lines for the sandbox's /etc/hosts (bound over the host's), e.g. "127.0.0.1 algo-1".
  // Empty: the host's /etc/hosts is visible unchanged.
  std::vector<std::string> hosts_file_lines;
  // The program: argv[0] is an absolute path, or a name looked up in env["PATH"]. With `container`
  // set: the container's command (CMD), e.g. {"train"}; the image's ENTRYPOINT (or
  // container->entrypoint) runs it.
  std::vector<std::string> argv;
  // The complete environment of the program; nothing is inherited from the server. With
  // `container` set: added to the image's own environment (these win; PATH and HOME should then
  // come from the image, so callers leave them out).
  std::map<std::string, std::string> env;
  // Working directory inside the sandbox; empty means "/" (with `container`: the image's WORKDIR).
  std::string working_dir;
  // CPU indices for the instance's cpuset (sched_setaffinity, and a cgroup cpuset where the host
  // allows). Empty: no restriction.
  std::vector<int> cpus;
  // Memory hard limit in bytes (cgroup v2 memory.max where the host allows); 0: none.
  uint64_t memory_limit_bytes = 0;
  // GPU indices assigned exclusively to this instance. The other /dev/nvidia<N> nodes are hidden
  // in the sandbox where possible. (Environment variables are the caller's job.)
  std::vector<int> gpus;
  // Empty: the instance shares the node's network (and hosts_file_lines should map its names to
  // 127.0.0.1). Set: a network namespace of its own, built as NetworkAttachment says before the
  // program starts; it (and the veth) disappears with the instance's last process.
  std::optional<NetworkAttachment> network;
  // Set (with `network` unset): the program joins this existing network namespace, a path such as
  // "/proc/<pid>/ns/net" (Runtime::Access's host_pid of another running instance), instead of
  // getting one of its own or the node's: the containers of one multi-container endpoint instance
  // share the first container's namespace (serving-contract.md §2). The namespace is not this
  // instance's to build or remove; it lives while any process is in it.
  std::string network_namespace;
  // Set: run this image through the container engine (runtime/docker/docker_runtime.h) instead of
  // a host program. extra_mounts, hosts_file_lines, cpus, memory, GPUs and network apply as above.
  std::optional<ContainerImage> container;

  // Fields below matter only to backends that place instances on other machines (the Slurm
  // runtime, runtime/slurm/); every other backend ignores them.

  // Instances launched together as one allocation (a multi-host training job): the backend may
  // start none of them until all `group_size` were launched. Empty: a group of one.
  std::string group;   // e.g. the training job's name
  int group_size = 1;  // how many Launch calls make the group; group_index is the order
  int group_index = 0;
  // The ml.* shape, for backends that allocate elsewhere (Slurm): vCPUs, memory and GPUs of one
  // instance from the instance catalog, whatever the local scheduler granted (cpus, gpus,
  // memory_limit_bytes above describe this machine and mean nothing on another).
  int shape_vcpus = 0;
  uint64_t shape_memory_bytes = 0;
  int shape_gpus = 0;
  std::string instance_type;  // e.g. "ml.m5.xlarge"; empty when unknown
  // Wall-clock limit (MaxRuntimeInSeconds + the stop grace); 0: none. Backends that enforce
  // limits themselves (Slurm --time, in whole minutes, rounded up) use it.
  int64_t time_limit_seconds = 0;
  // Scheduler hints from configuration or the resource's tags, e.g. {"partition":"gpu","qos":"high"}.
  std::map<std::string, std::string> placement;
};

enum class InstanceState {
  kRunning,  // the program runs (or the shim is starting it)
  kExited,   // the program exited or was killed; exit_code / term_signal say how
  kLost,     // the shim is gone without recording an exit (e.g. the node rebooted)
};

struct InstanceStatus {
  std::string instance_id;
  InstanceState state = InstanceState::kRunning;
  int64_t started_millis = 0;   // when the program was exec'd
  int64_t finished_millis = 0;  // kExited: when it ended
  int exit_code = -1;           // kExited normally: its exit status; else -1
  int term_signal = 0;          // kExited by a signal: the signal number; else 0
  bool stop_requested = false;  // Stop() was called for this instance
  // kExited: the kernel's OOM killer ended it (the container engine reports this; the process
  // runtime reports a SIGKILL it did not send, and callers treat both as out of memory).
  bool oom_killed = false;
  // kLost: why, when the backend knows (e.g. "the container engine no longer knows container
  // kiln-...", "the container engine at unix:///run/podman/podman.sock has been unreachable for
  // 30 s: ..."). Empty: the supervisor vanished without a word.
  std::string lost_reason;
  // kRunning but the program has not started yet because the backend waits (e.g. "Slurm job 812
  // is pending: Resources"); empty once it runs. Controllers show it as the status message.
  std::string waiting_reason;
  // Where the instance's network is reachable from the server when it is not this machine (the
  // Slurm node's address); empty: as launched (127.0.0.1 or its NetworkAttachment address).
  std::string address;
  // kLost/kExited because the cluster preempted it: managed spot jobs treat this as an
  // interruption, not a failure.
  bool preempted = false;
};

// What a running instance uses now (Runtime::Usage), for the instance metrics of
// training-contract.md §15 and serving-contract.md §15.3. CPU time is cumulative, so a
// utilization is the difference of two samples over the wall time between them; the other
// members are levels.
struct InstanceUsage {
  // CPU time (user + system) of every process of the instance since it started, in
  // microseconds. Monotonic within one `source`; compare only samples of the same source.
  uint64_t cpu_usec = 0;
  // Memory the instance's processes use: cgroup memory.current where the instance has its own
  // cgroup v2 leaf with the memory controller, else the sum of their proportional set sizes
  // (PSS: shared pages split among the sharers, so forked workers are not counted n times;
  // resident sizes where PSS cannot be read).
  uint64_t memory_bytes = 0;
  // The instance's memory limit (cgroup memory.max, else InstanceSpec::memory_limit_bytes);
  // 0 when it has none.
  uint64_t memory_limit_bytes = 0;
  // The GPU indices assigned to the instance (InstanceSpec::gpus).
  std::vector<int> gpus;
  // Where the numbers come from: "cgroup" (cpu.stat usage_usec, memory.current) or "proc"
  // (/proc over the instance's process tree).
  std::string source;
  int process_count = 0;  // processes counted ("proc"; 0 for "cgroup")
};

// Where remote access (src/access/, spec remote-access.md R-7..R-11) enters a running instance:
// the host pid of its program (PID 1 of the sandbox or container) whose namespaces
// (/proc/<pid>/ns/{mnt,uts,ipc,net,pid,cgroup}), cgroups (/proc/<pid>/cgroup), environment and
// user the agent takes on. The pid is checked against the instance when read (its parent is the
// instance's supervisor, or the engine reports it), so a reused pid is never returned; it can
// still end at any moment after, which the agent notices as a failed setns or open.
struct AccessPoint {
  int host_pid = 0;
  // The instance's hostname (algo-N, or the endpoint instance's), for messages and prompts.
  std::string hostname;
};

class Runtime {
 public:
  virtual ~Runtime() = default;

  // Makes `image` ready to Launch (ContainerImage::reference): present in the engine, pulled from
  // its registry when missing. Calls `progress` with one-line texts while pulling ("pulling
  // 123.dkr.ecr.../x:1 (mirror registry.local/x:1): 45% of 1.2 GB"), at most a few times per
  // second, from the calling thread. Blocks until done or `cancelled` returns true (Aborted).
  // Errors name the image and what was tried (local lookup, pull from which registry, the
  // engine's answer): NotFound when no registry had it, Unavailable when the engine cannot be
  // reached, PermissionDenied for rejected credentials. Backends without images answer
  // FailedPrecondition (the default).
  virtual Status PrepareImage(const ContainerImage& image, const std::function<void(const std::string&)>& progress,
                              const std::function<bool()>& cancelled) {
    (void)progress;
    (void)cancelled;
    return Status::FailedPrecondition("this runtime cannot run container images (" + image.requested +
                                      "): configure container_engine in the Kiln config file");
  }

  // Starts the instance and returns once its program has been exec'd inside the sandbox.
  // A program that cannot be started (missing, not executable, bad sandbox) is an error whose
  // message says what to fix, e.g. "cannot execute /usr/bin/pythn3: No such file or directory";
  // nothing is left running then. AlreadyExists if the id is in use.
  virtual Status Launch(const InstanceSpec& spec) = 0;

  // The instance's status from its on-disk state. NotFound if the id is unknown.
  virtual Result<InstanceStatus> Inspect(const std::string& instance_id) = 0;

  // Sends `signal` to the program (PID 1 of the sandbox).
  virtual Status Signal(const std::string& instance_id, int signal) = 0;

  // `docker stop -t grace`: SIGTERM to the program now, SIGKILL to every process of the sandbox
  // after `grace` unless it has exited. Returns at once; the shim carries the sequence out even if
  // the caller (the server) goes away. Idempotent; a shorter grace on a later call wins.
  virtual Status Stop(const std::string& instance_id, std::chrono::seconds grace) = 0;

  // Blocks until the instance has exited or `timeout` passes; returns the status either way.
  virtual Result<InstanceStatus> Wait(const std::string& instance_id, std::chrono::milliseconds timeout) = 0;

  // The captured-output file of the instance (format above). Exists from Launch on.
  virtual std::string OutputPath(const std::string& instance_id) const = 0;

  // Ids of every instance with state on this node, running or not.
  virtual Result<std::vector<std::string>> List() = 0;

  // Forgets an exited (or lost) instance: removes its state directory. FailedPrecondition while
  // it runs.
  virtual Status Remove(const std::string& instance_id) = 0;

  // What the instance uses now (InstanceUsage). NotFound if the id is unknown;
  // FailedPrecondition when it is not running (exited, lost, or not yet exec'd). Cheap enough to
  // call every few seconds per instance (a few /proc or cgroup reads). Backends that cannot
  // measure answer Unimplemented (the default), and callers then publish nothing.
  virtual Result<InstanceUsage> Usage(const std::string& instance_id) {
    return Status::Unimplemented("this runtime does not report the usage of instance " + instance_id);
  }

  // Where remote access enters the instance now (AccessPoint). NotFound if the id is unknown;
  // FailedPrecondition when it is not running (exited, lost, or not yet exec'd). Backends that
  // cannot be entered answer Unimplemented (the default).
  virtual Result<AccessPoint> Access(const std::string& instance_id) {
    return Status::Unimplemented("this runtime cannot give remote access to instance " + instance_id);
  }
};

}  // namespace kiln::runtime
