#pragma once
// The typed state of a training job: its statuses (the typed columns of training_jobs) and the
// state document (the `state_json` column) that the training controller rewrites with every step.
//
// The JSON mapping reads exactly what Kiln has always written (same member names, same status
// strings), so existing data directories keep working, and writes the same document back:
//
//   phase              "queued" | "staging" | "running" | "finishing" | "done"   (absent: queued)
//   transitions        [{Status, StartTime, StatusMessage, EndTime?}] (millis), Describe's
//                      SecondaryStatusTransitions
//   status_message     message of the current secondary status
//   hosts[]            {host, shard_index, instance_id, root, log_stream, started_millis}
//   allocations[]      the scheduler's grant (control/scheduler.h Allocation JSON; opaque here)
//   credentials        the instance credentials issued to the job (control/instance_credentials.h
//                      CredentialToJson; opaque here)
//   stop_requested     "user" | "max_runtime" | "max_wait_time" when a stop is under way (absent: none)
//   training_start_millis, training_end_millis, last_stream_epoch, retries, last_failure,
//   failure_reason, final_metrics {name: {value, timestamp_millis}}, model_artifacts,
//   output_artifacts
//   managed spot: interruptions, billable_millis (absent: 0), interrupt_requested,
//   resume_after_millis, attempt_start_millis
//
// Members this version does not know are kept in TrainingJobState::extra and written back, so a
// newer server's document survives a round trip through an older one. Optional members are
// written only when set (empty hosts / final_metrics and zero counters are not written), as the
// controller always did.
//
// Who writes what: only the training controller changes `phase`; the API creates a job with the
// defaults (phase queued) and records a stop *request* (stop_requested = kUser), never a phase.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::store {

// Where the controller is with a job (the controller's own progress, not shown to users).
enum class TrainingPhase { kQueued, kStaging, kRunning, kFinishing, kDone };

// TrainingJobStatus as SageMaker names it.
enum class TrainingJobStatus { kInProgress, kCompleted, kFailed, kStopping, kStopped };

// SecondaryStatus: every value AWS defines (the SageMaker API reference), of which Kiln writes
// Starting, Pending, Downloading, Training, Uploading, Stopping, Stopped, MaxRuntimeExceeded,
// Completed, Failed and Restarting.
enum class SecondaryStatus {
  kStarting,
  kPending,
  kLaunchingMLInstances,
  kPreparingTrainingStack,
  kDownloading,
  kDownloadingTrainingImage,
  kTraining,
  kUploading,
  kStopping,
  kStopped,
  kMaxRuntimeExceeded,
  kMaxWaitTimeExceeded,
  kCompleted,
  kFailed,
  kInterrupted,
  kUpdating,
  kRestarting,
};

// Why a job is being stopped: a request, not a phase (the controller carries it out).
enum class StopRequest { kNone, kUser, kMaxRuntime, kMaxWaitTime };

// The wire/column strings ("queued", "InProgress", "MaxRuntimeExceeded", "user").
std::string_view ToString(TrainingPhase phase);
std::string_view ToString(TrainingJobStatus status);
std::string_view ToString(SecondaryStatus status);
std::string_view ToString(StopRequest request);  // "" for kNone
// The inverse of ToString; nullopt for any other string (case-sensitive, as written).
std::optional<TrainingPhase> ParseTrainingPhase(std::string_view text);
std::optional<TrainingJobStatus> ParseTrainingJobStatus(std::string_view text);
std::optional<SecondaryStatus> ParseSecondaryStatus(std::string_view text);
std::optional<StopRequest> ParseStopRequest(std::string_view text);  // "" → kNone

// InProgress and Stopping: the controller still owns the job.
inline bool IsActive(TrainingJobStatus status) {
  return status == TrainingJobStatus::kInProgress || status == TrainingJobStatus::kStopping;
}

// One SecondaryStatusTransitions entry (times in millis since the epoch).
struct SecondaryStatusTransition {
  SecondaryStatus status = SecondaryStatus::kStarting;
  int64_t start_millis = 0;
  std::optional<int64_t> end_millis;  // set when the next status began (or the job ended)
  std::string message;

  bool operator==(const SecondaryStatusTransition&) const = default;
};

