#pragma once
// SageMaker real-time inference operations (spec/control-plane-api.md §8.3–8.5, serving-contract.md
// §1, §9), one .cc per resource family:
//   models.cc            CreateModel, DescribeModel, ListModels, DeleteModel
//   endpoint_configs.cc  CreateEndpointConfig, DescribeEndpointConfig, ListEndpointConfigs,
//                        DeleteEndpointConfig
//   endpoints.cc         CreateEndpoint, DescribeEndpoint, ListEndpoints, UpdateEndpoint,
//                        UpdateEndpointWeightsAndCapacities, DeleteEndpoint
// Tags of these resources (Create* Tags, AddTags/ListTags/DeleteTags) share the tag table with
// training jobs; the tag operations themselves are registered by training_jobs.cc.
//
// Shape validation (required members, patterns, lengths, ranges, enums) is done by the service
// model before a handler runs (JsonService::SetModel); the handlers add the cross-member rules,
// Kiln's own limits (instance catalog, features not offered yet) and answer AWS's messages (§7).
// Handlers only write desired state: endpoint changes are committed to the store, then the
// notifier is told, and the endpoint controller does the rest.
//
// Thread-safety: handlers only use the thread-safe repositories, the immutable catalog and the
// notifier (callable from any thread).

#include <string>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "base/time.h"
#include "control/endpoint_notifier.h"
#include "control/instance_catalog.h"
#include "store/database.h"
#include "store/endpoint_repository.h"

namespace kiln::api {

struct EndpointsContext {
  store::Database* database = nullptr;
  control::EndpointNotifier* notifier = nullptr;      // told after every committed endpoint change
  const control::InstanceCatalog* catalog = nullptr;  // instance types variants may use
  std::string account_id;
  std::string region;
  const Clock* clock = nullptr;  // nullptr: the system clock
};

// Register the operations of one family on `service` (the SageMaker JsonService). `context`
// members must outlive the service.
void RegisterModelOperations(JsonService* service, const EndpointsContext& context);
void RegisterEndpointConfigOperations(JsonService* service, const EndpointsContext& context);
void RegisterEndpointOperations(JsonService* service, const EndpointsContext& context);
// All three of the above.
void RegisterInferenceOperations(JsonService* service, const EndpointsContext& context);

// Describe* outputs (exposed for tests and for Search later).
nlohmann::json RenderModel(const store::DefinitionRecord& record);
nlohmann::json RenderEndpointConfig(const store::DefinitionRecord& record);
nlohmann::json RenderEndpoint(const store::EndpointRecord& record);

}  // namespace kiln::api
