#pragma once
// The node side of the Slurm runtime: `kiln node`, started by srun once per node inside each
// Slurm job the server submitted (README.md, "Node protocol"; /work/notes design, "Node side").
// It does on the compute node what the process runtime does on the server's machine, and mirrors
// the result back, so that the server's controllers see an instance exactly as a local one:
//
//   1. GET  /_kiln/node/v1/instances/<id>/spec     the InstanceSpec (spec_json.h)
//   2. GET  /_kiln/node/v1/instances/<id>/opt-ml   the server's opt_ml_dir as a tar, unpacked
//      (agent/tar_extract: safe paths) into <scratch>/kiln-<slurm job>/<id>/opt_ml
//   3. /etc/hosts: algo-(k+1) -> the k-th node of the job (itself included); a lone instance
//      (an endpoint's) keeps its names on 127.0.0.1
//   4. the program runs under a local process runtime (runtime/process: the shim, the sandbox)
//      with /opt/ml bound to the scratch copy, the node's network, the GPUs Slurm gave the task,
//      and no cpuset or memory limit of the server's (Slurm's cgroups apply)
//   5. every second, and at once when it exits: new captured output (POST .../output?offset=n,
//      409 {"size": m} resends from m), files changed under checkpoints/ and output/
//      (POST .../files, a tar), and a report (POST .../report) whose answer may ask for a stop
//      (with a grace) or signals, which the node carries out
//   6. at exit: the output to its end, then model/ + output/ + checkpoints/ + processing/ (a
//      processing job's outputs; not pushed while running), then the "exited"
//      report; each call retries with backoff (0.5 s -> 5 s) for up to an hour, so either side
//      may restart meanwhile. SIGTERM (scancel) stops the program with the last stop grace
//      (default 30 s) and still runs the exit sequence.
//   7. the scratch directory is removed.
//
// Every request carries `Authorization: Bearer <token>` (KILN_NODE_TOKEN). 401, 403 and 404 are
// final (the server no longer knows the instance or the token): the node stops the program and
// gives up.
//
// Thread-safety: NodeAgent::Run runs on one thread; RequestStop may be called from any thread
// and from a signal handler.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/runtime.h"

namespace kiln::runtime::slurm {

struct NodeAgentOptions {
  // The server's base URL as the nodes reach it, e.g. "http://10.77.0.1:5456" (config
  // slurm.server_url). http only.
  std::string server_url;
  // The per-Slurm-job credential (KILN_NODE_TOKEN).
  std::string token;
  // Every instance of the Slurm job, in task order; this task runs instance_ids[task_index].
  std::vector<std::string> instance_ids;
  size_t task_index = 0;
  // The IPv4 address of each node of the job (SLURM_JOB_NODELIST order: task k runs on node k).
  // Multi-instance jobs need one per instance; a lone instance may leave it empty.
  std::vector<std::string> node_addresses;
  // This node's name, for the reports (Slurm's node name).
  std::string node_name;
  // SLURM_JOB_ID: names the scratch directory <scratch_dir>/kiln-<job_id>/<instance id>.
  std::string job_id;
  std::string scratch_dir = "/tmp";
  // How the local process runtime starts shims, e.g. {"/usr/local/bin/kiln", "shim"}.
  std::vector<std::string> shim_command;
  // The GPUs Slurm gave this task (host indices: SLURM_STEP_GPUS / SLURM_JOB_GPUS), and Slurm's
  // CUDA_VISIBLE_DEVICES for it ("" when unset: the indices are used).
  std::vector<int> gpus;
  std::string cuda_visible_devices;
  // Period of the output/files/report loop. Shorter: fresher logs and reports, more requests.
  std::chrono::milliseconds tick{1000};
  // Backoff between retries of a failed call (doubling from min to max).
  std::chrono::milliseconds backoff_min{500};
  std::chrono::milliseconds backoff_max{5000};
  // How long after the program ended (or failed to start) the node keeps trying to deliver the
  // exit sequence before giving up (the server then reports the instance lost).
  std::chrono::seconds give_up_after{3600};
  // Stop grace when SIGTERM arrives before the server named one.
  std::chrono::seconds default_stop_grace{30};
  // Slurm's KillWait (scontrol show config): how long after its SIGTERM Slurm SIGKILLs the step.
  // On SIGTERM the program's grace is cut to KillWait - 3 s so that the exit sequence (output,
  // files, report) still runs before the SIGKILL. 0: unknown, the grace is not cut.
  std::chrono::seconds slurm_kill_wait{0};
  // Largest output body per request.
  size_t max_output_chunk = 1 << 20;
  // Keep the scratch directory at the end (debugging).
  bool keep_scratch = false;
};

class NodeAgent {
 public:
  // InvalidArgument when an option is missing or task_index is out of range.
  static Result<std::unique_ptr<NodeAgent>> Create(NodeAgentOptions options);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Steps 1-7. Returns the exit status `kiln node` should have: the program's exit code, 128 +
  // its signal when a signal ended it, 1 when it never ran (or the server gave up on it).
  int Run();

  // Stop the program with the current grace (SIGTERM to `kiln node`). Async-signal-safe.
  void RequestStop() { stop_requested_.store(true, std::memory_order_relaxed); }

 private:
  explicit NodeAgent(NodeAgentOptions options);
  class Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_requested_{false};
};

// Step 3: the sandbox's /etc/hosts from the spec's lines. With more than one instance, every name
// algo-(k+1) for k < instance_count is moved to node_addresses[k] (one line each, itself
// included); other names stay where the spec put them. With one instance the spec's lines are
// kept, and `hostname` is added on 127.0.0.1 when no line names it.
std::vector<std::string> NodeHostsLines(const std::vector<std::string>& spec_lines, const std::string& hostname,
                                        size_t instance_count, const std::vector<std::string>& node_addresses);

// Step 4: the spec the node launches from the server's: opt_ml_dir = `opt_ml_dir`, hosts as
// above, no cpuset/memory limit/network of the server's, GPUs and their environment from Slurm,
// extra mounts whose host path does not exist on this node left out (named in `dropped`).
InstanceSpec NodeSpec(const InstanceSpec& server_spec, const NodeAgentOptions& options, const std::string& opt_ml_dir,
                      std::vector<std::string>* dropped);

// The `kiln node` entry point: `argv` are the arguments after "node" (argv[0] is ignored):
//   --server URL --instances ID[,ID...] --scratch DIR [--keep-scratch]
// with KILN_NODE_TOKEN, SLURM_PROCID, SLURM_JOB_ID, SLURM_JOB_NODELIST (resolved with
// `scontrol show hostnames` and getaddrinfo) and the GPU variables from the environment.
// Returns the process exit status (see Run; 2 for bad arguments).
int RunNodeMain(int argc, char** argv);

}  // namespace kiln::runtime::slurm
