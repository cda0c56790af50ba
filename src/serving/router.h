#pragma once
// Router: one InvokeEndpoint from the front door to a serving container and back
// (spec/runtime-api.md §3, §5; spec/serving-contract.md §5.2, §5.3; DESIGN.md §7).
//
// For each request the router loads the endpoint's routing snapshot once (RoutingTable::Find, one
// atomic shared_ptr load) and holds it to the end. In order:
//   1. endpoint lookup and status (ValidationError: not found / not in service / async);
//   2. header validation (ValidationError), runtime-api.md §3.1;
//   3. variant: X-Amzn-SageMaker-Target-Variant, else weighted random over CurrentWeight
//      (all weights 0 → ValidationError);
//   4. instance: least outstanding requests (ties broken at random) or random, per the variant's
//      RoutingStrategy; none → ServiceUnavailable 503;
//   5. POST /invocations over the pooled client with only the headers of serving-contract §5.3
//      (+ X-Amzn-RequestId, X-Amzn-SageMaker-Session-Id); a connection that cannot be made is
//      tried once more on another instance of the variant when there is one;
//   6. the answer: 2xx → 200 with the container's body and headers of runtime-api.md §3.2;
//      anything else → ModelError 424 (§5.1/§5.2 body members).
// Every request that got past variant selection is counted in InvocationMetrics.
//
// Two ways in, one set of steps: Invoke (blocking, over the shared HttpClient; the front door's
// worker threads use it for chunked and 100-continue bodies) and InvokeAsync (on an event loop,
// over that loop's AsyncHttpClient; the answer comes through a completion). Both run the same
// Prepare (steps 1-5's set-up), Retry (step 5's second try) and Answer (step 6) functions; only
// the upstream call differs.
//
// Nothing here touches SQLite or takes a lock shared by all requests: the snapshot load, the
// instance's atomic `outstanding` counter (shared by every loop and thread, so least-outstanding
// selection sees all their calls) and the metrics shard mutex are all there is. Nothing blocks
// except the blocking client's Send in Invoke.
//
// Thread-safety: Invoke and InvokeAsync may be called concurrently from any number of threads
// (InvokeAsync on the thread of the loop owning `client`).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "aws/errors.h"
#include "base/io.h"
#include "net/async_http_client.h"
#include "net/http_client.h"
#include "net/http_server.h"
#include "serving/invocation_metrics.h"
#include "serving/multi_model.h"
#include "serving/routing.h"

