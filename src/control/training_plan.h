#pragma once
// The pure decisions of the training controller: what a job's request and state say to do now,
// with no I/O, no threads and no clock of its own (the caller passes `now`). The controller and
// the per-job run (training_job_run.h) execute what these return; the tests are tables of cases.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "control/scheduler.h"
#include "store/training_job_state.h"

namespace kiln::control::training {

// Secondary status messages (training-contract.md §14).
inline constexpr char kMsgPreparing[] = "Preparing the instances for training";
inline constexpr char kMsgDownloading[] = "Downloading input data";
// Container images (runtime.h PrepareImage): "<this> <image URI>", then ": <the pull's progress>".
inline constexpr char kMsgDownloadingImage[] = "Downloading the training image";
inline constexpr char kMsgTraining[] = "Training image download completed. Training in progress.";
inline constexpr char kMsgUploading[] = "Uploading generated training model";
inline constexpr char kMsgCompleted[] = "Training job completed";
inline constexpr char kMsgStopping[] = "Stopping the training job";
inline constexpr char kMsgStopped[] = "Training job stopped";
inline constexpr char kMsgMaxRuntime[] = "Job stopped because max runtime was exceeded";
inline constexpr char kMsgMaxPending[] = "Job stopped because max pending time was exceeded";
inline constexpr char kMsgWaiting[] = "Waiting for compute capacity";
inline constexpr char kMsgMaxWait[] = "Job stopped because max wait time was exceeded";
inline constexpr char kMsgInterrupted[] = "Training job interrupted, waiting for capacity";

// "; <what the scheduler gave instead of the full shape>" (the first note), or "".
std::string AllocationNote(const std::vector<Allocation>& allocations);

// A hyperparameter as the SDK sends it (json.dumps of the value) decoded to plain text:
// "\"x\"" → x, "4" → 4 (the raw text when it is not a JSON string). nullopt when absent or not
// a string.
std::optional<std::string> DecodedHyperparameter(const nlohmann::json& request, const std::string& key);

// The MPI launch's processes per host (training-contract.md §12.2).
inline constexpr char kMpiProcessesPerHost[] = "sagemaker_mpi_num_of_processes_per_host";
// sagemaker_mpi_num_of_processes_per_host as a positive integer (at most 1,000,000); nullopt when
// absent or not one (CreateTrainingJob refuses the latter).
std::optional<int64_t> MpiProcessesPerHost(const nlohmann::json& request);
// "; <warning>" when the MPI launch asks for more processes per host than a host's `gpus` (> 0):
// accepted (spec §12.2, the SDK validates nothing) but shown in the Training status message.
std::string ProcessesPerHostNote(const nlohmann::json& request, size_t gpus);

// `seconds` as milliseconds, saturating instead of overflowing.
int64_t SecondsToMillisSaturating(int64_t seconds);
// `at + millis` without overflow (a deadline far in the future stays in the far future).
int64_t AddSaturating(int64_t at, int64_t millis);

// A seconds member of the request's StoppingCondition: integers as sent, fractional numbers
// truncated (as the validator and AWS do), `fallback` when absent or not a number. (Rows written
// before the validator checked it, or by other paths, may hold anything.)
int64_t StoppingSeconds(const nlohmann::json& request, const char* member, int64_t fallback);
// StoppingCondition.MaxRuntimeInSeconds, 86400 when absent.
int64_t MaxRuntimeSeconds(const nlohmann::json& request);

// Why a run is stopping its hosts: the job's stop request, a stopping condition, a managed-spot
// interruption (the job resumes later), or a host that failed on its own.
enum class StopReason { kNone, kUser, kMaxRuntime, kMaxWaitTime, kInterruption, kPeerFailure };

// Managed spot (training-contract.md §9): whether the request runs on preemptible capacity.
bool IsManagedSpot(const nlohmann::json& request);
// The MaxRuntimeInSeconds deadline of an attempt that started at `attempt_start`, when earlier
// attempts already ran `billable_before` ms (spot: the limit counts running time of all attempts).
int64_t AttemptDeadline(const nlohmann::json& request, int64_t attempt_start, int64_t billable_before);
// Creation + MaxWaitTimeInSeconds for a managed-spot job that has one; nullopt otherwise.
std::optional<int64_t> MaxWaitDeadline(const nlohmann::json& request, int64_t creation_millis);
// Whether the operator's schedule (SpotOptions::interrupt_after_seconds) interrupts attempt
// `attempt` (0-based) after it trained `trained_millis`.
bool ScheduledInterruptionDue(const std::vector<double>& interrupt_after_seconds, int attempt, int64_t trained_millis);

// ---- The monitor's decision on every tick (training_job_run.cc Monitor) ----

// One host as the runtime showed it on this tick.
struct ObservedHost {
  bool exited = false;
  int exit_code = -1;  // when exited: the exit code (-1: lost, no exit recorded)
};

struct MonitorInput {
  // A stop is requested (the API's, or the row said so when the run began) and why: kUser or
  // kMaxRuntime (kNone with `stop_requested`: the user's).
  bool stop_requested = false;
  StopReason requested_reason = StopReason::kNone;
  bool stop_sent = false;  // the hosts were already told to stop (on an earlier tick)
  // A managed-spot interruption was asked for (kiln interrupt, the operator's schedule or
  // probability, an on-demand job that needs the node).
  bool interrupt_requested = false;
  std::vector<ObservedHost> hosts;
  int64_t deadline_millis = 0;               // training start + MaxRuntimeInSeconds (saturated)
  int64_t wait_deadline_millis = INT64_MAX;  // managed spot: creation + MaxWaitTimeInSeconds
};

struct MonitorActions {
  // Every host has exited: leave the monitor and finish the job (PlanOutcome decides how).
  bool finish = false;
  // Stop the hosts still running, for this reason (runtime Stop with the stop grace: SIGTERM,
  // then SIGKILL when the grace ends — the runtime's shim escalates, not the controller).
  StopReason stop = StopReason::kNone;
  // Before stopping: write the row Stopping with stop_requested = max_runtime.
  bool record_max_runtime = false;
  // Before stopping: write the row Stopping with stop_requested = max_wait_time.
  bool record_max_wait = false;
};

// First match wins: all hosts exited → finish; a stop already sent → nothing; a requested stop;
// MaxRuntimeInSeconds or MaxWaitTimeInSeconds passed (the earlier deadline names it); a host
// that exited non-zero (its peers are stopped, training-contract.md §11); an interruption. An
// empty host list is "all exited".
MonitorActions PlanMonitor(const MonitorInput& input, int64_t now_millis);

// ---- How a job that ran (or was stopped while staging) ends ----

struct OutcomeInput {
  store::StopRequest row_request = store::StopRequest::kNone;  // the row's stop_requested
  StopReason run_reason = StopReason::kNone;                   // why the monitor stopped the hosts
  bool stop_requested = false;                                 // the run was asked to stop
  bool any_failed = false;                                     // a host exited non-zero (or was lost)
  std::string host_failure;                                    // FailureReason from the hosts
  std::string upload_error;                                    // "" when the uploads succeeded
};

struct Outcome {
  store::TrainingJobStatus status = store::TrainingJobStatus::kCompleted;
  store::SecondaryStatus secondary = store::SecondaryStatus::kCompleted;
  std::string message;                        // the last transition's StatusMessage
  std::optional<std::string> failure_reason;  // set for Failed
};

// The row's stop request wins (a user's stop is Stopped even if a host failed meanwhile), then
// the run's: user → Stopped; max runtime → Stopped / MaxRuntimeExceeded; max wait → Stopped /
// MaxWaitTimeExceeded; otherwise a failed host
// (its reason) or a failed upload → Failed; otherwise Completed.
Outcome PlanOutcome(const OutcomeInput& input);

// ---- FailureReason of a job whose host failed ----

inline constexpr size_t kFailureReasonMax = 1024;

// `s` cut to at most `max` bytes, never inside a UTF-8 sequence.
std::string TruncateUtf8(std::string s, size_t max);

// How one host ended, as the run gathered it.
struct HostExit {
  std::string host;   // algo-<n>
  int exit_code = 0;  // -1: lost (no exit recorded)
  int term_signal = 0;
  bool oom_killed = false;       // the runtime says the kernel's OOM killer ended it
  std::string lost_reason;       // lost: why, when the runtime knows ("" otherwise)
  bool stopped_by_kiln = false;  // it ended after Kiln stopped it (a stop, MaxRuntime, a peer's failure)
  std::string failure_file;      // /opt/ml/output/failure, "" when none (training-contract.md §8)
  std::string last_stderr_line;  // the last line it wrote to stderr
};

// What a failure is (training-contract.md §10): the kind decides RetryStrategy and is never read
// back from the text, which for AlgorithmError may be whatever the user's failure file says.
enum class FailureKind {
  kNone,
  kClientError,          // the user's request or data ("ClientError: ...")
  kInternalServerError,  // Kiln's own fault ("InternalServerError: ..."): retried under RetryStrategy
  kAlgorithmError,       // the training program failed (its failure file, or "AlgorithmError: ...")
  kOutOfMemory,          // the program was SIGKILLed ("OutOfMemory: ...")
};

// A job's failure: its kind and its FailureReason as Describe shows it (prefix included).
struct JobFailure {
  FailureKind kind = FailureKind::kNone;
  std::string reason;
  bool failed() const { return kind != FailureKind::kNone; }
};

// A staging, launch or upload error as a JobFailure: a Status made by agent::ClientError or
// agent::InternalServerError (its ErrorReason) keeps its message; any other error is Kiln's own,
// "InternalServerError: <context><message>". Cut to kFailureReasonMax.
JobFailure FailureFromStatus(const Status& status, const std::string& context = "");

// A failed Runtime::PrepareImage of the training image as the Status Stage fails with (its
// message, the runtime's, names the image and what was tried): the user's image or registry
// (NotFound, PermissionDenied, Unauthenticated, InvalidArgument, FailedPrecondition, OutOfRange,
// Unimplemented) → "ClientError: <message>"; the engine unreachable (Unavailable) or any other
// failure → "InternalServerError: <message>", which RetryStrategy retries. Aborted (the run was
// stopped meanwhile) and OK are returned unchanged.
Status ImagePreparationError(const Status& status);

// The job's failure, kind kNone when no host failed. Hosts that failed on their own come before
// the ones Kiln stopped (when algo-2 crashes Kiln stops algo-1, whose SIGTERM exit is a
// consequence); within each group, host order. The first failed host's failure file wins
// (AlgorithmError, its text verbatim); otherwise the first failed host says: lost →
// InternalServerError (with the runtime's lost_reason when it gave one), oom_killed → OutOfMemory
// ("killed by the kernel's OOM killer"), SIGKILL / 137 (the process runtime cannot tell who sent
// it) → OutOfMemory, else AlgorithmError with its last stderr line
// and exit code (128 + signal when signalled). A job of several hosts names the failed host:
// " (host algo-2)" ends the AlgorithmError texts (after the failure file's text, trailing
// whitespace dropped); the lost and OutOfMemory texts always name it. At most kFailureReasonMax.
JobFailure FailureReason(const std::vector<HostExit>& hosts);

// RetryStrategy (training-contract.md §10): a failure for Kiln's own reasons
// (kInternalServerError) of an InProgress job is retried while attempts remain.
bool RetryAllowed(FailureKind kind, store::TrainingJobStatus status, int retries, int max_attempts);

}  // namespace kiln::control::training
