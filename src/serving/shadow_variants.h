#pragma once
// Shadow variants (spec/serving-contract.md §9, last row): every request an endpoint with
// ShadowProductionVariants serves is copied to its shadow variant, off the invoke path; the
// shadow's answer is discarded (captured under the shadow variant's name when the endpoint has
// data capture), its errors never reach the client, and its invocations are counted in
// InvocationMetrics under the shadow variant's name (Invocations, ModelLatency, errors...).
//
// Copy (called by DataCapture::Invoked, the router's observer) copies the request body and the
// forwarded headers into a bounded queue and returns; worker threads send each copy to an
// instance of the shadow variant (least outstanding requests, InstanceTarget::outstanding, so
// the controller's drain waits for shadow calls too) over the shared blocking HttpClient, with
// the router's timeouts. Each copy holds the route snapshot it came with until its call ends.
// A full queue drops the copy (counted): shadows never slow the production path.
//
// Thread-safety: Copy from any thread; Start/Stop from one.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "net/http_client.h"
#include "serving/invocation_metrics.h"
#include "serving/routing.h"

namespace kiln::serving {

class DataCapture;

struct ShadowVariantsOptions {
  // Worker threads sending copies (each blocks on one call at a time).
  int threads = 4;
  // Copies waiting for a worker, in bytes of body; over it a copy is dropped.
  size_t max_pending_bytes = 64 * 1024 * 1024;
  // As RouterOptions.
  int invocation_timeout_ms = 60000;
  int connect_timeout_ms = 250;
};

class ShadowVariants {
 public:
  // `client` must outlive this; `metrics` and `capture` may be null.
  ShadowVariants(ShadowVariantsOptions options, net::HttpClient* client, InvocationMetrics* metrics,
                 DataCapture* capture);
  ~ShadowVariants();
  ShadowVariants(const ShadowVariants&) = delete;
  ShadowVariants& operator=(const ShadowVariants&) = delete;

  void Start();
  // Ends the workers after the calls in flight; copies still queued are dropped.
  void Stop() EXCLUDES(mu_);

  // Queues a copy of one request (`forward`: the headers the production container got) for
  // every shadow variant of `route`. False when dropped (queue full, stopped, no shadow).
  bool Copy(const std::shared_ptr<const EndpointRoute>& route, const HeaderMap& forward, std::string_view body)
      EXCLUDES(mu_);

  struct Stats {
    uint64_t sent = 0;     // calls made (answered or not)
    uint64_t failed = 0;   // no instance, no answer or a non-2xx answer
    uint64_t dropped = 0;  // copies not queued
  };
  Stats stats() const EXCLUDES(mu_);

 private:
  struct Job {
    std::shared_ptr<const EndpointRoute> route;
    size_t shadow = 0;  // index into route->shadow_variants
    HeaderMap headers;
    std::string body;
    int64_t queued_steady_ns = 0;
  };

  void Work() EXCLUDES(mu_);
  void Send(Job& job);

  const ShadowVariantsOptions options_;
  net::HttpClient* const client_;
  InvocationMetrics* const metrics_;
  DataCapture* const capture_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Job> queue_ GUARDED_BY(mu_);
  size_t queued_bytes_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  Stats stats_ GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace kiln::serving
