#pragma once
// The routing snapshot (DESIGN.md §2, §7): what the invoke path needs to know about an endpoint,
// published by the endpoint controller and read by the router without a mutex or SQLite (an
// atomic<shared_ptr> load; see RoutingTable::Find).
//
// A snapshot is immutable once published: the controller builds a new EndpointRoute for every
// change (an instance became healthy or was removed, weights changed, status changed) and swaps
// it in with RoutingTable::Publish. The InstanceTarget objects are shared between successive
// snapshots (the controller keeps one per live instance), so the in-flight counter of an instance
// survives re-publishing, and the controller can drain an instance by removing it from the next
// snapshot and waiting until `outstanding` reaches 0.
//
// Thread-safety: RoutingTable methods may be called from any thread. Readers hold a
// shared_ptr to the snapshot they read for the whole request, and nothing longer: the endpoint
// controller considers an instance drained once its InstanceTarget is referenced by nothing but
// the controller (no published snapshot, no request holding one), so readers must not keep a
// route or a target beyond the request.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/mutex.h"
#include "net/http_client.h"

namespace kiln::serving {

struct DataCaptureSettings;  // serving/data_capture.h

// One container of a multi-container instance (serving-contract.md §8): all of an instance's
// containers share its network, each on its own port.
struct ContainerTarget {
  std::string hostname;    // ContainerHostname, or "container-<n>" for an unnamed pipeline container
  std::string host;        // the instance's address
  uint16_t port = 0;       // its SAGEMAKER_BIND_TO_PORT
  std::string log_stream;  // "<VariantName>/<instance-id>/<hostname>"
};

// How a variant's model calls its containers (serving-contract.md §8).
enum class ContainerMode {
  kSingle,  // one container at InstanceTarget::host:port
  kSerial,  // an inference pipeline: every container in order, each answer the next request
  kDirect,  // X-Amzn-SageMaker-Target-Container-Hostname names the one container called
};

// One serving instance (a container listening on host:port).
struct InstanceTarget {
  std::string instance_id;  // Kiln's id, "i-0a1b2c3d4e5f60718"; stable for the instance's life
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string container_hostname;  // for error messages; AWS says "primary" for single-container
  std::string log_stream;          // "<VariantName>/<instance-id>"
  // Requests sent to this instance and not yet answered. Maintained by the router (increment
  // before sending, decrement after the response is read or the call failed).
  mutable std::atomic<int64_t> outstanding{0};
  // Set once by the endpoint controller when it declares the instance failed (it stopped
  // answering /ping, or its process exited), and when it stops the instance with requests still
  // in flight after its drain time. Never set during a normal drain. The router passes it with
  // every call to this instance: calls in flight end at once with ModelError instead of waiting
  // for the invocation timeout, and a call not yet sent goes to another instance (or gets 503).
  // The reason is the controller's account of what happened (quoted in the client's error).
  net::CancelSignal failure;
  // Multi-model endpoints (serving/multi_model.h): the host directory that is the instance's
  // /opt/ml/models, and its vCPUs (requests in flight at or above them saturate it, §7.3).
  std::string models_dir;
  int vcpus = 1;
  // Multi-container models: every container, in the model's order (host:port above is the
  // first's). Empty for single-container models.
  std::vector<ContainerTarget> containers;
};

enum class RoutingStrategy {
  kLeastOutstandingRequests,  // AWS: LEAST_OUTSTANDING_REQUESTS (Kiln default, as AWS's)
  kRandom,                    // AWS: RANDOM
};

struct VariantRoute {
  std::string name;     // VariantName
  double weight = 1.0;  // CurrentWeight; 0 = only reachable through TargetVariant
  RoutingStrategy strategy = RoutingStrategy::kLeastOutstandingRequests;
  // Routable (healthy, not draining) instances. May be empty: requests to the variant then get
  // ServiceUnavailable.
  std::vector<std::shared_ptr<const InstanceTarget>> instances;
  // Mode MultiModel (serving-contract.md §7): the model's ModelDataUrl, the S3 prefix TargetModel
  // is relative to ("" for a single-model variant), and MultiModelConfig.ModelCacheSetting.
  std::string model_data_url;
  bool model_cache_enabled = true;
  // Multi-container models (§8): Serial or Direct; kSingle otherwise.
  ContainerMode container_mode = ContainerMode::kSingle;
};

struct EndpointRoute {
  std::string name;  // as created (lookups are case-sensitive, as AWS's are for invocations)
  std::string arn;
  // EndpointStatus. InvokeEndpoint is served in InService, Updating and SystemUpdating (and
  // RollingBack, which still serves the old fleet); any other status → "not in service".
  std::string status;
  // "arn:aws:logs:<region>:<account>:log-group:/aws/sagemaker/Endpoints/<name>" (ModelError's
  // LogStreamArn, which despite its name carries the group ARN in AWS's answers).
  std::string log_group_arn;
  std::vector<VariantRoute> variants;
  bool async = false;  // AsyncInferenceConfig set: only InvokeEndpointAsync is allowed
  // The endpoint configuration's AsyncInferenceConfig as JSON text ("" when not async): what
  // InvokeEndpointAsync (output locations) and the async dispatcher (concurrency, notifications)
  // read.
  std::string async_config;
  // Mode MultiModel: X-Amzn-SageMaker-Target-Model is accepted (and required by the container);
  // on any other endpoint the router refuses it with ValidationError.
  bool multi_model = false;
  // Some variant's model is multi-container with Mode Direct: X-Amzn-SageMaker-Target-Container-
  // Hostname is accepted (on any other endpoint the router refuses it with ValidationError).
  bool direct = false;
  // Some variant is an inference pipeline (several containers, Mode Serial): it makes one
  // blocking upstream call per container, so the front door serves the endpoint's invocations on
  // worker threads (Router::Invoke; FrontDoor::Claims). Direct variants need no such thing: one
  // call, on the event loop like any other.
  bool pipeline = false;
  // Serverless (serving-contract.md §12; its one variant has a ServerlessConfig): MaxConcurrency,
  // the most requests in flight to the endpoint (0: not serverless), and ProvisionedConcurrency,
  // the instances kept warm (0 when unset). The router admits requests through its
  // ServerlessGate and waits for an idle instance (router.h).
  int serverless_max_concurrency = 0;
  int serverless_provisioned = 0;
  // ShadowProductionVariants (serving-contract.md §9): never picked for a request; the router's
  // InvocationObserver sends each request a copy (serving/shadow_variants.h).
  std::vector<VariantRoute> shadow_variants;
  // An UpdateEndpoint shifting traffic under a DeploymentConfig (serving-contract.md §9): the new
  // deployment's variants (its instances only; `variants` are the old fleet's) and the share of
  // requests they get, in [0, 1]. The router picks the fleet first (the new one with probability
  // new_fleet_fraction), then the variant by weight within it; a TargetVariant is looked up in the
  // picked fleet first, then in the other. Empty / 0 when no shift is under way.
  std::vector<VariantRoute> new_variants;
  double new_fleet_fraction = 0;
  // DataCaptureConfig, parsed (serving/data_capture.h); null when the endpoint captures nothing.
  std::shared_ptr<const DataCaptureSettings> data_capture;
};

// Name → current snapshot. Publish/Remove replace the whole map copy-on-write: writers are rare
// (controller events), readers are every invocation.
class RoutingTable {
 public:
  using Map = std::map<std::string, std::shared_ptr<const EndpointRoute>, std::less<>>;

