#include "store/training_job_repository.h"

namespace kiln::store {
namespace {

// A row's warm pool status ("" when it has none), for WarmPoolStatusEquals.
constexpr std::string_view kWarmPoolStatusSql = "ifnull(json_extract(state_json, '$.warm_pool.status'), '')";

constexpr std::string_view kColumns =
    "seq, name, arn, request_json, status, secondary_status, creation_millis, last_modified_millis, "
    "training_end_millis, state_json, version";

Result<TrainingJobRecord> ReadRow(const Statement& st) {
  TrainingJobRecord r;
  r.seq = st.ColumnInt64(0);
  r.name = st.ColumnText(1);
  r.arn = st.ColumnText(2);
  r.request = nlohmann::json::parse(st.ColumnText(3), nullptr, false);
  const std::string status = st.ColumnText(4);
  const std::string secondary_status = st.ColumnText(5);
  r.creation_millis = st.ColumnInt64(6);
  r.last_modified_millis = st.ColumnInt64(7);
  if (!st.IsNull(8)) r.training_end_millis = st.ColumnInt64(8);
  const nlohmann::json state = nlohmann::json::parse(st.ColumnText(9), nullptr, false);
  r.version = st.ColumnInt64(10);
  if (r.request.is_discarded() || state.is_discarded()) {
    return Status::Internal("training job '" + r.name + "' has a corrupt row (unparsable JSON)");
  }
  auto typed_status = ParseTrainingJobStatus(status);
  auto typed_secondary = ParseSecondaryStatus(secondary_status);
  if (!typed_status || !typed_secondary) {
    return Status::Internal("training job '" + r.name + "' has a corrupt row (status '" + status + "' / '" +
                            secondary_status + "')");
  }
  r.status = *typed_status;
  r.secondary_status = *typed_secondary;
  auto typed_state = TrainingJobStateFromJson(state);
  if (!typed_state.ok()) {
    return Status::Internal("training job '" + r.name + "' has a corrupt row (" + typed_state.status().message() + ")");
  }
  r.state = std::move(typed_state).value();
  return r;
}

}  // namespace

Status TrainingJobRepository::Insert(TrainingJobRecord& record) {
  return database_->WithTransaction([&](Database& db) -> Status {
    {
      ASSIGN_OR_RETURN(auto existing, db.Prepare("SELECT arn FROM training_jobs WHERE name = ?"));
      existing.BindText(1, record.name);
      ASSIGN_OR_RETURN(bool found, existing.Step());
      if (found) return Status::AlreadyExists(existing.ColumnText(0));
    }
    ASSIGN_OR_RETURN(auto st,
                     db.Prepare("INSERT INTO training_jobs(name, arn, request_json, status, secondary_status, "
                                "creation_millis, last_modified_millis, training_end_millis, state_json, version) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1)"));
    st.BindText(1, record.name)
        .BindText(2, record.arn)
        .BindText(3, record.request.dump())
        .BindText(4, std::string(ToString(record.status)))
        .BindText(5, std::string(ToString(record.secondary_status)))
        .BindInt64(6, record.creation_millis)
        .BindInt64(7, record.last_modified_millis);
    if (record.training_end_millis) {
      st.BindInt64(8, *record.training_end_millis);
    } else {
      st.BindNull(8);
    }
    st.BindText(9, TrainingJobStateToJson(record.state).dump());
    RETURN_IF_ERROR(st.Run());
    record.seq = db.LastInsertRowId();
    record.version = 1;
    return Status::Ok();
  });
}

Result<TrainingJobRecord> TrainingJobRepository::Get(const std::string& name) {
  ASSIGN_OR_RETURN(auto st,
                   database_->Prepare("SELECT " + std::string(kColumns) + " FROM training_jobs WHERE name = ?"));
  st.BindText(1, name);
  ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return Status::NotFound("training job " + name);
  return ReadRow(st);
}

namespace {

// One job row's mutable columns, written by Mutate and MutateEach alike (version + 1 on each).
constexpr const char* kUpdateSql =
    "UPDATE training_jobs SET status = ?, secondary_status = ?, last_modified_millis = ?, "
    "training_end_millis = ?, state_json = ?, request_json = ?, version = version + 1 WHERE seq = ?";

void BindUpdate(Statement& st, const TrainingJobRecord& record) {
  st.BindText(1, std::string(ToString(record.status)))
      .BindText(2, std::string(ToString(record.secondary_status)))
      .BindInt64(3, record.last_modified_millis);
  if (record.training_end_millis) {
    st.BindInt64(4, *record.training_end_millis);
  } else {
    st.BindNull(4);
  }
  st.BindText(5, TrainingJobStateToJson(record.state).dump())
      .BindText(6, record.request.dump())
      .BindInt64(7, record.seq);
}

}  // namespace

Result<TrainingJobRecord> TrainingJobRepository::Mutate(const std::string& name,
                                                        const std::function<Status(TrainingJobRecord&)>& mutate) {
  TrainingJobRecord record;
  RETURN_IF_ERROR(database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(record, Get(name));
    RETURN_IF_ERROR(mutate(record));
    ASSIGN_OR_RETURN(auto st, db.Prepare(kUpdateSql));
    BindUpdate(st, record);
    RETURN_IF_ERROR(st.Run());
    ++record.version;
    return Status::Ok();
  }));
  return record;
}

