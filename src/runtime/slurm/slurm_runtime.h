#pragma once
// The Slurm runtime: runs instances on a Slurm cluster instead of this machine (README.md). Each
// group of instances (a training job's hosts; a single endpoint instance) is one Slurm batch job
// whose tasks run `kiln node` (node_agent.h) on the allocated nodes; the node fetches the spec and
// /opt/ml from this server, runs the program under its local process runtime and mirrors output,
// files and status back through the node protocol (node_service.h, spec_json.h).
//
// Deviations from the Runtime contract (runtime.h), all deliberate:
//   - Launch returns once Slurm accepted the job (or, for a group, once the instance is recorded
//     and the group is still incomplete), not once the program was exec'd. Until the node says the
//     program started, Inspect answers kRunning with started_millis 0 and a waiting_reason
//     ("Slurm job 812 is pending: Resources").
//   - opt_ml_dir is bound at /opt/ml by mirroring: the node downloads it before the start and
//     pushes checkpoints/, output/ and model/ back; the final push happens before the exit report,
//     so kExited is only visible once the server's opt_ml_dir holds the program's results.
//   - cpus, gpus, memory_limit_bytes, network and extra_mounts describe this machine and are not
//     used: Slurm allocates from the spec's shape_* members and placement; the node runs on its
//     own network (InstanceStatus::address says where).
//   - Access and PrepareImage are not implemented (Unimplemented / FailedPrecondition); specs with
//     a container are refused (FailedPrecondition).
//
// State, one directory per instance id under options.state_dir (kept across server restarts;
// README.md "State"): spec.json token output members job stop.json report.json final.json
// batch.sh (first member only). A new server reopening the directory finds every instance and
// goes on answering its nodes: nodes retry while the server is away.
//
// Thread-safety: thread-safe. A poller thread (options.poll_interval) asks Slurm about every
// unfinished job with one query per round.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "runtime/runtime.h"
#include "runtime/slurm/slurm_client.h"
#include "runtime/slurm/spec_json.h"

namespace kiln::runtime::slurm {

struct SlurmRuntimeOptions {
  // Directory with one subdirectory per instance; created if missing. Required.
  std::string state_dir;
  // The cluster. Required (NewCliSlurmClient in production, a fake in tests).
  std::shared_ptr<SlurmClient> client;
  // How nodes reach this server ("http://10.77.0.1:5456"); passed to `kiln node --server`. Required.
  std::string server_url;
  // The node side's command on the compute nodes; the runtime appends "node --server ...".
  std::vector<std::string> node_command = {"/usr/local/bin/kiln"};
  // Node-local scratch (kiln node's --scratch, sbatch --chdir, and the batch log's directory).
  std::string scratch_dir = "/tmp";
  // Defaults for placement members the spec does not set: "partition", "qos", "account".
  std::map<std::string, std::string> placement;
  // Appended to every sbatch call (e.g. {"--constraint=a100"}).
  std::vector<std::string> sbatch_args;
  // Whether the ml.* shape's vCPUs and memory are asked of Slurm (--cpus-per-task, --mem). A
  // cluster whose nodes are smaller than the shapes used can turn them off; GPUs are always asked.
  bool request_cpus = true;
  bool request_memory = true;
  // How often Slurm is asked about unfinished jobs (one squeue per round). Shorter notices pending
  // reasons and dead nodes sooner at one fork per round.
  std::chrono::milliseconds poll_interval = std::chrono::seconds(2);
  // After Stop(grace) on a running instance, how long past the grace the node may take to report
  // the exit before the Slurm job is cancelled outright (scancel).
  std::chrono::seconds stop_backstop = std::chrono::seconds(30);
  // An exit by a signal Kiln did not send is held back (kRunning) until Slurm says how the job
  // ended (preempted, time limit) or this long has passed.
  std::chrono::milliseconds exit_settle = std::chrono::seconds(10);
  // After the last instance of a job whose nodes all reported their exit is removed, how long the
  // job may take to end by itself (the nodes clean their scratch) before it is cancelled.
  std::chrono::milliseconds finish_grace = std::chrono::seconds(60);
  // How long a job may run (Slurm says RUNNING) without any report from its node before its
  // instances are lost and the job cancelled: the node cannot reach server_url, or node_command
  // is wrong. Longer than the node's start (a few seconds) by far.
  std::chrono::milliseconds node_contact_timeout = std::chrono::minutes(5);
  // false: no poller thread; tests call PollOnce themselves.
  bool start_poller = true;
};

class SlurmRuntime : public Runtime {
 public:
  ~SlurmRuntime() override = default;

  // The node protocol's server side (node_service.h calls these). `instance_id` must have been
  // checked with Authenticate first.

  // OK when `token` is the instance's; NotFound for an unknown id (or one whose state is gone);
  // Unauthenticated for a wrong token. Constant time in the token.
  virtual Status Authenticate(const std::string& instance_id, const std::string& token) = 0;
  // The spec as launched (what GET .../spec returns).
  virtual Result<InstanceSpec> NodeSpec(const std::string& instance_id) = 0;
  // Appends `data` to the instance's output file iff `offset` equals its size now, and sets
  // `*size` to the new size. Aborted, with the current size in `*size`, when the offsets differ
  // (the node resends from there). `data` may end mid-record: readers only use complete records.
  virtual Status AppendOutput(const std::string& instance_id, uint64_t offset, std::string_view data,
                              uint64_t* size) = 0;
  // Extracts the tar read from `body` over the instance's opt_ml_dir; only members under model/,
  // output/, checkpoints/ and processing/ are accepted (InvalidArgument otherwise, nothing
  // applied). Each file
  // replaces the server's copy whole (through a staging directory and rename).
  virtual Status ApplyFiles(const std::string& instance_id, ByteSource& body) = 0;
  // Records the node's report and answers what the node must do (stop, signals).
  // FailedPrecondition when the instance already has a final state (a node that was written off,
  // e.g. after its Slurm job was cancelled): the node should stop.
  virtual Result<NodeReportAnswer> Report(const std::string& instance_id, const NodeReport& report) = 0;

  // One round of the poller (tests with start_poller false).
  virtual void PollOnce() = 0;
};

// Opens the runtime over options.state_dir; instances already there are visible at once.
// InvalidArgument when a required option is missing.
Result<std::unique_ptr<SlurmRuntime>> OpenSlurmRuntime(SlurmRuntimeOptions options);

// The batch script for one Slurm job (exposed for tests): `kiln node` once per node through srun.
std::string BatchScript(const std::vector<std::string>& node_command, const std::string& server_url,
                        const std::vector<std::string>& instance_ids, const std::string& scratch_dir);

}  // namespace kiln::runtime::slurm
