#include "control/endpoint_states.h"

#include <atomic>
#include <string>

#include "base/log.h"

namespace kiln::control {
namespace {

using store::EndpointStatus;

std::atomic<int64_t> illegal_transitions{0};

struct StatusEdge {
  EndpointStatus from;
  EndpointStatus to;
};
constexpr StatusEdge kStatusEdges[] = {
    {EndpointStatus::kCreating, EndpointStatus::kInService},        // every variant healthy
    {EndpointStatus::kCreating, EndpointStatus::kFailed},           // an instance failed
    {EndpointStatus::kInService, EndpointStatus::kUpdating},        // the API: an update starts
    {EndpointStatus::kUpdating, EndpointStatus::kInService},        // done, or rolled back
    {EndpointStatus::kSystemUpdating, EndpointStatus::kInService},  // done
    // A guarded update (DeploymentConfig) rolled back after traffic had shifted: the old fleet
    // takes it all back, then InService, or UpdateRollbackFailed when the old fleet cannot serve.
    {EndpointStatus::kUpdating, EndpointStatus::kRollingBack},
    {EndpointStatus::kRollingBack, EndpointStatus::kInService},
    {EndpointStatus::kRollingBack, EndpointStatus::kUpdateRollbackFailed},
    // DeleteEndpoint, from any status but Deleting.
    {EndpointStatus::kOutOfService, EndpointStatus::kDeleting},
    {EndpointStatus::kCreating, EndpointStatus::kDeleting},
    {EndpointStatus::kUpdating, EndpointStatus::kDeleting},
    {EndpointStatus::kSystemUpdating, EndpointStatus::kDeleting},
    {EndpointStatus::kRollingBack, EndpointStatus::kDeleting},
    {EndpointStatus::kInService, EndpointStatus::kDeleting},
    {EndpointStatus::kFailed, EndpointStatus::kDeleting},
    {EndpointStatus::kUpdateRollbackFailed, EndpointStatus::kDeleting},
};

struct PhaseEdge {
  InstancePhase from;
  InstancePhase to;
};
constexpr PhaseEdge kPhaseEdges[] = {
    {InstancePhase::kProvisioning, InstancePhase::kStarting},  // launched
    {InstancePhase::kProvisioning, InstancePhase::kFailed},    // image, capacity, model data, launch
    {InstancePhase::kProvisioning, InstancePhase::kDraining},  // stopped before it launched
    {InstancePhase::kStarting, InstancePhase::kInService},     // GET /ping answered 200
    {InstancePhase::kStarting, InstancePhase::kFailed},        // exited, or no 200 in the budget
    {InstancePhase::kStarting, InstancePhase::kDraining},      // stopped while starting
    {InstancePhase::kInService, InstancePhase::kFailed},       // exited, or failed health checks
    {InstancePhase::kInService, InstancePhase::kDraining},     // scale-in, update, delete
    {InstancePhase::kFailed, InstancePhase::kDraining},        // every failed instance is stopped
    {InstancePhase::kDraining, InstancePhase::kStopped},
    {InstancePhase::kProvisioning, InstancePhase::kDetached},  // server shutdown
    {InstancePhase::kStarting, InstancePhase::kDetached},
    {InstancePhase::kInService, InstancePhase::kDetached},
    {InstancePhase::kFailed, InstancePhase::kDetached},
    {InstancePhase::kDraining, InstancePhase::kDetached},
};

void Illegal(std::string_view endpoint, std::string_view instance, const char* what, std::string_view from,
             std::string_view to) {
  illegal_transitions.fetch_add(1);
  KLOG(error, "internal error: illegal endpoint transition",
       {{"endpoint", std::string(endpoint)},
        {"instance", std::string(instance)},
        {"what", what},
        {"from", std::string(from)},
        {"to", std::string(to)}});
}

}  // namespace

std::string_view ToString(InstancePhase phase) {
  switch (phase) {
    case InstancePhase::kProvisioning: return "provisioning";
    case InstancePhase::kStarting: return "starting";
    case InstancePhase::kInService: return "in-service";
    case InstancePhase::kFailed: return "failed";
    case InstancePhase::kDraining: return "draining";
    case InstancePhase::kStopped: return "stopped";
    case InstancePhase::kDetached: return "detached";
  }
  return "unknown";
}

bool IsLegal(EndpointStatus from, EndpointStatus to) {
  if (from == to) return true;
  for (const StatusEdge& e : kStatusEdges) {
    if (e.from == from && e.to == to) return true;
  }
  return false;
}

bool IsLegal(InstancePhase from, InstancePhase to) {
  if (from == to) return true;
  for (const PhaseEdge& e : kPhaseEdges) {
    if (e.from == from && e.to == to) return true;
  }
  return false;
}

void SetStatus(store::EndpointRecord& record, EndpointStatus to) {
  if (!IsLegal(record.status, to))
    Illegal(record.name, "", "status", store::ToString(record.status), store::ToString(to));
  record.status = to;
}

void CheckInstancePhaseChange(std::string_view endpoint, std::string_view instance, InstancePhase from,
                              InstancePhase to) {
  if (!IsLegal(from, to)) Illegal(endpoint, instance, "instance phase", ToString(from), ToString(to));
}

int64_t IllegalEndpointTransitions() { return illegal_transitions.load(); }

}  // namespace kiln::control
