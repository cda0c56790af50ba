#pragma once
// TuningJobRepository: the tuning_jobs table (migration 11), the hyperparameter tuning jobs
// (api/tuning_jobs, control/tuning_controller).
//
// The same contracts as TrainingJobRepository (store/training_job_repository.h): a row keeps the
// validated CreateHyperParameterTuningJob request verbatim (`request`), the typed columns that
// lists filter and sort on, and the observed state as one JSON document (`state`,
// store/tuning_job_state.h: the trials, completion bookkeeping, the stop request) that the
// controller rewrites on every reconcile. A row whose status word or documents cannot be read is
// an Internal error ("corrupt row") on every read. Names are unique case-insensitively;
// Get/Mutate/Delete find a job by its name in any case. Tags live in resource_tags
// (TagRepository), keyed by the tuning job's ARN; Delete removes them with the row.
//
// Thread-safety: all methods may be called from any thread (the Database serialises them).
// Mutate() is the only read-modify-write: it runs in one transaction, so the API (a stop
// request) and the controller (progress) never overwrite each other's changes.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "store/database.h"
#include "store/list_query.h"
#include "store/tuning_job_state.h"

namespace kiln::store {

struct TuningJobRecord {
  int64_t seq = 0;  // creation order (assigned by Insert)
  std::string name;
  std::string arn;
  nlohmann::json request;  // the validated CreateHyperParameterTuningJob input, as received
  TuningJobStatus status = TuningJobStatus::kInProgress;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> end_millis;  // HyperParameterTuningEndTime
  TuningJobState state;               // the state_json column, typed (store/tuning_job_state.h)
  int64_t version = 0;                // incremented by every write
};

// What a ListHyperParameterTuningJobs page reads from the typed columns alone (no JSON parsed).
// The summary's Strategy, counters and ResourceLimits need the request and the trials: read the
// page with ListPageRecords, or Get each row.
struct TuningJobSummaryRow {
  std::string name;
  std::string arn;
  std::string status;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> end_millis;
};

class TuningJobRepository {
 public:
  explicit TuningJobRepository(Database* database) : database_(database) {}

  // Inserts a new job; fills record.seq and version. AlreadyExists (with the existing job's ARN as
  // message) when the name is taken in any case.
  Status Insert(TuningJobRecord& record);
  // NotFound when there is no such job.
  Result<TuningJobRecord> Get(const std::string& name);
  // Reads the job, lets `mutate` change it, and writes it back in one transaction (version + 1):
  // status, last-modified and end times, state and request. An error from `mutate` aborts without
  // writing and is returned. NotFound when there is no such job. Returns the record as written.
  Result<TuningJobRecord> Mutate(const std::string& name, const std::function<Status(TuningJobRecord&)>& mutate);
  // One page of jobs in (sort key, name) order from indexed columns (store/list_query.h):
  // NameContains, StatusEquals, CreationTime/LastModifiedTime After/Before; SortBy Name, Status or
  // CreationTime, ascending or descending; `after` is the last row of the previous page.
  Result<std::vector<TuningJobSummaryRow>> ListPage(const ListPageQuery& query);
  // The same page as ListPage, as whole records (the JSON of `query.limit` rows is parsed), for
  // summaries that need the request and the trials. Corrupt rows are Internal, as Get.
  Result<std::vector<TuningJobRecord>> ListPageRecords(const ListPageQuery& query);
  // Jobs whose status is InProgress or Stopping, in creation (seq) order: what the controller
  // reconciles, also after a restart.
  Result<std::vector<TuningJobRecord>> ListActive();
  // Removes the job and its tags (resource_tags rows of its ARN) in one transaction. NotFound
  // when absent.
  Status Delete(const std::string& name);

 private:
  Database* database_;
};

}  // namespace kiln::store