Status TrainingJobRepository::MutateEach(const std::vector<std::string>& names,
                                         const std::function<bool(TrainingJobRecord&)>& mutate) {
  if (names.empty()) return Status::Ok();
  return database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(auto st, db.Prepare(kUpdateSql));
    for (const std::string& name : names) {
      auto found = Get(name);
      if (found.status().IsNotFound()) continue;
      if (!found.ok()) return found.status();
      TrainingJobRecord& record = *found;
      if (!mutate(record)) continue;
      st.Reset();
      BindUpdate(st, record);
      RETURN_IF_ERROR(st.Run());
    }
    return Status::Ok();
  });
}

Result<std::vector<TrainingJobRecord>> TrainingJobRepository::List(const TrainingJobListQuery& query) {
  static constexpr ListTable kTable{.table = "training_jobs",
                                    .columns = kColumns,
                                    .has_status = true,
                                    .has_modified = true,
                                    .warm_pool_status = kWarmPoolStatusSql};
  std::vector<TrainingJobRecord> out;
  RETURN_IF_ERROR(ListAll(*database_, kTable, query, "seq", [&](const Statement& st) -> Status {
    ASSIGN_OR_RETURN(auto record, ReadRow(st));
    out.push_back(std::move(record));
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<TrainingJobSummaryRow>> TrainingJobRepository::ListPage(const ListPageQuery& query) {
  static constexpr ListTable kTable{
      .table = "training_jobs",
      .columns =
          "name, arn, status, secondary_status, creation_millis, last_modified_millis, training_end_millis, "
          "json_extract(state_json, '$.warm_pool.status'), "
          "json_extract(state_json, '$.warm_pool.retained_millis'), "
          "json_extract(state_json, '$.warm_pool.reused_by_job')",
      .has_status = true,
      .has_modified = true,
      .warm_pool_status = kWarmPoolStatusSql};
  std::vector<TrainingJobSummaryRow> out;
  RETURN_IF_ERROR(store::ListPage(*database_, kTable, query, [&](const Statement& st) {
    TrainingJobSummaryRow r;
    r.name = st.ColumnText(0);
    r.arn = st.ColumnText(1);
    r.status = st.ColumnText(2);
    r.secondary_status = st.ColumnText(3);
    r.creation_millis = st.ColumnInt64(4);
    r.last_modified_millis = st.ColumnInt64(5);
    if (!st.IsNull(6)) r.training_end_millis = st.ColumnInt64(6);
    if (!st.IsNull(7)) r.warm_pool_status = st.ColumnText(7);
    if (!st.IsNull(8)) r.warm_pool_retained_millis = st.ColumnInt64(8);
    if (!st.IsNull(9)) r.warm_pool_reused_by_job = st.ColumnText(9);
    out.push_back(std::move(r));
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<TrainingJobRecord>> TrainingJobRepository::ListActive() {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("SELECT " + std::string(kColumns) +
                                               " FROM training_jobs WHERE status IN ('InProgress', 'Stopping') "
                                               "ORDER BY seq"));
  std::vector<TrainingJobRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(auto record, ReadRow(st));
    out.push_back(std::move(record));
  }
  return out;
}

Status TrainingJobRepository::Delete(const std::string& name) {
  return database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(auto record, Get(name));
    ASSIGN_OR_RETURN(auto tags, db.Prepare("DELETE FROM resource_tags WHERE resource_arn = ?"));
    tags.BindText(1, record.arn);
    RETURN_IF_ERROR(tags.Run());
    ASSIGN_OR_RETURN(auto st, db.Prepare("DELETE FROM training_jobs WHERE seq = ?"));
    st.BindInt64(1, record.seq);
    return st.Run();
  });
}

Status TagRepository::Add(const std::string& arn, const std::vector<Tag>& tags) {
  return database_->WithTransaction([&](Database& db) -> Status {
    int64_t next_seq = 0;
    {
      ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT COALESCE(MAX(seq), 0) FROM resource_tags WHERE resource_arn = ?"));
      st.BindText(1, arn);
      ASSIGN_OR_RETURN(bool row, st.Step());
      if (row) next_seq = st.ColumnInt64(0);
    }
    for (const Tag& tag : tags) {
      // UPSERT keeps the original position of a key that is re-added (AWS lists tags in the
      // order they were first added).
      ASSIGN_OR_RETURN(auto st,
                       db.Prepare("INSERT INTO resource_tags(resource_arn, seq, key, value) VALUES (?, ?, ?, ?) "
                                  "ON CONFLICT(resource_arn, key) DO UPDATE SET value = excluded.value"));
      st.BindText(1, arn).BindInt64(2, ++next_seq).BindText(3, tag.key).BindText(4, tag.value);
      RETURN_IF_ERROR(st.Run());
    }
    return Status::Ok();
  });
}

Result<std::vector<Tag>> TagRepository::List(const std::string& arn) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("SELECT key, value FROM resource_tags WHERE resource_arn = ? "
                                               "ORDER BY seq"));
  st.BindText(1, arn);
  std::vector<Tag> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back({st.ColumnText(0), st.ColumnText(1)});
  }
  return out;
}

Status TagRepository::Remove(const std::string& arn, const std::vector<std::string>& keys) {
  return database_->WithTransaction([&](Database& db) -> Status {
    for (const auto& key : keys) {
      ASSIGN_OR_RETURN(auto st, db.Prepare("DELETE FROM resource_tags WHERE resource_arn = ? AND key = ?"));
      st.BindText(1, arn).BindText(2, key);
      RETURN_IF_ERROR(st.Run());
    }
    return Status::Ok();
  });
}

Status TagRepository::RemoveAll(const std::string& arn) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("DELETE FROM resource_tags WHERE resource_arn = ?"));
  st.BindText(1, arn);
  return st.Run();
}

}  // namespace kiln::store
