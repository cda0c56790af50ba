#include "store/processing_job_repository.h"

#include "base/log.h"

namespace kiln::store {
namespace {

constexpr std::string_view kColumns =
    "seq, name, arn, request_json, status, creation_millis, last_modified_millis, end_millis, state_json, version";

// The table as list_query.h sees it. A summary also needs FailureReason and ExitMessage, which live
// in the state document: the page reads state_json too (only for the rows of the page).
ListTable SummaryTable() {
  ListTable table;
  table.table = "processing_jobs";
  table.columns = "name, arn, status, creation_millis, last_modified_millis, end_millis, state_json";
  table.has_status = true;
  table.has_modified = true;
  return table;
}

Status Corrupt(const std::string& name, const std::string& why) {
  return Status::Internal("processing job '" + name + "' has a corrupt row (" + why + ")");
}

Result<ProcessingJobRecord> ReadRow(const Statement& st) {
  ProcessingJobRecord r;
  r.seq = st.ColumnInt64(0);
  r.name = st.ColumnText(1);
  r.arn = st.ColumnText(2);
  r.request = nlohmann::json::parse(st.ColumnText(3), nullptr, false);
  const std::string status = st.ColumnText(4);
  r.creation_millis = st.ColumnInt64(5);
  r.last_modified_millis = st.ColumnInt64(6);
  if (!st.IsNull(7)) r.end_millis = st.ColumnInt64(7);
  const nlohmann::json state = nlohmann::json::parse(st.ColumnText(8), nullptr, false);
  r.version = st.ColumnInt64(9);
  if (r.request.is_discarded() || state.is_discarded()) return Corrupt(r.name, "unparsable JSON");
  auto typed_status = ParseProcessingJobStatus(status);
  if (!typed_status) return Corrupt(r.name, "status '" + status + "'");
  r.status = *typed_status;
  auto typed_state = ProcessingJobStateFromJson(state);
  if (!typed_state.ok()) return Corrupt(r.name, typed_state.status().message());
  r.state = std::move(typed_state).value();
  return r;
}

void BindEnd(Statement& st, int index, const std::optional<int64_t>& end_millis) {
  if (end_millis) {
    st.BindInt64(index, *end_millis);
  } else {
    st.BindNull(index);
  }
}

}  // namespace

Status ProcessingJobRepository::Insert(ProcessingJobRecord& record) {
  return database_->WithTransaction([&](Database& db) -> Status {
    {
      ASSIGN_OR_RETURN(auto existing, db.Prepare("SELECT arn FROM processing_jobs WHERE name = ?"));
      existing.BindText(1, record.name);
      ASSIGN_OR_RETURN(bool found, existing.Step());
      if (found) return Status::AlreadyExists(existing.ColumnText(0));
    }
    ASSIGN_OR_RETURN(auto st,
                     db.Prepare("INSERT INTO processing_jobs(name, arn, request_json, status, creation_millis, "
                                "last_modified_millis, end_millis, state_json, version) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)"));
    st.BindText(1, record.name)
        .BindText(2, record.arn)
        .BindText(3, record.request.dump())
        .BindText(4, std::string(ProcessingJobStatusName(record.status)))
        .BindInt64(5, record.creation_millis)
        .BindInt64(6, record.last_modified_millis);
    BindEnd(st, 7, record.end_millis);
    st.BindText(8, ProcessingJobStateToJson(record.state).dump());
    RETURN_IF_ERROR(st.Run());
    record.seq = db.LastInsertRowId();
    record.version = 1;
    return Status::Ok();
  });
}

Result<ProcessingJobRecord> ProcessingJobRepository::Get(const std::string& name) {
  ASSIGN_OR_RETURN(auto st,
                   database_->Prepare("SELECT " + std::string(kColumns) + " FROM processing_jobs WHERE name = ?"));
  st.BindText(1, name);
  ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return Status::NotFound("processing job " + name);
  return ReadRow(st);
}

Result<ProcessingJobRecord> ProcessingJobRepository::Mutate(const std::string& name,
                                                            const std::function<Status(ProcessingJobRecord&)>& mutate) {
  ProcessingJobRecord record;
  RETURN_IF_ERROR(database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(record, Get(name));
    RETURN_IF_ERROR(mutate(record));
    ASSIGN_OR_RETURN(auto st,
                     db.Prepare("UPDATE processing_jobs SET status = ?, last_modified_millis = ?, end_millis = ?, "
                                "state_json = ?, request_json = ?, version = version + 1 WHERE seq = ?"));
    st.BindText(1, std::string(ProcessingJobStatusName(record.status))).BindInt64(2, record.last_modified_millis);
    BindEnd(st, 3, record.end_millis);
    st.BindText(4, ProcessingJobStateToJson(record.state).dump())
        .BindText(5, record.request.dump())
        .BindInt64(6, record.seq);
    RETURN_IF_ERROR(st.Run());
    ++record.version;
    return Status::Ok();
  }));
  return record;
}

