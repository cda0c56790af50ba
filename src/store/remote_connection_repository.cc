#include "store/remote_connection_repository.h"

#include <nlohmann/json.hpp>

namespace kiln::store {
namespace {

constexpr std::string_view kColumns =
    "id, resource_arn, target, principal, source_address, start_millis, end_millis, bytes_in, bytes_out, "
    "forwards_json, exit_statuses_json, close_reason";

Result<RemoteConnectionRecord> ReadRow(const Statement& st) {
  RemoteConnectionRecord r;
  r.id = st.ColumnText(0);
  r.resource_arn = st.ColumnText(1);
  r.target = st.ColumnText(2);
  r.principal = st.ColumnText(3);
  r.source_address = st.ColumnText(4);
  r.start_millis = st.ColumnInt64(5);
  if (!st.IsNull(6)) r.end_millis = st.ColumnInt64(6);
  r.bytes_in = static_cast<uint64_t>(st.ColumnInt64(7));
  r.bytes_out = static_cast<uint64_t>(st.ColumnInt64(8));
  auto forwards = nlohmann::json::parse(st.ColumnText(9), nullptr, false);
  auto statuses = nlohmann::json::parse(st.ColumnText(10), nullptr, false);
  if (!forwards.is_array() || !statuses.is_array()) {
    return Status::Internal("remote connection " + r.id + " has a corrupt row (unparsable JSON)");
  }
  for (const auto& f : forwards) {
    if (f.is_string()) r.forwards.push_back(f.get<std::string>());
  }
  for (const auto& s : statuses) {
    if (s.is_number_integer()) r.exit_statuses.push_back(s.get<int>());
  }
  r.close_reason = st.ColumnText(11);
  return r;
}

std::string ForwardsJson(const RemoteConnectionRecord& r) { return nlohmann::json(r.forwards).dump(); }
std::string StatusesJson(const RemoteConnectionRecord& r) { return nlohmann::json(r.exit_statuses).dump(); }

}  // namespace

Status RemoteConnectionRepository::Insert(const RemoteConnectionRecord& r) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("INSERT INTO remote_connections (" + std::string(kColumns) +
                                               ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
  st.BindText(1, r.id).BindText(2, r.resource_arn).BindText(3, r.target).BindText(4, r.principal);
  st.BindText(5, r.source_address).BindInt64(6, r.start_millis);
  if (r.end_millis) {
    st.BindInt64(7, *r.end_millis);
  } else {
    st.BindNull(7);
  }
  st.BindInt64(8, static_cast<int64_t>(r.bytes_in)).BindInt64(9, static_cast<int64_t>(r.bytes_out));
  st.BindText(10, ForwardsJson(r)).BindText(11, StatusesJson(r)).BindText(12, r.close_reason);
  return st.Run();
}

Status RemoteConnectionRepository::Close(const RemoteConnectionRecord& r) {
  ASSIGN_OR_RETURN(auto st,
                   database_->Prepare("UPDATE remote_connections SET end_millis = ?, bytes_in = ?, bytes_out = ?, "
                                      "forwards_json = ?, exit_statuses_json = ?, close_reason = ? WHERE id = ?"));
  st.BindInt64(1, r.end_millis.value_or(r.start_millis));
  st.BindInt64(2, static_cast<int64_t>(r.bytes_in)).BindInt64(3, static_cast<int64_t>(r.bytes_out));
  st.BindText(4, ForwardsJson(r)).BindText(5, StatusesJson(r)).BindText(6, r.close_reason).BindText(7, r.id);
  RETURN_IF_ERROR(st.Run());
  if (database_->Changes() == 0) return Status::NotFound("no remote connection " + r.id);
  return Status::Ok();
}

Result<RemoteConnectionRecord> RemoteConnectionRepository::Get(const std::string& id) {
  ASSIGN_OR_RETURN(auto st,
                   database_->Prepare("SELECT " + std::string(kColumns) + " FROM remote_connections WHERE id = ?"));
  st.BindText(1, id);
  ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Status::NotFound("no remote connection " + id);
  return ReadRow(st);
}

Result<std::vector<RemoteConnectionRecord>> RemoteConnectionRepository::List(const std::string& resource_arn,
                                                                             int limit) {
  std::string sql = "SELECT " + std::string(kColumns) + " FROM remote_connections";
  if (!resource_arn.empty()) sql += " WHERE resource_arn = ?";
  sql += " ORDER BY start_millis DESC, id DESC LIMIT ?";
  ASSIGN_OR_RETURN(auto st, database_->Prepare(sql));
  int index = 1;
  if (!resource_arn.empty()) st.BindText(index++, resource_arn);
  st.BindInt64(index, limit);
  std::vector<RemoteConnectionRecord> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(RemoteConnectionRecord r, ReadRow(st));
    out.push_back(std::move(r));
  }
  return out;
}

Result<int64_t> RemoteConnectionRepository::CloseOpen(int64_t end_millis, const std::string& reason) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("UPDATE remote_connections SET end_millis = ?, close_reason = ? "
                                               "WHERE end_millis IS NULL"));
  st.BindInt64(1, end_millis).BindText(2, reason);
  RETURN_IF_ERROR(st.Run());
  return database_->Changes();
}

}  // namespace kiln::store
