#pragma once
// The legal changes of an endpoint's status and of a serving instance's phase: one table each,
// consulted whenever the endpoint controller (or the API, for the statuses that start an
// operation) changes them.
//
//   status (API):        Creating (CreateEndpoint)
//                        InService ──► Updating              (UpdateEndpoint, ...WeightsAndCapacities)
//                        any but Deleting ──► Deleting       (DeleteEndpoint; the row then goes)
//   status (controller): Creating ──► InService | Failed
//                        Updating | SystemUpdating ──► InService   (done, or an update rolled back:
//                                                                   InService with FailureReason)
//
// Kiln never enters RollingBack, OutOfService or UpdateRollbackFailed (AWS values kept in the
// enum for completeness): a failed update goes straight back to InService, as AWS's reaches it.
// Staying in the same status is always legal (an idempotent write). Failed and Deleting are
// terminal but for the delete.
//
//   instance phase:  provisioning ──► starting ──► in-service
//                         │              │             │
//                         └──────────────┴──► failed ◄─┘      (image, capacity, model data,
//                         │              │      │              launch, /ping, health, exit)
//                         └──────────────┴──────┴──► draining ──► stopped
//                    any but stopped ──► detached   (server shutdown: the process is left
//                                                    running for the next server to adopt)
//
// An illegal change is a bug in Kiln, not a user error: SetStatus / InstancePhaseChange log it as
// an internal error and count it (the controller tests assert the count stays 0), and the change
// is still made, so that an endpoint is never left stuck by the check itself.
//
// Thread-safety: pure functions; the counter is atomic.

#include <cstdint>
#include <string_view>

#include "store/endpoint_repository.h"
#include "store/endpoint_state.h"

namespace kiln::control {

// Where one serving instance (control/endpoint_controller.cc's InstanceRun) is in its life.
enum class InstancePhase {
  kProvisioning,  // image resolved, waiting for capacity, downloading model data, launching
  kStarting,      // launched (or adopted), not yet answering GET /ping
  kInService,     // healthy: routable
  kFailed,        // failed (why: the instance's failure reason); drained and stopped next
  kDraining,      // out of routing, waiting for requests in flight, then SIGTERM/SIGKILL
  kStopped,       // the process is gone and its resources released
  kDetached,      // server shutdown: left running for the next server
};

std::string_view ToString(InstancePhase phase);

bool IsLegal(store::EndpointStatus from, store::EndpointStatus to);
bool IsLegal(InstancePhase from, InstancePhase to);

// Sets record.status to `to`, logging (and counting) an illegal change.
void SetStatus(store::EndpointRecord& record, store::EndpointStatus to);
// Logs (and counts) the instance's change when illegal; the caller makes it.
void CheckInstancePhaseChange(std::string_view endpoint, std::string_view instance, InstancePhase from,
                              InstancePhase to);

// Illegal endpoint status or instance phase changes seen by this process so far.
int64_t IllegalEndpointTransitions();

}  // namespace kiln::control
