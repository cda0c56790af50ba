#include "store/endpoint_repository.h"

namespace kiln::store {
namespace {

const char* TableOf(DefinitionRepository::Kind kind) {
  return kind == DefinitionRepository::Kind::kModel ? "models" : "endpoint_configs";
}

const char* NounOf(DefinitionRepository::Kind kind) {
  return kind == DefinitionRepository::Kind::kModel ? "model" : "endpoint configuration";
}

constexpr std::string_view kDefinitionColumns = "name, arn, request_json, creation_millis";

Result<DefinitionRecord> ReadDefinition(const Statement& st, const char* noun) {
  DefinitionRecord r;
  r.name = st.ColumnText(0);
  r.arn = st.ColumnText(1);
  r.request = nlohmann::json::parse(st.ColumnText(2), nullptr, false);
  r.creation_millis = st.ColumnInt64(3);
  if (r.request.is_discarded()) {
    return Status::Internal(std::string(noun) + " '" + r.name + "' has a corrupt row (unparsable JSON)");
  }
  return r;
}

constexpr std::string_view kEndpointColumns =
    "seq, name, arn, config_name, status, failure_reason, creation_millis, last_modified_millis, request_json, "
    "deployment_json, pending_json, desired_json, state_json, version";

Status CorruptRow(const std::string& name, const std::string& why) {
  return Status::Internal("endpoint '" + name + "' has a corrupt row (" + why + ")");
}

Result<nlohmann::json> ParseColumn(const Statement& st, int column, const std::string& name) {
  auto parsed = nlohmann::json::parse(st.ColumnText(column), nullptr, false);
  if (parsed.is_discarded()) return CorruptRow(name, "unparsable JSON");
  return parsed;
}

Result<EndpointRecord> ReadEndpoint(const Statement& st, int64_t* seq) {
  EndpointRecord r;
  if (seq != nullptr) *seq = st.ColumnInt64(0);
  r.name = st.ColumnText(1);
  r.arn = st.ColumnText(2);
  r.config_name = st.ColumnText(3);
  auto status = ParseEndpointStatus(st.ColumnText(4));
  if (!status.ok()) return CorruptRow(r.name, status.status().message());
  r.status = *status;
  r.failure_reason = st.ColumnText(5);
  r.creation_millis = st.ColumnInt64(6);
  r.last_modified_millis = st.ColumnInt64(7);
  ASSIGN_OR_RETURN(r.request, ParseColumn(st, 8, r.name));
  ASSIGN_OR_RETURN(auto deployment, ParseColumn(st, 9, r.name));
  auto typed_deployment = DeploymentFromJson(deployment);
  if (!typed_deployment.ok()) return CorruptRow(r.name, typed_deployment.status().message());
  r.deployment = std::move(*typed_deployment);
  if (!st.IsNull(10)) {
    ASSIGN_OR_RETURN(auto pending, ParseColumn(st, 10, r.name));
    if (!pending.is_null()) {
      auto typed = DeploymentFromJson(pending);
      if (!typed.ok()) return CorruptRow(r.name, "pending " + typed.status().message());
      r.pending = std::move(*typed);
    }
  }
  ASSIGN_OR_RETURN(auto desired, ParseColumn(st, 11, r.name));
  auto typed_desired = DesiredVariantsFromJson(desired);
  if (!typed_desired.ok()) return CorruptRow(r.name, typed_desired.status().message());
  r.desired = std::move(*typed_desired);
  ASSIGN_OR_RETURN(auto state, ParseColumn(st, 12, r.name));
  auto typed_state = ObservedStateFromJson(state);
  if (!typed_state.ok()) return CorruptRow(r.name, typed_state.status().message());
  r.state = std::move(*typed_state);
  r.version = st.ColumnInt64(13);
  return r;
}

// Binds the mutable endpoint columns at 1..10 in the order the INSERT and UPDATE below use.
void BindEndpointState(Statement& st, const EndpointRecord& r) {
  st.BindText(1, r.config_name)
      .BindText(2, std::string(ToString(r.status)))
      .BindText(3, r.failure_reason)
      .BindInt64(4, r.last_modified_millis)
      .BindText(5, r.request.dump())
      .BindText(6, ToJson(r.deployment).dump());
  if (!r.pending) {
    st.BindNull(7);
  } else {
    st.BindText(7, ToJson(*r.pending).dump());
  }
  st.BindText(8, ToJson(r.desired).dump()).BindText(9, ToJson(r.state).dump());
}

Status DeleteTags(Database& db, const std::string& arn) {
  ASSIGN_OR_RETURN(auto tags, db.Prepare("DELETE FROM resource_tags WHERE resource_arn = ?"));
  tags.BindText(1, arn);
  return tags.Run();
}

}  // namespace

Status DefinitionRepository::Insert(const DefinitionRecord& record) {
  const std::string table = TableOf(kind_);
  return database_->WithTransaction([&](Database& db) -> Status {
    {
      ASSIGN_OR_RETURN(auto existing, db.Prepare("SELECT arn FROM " + table + " WHERE name = ?"));
      existing.BindText(1, record.name);
      ASSIGN_OR_RETURN(bool found, existing.Step());
      if (found) return Status::AlreadyExists(existing.ColumnText(0));
    }
    ASSIGN_OR_RETURN(
        auto st, db.Prepare("INSERT INTO " + table + "(name, arn, request_json, creation_millis) VALUES (?, ?, ?, ?)"));
    st.BindText(1, record.name)
        .BindText(2, record.arn)
        .BindText(3, record.request.dump())
        .BindInt64(4, record.creation_millis);
    return st.Run();
  });
}

Result<DefinitionRecord> DefinitionRepository::Get(const std::string& name) {
  ASSIGN_OR_RETURN(auto st, database_->Prepare("SELECT " + std::string(kDefinitionColumns) + " FROM " + TableOf(kind_) +
                                               " WHERE name = ?"));
  st.BindText(1, name);
  ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return Status::NotFound(std::string(NounOf(kind_)) + " " + name);
  return ReadDefinition(st, NounOf(kind_));
}

Result<std::vector<DefinitionRecord>> DefinitionRepository::List(const DefinitionListQuery& query) {
  const ListTable table{.table = TableOf(kind_), .columns = kDefinitionColumns};
  std::vector<DefinitionRecord> out;
  RETURN_IF_ERROR(ListAll(*database_, table, query, "seq", [&](const Statement& st) -> Status {
    ASSIGN_OR_RETURN(auto record, ReadDefinition(st, NounOf(kind_)));
    out.push_back(std::move(record));
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<DefinitionSummaryRow>> DefinitionRepository::ListPage(const ListPageQuery& query) {
  const ListTable table{.table = TableOf(kind_), .columns = "name, arn, creation_millis"};
  std::vector<DefinitionSummaryRow> out;
  RETURN_IF_ERROR(store::ListPage(*database_, table, query, [&](const Statement& st) {
    out.push_back({st.ColumnText(0), st.ColumnText(1), st.ColumnInt64(2)});
    return Status::Ok();
  }));
  return out;
}

Status DefinitionRepository::Delete(const std::string& name) {
  return database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(auto record, Get(name));
    RETURN_IF_ERROR(DeleteTags(db, record.arn));
    ASSIGN_OR_RETURN(auto st, db.Prepare(std::string("DELETE FROM ") + TableOf(kind_) + " WHERE name = ?"));
    st.BindText(1, record.name);
    return st.Run();
  });
}

Status EndpointRepository::Insert(EndpointRecord& record) {
  return database_->WithTransaction([&](Database& db) -> Status {
    {
      ASSIGN_OR_RETURN(auto existing, db.Prepare("SELECT arn FROM endpoints WHERE name = ?"));
      existing.BindText(1, record.name);
      ASSIGN_OR_RETURN(bool found, existing.Step());
      if (found) return Status::AlreadyExists(existing.ColumnText(0));
    }
    ASSIGN_OR_RETURN(auto st,
                     db.Prepare("INSERT INTO endpoints(config_name, status, failure_reason, last_modified_millis, "
                                "request_json, deployment_json, pending_json, desired_json, state_json, name, arn, "
                                "creation_millis, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)"));
    BindEndpointState(st, record);
    st.BindText(10, record.name).BindText(11, record.arn).BindInt64(12, record.creation_millis);
    RETURN_IF_ERROR(st.Run());
    record.version = 1;
    return Status::Ok();
  });
}

Result<EndpointRecord> EndpointRepository::Get(const std::string& name) {
  ASSIGN_OR_RETURN(auto st,
                   database_->Prepare("SELECT " + std::string(kEndpointColumns) + " FROM endpoints WHERE name = ?"));
  st.BindText(1, name);
  ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return Status::NotFound("endpoint " + name);
  return ReadEndpoint(st, nullptr);
}

Result<EndpointRecord> EndpointRepository::Mutate(const std::string& name,
                                                  const std::function<Status(EndpointRecord&)>& mutate) {
  EndpointRecord record;
  RETURN_IF_ERROR(database_->WithTransaction([&](Database& db) -> Status {
    int64_t seq = 0;
    {
      ASSIGN_OR_RETURN(auto st,
                       db.Prepare("SELECT " + std::string(kEndpointColumns) + " FROM endpoints WHERE name = ?"));
      st.BindText(1, name);
      ASSIGN_OR_RETURN(bool found, st.Step());
      if (!found) return Status::NotFound("endpoint " + name);
      ASSIGN_OR_RETURN(record, ReadEndpoint(st, &seq));
    }
    RETURN_IF_ERROR(mutate(record));
    ASSIGN_OR_RETURN(auto st,
                     db.Prepare("UPDATE endpoints SET config_name = ?, status = ?, failure_reason = ?, "
                                "last_modified_millis = ?, request_json = ?, deployment_json = ?, pending_json = ?, "
                                "desired_json = ?, state_json = ?, version = version + 1 WHERE seq = ?"));
    BindEndpointState(st, record);
    st.BindInt64(10, seq);
    RETURN_IF_ERROR(st.Run());
    ++record.version;
    return Status::Ok();
  }));
  return record;
}

Result<std::vector<EndpointRecord>> EndpointRepository::List(const EndpointListQuery& query) {
  static constexpr ListTable kTable{
      .table = "endpoints", .columns = kEndpointColumns, .has_status = true, .has_modified = true};
  std::vector<EndpointRecord> out;
  RETURN_IF_ERROR(ListAll(*database_, kTable, query, "seq", [&](const Statement& st) -> Status {
    ASSIGN_OR_RETURN(auto record, ReadEndpoint(st, nullptr));
    out.push_back(std::move(record));
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<EndpointSummaryRow>> EndpointRepository::ListPage(const ListPageQuery& query) {
  static constexpr ListTable kTable{.table = "endpoints",
                                    .columns = "name, arn, status, creation_millis, last_modified_millis",
                                    .has_status = true,
                                    .has_modified = true};
  std::vector<EndpointSummaryRow> out;
  RETURN_IF_ERROR(store::ListPage(*database_, kTable, query, [&](const Statement& st) {
    auto status = ParseEndpointStatus(st.ColumnText(2));
    if (!status.ok()) return CorruptRow(st.ColumnText(0), status.status().message());
    out.push_back({st.ColumnText(0), st.ColumnText(1), *status, st.ColumnInt64(3), st.ColumnInt64(4)});
    return Status::Ok();
  }));
  return out;
}

Status EndpointRepository::Delete(const std::string& name) {
  return database_->WithTransaction([&](Database& db) -> Status {
    ASSIGN_OR_RETURN(auto record, Get(name));
    RETURN_IF_ERROR(DeleteTags(db, record.arn));
    ASSIGN_OR_RETURN(auto st, db.Prepare("DELETE FROM endpoints WHERE name = ?"));
    st.BindText(1, record.name);
    return st.Run();
  });
}

}  // namespace kiln::store
