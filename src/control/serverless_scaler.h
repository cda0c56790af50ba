#pragma once
// ServerlessScaler: sizes the instance pool of serverless endpoints (spec serving-contract.md §12)
// and admits their requests (serving::ServerlessGate, called by Router::Invoke).
//
// Kiln runs a serverless variant as a pool of ordinary endpoint instances (EndpointController;
// each sized ml.serverless.<MemorySizeInMB>: MemorySizeInMB of memory, 1 vCPU per 1024 MB), one
// in-flight request per instance (Kiln's choice). The pool size is the endpoint row's desired
// instance count of the variant (store::EndpointRecord::desired, as the autoscaler and
// UpdateEndpointWeightsAndCapacities write it): the controller's plan already launches and drains
// to that count, survives restarts with it, and keeps the endpoint InService at 0 — so the
// serverless scaler only decides the number, and the controller stays the only one that starts
// and stops instances. The row is written without changing the status (a serverless endpoint
// stays InService while its pool moves, as AWS's do) and the controller is notified.
//
// The number, per endpoint: max(ProvisionedConcurrency, the requests in flight now, the most
// requests that were in flight at once during the last `idle` span), at most MaxConcurrency. A
// request admitted when every instance is busy (or there is none) raises it at once (the loop
// is woken: the new instance starts while the request waits in Router::Invoke); an instance
// left idle for `idle` (config serverless.idle_seconds, default 600 s) is stopped, down to
// ProvisionedConcurrency (0 when unset). Admission refuses a request when MaxConcurrency are in
// flight (Router → ThrottlingException).
//
// ModelSetupTime (§15.2; AWS/SageMaker, {EndpointName, VariantName}, Microseconds): each cold
// start the router reports (how long a request waited for a new instance) becomes one sample,
// written to the metric store by the loop. A variant with ProvisionedConcurrency also gets, each
// tick, ServerlessProvisionedConcurrencyExecutions (the most requests in flight since the last
// tick, at most ProvisionedConcurrency) and ServerlessProvisionedConcurrencyUtilization
// (executions / ProvisionedConcurrency): AWS's metrics, the second the one Application Auto
// Scaling's SageMakerVariantProvisionedConcurrencyUtilization tracks.
//
// Serverless endpoints are found in the routing table (EndpointRoute::serverless_max_concurrency);
// one first seen (a new endpoint, or all of them after a restart) counts its routable instances
// as in use now, so a restarted server keeps them for `idle` before shrinking.
//
// Thread-safety: Admit/Leave/ColdStart from any thread (one mutex, no I/O under it); Start/Stop
// from the owner. The loop thread is the only one that writes rows and metrics.

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "control/endpoint_notifier.h"
#include "observe/metric_store.h"
#include "serving/router.h"
#include "serving/routing.h"
#include "store/database.h"
#include "store/endpoint_repository.h"

namespace kiln::control {

struct ServerlessScalerOptions {
  std::chrono::milliseconds idle{600000};  // an instance idle this long is stopped (Kiln: 10 min)
  std::chrono::milliseconds tick{1000};    // the loop's period when nothing wakes it
  // Requests in flight at once over all serverless endpoints (AWS's regional quota: 1000 in large
  // regions; config serverless.account_max_concurrency). Beyond it → ThrottlingException.
  int account_max_concurrency = 1000;
};

struct ServerlessScalerDeps {
  store::Database* database = nullptr;
  observe::MetricStore* metrics = nullptr;  // may be null: ModelSetupTime is not recorded
  EndpointNotifier* notifier = nullptr;
  const serving::RoutingTable* routes = nullptr;
};

class ServerlessScaler final : public serving::ServerlessGate {
 public:
  ServerlessScaler(ServerlessScalerOptions options, ServerlessScalerDeps deps);
  ~ServerlessScaler() override;  // Stop()
  ServerlessScaler(const ServerlessScaler&) = delete;
  ServerlessScaler& operator=(const ServerlessScaler&) = delete;

  void Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

  bool Admit(const serving::EndpointRoute& route) override EXCLUDES(mu_);
  void Leave(const serving::EndpointRoute& route) override EXCLUDES(mu_);
  void ColdStart(const serving::EndpointRoute& route, const std::string& variant, int64_t micros) override
      EXCLUDES(mu_);

  // One pass of the loop (tests call it without Start): finds serverless routes, writes the pool
  // sizes that changed, flushes ModelSetupTime samples.
  void RunOnce() EXCLUDES(mu_);

  // The pool size last written for `endpoint` (-1: none); for tests.
  int WrittenSize(const std::string& endpoint) EXCLUDES(mu_);

 private:
  struct Pool {
    std::string variant{};
    int max = 1;
    int provisioned = 0;
    int in_flight = 0;
    int tick_peak = 0;  // the most requests in flight since the loop's last pass
    // seen[k - 1]: when (steady ms) k or more requests were last in flight.
    std::vector<int64_t> seen{};
    int written = -1;  // the desired count last written (-1: not yet)
  };
  struct SetupSample {
    std::string endpoint{};
    std::string variant{};
    int64_t micros = 0;
    int64_t wall_millis = 0;
  };

  Pool& PoolOf(const serving::EndpointRoute& route, int64_t now) REQUIRES(mu_);
  int TotalInFlight() const REQUIRES(mu_);
  static void Mark(Pool& pool, int64_t now);
  int Target(const Pool& pool, int64_t now) const;
  // Writes `size` as the variant's desired count; false when the row was not written.
  bool Write(const std::string& endpoint, const std::string& variant, int size);

  const ServerlessScalerOptions options_;
  const ServerlessScalerDeps deps_;
  store::EndpointRepository endpoints_;

  Mutex mu_;
  CondVar wake_;
  std::map<std::string, Pool> pools_ GUARDED_BY(mu_);  // by endpoint name
  std::vector<SetupSample> setup_samples_ GUARDED_BY(mu_);
  bool dirty_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kiln::control