namespace kiln::serving {

struct RouterOptions {
  // The container's budget to answer /invocations (serving-contract §5.2: AWS's 60 s). Tests
  // lower it; raising it lets a hung container hold a server thread longer.
  int invocation_timeout_ms = 60000;
  // TCP connect budget per attempt (AWS: 250 ms), after which another instance is tried once.
  int connect_timeout_ms = 250;
  // Request bodies above this get 413 (runtime-api.md §2). The front door enforces it while
  // reading; the router only reports it (ContentLengthExceeded).
  size_t max_request_body_bytes = 6291456;
  // Container responses above this become ModelError (serving-contract §5.3). The HttpClient's
  // own max_response_body_bytes must be at least this (the client enforces its own limit).
  size_t max_response_body_bytes = 6 * 1024 * 1024;
};

// Serverless endpoints (serving-contract.md §12; EndpointRoute::serverless_max_concurrency > 0):
// what the router asks before it serves one, and tells after. Implemented by the control plane's
// serverless scaler (control/serverless_scaler.h), which sizes the endpoint's pool from the
// requests in flight. Called from any thread.
class ServerlessGate {
 public:
  virtual ~ServerlessGate() = default;
  // Admits one request: false when MaxConcurrency requests are already in flight to the endpoint
  // (→ ThrottlingException). Admitted requests count toward the pool size until Leave.
  virtual bool Admit(const EndpointRoute& route) = 0;
  virtual void Leave(const EndpointRoute& route) = 0;
  // A request waited `micros` for an instance to start (a cold start: ModelSetupTime, §15.2).
  virtual void ColdStart(const EndpointRoute& route, const std::string& variant, int64_t micros) = 0;
};

// One answered invocation as the router's InvocationObserver sees it. Everything it points to
// lives only for the Invoked call: an observer copies what it keeps.
struct ObservedInvocation {
  const std::shared_ptr<const EndpointRoute>* route = nullptr;  // the snapshot the request used
  const VariantRoute* variant = nullptr;                        // the production variant that served it
  const HeaderMap* forward = nullptr;                           // the headers the container got
  std::string_view body;                                        // the request body
  const aws::WireResponse* answer = nullptr;                    // what the client gets (200 or an error)
  int64_t epoch_millis = 0;                                     // when the answer was ready
};

// Told of every invocation that reached an instance of an endpoint whose route has data capture
// or shadow variants (EndpointRoute::data_capture, ::shadow_variants): serving/data_capture.h
// captures it and hands shadow copies to serving/shadow_variants.h. Called on the invoke path
// (an event loop or a worker thread) before the answer leaves on the event loop, after it on a
// worker: it must not block and should cost no more than copying what it keeps.
class InvocationObserver {
 public:
  virtual ~InvocationObserver() = default;
  virtual void Invoked(const ObservedInvocation& invocation) = 0;
};

// What the front door hands over for one InvokeEndpoint.
struct InvokeRequest {
  std::string_view endpoint_name;      // from the path, already pattern-checked
  const HeaderMap* headers = nullptr;  // the client's request headers
  std::string_view body;
  std::string_view request_id;  // x-amzn-RequestId of the answer
  std::string_view account_id;  // for "Endpoint <name> of account <account> not found."
  // steady_clock time (ns since its epoch) when the request arrived, for OverheadLatency.
  int64_t start_steady_ns = 0;
};

// Receives InvokeAsync's whole answer (success or error), exactly once.
using InvokeCompletion = std::function<void(aws::WireResponse answer)>;

class Router {
 public:
  // `routes` and `client` must outlive the router; `metrics` may be null (nothing counted).
  Router(RouterOptions options, const RoutingTable* routes, net::HttpClient* client, InvocationMetrics* metrics);
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Serves one InvokeEndpoint and writes the whole answer (success or error) to `response`.
  // Never throws; a write error (the client went away) ends the call.
  //
  // A serverless endpoint (with a gate set): the request is admitted by the gate (refused:
  // ThrottlingException 429), then waits — blocking this thread, which is why the front door
  // sends serverless endpoints here and never to InvokeAsync — until the endpoint has an idle
  // routable instance (one in-flight request per instance, Kiln's choice; the gate's scaler
  // starts one when none is idle), at most invocation_timeout_ms from the request's arrival
  // (then ModelNotReadyException 429, runtime-api.md). A wait that found no idle instance at
  // first is a cold start, reported to the gate with its duration.
  void Invoke(const InvokeRequest& request, net::ResponseWriter& response);

  // Set before serving (not thread-safe with calls); null: serverless routes are served as any other.
  void SetServerlessGate(ServerlessGate* gate) { gate_ = gate; }
  // Set before serving (not thread-safe with calls); null: nothing is captured or shadowed.
  void SetInvocationObserver(InvocationObserver* observer) { observer_ = observer; }
  // True when `endpoint`'s current route is serverless and a gate is set: the front door serves
  // such invocations on a worker thread (FrontDoor::Claims).
  bool IsServerless(std::string_view endpoint) const;
  // Set before serving (not thread-safe with calls); null: a multi-model route's requests go to
  // /invocations as any other. Set: Invoke places TargetModel (serving/multi_model.h) and calls
  // POST /models/<name>/invoke.
  void SetMultiModel(MultiModelManager* manager) { multi_model_ = manager; }
  // True when `endpoint`'s current route is multi-model and a manager is set: a request may wait
  // for its model to load, so the front door serves it on a worker thread (FrontDoor::Claims).
  bool IsMultiModel(std::string_view endpoint) const;
  // True when `endpoint`'s current route has an inference pipeline (serving-contract.md §8.2):
  // it makes one upstream call per container, so the front door serves it on a worker thread
  // (FrontDoor::Claims), where Invoke runs the chain. Direct multi-container calls are single
  // calls and take either path.
  bool IsPipeline(std::string_view endpoint) const;

  // The same InvokeEndpoint without blocking: the container call goes through `client` (the
  // calling loop's; call on its thread) and `done` receives the answer on that thread — inline,
  // before InvokeAsync returns, when the request ends before the call (validation errors, 413,
  // no instance), else from the client's completion. Everything `request` views (headers, body,
  // ids) must stay valid until `done` has run; the router keeps its own state (the snapshot, the
  // forwarded headers) alive itself.
  void InvokeAsync(const InvokeRequest& request, net::AsyncHttpClient& client, InvokeCompletion done);

