#pragma once
// The one thing the API needs from the endpoint controller: after committing a change to an
// endpoint's row (CreateEndpoint, UpdateEndpoint, UpdateEndpointWeightsAndCapacities,
// DeleteEndpoint), the API calls EndpointChanged so the controller reconciles it. The call only
// enqueues (never blocks on instances).
//
// Thread-safety: implementations accept calls from any thread.

#include <string>

namespace kiln::control {

class EndpointNotifier {
 public:
  virtual ~EndpointNotifier() = default;
  virtual void EndpointChanged(const std::string& endpoint_name) = 0;
};

}  // namespace kiln::control
