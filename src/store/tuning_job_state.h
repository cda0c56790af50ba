#pragma once
// The typed state of a hyperparameter tuning job: its status (the `status` column of
// tuning_jobs, migration 11) and the state document (the `state_json` column) that the tuning
// controller rewrites on every reconcile.
//
// The document (member names are the fields' names; times in millis since the epoch):
//
//   trials[]           {seq, name, definition_name, tuned {hp: value}, creation_millis, status,
//                      failure_reason?, objective?, curve [..], bracket, judged_rung,
//                      early_stopped?, start_millis?, end_millis?}, in seq order
//   failure_reason?, stop_reason?, not_improving, convergence_detected_millis?, stop_requested,
//   end_millis?, runtime_ms_consumed
//
// Every member is written (optionals only when set), so a document is self-describing. Doubles
// that JSON cannot hold (NaN, ±infinity: a training script may print them as a metric) are
// written as the strings "NaN", "Infinity", "-Infinity" and read back as those values, so such a
// value never makes the row unreadable. A trial's `status` must be a TrainingJobStatus word
// (store/training_job_state.h). Members this version does not know are kept (`extra`, in the
// document and in each trial) and written back, so a newer server's document survives a round
// trip through an older one, as training_job_state.h does.
//
// Who writes what: the API creates a job with the default state (no trials) and records a stop
// *request* (stop_requested = true, status Stopping); everything else is the controller's.
//
// Thread-safety: plain values.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::store {

// HyperParameterTuningJobStatus as SageMaker names it (the column holds ToString's word).
enum class TuningJobStatus { kInProgress, kCompleted, kFailed, kStopping, kStopped, kDeleting, kDeleteFailed };

// "InProgress", "Completed", "Failed", "Stopping", "Stopped", "Deleting", "DeleteFailed".
std::string_view ToString(TuningJobStatus status);
// The inverse of ToString (case-sensitive, as written); InvalidArgument naming the word otherwise.
Result<TuningJobStatus> ParseTuningJobStatus(std::string_view text);
// Completed, Failed, Stopped and DeleteFailed: nothing runs any more (DeleteHyperParameterTuningJob
// accepts these).
bool IsTerminal(TuningJobStatus status);
// InProgress and Stopping: the controller still owns the job (TuningJobRepository::ListActive).
inline bool IsActive(TuningJobStatus status) {
  return status == TuningJobStatus::kInProgress || status == TuningJobStatus::kStopping;
}

// One launched (or failed-to-launch) training job of a tuning job.
struct TuningTrial {
  int seq = 0;                                // 1-based, the NNN of its name
  std::string name;                           // training job name ("" if it could not be created)
  std::string definition_name;                // TrainingJobDefinition.DefinitionName ("" for the single form)
  std::map<std::string, std::string> tuned;   // TunedHyperParameters (chosen values only)
  int64_t creation_millis = 0;                //
  std::string status = "InProgress";          // last seen TrainingJobStatus ("Failed" if never created)
  std::optional<std::string> failure_reason;  //
  std::optional<double> objective;            // final value as the metric reports it (NOT negated)
  std::vector<double> curve;                  // intermediate objective values (as reported; the controller caps it)
  int bracket = -1;                           // Hyperband bracket, -1 otherwise
  int judged_rung = 0;                        // Hyperband: highest rung already judged (passed)
  std::optional<std::string> early_stopped;   // why Kiln stopped it (median rule, Hyperband, criteria, MaxRuntime)
  std::optional<int64_t> start_millis, end_millis;  // TrainingStartTime / TrainingEndTime seen
  nlohmann::json extra = nlohmann::json::object();  // members this version does not know

  bool operator==(const TuningTrial&) const = default;
};

struct TuningJobState {
  std::vector<TuningTrial> trials;  // in seq order
  std::optional<std::string> failure_reason;
  std::optional<std::string> stop_reason;  // completion criterion / MaxRuntime that ended it
  int not_improving = 0;                   // TuningJobCompletionDetails.NumberOfTrainingJobsObjectiveNotImproving
  std::optional<int64_t> convergence_detected_millis;
  bool stop_requested = false;  // StopHyperParameterTuningJob was called
  std::optional<int64_t> end_millis;
  int64_t runtime_ms_consumed = 0;                  // ConsumedResources.RuntimeInSeconds basis
  nlohmann::json extra = nlohmann::json::object();  // members this version does not know

  bool operator==(const TuningJobState&) const = default;
};

// The document of `state` (see above).
nlohmann::json ToJson(const TuningJobState& state);
// Reads a state document. InvalidArgument (naming the member, e.g. "trials[2].curve[0]") when a
// known member has the wrong type, an integer is out of range or a trial's status is not a
// TrainingJobStatus word; unknown members go to `extra`. A null document is the default state.
Result<TuningJobState> TuningJobStateFromJson(const nlohmann::json& document);

}  // namespace kiln::store