// One launched host of a job, as recorded for adoption after a restart.
struct TrainingHostState {
  std::string host;  // algo-<n>
  int shard_index = 0;
  std::string instance_id;
  std::string root;  // <work_dir>/<job>/algo-<n>
  std::string log_stream;
  int64_t started_millis = 0;

  bool operator==(const TrainingHostState&) const = default;
};

// The last value of a metric the job's log lines produced (FinalMetricDataList).
struct FinalMetric {
  double value = 0;
  int64_t timestamp_millis = 0;

  bool operator==(const FinalMetric&) const = default;
};

// A warm pool (ResourceConfig.KeepAlivePeriodInSeconds; training-contract.md §19): the hosts a
// finished job keeps for a matching next job. The job that kept them shows Available, then Reused
// (ReusedByJob) or Terminated; the job that took a pool shows InUse until it ends (and keeps a pool
// of its own when it asks for one).
enum class WarmPoolStatus { kNone, kAvailable, kInUse, kReused, kTerminated };
std::string_view ToString(WarmPoolStatus status);                          // "" for kNone, else AWS's word
std::optional<WarmPoolStatus> ParseWarmPoolStatus(std::string_view text);  // "" → kNone

struct WarmPoolState {
  WarmPoolStatus status = WarmPoolStatus::kNone;
  int64_t available_since_millis = 0;  // Available: when the job's hosts were kept
  int64_t expires_millis = 0;          // Available: when it is terminated unless reused
  int64_t retained_millis = 0;         // ResourceRetainedBillableTimeInSeconds once Reused/Terminated
  std::string reused_by_job;           // Reused: the job that took it
  std::string reused_from_job;         // InUse: the job whose pool this one took
  // When the first job of a chain of reuses kept its hosts: a pool is handed on for at most
  // kMaxWarmPoolChain (control/warm_pools.h) from then.
  int64_t chain_start_millis = 0;
  std::string directory;       // Available: the kept host directories (<work_dir>/.warm-pools/<job>)
  nlohmann::json allocations;  // Available: the kept grant (the scheduler's Allocation array)

  bool operator==(const WarmPoolState&) const = default;
};

struct TrainingJobState {
  TrainingPhase phase = TrainingPhase::kQueued;
  std::vector<SecondaryStatusTransition> transitions;
  std::string status_message;
  std::vector<TrainingHostState> hosts;
  nlohmann::json allocations;  // null, or the scheduler's Allocation array (control/scheduler.h)
  nlohmann::json credentials;  // null, or CredentialToJson (control/instance_credentials.h)
  StopRequest stop_requested = StopRequest::kNone;
  std::optional<int64_t> training_start_millis;
  std::optional<int64_t> training_end_millis;
  int64_t last_stream_epoch = 0;              // log stream suffix of the last launch (a retry takes a later one)
  int retries = 0;                            // RetryStrategy attempts used
  std::optional<std::string> last_failure;    // why the last attempt was retried
  std::optional<std::string> failure_reason;  // FailureReason of a Failed job
  std::map<std::string, FinalMetric> final_metrics;
  std::optional<std::string> model_artifacts;   // S3 URI of model.tar.gz
  std::optional<std::string> output_artifacts;  // S3 URI of output.tar.gz
  // Managed spot (EnableManagedSpotTraining).
  int interruptions = 0;        // interruptions so far (the attempt index of spot schedules)
  int64_t billable_millis = 0;  // running time of ended attempts (the last included once the job ends)
  std::optional<std::string> interrupt_requested;  // an interruption is under way, and why
  std::optional<int64_t> resume_after_millis;      // an interrupted job is not queued before this
  std::optional<int64_t> attempt_start_millis;     // this attempt's start (training_start_millis stays the first)
  WarmPoolState warm_pool;
  nlohmann::json extra = nlohmann::json::object();  // members this version does not know

  bool operator==(const TrainingJobState&) const = default;
};

// Reads a state document. InvalidArgument (naming the member) when a known member has the wrong
// type or an unknown enum string; unknown members go to `extra`. A null document is the default
// state.
Result<TrainingJobState> TrainingJobStateFromJson(const nlohmann::json& document);
nlohmann::json TrainingJobStateToJson(const TrainingJobState& state);

}  // namespace kiln::store
