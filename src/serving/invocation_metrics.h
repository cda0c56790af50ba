#pragma once
// InvocationMetrics: the per-(endpoint, variant) invocation counters of spec/serving-contract.md
// §15.2, counted on the invoke path and flushed once a second into the MetricStore (namespace
// "AWS/SageMaker", dimensions EndpointName + VariantName) and read by the Prometheus exporter.
//
// Hot path: Record() takes one of kShards mutexes (the calling thread's shard, chosen once per
// thread round-robin, so concurrent request threads rarely share one) and updates fixed-size
// counters found by a heterogeneous hash lookup (no string is built per request once the
// thread's key buffer is warm). There is no global lock per request.
//
// Seconds: each counter cell accumulates the second its samples belong to (the wall-clock second
// in which the response was sent). A sample of a later second moves the finished second into the
// cell's pending list; the flusher takes every second older than the current one. So points land
// in the right second even when the flusher runs late.
//
// What one MetricStore point means: the CloudWatch statistic set of the second's requests, so
// every statistic of any period is exact (the store merges sets):
//   Invocations, Invocation4XXErrors, Invocation5XXErrors, InvocationModelErrors (unit Count) —
//   one sample per request, 1 if it counts, else 0: SampleCount = requests, Sum = the count,
//   Minimum/Maximum 0 or 1, with the two-value distribution {(0, n - k), (1, k)} (so Average is
//   the rate, as on AWS, and percentiles are exact);
//   InvocationsPerInstance (Count) — one sample of 1/instances per request: exact SampleCount,
//   Sum, Minimum, Maximum (percentiles only for seconds where the instance count did not change);
//   ModelLatency, OverheadLatency (Microseconds) — exact SampleCount/Sum/Minimum/Maximum, and the
//   second's LatencySketch as the distribution, so percentiles are within 1% of the true value.
// Only seconds with traffic are written (no zero points), as CloudWatch does.
//
// Prometheus totals (Totals()) are cumulative since process start: flushed seconds plus what the
// shards still hold, so /metrics is never staler than the request that just finished. Flushed
// totals keep no LatencySketch (only the stored points need one).
//
// Memory follows the live endpoints, not their history: a shard's cell for an (endpoint, variant)
// that has had no request for `idle_cell_seconds` is dropped by the flusher (its counts are in the
// totals by then), and the totals of an endpoint that `is_live` says is gone are dropped once no
// shard holds a cell for it (so its Prometheus series end with the endpoint).
//
// Thread-safety: every method may be called from any thread. Start/Stop from one owner.
//
//   InvocationMetrics metrics({}, &metric_store);
//   metrics.Start();
//   ... router records; /metrics renders metrics.Totals() ...
//   metrics.Stop();  // flushes what is left

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "observe/metric_store.h"

namespace kiln::serving {

// Upper bounds (microseconds) of the latency histogram buckets exported to Prometheus (in
// seconds there); a final +Inf bucket is implicit.
inline constexpr std::array<int64_t, 16> kLatencyBucketsMicros = {
    500,    1000,   2500,    5000,    10000,   25000,    50000,    100000,
    250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000, 60000000};

// A log-bucketed latency sketch (the DDSketch idea) for the percentiles of the stored points:
// bucket i > 0 holds the values in (γ^(i-2), γ^(i-1)] with γ = 1.01 / 0.99, and reports them as
// 2γ^(i-1) / (γ + 1), which is within 1% (relative) of every value in the bucket; bucket 0
// holds zero exactly. Sparse (only non-empty buckets), so a second of similar latencies costs a
// few dozen entries; at most ~2,200 for any int64 range. Not thread-safe (owned by one cell).
class LatencySketch {
 public:
  static constexpr double kRelativeError = 0.01;
  void Add(int64_t micros);  // negative counts as 0
  void Merge(const LatencySketch& other);
  // (representative value, count) per non-empty bucket, ascending by value.
  std::vector<std::pair<double, double>> ValuesCounts() const;
  size_t buckets() const { return buckets_.size(); }
  // The bucket of `micros` (exposed for tests).
  static int32_t BucketOf(int64_t micros);
  static double ValueOf(int32_t bucket);

