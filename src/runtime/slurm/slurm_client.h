#pragma once
// SlurmClient: the few things the Slurm runtime asks of a Slurm cluster — submit a batch job, ask
// the state of its jobs, cancel one — behind an interface, so the runtime's logic is tested
// against a fake (FakeSlurmClient, test_util/) and runs against the real cluster through its
// command-line tools (NewCliSlurmClient). Why the CLI and not slurmrestd: README.md.
//
// Thread-safety: implementations are thread-safe.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kiln::runtime::slurm {

// One sbatch call: a batch job of `nodes` nodes with one task per node.
struct SubmitRequest {
  std::string job_name;       // --job-name (shows in squeue)
  std::string script_path;    // the batch script, read by sbatch on this machine
  int nodes = 1;              // --nodes, with --ntasks-per-node=1
  int cpus_per_task = 0;      // --cpus-per-task; 0: Slurm's default
  uint64_t memory_bytes = 0;  // --mem per node, in MiB rounded up; 0: Slurm's default
  int gpus_per_node = 0;      // --gpus-per-node; 0: none asked
  // --time in whole minutes, rounded up; 0: the partition's default limit.
  int64_t time_limit_seconds = 0;
  std::string partition, qos, account;  // empty: not passed
  // --output: where the batch step's own stdout/stderr go, a path on the node that runs the
  // batch script (%j expands to the job id). Empty: Slurm's default (slurm-%j.out in the cwd).
  std::string output_path;
  std::string working_dir;  // --chdir on the node; empty: not passed
  // Variables passed to the job through sbatch's own environment and --export=ALL, never on a
  // command line (they may be secrets: /proc/<pid>/cmdline is world-readable). sbatch runs in a
  // clean environment: only these, and of the server's PATH, HOME, USER, LOGNAME, LANG, LC_*, TZ,
  // TMPDIR, SLURM_* and SBATCH_*, reach the job.
  std::map<std::string, std::string> env;
  // Operator's further sbatch arguments, appended last (e.g. "--constraint=a100").
  std::vector<std::string> extra_args;
};

// What Slurm says about one job. `state` is Slurm's base state name as squeue's %T prints it
// ("PENDING", "RUNNING", "COMPLETING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
// "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SUSPENDED", ...).
struct JobInfo {
  std::string job_id;
  std::string state;
  std::string reason;     // "Resources", "Priority", "None", "NonZeroExitCode", ...
  std::string node_list;  // Slurm's hostlist expression ("kn[1-2]"); empty while pending
  // From `scontrol show job` (ExitCode=<code>:<signal>) only; -1/0 when unknown.
  int exit_code = -1;
  int term_signal = 0;
};

// Whether `state` is one a job never leaves (it has ended).
bool IsTerminalState(std::string_view state);

class SlurmClient {
 public:
  virtual ~SlurmClient() = default;

  // Submits the job; returns Slurm's job id ("812"). Errors carry the command's own words
  // ("sbatch: error: invalid partition specified: gpu"): InvalidArgument when Slurm refused the
  // job (bad partition, QoS, account, shape), Unavailable when the controller could not be
  // reached or the command could not run.
  virtual Result<std::string> Submit(const SubmitRequest& request) = 0;

  // The jobs among `job_ids` that Slurm still knows, by id; a job Slurm has forgotten (purged
  // after MinJobAge) is absent from the map, not an error. One query for all of them (one squeue,
  // then `scontrol show job` only for ended jobs, whose exit codes squeue does not give).
  // Unavailable when the controller cannot be reached.
  virtual Result<std::map<std::string, JobInfo>> Query(const std::vector<std::string>& job_ids) = 0;

  // scancel: the whole job, or with `signal` != 0 only that signal to its steps and batch shell
  // (scancel --signal --full). OK when the job has already ended or is unknown (nothing to
  // cancel); Unavailable when the controller cannot be reached.
  virtual Status Cancel(const std::string& job_id, int signal = 0) = 0;
};

struct CliSlurmClientOptions {
  // Where the tools are: "" finds sbatch, squeue, scontrol and scancel on PATH; else a directory
  // holding them (tests point it at stand-ins).
  std::string bin_dir;
  // Longest one command may run before it is killed and the call answers Unavailable. A
  // controller that is down makes every command wait its MessageTimeout (10 s by default) first.
  std::chrono::milliseconds command_timeout = std::chrono::seconds(60);
};

// The real cluster, through its command-line tools (fork/exec; one process per call).
std::unique_ptr<SlurmClient> NewCliSlurmClient(CliSlurmClientOptions options);

// Parsers, pure functions tested on sample output.
// squeue -h -o "%i|%T|%r|%N" lines -> JobInfo by id (exit code unknown).
std::map<std::string, JobInfo> ParseSqueue(std::string_view text);
// `scontrol show job -o <id>` (one line of Key=Value pairs; values may hold spaces) -> JobInfo.
// NotFound for "slurm_load_jobs error: Invalid job id specified" / empty output.
Result<JobInfo> ParseScontrolJob(std::string_view text);
// sbatch --parsable prints "<id>" or "<id>;<cluster>"; InvalidArgument otherwise.
Result<std::string> ParseSbatchParsable(std::string_view text);
// The sbatch argument list for `request` (without the program name).
std::vector<std::string> SbatchArguments(const SubmitRequest& request);

}  // namespace kiln::runtime::slurm
