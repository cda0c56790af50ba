#pragma once
// The asynchronous inference dispatcher (spec/serving-contract.md §11.2–11.5, §15.2): runs the
// requests InvokeEndpointAsync queued (serving::AsyncQueue) on the endpoint's instances.
//
// One loop thread, woken by every enqueue and completion (and every 50 ms): per endpoint with
// waiting requests, while a routable instance of its routing snapshot has fewer than
// MaxConcurrentInvocationsPerInstance (default 4) requests in flight (InstanceTarget::outstanding,
// shared with the router, so the controller's drain sees them), it takes the next request and
// hands it to a worker thread. An endpoint whose route is missing (not yet published after a
// restart) or has no instance (scaled to 0) keeps its requests queued; the queue of an endpoint
// that was deleted (no route, and deps.endpoint_gone says its row is gone) is dropped.
//
// A worker runs one request:
//   1. recovered requests (queued again after a restart) whose output or failure object already
//      exists are finished without running again;
//   2. older than RequestTTLSeconds → expired (failure object, ExpiredRequests, error notification);
//   3. reads the input object, POSTs /invocations with Content-Type = X-Amzn-SageMaker-Content-Type
//      (else the object's), Accept, custom attributes and the inference id, within
//      InvocationTimeoutSeconds;
//   4. 2xx → the body is written to the output location with the response's Content-Type;
//      anything else → the failure object (the container's body, or {"errorMessage",
//      "statusCode"}) when S3FailurePath is set;
//   5. notification (the §11.4 JSON) to the webhook configured for the topic ARN, and always one
//      line in the data-log stream <VariantName>/<instance-id>/data-log of
//      /aws/sagemaker/Endpoints/<EndpointName> (appended in batches every 100 ms, so a kill -9 may
//      lose the last lines);
//   6. completes the request in the queue.
// S3 reads/writes and "could not connect" (nothing sent) are retried up to 3 times in all; model
// errors (non-2xx, timeout, reset) are not. A stop of the dispatcher interrupts calls in flight
// without completing them: their requests stay in the journal and run after the restart.
//
// Metrics (namespace AWS/SageMaker) each second: ApproximateBacklogSize,
// ApproximateBacklogSizePerInstance, ApproximateAgeOfOldestRequest, HasBacklogWithoutCapacity
// (dimensions {EndpointName}) for every async endpoint; per {EndpointName, VariantName}:
// InvocationsProcesssed, InvocationFailures, ExpiredRequests, Invocation4XXErrors,
// Invocation5XXErrors, RequestDownloadFailures, ResponseUploadFailures, NotificationFailures
// (Count), ModelLatency (Microseconds), TimeInBacklog and TotalProcessingTime (Milliseconds).
//
// Thread-safety: Start/Stop from one thread; everything else is internal.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "net/http_client.h"
#include "objects/object_store.h"
#include "observe/log_store.h"
#include "observe/metric_store.h"
#include "serving/async_queue.h"
#include "serving/routing.h"

namespace kiln::control {

struct AsyncDispatcherOptions {
  int default_max_concurrency = 4;  // MaxConcurrentInvocationsPerInstance when unset
  int workers = 32;                 // threads running requests
  int max_attempts = 3;             // S3 and platform errors
  // Topic ARN → webhook URL (http://host:port/path; host an IP literal or localhost).
  std::map<std::string, std::string> notification_webhooks{};
  std::string region = "us-east-1";
  size_t max_response_body_bytes = 1024ull * 1024 * 1024;  // 1 GB payloads (§11.2)
  std::chrono::milliseconds metrics_interval{1000};
};

struct AsyncDispatcherDeps {
  serving::AsyncQueue* queue = nullptr;
  const serving::RoutingTable* routes = nullptr;
  objects::ObjectStore* objects = nullptr;
  observe::LogStore* logs = nullptr;        // optional
  observe::MetricStore* metrics = nullptr;  // optional
  // True when the endpoint no longer exists (its row is gone): its queue is then dropped. Asked
  // every few seconds for endpoints with queued requests and no route. Optional.
  std::function<bool(const std::string& endpoint)> endpoint_gone{};
};

class AsyncDispatcher {
 public:
  AsyncDispatcher(AsyncDispatcherOptions options, AsyncDispatcherDeps deps);
  ~AsyncDispatcher();
  AsyncDispatcher(const AsyncDispatcher&) = delete;
  AsyncDispatcher& operator=(const AsyncDispatcher&) = delete;

  void Start();
  void Stop();

  // Tests: requests finished (any outcome) since Start.
  int64_t TEST_Finished() const { return finished_.load(); }

 private:
  struct Task {
    serving::AsyncRequest request;
    std::shared_ptr<const serving::InstanceTarget> instance;
    std::string variant;
    std::string async_config;  // the route's AsyncInferenceConfig JSON
  };
  struct Outcome;
  struct Cell;  // per (endpoint, variant) metric accumulators

  void Loop();
  void DispatchAll();
  void DropDeleted();
  void WorkerLoop();
  void Run(Task& task);
  void Finish(const Task& task, const Outcome& outcome);
  void Notify(const Task& task, const Outcome& outcome, const std::string& topic, bool include_body);
  void DataLog(const Task& task, const Outcome& outcome);
  void FlushDataLog();
  void PublishMetrics();
  Cell& CellFor(const std::string& endpoint, const std::string& variant) REQUIRES(metrics_mu_);

  const AsyncDispatcherOptions options_;
  const AsyncDispatcherDeps deps_;
  net::HttpClient client_;
  net::CancelSignal stopping_;
  std::atomic<bool> stop_{false};
  std::thread loop_;
  std::vector<std::thread> workers_;
  Mutex tasks_mu_;
  CondVar tasks_cv_;
  std::deque<Task> tasks_ GUARDED_BY(tasks_mu_);
  Mutex metrics_mu_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Cell>> cells_ GUARDED_BY(metrics_mu_);
  Mutex streams_mu_;
  std::set<std::string> streams_ GUARDED_BY(streams_mu_);  // data-log streams created
  // Data-log lines not yet appended, by (group, stream): the loop appends them every 100 ms, one
  // LogStore fdatasync per stream and batch instead of one per request.
  std::map<std::pair<std::string, std::string>, std::vector<observe::InputEvent>> pending_lines_
      GUARDED_BY(streams_mu_);
  std::atomic<int64_t> finished_{0};
};

}  // namespace kiln::control