  // The 413 answer for a body over the limit (runtime-api.md §3.3 step 4): no error type, body
  // {"message": "HTTP content length exceeded 6291456 bytes."}.
  aws::WireResponse ContentLengthExceeded(std::string_view request_id) const;

  const RouterOptions& options() const { return options_; }

  // Exposed for tests (pure functions over a snapshot).
  // The variant for a request: `target_variant` when non-empty (null when unknown), else a
  // weighted pick with `uniform` in [0, 1) (null when every weight is 0 or there are no variants).
  static const VariantRoute* PickVariant(const EndpointRoute& route, std::string_view target_variant, double uniform);
  // The same over one fleet's variants.
  static const VariantRoute* PickVariant(const std::vector<VariantRoute>& variants, std::string_view target_variant,
                                         double uniform);
  // During a traffic shift (EndpointRoute::new_variants): the new fleet when `fleet_uniform` in
  // [0, 1) is below new_fleet_fraction, else the old one; then PickVariant within it. A
  // TargetVariant the picked fleet lacks is looked up in the other one. Without a shift,
  // PickVariant(route, ...).
  static const VariantRoute* PickFleetVariant(const EndpointRoute& route, std::string_view target_variant,
                                              double fleet_uniform, double uniform);
  // The instance for a request (null when none): least outstanding with random ties, or
  // uniformly random; `exclude` (may be null) is skipped (the retry after a failed connect).
  static const InstanceTarget* PickInstance(const VariantRoute& variant, const InstanceTarget* exclude);

 private:
  // One invocation between its checks and its answer (router.cc).
  struct Call;
  // Steps 1-4 and the call's set-up. Returns the answer when the request ends here (it is then
  // not sent); otherwise `call` is ready to send to call.instance.
  std::optional<aws::WireResponse> Prepare(const InvokeRequest& request, Call& call) const;
  // After a failed attempt: true when it is worth a second one (nothing was delivered and another
  // instance exists), with call.instance switched to it.
  bool Retry(const Result<net::ClientResponse>& result, Call& call) const;
  // Step 6: the client's answer for the container's `result`.
  aws::WireResponse Answer(Call& call, Result<net::ClientResponse> result) const;
  // Counts a request that got past variant selection, once its answer is out.
  void Record(Call& call) const;
  // The serverless admission and wait of Invoke: the answer when the request ends there (the
  // gate is then left already); otherwise the caller leaves the gate once it has answered.
  std::optional<aws::WireResponse> AwaitServerless(const InvokeRequest& request, const EndpointRoute& route) const;
  // Tells the observer of an answered call when its route asks for it (data capture, shadows).
  void Observe(const Call& call, const aws::WireResponse& answer) const;
  // Invoke's multi-model step (§7.3): the model placed and loaded, call.instance and the target
  // set to it. The answer when the request ends there (the lease is then empty).
  std::optional<aws::WireResponse> PlaceModel(Call& call, ModelLease& lease) const;
  // Invoke's inference pipeline (§8.2, serving/pipeline.h): every container of call.instance in
  // order; the client's answer (the last container's, or the ModelError naming the one that
  // failed). Counts ContainerLatency per container; call.sample gets the sum as ModelLatency.
  aws::WireResponse InvokePipeline(Call& call) const;
  // InvokeAsync's attempt on call->instance; retries or completes from the client's callback.
  void SendAsync(std::shared_ptr<Call> call, net::AsyncHttpClient& client, InvokeCompletion done) const;

  const RouterOptions options_;
  const RoutingTable* const routes_;
  net::HttpClient* const client_;
  InvocationMetrics* const metrics_;
  ServerlessGate* gate_ = nullptr;
  MultiModelManager* multi_model_ = nullptr;
  InvocationObserver* observer_ = nullptr;
};

// The calling thread's fast PRNG (xoshiro256**), seeded from std::random_device on first use.
uint64_t ThreadRandom();
// A double in [0, 1) from ThreadRandom().
double ThreadUniform();
// Reseeds the calling thread's PRNG (tests that check split statistics with a fixed seed).
void SeedThreadRandomForTest(uint64_t seed);

}  // namespace kiln::serving