  // Adds or replaces the route of route->name.
  void Publish(std::shared_ptr<const EndpointRoute> route) {
    MutexLock lock(write_mutex_);
    auto next = std::make_shared<Map>(*map_.load(std::memory_order_acquire));
    (*next)[route->name] = std::move(route);
    map_.store(std::shared_ptr<const Map>(std::move(next)), std::memory_order_release);
  }

  void Remove(std::string_view name) {
    MutexLock lock(write_mutex_);
    auto next = std::make_shared<Map>(*map_.load(std::memory_order_acquire));
    auto it = next->find(name);
    if (it == next->end()) return;
    next->erase(it);
    map_.store(std::shared_ptr<const Map>(std::move(next)), std::memory_order_release);
  }

  // The current route of `name`, or null. Readers take no mutex and touch no SQLite: one
  // atomic<shared_ptr> load. It is not lock-free: libstdc++ (GCC 12) guards the control-block
  // pointer with a one-bit spin lock inside the atomic, held only for the reference-count
  // increment, so readers never wait on a writer's map copy (made before the store).
  std::shared_ptr<const EndpointRoute> Find(std::string_view name) const {
    std::shared_ptr<const Map> map = map_.load(std::memory_order_acquire);
    auto it = map->find(name);
    return it == map->end() ? nullptr : it->second;
  }

  std::shared_ptr<const Map> All() const { return map_.load(std::memory_order_acquire); }

 private:
  Mutex write_mutex_;  // serialises writers' copy-modify-store, so none is lost
  std::atomic<std::shared_ptr<const Map>> map_{std::make_shared<const Map>()};
};

}  // namespace kiln::serving
