#pragma once
// ProcessingJobRepository: the processing_jobs table (migration 12), the processing jobs
// (api/processing_jobs, control/processing_controller).
//
// The same contracts as TuningJobRepository (store/tuning_job_repository.h): a row keeps the
// validated CreateProcessingJob request verbatim (`request`, Tags removed), the typed columns that
// lists filter and sort on, and the observed state as one JSON document (`state`,
// store/processing_job_state.h) that the controller rewrites as the job runs. A row whose status
// word or documents cannot be read is an Internal error ("corrupt row") on every read. Names are
// unique case-insensitively; Get/Mutate/Delete find a job by its name in any case. Tags live in
// resource_tags (TagRepository), keyed by the job's ARN; Delete removes them with the row.
//
// Thread-safety: all methods may be called from any thread (the Database serialises them).
// Mutate() is the only read-modify-write: it runs in one transaction, so the API (a stop request)
// and the controller (progress) never overwrite each other's changes.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "store/database.h"
#include "store/list_query.h"
#include "store/processing_job_state.h"

namespace kiln::store {

struct ProcessingJobRecord {
  int64_t seq = 0;  // creation order (assigned by Insert)
  std::string name;
  std::string arn;
  nlohmann::json request;  // the validated CreateProcessingJob input (Tags removed)
  ProcessingJobStatus status = ProcessingJobStatus::kInProgress;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> end_millis;  // ProcessingEndTime
  ProcessingJobState state;           // the state_json column, typed (store/processing_job_state.h)
  int64_t version = 0;                // incremented by every write
};

// What a ListProcessingJobs page needs (ProcessingJobSummary): the typed columns plus the state's
// failure reason and exit message (read from the state document; "" when none).
struct ProcessingJobSummaryRow {
  std::string name;
  std::string arn;
  std::string status;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> end_millis;
  std::string failure_reason;
  std::string exit_message;
};

class ProcessingJobRepository {
 public:
  explicit ProcessingJobRepository(Database* database) : database_(database) {}

  // Inserts a new job; fills record.seq and version. AlreadyExists (with the existing job's ARN as
  // message) when the name is taken in any case.
  Status Insert(ProcessingJobRecord& record);
  // NotFound when there is no such job; Internal for a corrupt row.
  Result<ProcessingJobRecord> Get(const std::string& name);
  // Reads the job, lets `mutate` change it, and writes it back in one transaction (version + 1):
  // status, last-modified and end times, state and request. An error from `mutate` aborts without
  // writing and is returned. NotFound when there is no such job. Returns the record as written.
  Result<ProcessingJobRecord> Mutate(const std::string& name,
                                     const std::function<Status(ProcessingJobRecord&)>& mutate);
  // One page of jobs in (sort key, name) order from indexed columns (store/list_query.h):
  // NameContains, StatusEquals, CreationTime/LastModifiedTime After/Before; SortBy Name, Status or
  // CreationTime, ascending or descending; `after` is the last row of the previous page. Internal
  // when a row's state document is unparsable.
  Result<std::vector<ProcessingJobSummaryRow>> ListPage(const ListPageQuery& query);
  // Jobs whose status is InProgress or Stopping, in creation (seq) order: what the controller
  // reconciles, also after a restart. Corrupt rows are skipped (and logged).
  Result<std::vector<ProcessingJobRecord>> ListActive();
  // Removes the job and its tags (resource_tags rows of its ARN) in one transaction. NotFound
  // when absent. A corrupt row can still be deleted.
  Status Delete(const std::string& name);

 private:
  Database* database_;
};

}  // namespace kiln::store
