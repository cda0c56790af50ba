#include "store/transform_job_repository.h"

#include <array>
#include <utility>

#include "base/log.h"
#include "store/json_member.h"

namespace kiln::store {
namespace {

using nlohmann::json;

constexpr std::array<std::pair<TransformJobStatus, std::string_view>, 5> kStatuses = {{
    {TransformJobStatus::kInProgress, "InProgress"},
    {TransformJobStatus::kCompleted, "Completed"},
    {TransformJobStatus::kFailed, "Failed"},
    {TransformJobStatus::kStopping, "Stopping"},
    {TransformJobStatus::kStopped, "Stopped"},
}};

constexpr std::array<std::string_view, 4> kStateMembers = {"model", "start_millis", "failure_reason", "stop_requested"};

constexpr std::string_view kColumns =
    "seq, name, arn, request_json, status, creation_millis, last_modified_millis, end_millis, state_json, version";

Status BadState(std::string_view path, std::string_view expected) {
  return Status::InvalidArgument("transform job state: " + std::string(path) + " is not " + std::string(expected));
}

Status Corrupt(const std::string& name, const std::string& why) {
  return Status::Internal("transform job '" + name + "' has a corrupt row (" + why + ")");
}

ListTable SummaryTable() {
  ListTable table;
  table.table = "transform_jobs";
  table.columns = "name, arn, status, creation_millis, last_modified_millis, end_millis, state_json";
  table.has_status = true;
  table.has_modified = true;
  return table;
}

Result<TransformJobRecord> ReadRow(const Statement& st) {
  TransformJobRecord r;
  r.seq = st.ColumnInt64(0);
  r.name = st.ColumnText(1);
  r.arn = st.ColumnText(2);
  r.request = json::parse(st.ColumnText(3), nullptr, false);
  const std::string status = st.ColumnText(4);
  r.creation_millis = st.ColumnInt64(5);
  r.last_modified_millis = st.ColumnInt64(6);
  if (!st.IsNull(7)) r.end_millis = st.ColumnInt64(7);
  const json state = json::parse(st.ColumnText(8), nullptr, false);
  r.version = st.ColumnInt64(9);
  if (r.request.is_discarded() || state.is_discarded()) return Corrupt(r.name, "unparsable JSON");
  auto typed_status = ParseTransformJobStatus(status);
  if (!typed_status) return Corrupt(r.name, "status '" + status + "'");
  r.status = *typed_status;
  auto typed_state = TransformJobStateFromJson(state);
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

std::string_view TransformJobStatusName(TransformJobStatus status) {
  for (const auto& [value, name] : kStatuses) {
    if (value == status) return name;
  }
  return "InProgress";
}

std::optional<TransformJobStatus> ParseTransformJobStatus(std::string_view text) {
  for (const auto& [value, name] : kStatuses) {
    if (name == text) return value;
  }
  return std::nullopt;
}

json TransformJobStateToJson(const TransformJobState& state) {
  json out = json::object();
  for (const auto& [key, value] : state.extra.items()) out[key] = value;
  out["model"] = state.model;
  if (state.start_millis) {
    out["start_millis"] = *state.start_millis;
  } else {
    out.erase("start_millis");
  }
  out["failure_reason"] = state.failure_reason;
  out["stop_requested"] = state.stop_requested;
  return out;
}

Result<TransformJobState> TransformJobStateFromJson(const json& document) {
  TransformJobState out;
  if (document.is_null()) return out;
  RETURN_IF_ERROR(json_member::RequireObject(document, "state", BadState));
  if (document.contains("model") && !document["model"].is_null()) {
    if (!document["model"].is_object()) return BadState("model", "an object");
    out.model = document["model"];
  }
  RETURN_IF_ERROR(json_member::ReadOptional(document, "start_millis", "", BadState, out.start_millis));
  RETURN_IF_ERROR(json_member::ReadString(document, "failure_reason", "", BadState, out.failure_reason));
  RETURN_IF_ERROR(json_member::ReadBool(document, "stop_requested", "", BadState, out.stop_requested));
  for (const auto& [key, value] : document.items()) {
    bool known = false;
    for (std::string_view k : kStateMembers) known |= key == k;
    if (!known) out.extra[key] = value;
  }
  return out;
}

Status TransformJobRepository::Insert(TransformJobRecord& record) {
  return database_->WithTransaction([&](Database& db) -> Status {
    {
      ASSIGN_OR_RETURN(auto existing, db.Prepare("SELECT arn FROM transform_jobs WHERE name = ?"));
      existing.BindText(1, record.name);
      ASSIGN_OR_RETURN(bool found, existing.Step());
      if (found) return Status::AlreadyExists(existing.ColumnText(0));
    }
    ASSIGN_OR_RETURN(auto st, db.Prepare("INSERT INTO transform_jobs(name, arn, request_json, status, creation_millis, "
                                         "last_modified_millis, end_millis, state_json, version) "
                                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)"));
    st.BindText(1, record.name)
        .BindText(2, record.arn)
        .BindText(3, record.request.dump())
        .BindText(4, std::string(TransformJobStatusName(record.status)))
        .BindInt64(5, record.creation_millis)
        .BindInt64(6, record.last_modified_millis);
    BindEnd(st, 7, record.end_millis);
    st.BindText(8, TransformJobStateToJson(record.state).dump());
    RETURN_IF_ERROR(st.Run());
    record.seq = db.LastInsertRowId();
    record.version = 1;
    return Status::Ok();
  });
}

Result<TransformJobRecord> TransformJobRepository::Get(const std::string& name) {
  ASSIGN_OR_RETURN(auto st,
                   database_->Prepare("SELECT " + std::string(kColumns) + " FROM transform_jobs WHERE name = ?"));
  st.BindText(1, name);
  ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return Status::NotFound("transform job " + name);
  return ReadRow(st);
}

Result<TransformJobRecord> TransformJobRepository::Mutate(const std::string& name,
                                                          const std::function<Status(TransformJobRecord&)>& mutate) {
  TransformJobRecord record;
  RETURN_IF_ERROR(database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(record, Get(name));
    RETURN_IF_ERROR(mutate(record));
    ASSIGN_OR_RETURN(auto st,
                     db.Prepare("UPDATE transform_jobs SET status = ?, last_modified_millis = ?, end_millis = ?, "
                                "state_json = ?, version = version + 1 WHERE seq = ?"));
    st.BindText(1, std::string(TransformJobStatusName(record.status))).BindInt64(2, record.last_modified_millis);
    BindEnd(st, 3, record.end_millis);
    st.BindText(4, TransformJobStateToJson(record.state).dump()).BindInt64(5, record.seq);
    RETURN_IF_ERROR(st.Run());
    ++record.version;
    return Status::Ok();
  }));
  return record;
}

Result<std::vector<TransformJobSummaryRow>> TransformJobRepository::ListPage(const ListPageQuery& query) {
  std::vector<TransformJobSummaryRow> out;
  RETURN_IF_ERROR(store::ListPage(*database_, SummaryTable(), query, [&](const Statement& st) -> Status {
    TransformJobSummaryRow r;
    r.name = st.ColumnText(0);
    r.arn = st.ColumnText(1);
    r.status = st.ColumnText(2);
    r.creation_millis = st.ColumnInt64(3);
    r.last_modified_millis = st.ColumnInt64(4);
    if (!st.IsNull(5)) r.end_millis = st.ColumnInt64(5);
    const json document = json::parse(st.ColumnText(6), nullptr, false);
    if (document.is_discarded()) return Corrupt(r.name, "unparsable JSON");
    auto state = TransformJobStateFromJson(document);
    if (!state.ok()) return Corrupt(r.name, state.status().message());
    r.failure_reason = std::move(state->failure_reason);
    out.push_back(std::move(r));
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<TransformJobRecord>> TransformJobRepository::ListActive() {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("SELECT " + std::string(kColumns) +
                                               " FROM transform_jobs WHERE status IN ('InProgress', 'Stopping') "
                                               "ORDER BY seq"));
  std::vector<TransformJobRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    auto record = ReadRow(st);
    if (!record.ok()) {
      KLOG(warn, "transform job row skipped", {{"error", record.status().ToString()}});
      continue;
    }
    out.push_back(std::move(record).value());
  }
  return out;
}

}  // namespace kiln::store
