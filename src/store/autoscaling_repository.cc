#include "store/autoscaling_repository.h"

namespace kiln::store {
namespace {

using nlohmann::json;

constexpr std::string_view kColumns =
    "seq, kind, service_namespace, resource_id, scalable_dimension, name, creation_millis, doc_json, state_json";

const char* KindName(AutoscalingKind kind) {
  switch (kind) {
    case AutoscalingKind::kTarget: return "target";
    case AutoscalingKind::kPolicy: return "policy";
    case AutoscalingKind::kScheduledAction: return "scheduled-action";
    case AutoscalingKind::kActivity: return "activity";
    case AutoscalingKind::kAlarm: return "alarm";
  }
  return "target";
}

AutoscalingKind KindFrom(const std::string& name) {
  if (name == "policy") return AutoscalingKind::kPolicy;
  if (name == "scheduled-action") return AutoscalingKind::kScheduledAction;
  if (name == "activity") return AutoscalingKind::kActivity;
  if (name == "alarm") return AutoscalingKind::kAlarm;
  return AutoscalingKind::kTarget;
}

Result<AutoscalingRecord> ReadRow(const Statement& st) {
  AutoscalingRecord r;
  r.seq = st.ColumnInt64(0);
  r.kind = KindFrom(st.ColumnText(1));
  r.service_namespace = st.ColumnText(2);
  r.resource_id = st.ColumnText(3);
  r.scalable_dimension = st.ColumnText(4);
  r.name = st.ColumnText(5);
  r.creation_millis = st.ColumnInt64(6);
  r.doc = json::parse(st.ColumnText(7), nullptr, false);
  r.state = json::parse(st.ColumnText(8), nullptr, false);
  if (!r.doc.is_object() || !r.state.is_object()) {
    return Status::Internal("autoscaling row " + std::to_string(r.seq) + " is corrupt (unparsable JSON)");
  }
  return r;
}

Result<std::vector<AutoscalingRecord>> ReadAll(Statement& st) {
  std::vector<AutoscalingRecord> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(AutoscalingRecord r, ReadRow(st));
    out.push_back(std::move(r));
  }
  return out;
}

std::string KeyDescription(const std::string& resource_id, const std::string& name) {
  return resource_id + (name.empty() ? "" : " " + name);
}

}  // namespace

Status AutoscalingRepository::Insert(const AutoscalingRecord& r) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("INSERT INTO autoscaling_objects (kind, service_namespace, "
                                               "resource_id, scalable_dimension, name, creation_millis, doc_json, "
                                               "state_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"));
  st.BindText(1, KindName(r.kind)).BindText(2, r.service_namespace).BindText(3, r.resource_id);
  st.BindText(4, r.scalable_dimension).BindText(5, r.name).BindInt64(6, r.creation_millis);
  st.BindText(7, r.doc.dump()).BindText(8, r.state.dump());
  return st.Run();
}

Result<AutoscalingRecord> AutoscalingRepository::Put(const AutoscalingRecord& r) {
  Status status = database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(auto st, db.Prepare("UPDATE autoscaling_objects SET doc_json = ?, state_json = ? WHERE kind = ? "
                                         "AND service_namespace = ? AND resource_id = ? AND scalable_dimension = ? "
                                         "AND name = ?"));
    st.BindText(1, r.doc.dump()).BindText(2, r.state.dump()).BindText(3, KindName(r.kind));
    st.BindText(4, r.service_namespace).BindText(5, r.resource_id).BindText(6, r.scalable_dimension);
    st.BindText(7, r.name);
    RETURN_IF_ERROR(st.Run());
    if (db.Changes() > 0) return Status::Ok();
    return Insert(r);
  });
  RETURN_IF_ERROR(status);
  return Get(r.kind, r.service_namespace, r.resource_id, r.scalable_dimension, r.name);
}

Result<AutoscalingRecord> AutoscalingRepository::Get(AutoscalingKind kind, const std::string& service_namespace,
                                                     const std::string& resource_id,
                                                     const std::string& scalable_dimension, const std::string& name) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("SELECT " + std::string(kColumns) +
                                               " FROM autoscaling_objects WHERE kind = ? AND service_namespace = ? "
                                               "AND resource_id = ? AND scalable_dimension = ? AND name = ?"));
  st.BindText(1, KindName(kind)).BindText(2, service_namespace).BindText(3, resource_id);
  st.BindText(4, scalable_dimension).BindText(5, name);
  ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Status::NotFound(std::string("no ") + KindName(kind) + " " + KeyDescription(resource_id, name));
  return ReadRow(st);
}