Result<std::vector<ProcessingJobSummaryRow>> ProcessingJobRepository::ListPage(const ListPageQuery& query) {
  std::vector<ProcessingJobSummaryRow> out;
  RETURN_IF_ERROR(store::ListPage(*database_, SummaryTable(), query, [&](const Statement& st) -> Status {
    ProcessingJobSummaryRow r;
    r.name = st.ColumnText(0);
    r.arn = st.ColumnText(1);
    r.status = st.ColumnText(2);
    r.creation_millis = st.ColumnInt64(3);
    r.last_modified_millis = st.ColumnInt64(4);
    if (!st.IsNull(5)) r.end_millis = st.ColumnInt64(5);
    const nlohmann::json document = nlohmann::json::parse(st.ColumnText(6), nullptr, false);
    if (document.is_discarded()) return Corrupt(r.name, "unparsable JSON");
    auto state = ProcessingJobStateFromJson(document);
    if (!state.ok()) return Corrupt(r.name, state.status().message());
    r.failure_reason = std::move(state->failure_reason);
    r.exit_message = std::move(state->exit_message);
    out.push_back(std::move(r));
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<ProcessingJobRecord>> ProcessingJobRepository::ListActive() {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("SELECT " + std::string(kColumns) +
                                               " FROM processing_jobs WHERE status IN ('InProgress', 'Stopping') "
                                               "ORDER BY seq"));
  std::vector<ProcessingJobRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    // One unreadable row must not stall every other processing job: it is left out (and logged);
    // Get, Describe and Delete still name it.
    auto record = ReadRow(st);
    if (!record.ok()) {
      KLOG(warn, "processing job row skipped", {{"error", record.status().ToString()}});
      continue;
    }
    out.push_back(std::move(record).value());
  }
  return out;
}

Status ProcessingJobRepository::Delete(const std::string& name) {
  return database_->WithTransaction([&](Database& db) -> Status {
    // Only the name and ARN are needed: a corrupt row can still be deleted.
    std::string arn;
    int64_t seq = 0;
    {
      ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT seq, arn FROM processing_jobs WHERE name = ?"));
      st.BindText(1, name);
      ASSIGN_OR_RETURN(bool found, st.Step());
      if (!found) return Status::NotFound("processing job " + name);
      seq = st.ColumnInt64(0);
      arn = st.ColumnText(1);
    }
    ASSIGN_OR_RETURN(auto tags, db.Prepare("DELETE FROM resource_tags WHERE resource_arn = ?"));
    tags.BindText(1, arn);
    RETURN_IF_ERROR(tags.Run());
    ASSIGN_OR_RETURN(auto st, db.Prepare("DELETE FROM processing_jobs WHERE seq = ?"));
    st.BindInt64(1, seq);
    return st.Run();
  });
}

}  // namespace kiln::store