 private:
  std::vector<std::pair<int32_t, uint64_t>> buckets_;  // sorted by bucket index
};

struct LatencyHistogram {
  std::array<uint64_t, kLatencyBucketsMicros.size() + 1> buckets{};  // non-cumulative; last = +Inf
  uint64_t count = 0;
  int64_t sum_micros = 0;
  int64_t min_micros = 0;  // exact; meaningful when count > 0
  int64_t max_micros = 0;
  LatencySketch sketch;
  void Add(int64_t micros);
  void Merge(const LatencyHistogram& other);
};

// One request's contribution.
struct InvocationSample {
  int64_t epoch_second = 0;     // wall-clock second the response was sent in
  double per_instance = 0;      // 1 / routable instances of the variant at request time
  bool reached_model = true;    // false: no instance (503) — counted only as `unavailable`
  int model_status = 0;         // container HTTP status; 0 when there was none
  bool model_error = false;     // any non-2xx, socket error, malformed response or timeout
  int64_t model_micros = 0;     // request sent → response read
  int64_t overhead_micros = 0;  // total − model
};

// Counters of one (endpoint, variant) over some span of time.
struct InvocationCounts {
  uint64_t invocations = 0;
  double invocations_per_instance = 0;
  double per_instance_min = 0;  // extremes of the per-request values; meaningful when invocations > 0
  double per_instance_max = 0;
  uint64_t errors_4xx = 0;
  uint64_t errors_5xx = 0;
  uint64_t model_errors = 0;
  uint64_t unavailable = 0;  // Kiln extra: requests that found no routable instance (503)
  LatencyHistogram model_latency;
  LatencyHistogram overhead_latency;
  void Add(const InvocationSample& sample);
  void Merge(const InvocationCounts& other);
  bool empty() const { return invocations == 0 && unavailable == 0; }
};

struct InvocationMetricsOptions {
  std::string metric_namespace = "AWS/SageMaker";
  // How often the flusher wakes; points are per second regardless. Lower costs CPU, higher
  // delays the points' appearance in GetMetricStatistics.
  int flush_interval_ms = 1000;
  // A shard cell idle this long is dropped (a later request recreates it). Lower costs an
  // allocation per (endpoint, variant, thread shard) after each idle spell; higher keeps the
  // cells of deleted endpoints (~700 bytes each, up to one per shard) longer.
  int64_t idle_cell_seconds = 300;
  // Whether an endpoint still exists (its totals are kept while it does). Unset: totals are
  // kept for every endpoint ever counted.
  std::function<bool(std::string_view endpoint)> is_live;
};

class InvocationMetrics {
 public:
  // `store` may be null (nothing is written; Prometheus totals still work); it must outlive this.
  InvocationMetrics(InvocationMetricsOptions options, observe::MetricStore* store);
  ~InvocationMetrics();  // Stop()
  InvocationMetrics(const InvocationMetrics&) = delete;
  InvocationMetrics& operator=(const InvocationMetrics&) = delete;

  // Starts the flusher thread. Idempotent.
  void Start();
  // Stops the flusher and writes every second still held (including the current one). Idempotent.
  void Stop();

  // Counts one request of `endpoint`/`variant`. Cheap; never blocks on I/O.
  void Record(std::string_view endpoint, std::string_view variant, const InvocationSample& sample);
  // Multi-container endpoints (serving-contract.md §8, §15.2): one container's part of a request,
  // written with the extra dimension ContainerName. A pipeline container (`direct` false) gives
  // ContainerLatency only (its model_micros); a Direct endpoint's container gives the invocation
  // metrics of Record plus ContainerLatency. Not in Totals() (Prometheus shows the variant's).
  void RecordContainer(std::string_view endpoint, std::string_view variant, std::string_view container, bool direct,
                       const InvocationSample& sample);

  // Writes every second older than `now_epoch_second` (all of them when `everything`) into the
  // store and folds them into the totals. The flusher calls it; tests call it directly.
  // Errors from the store are returned (the points of that call are dropped, and logged by the
  // flusher: the next second is written independently).
  Status Flush(int64_t now_epoch_second, bool everything = false);

  // Cumulative counters per (endpoint, variant), including what is not flushed yet.
  std::map<std::pair<std::string, std::string>, InvocationCounts> Totals() const;

  // Shard cells and totals entries held (what the idle and liveness rules bound).
  struct MemoryStats {
    size_t cells = 0;
    size_t totals = 0;
  };
  MemoryStats TEST_MemoryStats() const;

  // The MetricStore points of one second of `counts` (Invocations ... OverheadLatency).
  // `container` non-empty: RecordContainer's points (ContainerName dimension; `direct` as there).
  static std::vector<observe::MetricDatum> PointsFor(std::string_view endpoint, std::string_view variant,
                                                     int64_t epoch_second, const InvocationCounts& counts,
                                                     std::string_view container = {}, bool direct = false);

 private:
  static constexpr size_t kShards = 16;
  struct Cell {
    std::string endpoint;
    std::string variant;
    std::string container;  // RecordContainer's cells; "" for Record's
    bool direct = false;
    int64_t second = 0;
    InvocationCounts current;
    std::vector<std::pair<int64_t, InvocationCounts>> pending;  // finished seconds, oldest first
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view key) const { return std::hash<std::string_view>()(key); }
  };
  struct Shard {
    mutable Mutex mutex;
    // key "endpoint\x1fvariant" (0x1f cannot appear in either name); RecordContainer's
    // "endpoint\x1fvariant\x1f<d|s>container"
    std::unordered_map<std::string, Cell, KeyHash, std::equal_to<>> cells GUARDED_BY(mutex);
  };
  void Run();
  void RecordKey(std::string_view endpoint, std::string_view variant, std::string_view container, bool direct,
                 const InvocationSample& sample);

  const InvocationMetricsOptions options_;
  observe::MetricStore* const store_;
  std::array<Shard, kShards> shards_;

  mutable Mutex totals_mutex_;
  std::map<std::pair<std::string, std::string>, InvocationCounts> totals_ GUARDED_BY(totals_mutex_);
  mutable Mutex flush_mutex_;  // one Flush at a time (flusher vs Stop vs tests), and Totals

  Mutex run_mutex_;
  CondVar run_cv_;
  bool stopping_ GUARDED_BY(run_mutex_) = false;
  std::thread flusher_;
};

}  // namespace kiln::serving
