#pragma once
// Repositories for the real-time inference resources (migration 6): models, endpoint
// configurations and endpoints. Names are unique per kind, compared case-insensitively
// (spec/control-plane-api.md §6); Get/Mutate/Delete find a row by its name in any case.
//
// Models and endpoint configurations are immutable after creation: a row keeps the validated
// Create* request verbatim. An endpoint row keeps a *deployment*: the endpoint configuration and
// every model it names, copied at CreateEndpoint/UpdateEndpoint time, so that deleting a model or
// configuration later never changes a running endpoint (AWS behaviour).
//
// Reading a row whose status word or documents do not map (store/endpoint_state.h) is Internal
// ("corrupt row"), as unparsable JSON always was.
//
// Thread-safety: all methods may be called from any thread (the Database serialises them).
// EndpointRepository::Mutate is the one read-modify-write: the API (updates, delete) and the
// endpoint controller (observed state) never overwrite each other's changes.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "store/database.h"
#include "store/endpoint_state.h"
#include "store/list_query.h"

namespace kiln::store {

// A model or an endpoint configuration.
struct DefinitionRecord {
  std::string name;
  std::string arn;
  nlohmann::json request;  // the validated CreateModel / CreateEndpointConfig input, as received
  int64_t creation_millis = 0;
};

// Filters of DefinitionRepository::List: name substring and creation-time bounds (a status or
// last-modified filter is InvalidArgument: these rows have neither).
using DefinitionListQuery = ListFilter;

// What a ListModels / ListEndpointConfigs summary shows (no JSON is read).
struct DefinitionSummaryRow {
  std::string name;
  std::string arn;
  int64_t creation_millis = 0;
};

// One repository class for both immutable kinds; `kind` picks the table.
class DefinitionRepository {
 public:
  enum class Kind { kModel, kEndpointConfig };
  DefinitionRepository(Database* database, Kind kind) : database_(database), kind_(kind) {}

  // AlreadyExists (message = the existing row's ARN) when the name is taken in any case.
  Status Insert(const DefinitionRecord& record);
  // NotFound when absent.
  Result<DefinitionRecord> Get(const std::string& name);
  // Matching rows in creation order (callers sort and page).
  Result<std::vector<DefinitionRecord>> List(const DefinitionListQuery& query);
  // One page in (sort key, name) order from indexed columns (store/list_query.h); sorting by
  // kStatus and status or last-modified filters are InvalidArgument (these rows have neither).
  Result<std::vector<DefinitionSummaryRow>> ListPage(const ListPageQuery& query);
  // Removes the row and its tags. NotFound when absent.
  Status Delete(const std::string& name);

 private:
  Database* database_;
  Kind kind_;
};

// An endpoint row. Its documents are typed (store/endpoint_state.h has them, their JSON mapping
// and who writes which); the repository maps them to and from the row's columns.
struct EndpointRecord {
  std::string name;
  std::string arn;
  std::string config_name;  // EndpointConfigName as Describe shows it (the deployed one)
  EndpointStatus status = EndpointStatus::kCreating;
  std::string failure_reason;  // empty when none
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
  nlohmann::json request;  // the validated CreateEndpoint input (DeploymentConfig, Tags)
  Deployment deployment;   // the current deployment
  // The deployment an UpdateEndpoint asked for while it rolls out; empty otherwise. The
  // controller moves it into `deployment` when the new fleet is InService.
  std::optional<Deployment> pending;
  // Desired state per variant, written by the API (create, update, weights and capacities), for
  // the variants of `pending` when set, else of `deployment`.
  DesiredVariants desired;
  // Observed state, written by the controller only.
  EndpointObservedState state;
  int64_t version = 0;  // incremented by every write
};

// What a ListEndpoints summary shows (no JSON is read).
struct EndpointSummaryRow {
  std::string name;
  std::string arn;
  EndpointStatus status = EndpointStatus::kCreating;
  int64_t creation_millis = 0;
  int64_t last_modified_millis = 0;
};

// Filters of EndpointRepository::List.
using EndpointListQuery = ListFilter;

class EndpointRepository {
 public:
  explicit EndpointRepository(Database* database) : database_(database) {}

  // Fills version. AlreadyExists (message = the existing endpoint's ARN) when the name is taken.
  Status Insert(EndpointRecord& record);
  // NotFound when absent.
  Result<EndpointRecord> Get(const std::string& name);
  // Reads the row, lets `mutate` change it and writes it back in one transaction (version + 1;
  // last_modified_millis is the mutator's business). An error from `mutate` aborts without
  // writing and is returned. Returns the record as written. NotFound when absent.
  Result<EndpointRecord> Mutate(const std::string& name, const std::function<Status(EndpointRecord&)>& mutate);
  // Matching rows in creation order (callers sort and page).
  Result<std::vector<EndpointRecord>> List(const EndpointListQuery& query);
  // One page in (sort key, name) order from indexed columns (store/list_query.h).
  Result<std::vector<EndpointSummaryRow>> ListPage(const ListPageQuery& query);
  // Removes the row and its tags. NotFound when absent.
  Status Delete(const std::string& name);

 private:
  Database* database_;
};

}  // namespace kiln::store
