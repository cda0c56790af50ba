#pragma once
// The typed documents of an endpoint row (store/endpoint_repository.h) and their JSON mapping.
//
// The row keeps each document as a JSON column (deployment_json, pending_json, desired_json,
// state_json) and the status as text; these types are what code reads and writes instead of
// untyped JSON. The mapping reads exactly what earlier versions wrote (same keys, same status
// words), so existing data directories keep working; endpoint_state_test.cc holds a row in that
// format.
//
// Who writes what (the repository cannot enforce it; the API and the controller follow it):
//   - the API: `deployment` (CreateEndpoint), `pending` (UpdateEndpoint), `desired` (create,
//     update, UpdateEndpointWeightsAndCapacities), the status an operation moves to
//     (Creating, Updating, Deleting), and it clears the FailureReason when an update starts;
//   - the endpoint controller: everything in `EndpointObservedState`, the FailureReason, the
//     statuses that end an operation (InService, Failed) and the move of `pending` into
//     `deployment` when an update completes (control/endpoint_states.h has the transitions).
//
// Thread-safety: plain values.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::store {

// AWS's EndpointStatus. The column holds the AWS word (ToString).
enum class EndpointStatus {
  kOutOfService,
  kCreating,
  kUpdating,
  kSystemUpdating,
  kRollingBack,
  kInService,
  kDeleting,
  kFailed,
  kUpdateRollbackFailed,
};

// "InService", "Creating", ... (AWS's spelling, also the column's value).
std::string_view ToString(EndpointStatus status);
// InvalidArgument for a word that is not an EndpointStatus (names it).
Result<EndpointStatus> ParseEndpointStatus(std::string_view text);

// A deployment: what an endpoint runs, copied at CreateEndpoint/UpdateEndpoint time so that
// deleting a model or configuration later never changes a running endpoint. JSON:
//   {"EndpointConfigName": "cfg", "EndpointConfig": <CreateEndpointConfig request>,
//    "Models": {"<ModelName>": <CreateModel request>, ...}, "DeployedMillis": <ms>}
// The two requests stay JSON: they are the validated AWS inputs, verbatim.
struct Deployment {
  std::string config_name;
  nlohmann::json endpoint_config;  // null when absent
  nlohmann::json models = nlohmann::json::object();
  int64_t deployed_millis = 0;  // also the deployment's generation (instances carry it)

  // The configuration's ProductionVariants (or ShadowProductionVariants) entry named `variant`;
  // nullptr when none.
  const nlohmann::json* FindVariant(const std::string& variant) const;
  // Production variant names in configuration order (what requests are routed to).
  std::vector<std::string> VariantNames() const;
  // ShadowProductionVariants names (serving-contract.md §9): launched and watched like production
  // variants, sent copies of the requests, never routed to.
  std::vector<std::string> ShadowVariantNames() const;
  // VariantNames() then ShadowVariantNames(): every variant that runs instances.
  std::vector<std::string> AllVariantNames() const;
  // The CreateModel request of `model_name`; an empty object when absent.
  nlohmann::json Model(const std::string& model_name) const;

  bool operator==(const Deployment&) const = default;
};

// What the API wants of one variant (null members: not set; the configuration's initial values
// apply). JSON: {"DesiredWeight": 0.7, "DesiredInstanceCount": 2, "DesiredServerlessConfig":
// {"MaxConcurrency": 4, "ProvisionedConcurrency": 2}} — the last for serverless variants only
// (UpdateEndpointWeightsAndCapacities' ServerlessUpdateConfig, the autoscaler's
// sagemaker:variant:DesiredProvisionedConcurrency); each of its members overrides the
// configuration's ServerlessConfig member of the same name.
struct VariantDesired {
  std::optional<double> weight{};
  std::optional<int64_t> instance_count{};
  std::optional<int64_t> serverless_max_concurrency{};
  std::optional<int64_t> serverless_provisioned_concurrency{};
  bool operator==(const VariantDesired&) const = default;
};
// By variant name: the variants of `pending` while it is set, else of `deployment`.
using DesiredVariants = std::map<std::string, VariantDesired>;

// The ServerlessConfig a serverless variant runs with: the configuration variant's (`variant`, a
// ProductionVariants entry) with `desired`'s overrides applied (`desired` may be null). Null when
// the variant is not serverless.
nlohmann::json EffectiveServerlessConfig(const nlohmann::json& variant, const VariantDesired* desired);

// ProductionVariantSummary.DeployedImages[]: {"SpecifiedImage", "ResolvedImage", "ResolutionTime"}.
struct DeployedImage {
  std::string specified_image;
  std::string resolved_image;
  double resolution_time = 0;  // epoch seconds
  bool operator==(const DeployedImage&) const = default;
};

