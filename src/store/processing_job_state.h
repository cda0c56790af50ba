#pragma once
// The typed state of a processing job: its status (the `status` column of processing_jobs) and the
// state document (the `state_json` column) that the processing controller rewrites as the job runs.
//
// The document (member names are the fields' names; times in millis since the epoch):
//
//   start_millis?      ProcessingStartTime: when the containers started
//   failure_reason     FailureReason ("" / absent: none)
//   exit_message       ExitMessage ("" / absent: none)
//   stop_reason        "" | "MaxRuntimeExceeded" | "StopRequested" (Kiln bookkeeping)
//   hosts[]            {runtime_id, log_stream, log_offset, exit_code?, oom_killed}, index = host
//                      number - 1
//   allocation_ids[]   the scheduler's grant (opaque here)
//   ...                any other member: the controller's own bookkeeping, kept in `extra`
//
// Every typed member is written (optionals only when set), so a document is self-describing;
// reading treats an absent or null member as its default. Members this
// version does not know are kept (`extra`) and written back, so a newer server's document survives
// a round trip through an older one (as training_job_state.h does).
//
// Who writes what: the API creates a job with the default state and records a stop *request*
// (status Stopping, stop_reason "StopRequested"); everything else is the controller's.
//
// Thread-safety: plain values.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::store {

// ProcessingJobStatus as SageMaker names it (the column holds ProcessingJobStatusName's word).
enum class ProcessingJobStatus { kInProgress, kCompleted, kFailed, kStopping, kStopped };

// "InProgress", "Completed", "Failed", "Stopping", "Stopped".
std::string_view ProcessingJobStatusName(ProcessingJobStatus status);
// The inverse of ProcessingJobStatusName (case-sensitive, as written); nullopt for any other word.
std::optional<ProcessingJobStatus> ParseProcessingJobStatus(std::string_view text);
// Completed, Failed and Stopped: nothing runs any more (DeleteProcessingJob accepts these).
bool IsTerminal(ProcessingJobStatus status);
// InProgress and Stopping: the controller still owns the job (ProcessingJobRepository::ListActive).
inline bool IsActive(ProcessingJobStatus status) {
  return status == ProcessingJobStatus::kInProgress || status == ProcessingJobStatus::kStopping;
}

// The stop_reason words.
inline constexpr std::string_view kProcessingStopRequested = "StopRequested";
inline constexpr std::string_view kProcessingMaxRuntimeExceeded = "MaxRuntimeExceeded";

// One host of a job (index = host number - 1).
struct ProcessingHostState {
  std::string runtime_id;        // the runtime instance ("" until launched)
  std::string log_stream;        // "<job>/algo-<n>-<epoch seconds>"
  int64_t log_offset = 0;        // the log pump's persisted offset
  std::optional<int> exit_code;  // once exited
  bool oom_killed = false;

  bool operator==(const ProcessingHostState&) const = default;
};

// The observed state (state_json): written by the controller, read by Describe.
struct ProcessingJobState {
  std::optional<int64_t> start_millis;  // ProcessingStartTime: when the containers started
  std::string failure_reason;           // FailureReason
  std::string exit_message;             // ExitMessage
  std::string stop_reason;              // "" | "MaxRuntimeExceeded" | "StopRequested" (Kiln bookkeeping)
  std::vector<ProcessingHostState> hosts;
  std::vector<std::string> allocation_ids;          // scheduler grant bookkeeping (opaque to the API)
  nlohmann::json extra = nlohmann::json::object();  // the controller's own bookkeeping, kept verbatim

  bool operator==(const ProcessingJobState&) const = default;
};

// The document of `state` (see above). Members of `extra` never override the typed ones.
nlohmann::json ProcessingJobStateToJson(const ProcessingJobState& state);
// Reads a state document. InvalidArgument (naming the member, e.g. "hosts[1].exit_code") when a
// known member has the wrong type or an integer is out of range; unknown members go to `extra`.
// A null document is the default state.
Result<ProcessingJobState> ProcessingJobStateFromJson(const nlohmann::json& document);

}  // namespace kiln::store