Status AutoscalingRepository::SetState(const AutoscalingRecord& r, const json& state) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("UPDATE autoscaling_objects SET state_json = ? WHERE seq = ?"));
  st.BindText(1, state.dump()).BindInt64(2, r.seq);
  RETURN_IF_ERROR(st.Run());
  if (database_->Changes() == 0) {
    return Status::NotFound(std::string("no ") + KindName(r.kind) + " " + KeyDescription(r.resource_id, r.name));
  }
  return Status::Ok();
}

Status AutoscalingRepository::Delete(AutoscalingKind kind, const std::string& service_namespace,
                                     const std::string& resource_id, const std::string& scalable_dimension,
                                     const std::string& name) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("DELETE FROM autoscaling_objects WHERE kind = ? AND "
                                               "service_namespace = ? AND resource_id = ? AND "
                                               "scalable_dimension = ? AND name = ?"));
  st.BindText(1, KindName(kind)).BindText(2, service_namespace).BindText(3, resource_id);
  st.BindText(4, scalable_dimension).BindText(5, name);
  RETURN_IF_ERROR(st.Run());
  if (database_->Changes() == 0) {
    return Status::NotFound(std::string("no ") + KindName(kind) + " " + KeyDescription(resource_id, name));
  }
  return Status::Ok();
}

Status AutoscalingRepository::DeleteTarget(const std::string& service_namespace, const std::string& resource_id,
                                           const std::string& scalable_dimension) {
  return database_->WithTransaction([&](Database& db) -> Status {
    RETURN_IF_ERROR(Delete(AutoscalingKind::kTarget, service_namespace, resource_id, scalable_dimension, ""));
    ASSIGN_OR_RETURN(auto st, db.Prepare("DELETE FROM autoscaling_objects WHERE kind IN ('policy', "
                                         "'scheduled-action') AND service_namespace = ? AND resource_id = ? AND "
                                         "scalable_dimension = ?"));
    st.BindText(1, service_namespace).BindText(2, resource_id).BindText(3, scalable_dimension);
    return st.Run();
  });
}

Result<std::vector<AutoscalingRecord>> AutoscalingRepository::List(const AutoscalingQuery& q) {
  std::string sql =
      "SELECT " + std::string(kColumns) + " FROM autoscaling_objects WHERE kind = ? AND " + "service_namespace = ?";
  if (q.after_seq) sql += q.descending ? " AND seq < ?" : " AND seq > ?";
  if (!q.scalable_dimension.empty()) sql += " AND scalable_dimension = ?";
  sql += q.descending ? " ORDER BY seq DESC" : " ORDER BY seq";
  ASSIGN_OR_RETURN(auto st, database_->Prepare(sql));
  int index = 1;
  st.BindText(index++, KindName(q.kind));
  st.BindText(index++, q.service_namespace);
  if (q.after_seq) st.BindInt64(index++, *q.after_seq);
  if (!q.scalable_dimension.empty()) st.BindText(index++, q.scalable_dimension);
  std::vector<AutoscalingRecord> out;
  for (;;) {
    if (q.limit > 0 && out.size() >= q.limit) break;
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(AutoscalingRecord r, ReadRow(st));
    if (!q.resource_ids.empty() && !q.resource_ids.count(r.resource_id)) continue;
    if (!q.names.empty() && !q.names.count(r.name)) continue;
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<AutoscalingRecord>> AutoscalingRepository::ListAll(AutoscalingKind kind) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("SELECT " + std::string(kColumns) +
                                               " FROM autoscaling_objects WHERE kind = ? ORDER BY seq"));
  st.BindText(1, KindName(kind));
  return ReadAll(st);
}

Status AutoscalingRepository::PruneActivities(const std::string& service_namespace, const std::string& resource_id,
                                              int64_t keep) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("DELETE FROM autoscaling_objects WHERE kind = 'activity' AND "
                                               "service_namespace = ? AND resource_id = ? AND seq NOT IN (SELECT seq "
                                               "FROM autoscaling_objects WHERE kind = 'activity' AND "
                                               "service_namespace = ? AND resource_id = ? ORDER BY seq DESC LIMIT ?)"));
  st.BindText(1, service_namespace).BindText(2, resource_id).BindText(3, service_namespace).BindText(4, resource_id);
  st.BindInt64(5, keep);
  return st.Run();
}

}  // namespace kiln::store