// ProductionVariantSummary.VariantStatus[]: {"Status", "StatusMessage", "StartTime"}.
struct VariantStatusEntry {
  std::string status;  // Creating | Updating (control/endpoint_status.h)
  std::string status_message;
  double start_time = 0;  // epoch seconds
  bool operator==(const VariantStatusEntry&) const = default;
};

// AWS's ProductionVariantSummary as the controller observes it. DeployedImages and RoutingConfig
// are written only when known (an empty `deployed_images` is written as absent).
struct VariantSummary {
  std::string variant_name;
  double current_weight = 0;
  double desired_weight = 0;
  int64_t current_instance_count = 0;
  int64_t desired_instance_count = 0;
  std::vector<DeployedImage> deployed_images;
  std::vector<VariantStatusEntry> variant_status;
  nlohmann::json routing_config;  // the configuration's RoutingConfig; null when absent
  bool operator==(const VariantSummary&) const = default;
};

// One serving instance the controller launched (what a restarted server adopts). JSON keys:
// InstanceId, RuntimeId, VariantName, ModelName, InstanceType, Generation, PortBase,
// LaunchedMillis, Reserved, Allocation (only when reserved).
struct InstanceRecord {
  std::string instance_id;  // i-<17 hex>
  std::string runtime_id;   // the runtime's name for it
  std::string variant;
  std::string model_name;
  std::string instance_type;
  int64_t generation = 0;  // Deployment::deployed_millis of the deployment it runs
  int64_t port_base = 0;
  int64_t launched_millis = 0;
  bool reserved = false;  // holds a scheduler allocation
  // control::Allocation's JSON (control/scheduler.h owns the type); null when absent.
  nlohmann::json allocation;
  bool operator==(const InstanceRecord&) const = default;
};

// The progress of an UpdateEndpoint's guarded rollout (DeploymentConfig, serving-contract.md §9;
// control/endpoint_rollout.h decides it), kept in the row so that a restarted server resumes the
// shift where it was: the same traffic share, the same bake deadline. JSON keys: Generation,
// Phase, Step, Fraction, UntilMillis, StartedMillis. Written by the controller only.
struct RolloutState {
  enum class Phase {
    kBaking,           // the new fleet gets `fraction` of the traffic until `until_millis`
    kTerminationWait,  // all traffic on the new fleet, the old one kept until `until_millis`
    kProvisioning,     // rolling: batch `step` of new instances is coming up (not routed yet)
  };
  int64_t generation = 0;  // the pending Deployment::deployed_millis this rollout moves to
  Phase phase = Phase::kBaking;
  int64_t step = 0;            // 1-based: the traffic step (blue/green) or batch (rolling) reached
  double fraction = 0;         // the new fleet's share of the traffic, 0..1
  int64_t until_millis = 0;    // wall-clock end of the bake or of the termination wait
  int64_t started_millis = 0;  // wall-clock time of the first shift
  bool operator==(const RolloutState&) const = default;
};

std::string_view ToString(RolloutState::Phase phase);

// What the controller observed, written by it only. JSON:
//   {"ProductionVariants": [<VariantSummary>...], "Instances": [<InstanceRecord>...],
//    "Credentials": <control::CredentialToJson>,   (Credentials only once issued)
//    "Rollout": <RolloutState>}                   (only while a guarded update shifts traffic)
struct EndpointObservedState {
  std::vector<VariantSummary> production_variants;
  std::vector<InstanceRecord> instances;
  nlohmann::json credentials;  // null until the controller issued the instances' credentials
  std::optional<RolloutState> rollout{};
  bool operator==(const EndpointObservedState&) const = default;
};

// JSON mapping. FromJson: InvalidArgument naming the member when a member has the wrong type
// or a required one (VariantName, InstanceId, RuntimeId) is missing; other missing members take
// their defaults.
nlohmann::json ToJson(const Deployment& d);
Result<Deployment> DeploymentFromJson(const nlohmann::json& j);
nlohmann::json ToJson(const DesiredVariants& d);
Result<DesiredVariants> DesiredVariantsFromJson(const nlohmann::json& j);
nlohmann::json ToJson(const VariantSummary& v);
Result<VariantSummary> VariantSummaryFromJson(const nlohmann::json& j);
nlohmann::json ToJson(const InstanceRecord& r);
Result<InstanceRecord> InstanceRecordFromJson(const nlohmann::json& j);
nlohmann::json ToJson(const RolloutState& r);
Result<RolloutState> RolloutStateFromJson(const nlohmann::json& j);
nlohmann::json ToJson(const EndpointObservedState& s);
Result<EndpointObservedState> ObservedStateFromJson(const nlohmann::json& j);

}  // namespace kiln::store
