#include "control/transform_instances.h"

#include <algorithm>

#include "base/log.h"
#include "control/archive_caps.h"
#include "control/training_launch.h"

namespace kiln::control {

std::shared_ptr<EndpointInstance> StandaloneInstances::New(EndpointController& controller, EndpointInstance::Spec spec,
                                                           const std::string& network, bool isolated,
                                                           std::function<void()> on_change) {
  // The budgets and caps an endpoint variant that sets none gets.
  spec.startup_timeout = controller.options_.default_startup_timeout;
  spec.download_timeout = controller.options_.default_download_timeout;
  spec.provision_timeout = controller.options_.default_provision_timeout;
  spec.unpack_cap = ModelDataCap(nlohmann::json::object(), controller.options_.archive_caps);
  if (controller.deps_.networks != nullptr) {
    spec.port_base = 0;
    auto ensured = controller.deps_.networks->Ensure(network, isolated);
    if (!ensured.ok()) {
      spec.network_error =
          "InternalServerError: The network " + network + " could not be created: " + ensured.status().message();
    } else {
      auto attached = controller.deps_.networks->Attach(network, spec.runtime_id,
                                                        LoopbackForwards(controller.options_.endpoint_url));
      if (attached.ok()) {
        spec.network = std::move(*attached);
      } else {
        spec.network_error = "InternalServerError: No address for instance " + spec.instance_id + " on network " +
                             network + ": " + attached.status().message();
      }
    }
  } else {
    // One block of ports per container (an inference pipeline's, serving-contract.md §2).
    spec.port_base = controller.ReservePorts(std::max<int>(1, static_cast<int>(spec.containers.size())));
    if (spec.port_base == 0) return nullptr;
  }
  return std::make_shared<EndpointInstance>(*controller.instance_env_, std::move(spec), false, std::nullopt,
                                            std::move(on_change));
}

void StandaloneInstances::RemoveNetwork(EndpointController& controller, const std::string& network) {
  if (controller.deps_.networks == nullptr) return;
  if (Status s = controller.deps_.networks->Remove(network); !s.ok()) {
    KLOG(warn, "instance network not removed", {{"network", network}, {"error", s.ToString()}});
  }
}

}  // namespace kiln::control
