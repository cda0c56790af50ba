#pragma once
// TransformJobRepository: the transform_jobs table (migration 14), the batch transform jobs
// (api/transform_jobs, control/transform_controller).
//
// Laid out as ProcessingJobRepository (store/processing_job_repository.h): a row keeps the
// validated CreateTransformJob request verbatim (`request`, Tags removed), the typed columns that
// lists filter and sort on, and the observed state as one JSON document (`state_json`, below)
// that the API creates and the controller rewrites as the job runs. A row whose status word or
// documents cannot be read is an Internal error ("corrupt row") on every read. Names are unique
// case-insensitively; Get/Mutate find a job by its name in any case. Tags live in resource_tags,
// keyed by the job's ARN (the API has no DeleteTransformJob: rows stay).
//
// The state document (times in millis since the epoch; absent members read as their defaults,
// unknown members are kept in `extra` and written back):
//   model            the model's CreateModel request as it was when the job was created (the job
//                    runs that snapshot even if the model is deleted meanwhile)
//   start_millis?    TransformStartTime: when the instances were asked for
//   failure_reason   FailureReason ("" / absent: none)
//   stop_requested   StopTransformJob was called (status Stopping until the controller ends it)
//
// Thread-safety: all methods may be called from any thread (the Database serialises them).
// Mutate() is the only read-modify-write: one transaction, so the API's stop request and the
// controller's progress never overwrite each other.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "store/database.h"
#include "store/list_query.h"

namespace kiln::store {

// TransformJobStatus as SageMaker names it.
enum class TransformJobStatus { kInProgress, kCompleted, kFailed, kStopping, kStopped };

// "InProgress", "Completed", "Failed", "Stopping", "Stopped".
std::string_view TransformJobStatusName(TransformJobStatus status);
// The inverse (case-sensitive); nullopt for any other word.
std::optional<TransformJobStatus> ParseTransformJobStatus(std::string_view text);
// InProgress and Stopping: the controller still owns the job.
inline bool IsActive(TransformJobStatus status) {
  return status == TransformJobStatus::kInProgress || status == TransformJobStatus::kStopping;
}

struct TransformJobState {
  nlohmann::json model = nlohmann::json::object();
  std::optional<int64_t> start_millis;
  std::string failure_reason;
  bool stop_requested = false;
  nlohmann::json extra = nlohmann::json::object();

  bool operator==(const TransformJobState&) const = default;
};

nlohmann::json TransformJobStateToJson(const TransformJobState& state);
// InvalidArgument naming the member when a known member has the wrong type. Null: the default.
Result<TransformJobState> TransformJobStateFromJson(const nlohmann::json& document);

struct TransformJobRecord {
  int64_t seq = 0;  // creation order (assigned by Insert)
  std::string name;
  std::string arn;
  nlohmann::json request;  // the validated CreateTransformJob input (Tags removed)
  TransformJobStatus status = TransformJobStatus::kInProgress;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> end_millis;  // TransformEndTime
  TransformJobState state;
  int64_t version = 0;  // incremented by every write
};

// What a ListTransformJobs page needs (TransformJobSummary).
struct TransformJobSummaryRow {
  std::string name;
  std::string arn;
  std::string status;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> end_millis;
  std::string failure_reason;
};

class TransformJobRepository {
 public:
  explicit TransformJobRepository(Database* database) : database_(database) {}

  // Inserts a new job; fills record.seq and version. AlreadyExists (with the existing job's ARN as
  // message) when the name is taken in any case.
  Status Insert(TransformJobRecord& record);
  // NotFound when there is no such job; Internal for a corrupt row.
  Result<TransformJobRecord> Get(const std::string& name);
  // Reads the job, lets `mutate` change it and writes it back in one transaction (version + 1):
  // status, last-modified and end times, state. An error from `mutate` aborts without writing and
  // is returned. NotFound when there is no such job. Returns the record as written.
  Result<TransformJobRecord> Mutate(const std::string& name, const std::function<Status(TransformJobRecord&)>& mutate);
  // One page in (sort key, name) order (store/list_query.h): NameContains, StatusEquals,
  // CreationTime/LastModifiedTime After/Before; SortBy Name, Status or CreationTime.
  Result<std::vector<TransformJobSummaryRow>> ListPage(const ListPageQuery& query);
  // Jobs whose status is InProgress or Stopping, in creation order (corrupt rows skipped, logged).
  Result<std::vector<TransformJobRecord>> ListActive();

 private:
  Database* database_;
};

}  // namespace kiln::store
