#pragma once
// StandaloneInstances: serving instances that belong to no endpoint — batch transform's
// (control/transform_job_run.h) — launched by the endpoint controller's machinery exactly as an
// endpoint's instances are (EndpointInstance: image, capacity through the scheduler, model data,
// `<image> serve` on the process runtime or the engine, the /ping gate, health watch, drain and
// stop), so that every rule of serving-contract.md §1–§4 holds for them too.
//
// Thread-safety: as EndpointController's (the port blocks are under its mutex).

#include <functional>
#include <memory>
#include <string>

#include "control/endpoint_controller.h"
#include "control/endpoint_instance.h"

namespace kiln::control {

class StandaloneInstances {
 public:
  // Fills in the budgets an endpoint variant that sets none gets (startup, download, provision,
  // the model archive's cap) and where `spec` listens — a block of `controller`'s ports (host mode) or a lease on
  // network `network` (namespaced mode; the network is created with `isolated` when absent, and a
  // failure is left in spec.network_error so that the instance fails with it) — and creates the
  // instance, not started: the caller owns it (Start, then RequestStop or Detach, then Join) and
  // calls RemoveNetwork once every instance on `network` stopped. nullptr when no port block is
  // free (host mode).
  static std::shared_ptr<EndpointInstance> New(EndpointController& controller, EndpointInstance::Spec spec,
                                               const std::string& network, bool isolated,
                                               std::function<void()> on_change);
  // Namespaced mode: removes `network` (logged when it cannot be). Host mode: nothing.
  static void RemoveNetwork(EndpointController& controller, const std::string& network);
};

}  // namespace kiln::control
