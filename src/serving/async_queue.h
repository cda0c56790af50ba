#pragma once
// The durable queue of asynchronous invocations (spec/serving-contract.md §11.2): per endpoint,
// FIFO by arrival, bounded, and durable across kill -9 of the daemon.
//
// Storage: one append-only journal per endpoint, <dir>/<endpoint>.journal, one JSON object a
// line: {"op":"put", ...the request...} when a request is queued, {"op":"done","seq":n} when it
// is finished (output or failure written, or expired). Enqueue returns only once its line is on
// disk (fdatasync); concurrent enqueuers share one fdatasync (group commit: whoever syncs covers
// every line written before it). "done" lines are not synced: a done line lost to a crash means
// the request is queued again on recovery, and the dispatcher then finds its output object and
// does not run it again (AsyncRequest::recovered). A torn last line (crash mid-write, never
// acknowledged) is ignored on recovery.
//
// Compaction: once an endpoint's journal holds more than compact_min_records lines and at most
// half of them describe live requests, it is rewritten with only the live ones (temp file,
// fsync, rename, fsync of the directory), so its size follows the backlog, not the history.
//
// Recovery (Open): every journal is read; requests without a done line are queued again in
// their original order with `recovered` set (the previous daemon may have been running them).
//
// Thread-safety: all methods may be called from any thread.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace kiln::serving {

struct AsyncRequest {
  uint64_t seq = 0;        // assigned by Enqueue; increasing per endpoint
  std::string endpoint{};  // EndpointName
  std::string inference_id{};
  std::string input_location{};     // s3://bucket/key
  std::string content_type{};       // X-Amzn-SageMaker-Content-Type ("" when not given)
  std::string accept{};             // X-Amzn-SageMaker-Accept
  std::string custom_attributes{};  // X-Amzn-SageMaker-Custom-Attributes
  std::string output_location{};    // s3://... (§11.3)
  std::string failure_location{};   // "" when the config has no S3FailurePath
  int64_t received_millis = 0;      // epoch millis of the 202
  int ttl_seconds = 21600;          // RequestTTLSeconds
  int invocation_timeout_seconds = 900;
  // Queued again by recovery: it may have run before the restart (the dispatcher checks for its
  // output object first). Not journaled.
  bool recovered = false;
};

struct AsyncQueueOptions {
  std::string dir{};                  // created when missing
  size_t max_per_endpoint = 100000;   // waiting + in flight; Enqueue refuses past it
  size_t compact_min_records = 4096;  // journal lines before compaction is considered
};

struct AsyncBacklog {
  size_t waiting = 0;                  // queued, not yet taken
  size_t in_flight = 0;                // taken, not yet completed
  int64_t oldest_received_millis = 0;  // of all waiting and in-flight requests; 0 when none
};

class AsyncQueue {
 public:
  static Result<std::unique_ptr<AsyncQueue>> Open(AsyncQueueOptions options);
  ~AsyncQueue();
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;

  // Queues `request` (its seq is set) and returns once it is durable. ResourceExhausted when the
  // endpoint already has max_per_endpoint requests; the journal's I/O errors otherwise.
  Status Enqueue(AsyncRequest& request);
  // The oldest waiting request of `endpoint`, now in flight; nullopt when none waits.
  std::optional<AsyncRequest> Take(const std::string& endpoint);
  // Puts a taken request back at the head of its queue (it could not be started).
  void Untake(const AsyncRequest& request);
  // The request is finished (whatever the outcome): journals it done, forgets it.
  void Complete(const std::string& endpoint, uint64_t seq);
  // Forgets an endpoint's queue and removes its journal (the endpoint was deleted).
  void Drop(const std::string& endpoint);

  std::map<std::string, AsyncBacklog> Backlogs() const;
  // Waits until something was enqueued (or untaken) since the last call, or `timeout`.
  void WaitForWork(std::chrono::milliseconds timeout);
  // Wakes WaitForWork (a dispatcher that stops, or capacity that freed up).
  void Wake();

  // Tests: lines in an endpoint's journal file now.
  size_t TEST_JournalLines(const std::string& endpoint) const;

 private:
  struct Journal;
  explicit AsyncQueue(AsyncQueueOptions options);
  Status Recover();
  Journal* JournalFor(const std::string& endpoint) REQUIRES(mu_);
  Status AppendLine(Journal& journal, const std::string& line) REQUIRES(mu_);
  Status Compact(Journal& journal) REQUIRES(mu_);
  std::string PathOf(const std::string& endpoint) const;

  const AsyncQueueOptions options_;
  // Lock order: sync_mu_ before mu_.
  Mutex sync_mu_;
  mutable Mutex mu_;
  CondVar work_;
  bool work_pending_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Journal>> journals_ GUARDED_BY(mu_);
};

}  // namespace kiln::serving
