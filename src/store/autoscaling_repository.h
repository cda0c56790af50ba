#pragma once
// AutoscalingRepository: Application Auto Scaling's objects (migration 13, spec
// control-plane-api.md §12, serving-contract.md §10) — scalable targets, scaling policies (with
// their alarms), scheduled actions, scaling activities and CloudWatch metric alarms, all in table
// autoscaling_objects.
//
// A row is keyed by (kind, service namespace, resource id, scalable dimension, name); `name` is
// empty for a scalable target, the policy or scheduled action name, or the activity id. `doc` is
// the object as the API describes it (less CreationTime, which is `creation_millis`); `state` is
// the scaler's bookkeeping (alarm states, cooldown times, the last run of a scheduled action),
// never shown to clients. `seq` grows with every insert: listings come in seq order and page on it.
//
// Thread-safe (the Database serialises access). The Database must outlive the repository.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "store/database.h"

namespace kiln::store {

// kAlarm: a CloudWatch metric alarm (PutMetricAlarm; namespace "cloudwatch", resource and
// dimension empty, name = AlarmName) whose actions may name step-scaling policies.
enum class AutoscalingKind { kTarget, kPolicy, kScheduledAction, kActivity, kAlarm };

struct AutoscalingRecord {
  int64_t seq = 0;  // set by the store
  AutoscalingKind kind = AutoscalingKind::kTarget;
  std::string service_namespace;
  std::string resource_id;
  std::string scalable_dimension;
  std::string name;
  int64_t creation_millis = 0;
  nlohmann::json doc = nlohmann::json::object();
  nlohmann::json state = nlohmann::json::object();
};

struct AutoscalingQuery {
  AutoscalingKind kind = AutoscalingKind::kTarget;
  std::string service_namespace;       // required
  std::set<std::string> resource_ids;  // empty: any
  std::string scalable_dimension;      // empty: any
  std::set<std::string> names;         // empty: any
  bool descending = false;             // newest first (activities)
  std::optional<int64_t> after_seq;    // strictly after this seq in the listing order
  size_t limit = 0;                    // 0: no limit
};

class AutoscalingRepository {
 public:
  explicit AutoscalingRepository(Database* database) : database_(database) {}

  // Inserts the row, or replaces the doc and state of the row with its key (keeping its seq and
  // creation time). Returns the stored row.
  Result<AutoscalingRecord> Put(const AutoscalingRecord& record);
  // Inserts a new row; AlreadyExists when the key is taken.
  Status Insert(const AutoscalingRecord& record);
  // NotFound when there is no such row.
  Result<AutoscalingRecord> Get(AutoscalingKind kind, const std::string& service_namespace,
                                const std::string& resource_id, const std::string& scalable_dimension,
                                const std::string& name);
  // Replaces the state of a row. NotFound when it is gone.
  Status SetState(const AutoscalingRecord& record, const nlohmann::json& state);
  // Deletes one row. NotFound when there is none.
  Status Delete(AutoscalingKind kind, const std::string& service_namespace, const std::string& resource_id,
                const std::string& scalable_dimension, const std::string& name);
  // Deletes a scalable target with its policies and scheduled actions (activities stay), in one
  // transaction. NotFound when the target does not exist.
  Status DeleteTarget(const std::string& service_namespace, const std::string& resource_id,
                      const std::string& scalable_dimension);
  // Rows matching `query`, in seq order (descending when asked), at most `limit`.
  Result<std::vector<AutoscalingRecord>> List(const AutoscalingQuery& query);
  // Every row of `kind`, in seq order (the scaler's sweep).
  Result<std::vector<AutoscalingRecord>> ListAll(AutoscalingKind kind);
  // Keeps the newest `keep` activities of a resource, deleting older ones.
  Status PruneActivities(const std::string& service_namespace, const std::string& resource_id, int64_t keep);

 private:
  Database* database_;
};

}  // namespace kiln::store
