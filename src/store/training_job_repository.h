#pragma once
// TrainingJobRepository: the training_jobs and resource_tags tables (migration 4).
//
// A row keeps the validated CreateTrainingJob request verbatim (`request`), the typed columns
// that lists filter and sort on, and the observed state as one JSON document (`state`: secondary
// status transitions, failure reason, artifacts, final metrics, instance bookkeeping) that the
// controller rewrites with every step. The repository maps the status columns and the document
// to their types (store/training_job_state.h); a row whose status strings or document cannot be
// read is an Internal error ("corrupt row") on every read. Names are unique
// case-insensitively; Get/Mutate/Delete find a job by its name in any case.
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
#include "store/training_job_state.h"

namespace kiln::store {

struct TrainingJobRecord {
  int64_t seq = 0;  // submission order (assigned by Insert)
  std::string name;
  std::string arn;
  nlohmann::json request;  // the validated CreateTrainingJob input, as received
  TrainingJobStatus status = TrainingJobStatus::kInProgress;
  SecondaryStatus secondary_status = SecondaryStatus::kStarting;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> training_end_millis;
  TrainingJobState state;  // the state_json column, typed (store/training_job_state.h)
  int64_t version = 0;     // incremented by every write
};

// Filters of List: status, case-insensitive name substring, exclusive time bounds.
using TrainingJobListQuery = ListFilter;

// What a ListTrainingJobs summary shows: the typed columns and three members of the warm pool read
// with json_extract (SQLite's JSON1) from the state document.
struct TrainingJobSummaryRow {
  std::string name;
  std::string arn;
  std::string status;
  std::string secondary_status;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  std::optional<int64_t> training_end_millis;
  // The warm pool's members of the state document (empty status: the job has none).
  std::string warm_pool_status;
  int64_t warm_pool_retained_millis = 0;
  std::string warm_pool_reused_by_job;
};

class TrainingJobRepository {
 public:
  explicit TrainingJobRepository(Database* database) : database_(database) {}

  // Inserts a new job; fills record.seq and version. AlreadyExists (with the existing job's ARN as
  // message) when the name is taken in any case.
  Status Insert(TrainingJobRecord& record);
  // NotFound when there is no such job.
  Result<TrainingJobRecord> Get(const std::string& name);
  // Reads the job, lets `mutate` change it, and writes it back in one transaction (version + 1).
  // An error from `mutate` aborts without writing and is returned. Returns the record as written.
  Result<TrainingJobRecord> Mutate(const std::string& name, const std::function<Status(TrainingJobRecord&)>& mutate);
  // Mutate for many jobs in ONE transaction (one commit, one fsync), for controllers that change
  // several jobs at once (the grants of one scheduling pass, the jobs entering Pending together).
  // `mutate` returns true to write the row back (version + 1), false to leave it as it was; names
  // with no job are skipped. A database error rolls every row back and is returned.
  Status MutateEach(const std::vector<std::string>& names, const std::function<bool(TrainingJobRecord&)>& mutate);
  // Every job matching `query`, in submission order (callers sort and page).
  Result<std::vector<TrainingJobRecord>> List(const TrainingJobListQuery& query);
  // One page of jobs in (sort key, name) order from indexed columns (store/list_query.h): the
  // cost is that of `query.limit` rows whatever the number of jobs (NameContains aside, which
  // scans names). Sorting by kStatus, filtering on status and last-modified time are supported.
  Result<std::vector<TrainingJobSummaryRow>> ListPage(const ListPageQuery& query);
  // Jobs whose status is InProgress or Stopping, in submission order.
  Result<std::vector<TrainingJobRecord>> ListActive();
  // Removes the job and its tags. NotFound when absent.
  Status Delete(const std::string& name);

 private:
  Database* database_;
};

struct Tag {
  std::string key;
  std::string value;
};

// Tags of any SageMaker resource, keyed by ARN (case-insensitively, as spec/control-plane-api.md
// §5 asks). Keys keep their insertion order; re-adding a key replaces its value in place.
class TagRepository {
 public:
  explicit TagRepository(Database* database) : database_(database) {}
  Status Add(const std::string& arn, const std::vector<Tag>& tags);
  Result<std::vector<Tag>> List(const std::string& arn);
  Status Remove(const std::string& arn, const std::vector<std::string>& keys);
  Status RemoveAll(const std::string& arn);

 private:
  Database* database_;
};

}  // namespace kiln::store
