#include "serving/invocation_metrics.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <set>

#include "base/log.h"

namespace kiln::serving {

namespace {

int64_t NowEpochMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Each thread keeps to one shard (assigned round-robin on first use), so request threads spread
// over the shards and a shard's mutex is rarely contended.
size_t ThreadShard(size_t shards) {
  static std::atomic<size_t> next{0};
  thread_local size_t shard = next.fetch_add(1, std::memory_order_relaxed);
  return shard % shards;
}

}  // namespace

namespace {
const double kGamma = (1 + LatencySketch::kRelativeError) / (1 - LatencySketch::kRelativeError);
const double kLogGamma = std::log(kGamma);
}  // namespace

int32_t LatencySketch::BucketOf(int64_t micros) {
  if (micros <= 0) return 0;
  return static_cast<int32_t>(std::ceil(std::log(static_cast<double>(micros)) / kLogGamma)) + 1;
}

double LatencySketch::ValueOf(int32_t bucket) {
  if (bucket <= 0) return 0;
  return 2 * std::pow(kGamma, bucket - 1) / (kGamma + 1);
}

void LatencySketch::Add(int64_t micros) {
  int32_t bucket = BucketOf(micros);
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), bucket,
                             [](const std::pair<int32_t, uint64_t>& b, int32_t i) { return b.first < i; });
  if (it != buckets_.end() && it->first == bucket) {
    ++it->second;
  } else {
    buckets_.insert(it, {bucket, 1});
  }
}

void LatencySketch::Merge(const LatencySketch& other) {
  if (other.buckets_.empty()) return;
  std::vector<std::pair<int32_t, uint64_t>> merged;
  merged.reserve(buckets_.size() + other.buckets_.size());
  size_t i = 0, j = 0;
  while (i < buckets_.size() || j < other.buckets_.size()) {
    if (j == other.buckets_.size() || (i < buckets_.size() && buckets_[i].first < other.buckets_[j].first)) {
      merged.push_back(buckets_[i++]);
    } else if (i == buckets_.size() || other.buckets_[j].first < buckets_[i].first) {
      merged.push_back(other.buckets_[j++]);
    } else {
      merged.emplace_back(buckets_[i].first, buckets_[i].second + other.buckets_[j].second);
      ++i;
      ++j;
    }
  }
  buckets_ = std::move(merged);
}

std::vector<std::pair<double, double>> LatencySketch::ValuesCounts() const {
  std::vector<std::pair<double, double>> out;
  out.reserve(buckets_.size());
  for (const auto& [bucket, count] : buckets_) out.emplace_back(ValueOf(bucket), static_cast<double>(count));
  return out;
}

void LatencyHistogram::Add(int64_t micros) {
  if (micros < 0) micros = 0;
  size_t i = std::lower_bound(kLatencyBucketsMicros.begin(), kLatencyBucketsMicros.end(), micros) -
             kLatencyBucketsMicros.begin();
  ++buckets[i];
  min_micros = count == 0 ? micros : std::min(min_micros, micros);
  max_micros = count == 0 ? micros : std::max(max_micros, micros);
  ++count;
  sum_micros += micros;
  sketch.Add(micros);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  if (other.count == 0) return;
  for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += other.buckets[i];
  min_micros = count == 0 ? other.min_micros : std::min(min_micros, other.min_micros);
  max_micros = count == 0 ? other.max_micros : std::max(max_micros, other.max_micros);
  count += other.count;
  sum_micros += other.sum_micros;
  sketch.Merge(other.sketch);
}

void InvocationCounts::Add(const InvocationSample& sample) {
  if (!sample.reached_model) {
    ++unavailable;
    return;
  }
  per_instance_min = invocations == 0 ? sample.per_instance : std::min(per_instance_min, sample.per_instance);
  per_instance_max = invocations == 0 ? sample.per_instance : std::max(per_instance_max, sample.per_instance);
  ++invocations;
  invocations_per_instance += sample.per_instance;
  if (sample.model_status >= 400 && sample.model_status < 500) ++errors_4xx;
  if (sample.model_status >= 500 && sample.model_status < 600) ++errors_5xx;
  if (sample.model_error) ++model_errors;
  model_latency.Add(sample.model_micros);
  overhead_latency.Add(sample.overhead_micros);
}

void InvocationCounts::Merge(const InvocationCounts& other) {
  if (other.invocations > 0) {
    per_instance_min = invocations == 0 ? other.per_instance_min : std::min(per_instance_min, other.per_instance_min);
    per_instance_max = invocations == 0 ? other.per_instance_max : std::max(per_instance_max, other.per_instance_max);
  }
  invocations += other.invocations;
  invocations_per_instance += other.invocations_per_instance;
  errors_4xx += other.errors_4xx;
  errors_5xx += other.errors_5xx;
  model_errors += other.model_errors;
  unavailable += other.unavailable;
  model_latency.Merge(other.model_latency);
  overhead_latency.Merge(other.overhead_latency);
}

InvocationMetrics::InvocationMetrics(InvocationMetricsOptions options, observe::MetricStore* store)
    : options_(std::move(options)), store_(store) {}

InvocationMetrics::~InvocationMetrics() { Stop(); }

void InvocationMetrics::Start() {
  MutexLock lock(run_mutex_);
  if (flusher_.joinable()) return;
  stopping_ = false;
  flusher_ = std::thread([this] { Run(); });
}

void InvocationMetrics::Stop() {
  {
    MutexLock lock(run_mutex_);
    if (!flusher_.joinable()) return;
    stopping_ = true;
  }
  run_cv_.NotifyAll();
  flusher_.join();
  Status status = Flush(NowEpochMillis() / 1000, /*everything=*/true);
  if (!status.ok()) {
    KLOG(warn, "invocation metrics: final flush failed", {{"error", status.ToString()}});
  }
}

void InvocationMetrics::Run() {
  MutexLock lock(run_mutex_);
  while (!stopping_) {
    // Wake just after a second boundary so the second that ended is complete.
    int64_t now = NowEpochMillis();
    int64_t wait_ms = options_.flush_interval_ms >= 1000 ? 1000 - now % 1000 + 5 : options_.flush_interval_ms;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (!stopping_ && run_cv_.WaitUntil(run_mutex_, deadline) == std::cv_status::no_timeout) {
    }
    if (stopping_) break;
    lock.Unlock();
    Status status = Flush(NowEpochMillis() / 1000);
    if (!status.ok()) {
      KLOG(warn, "invocation metrics: flush failed; those points are lost", {{"error", status.ToString()}});
    }
    lock.Lock();
  }
}

void InvocationMetrics::Record(std::string_view endpoint, std::string_view variant, const InvocationSample& sample) {
  RecordKey(endpoint, variant, {}, false, sample);
}

void InvocationMetrics::RecordContainer(std::string_view endpoint, std::string_view variant, std::string_view container,
                                        bool direct, const InvocationSample& sample) {
  if (container.empty()) return;
  RecordKey(endpoint, variant, container, direct, sample);
}

void InvocationMetrics::RecordKey(std::string_view endpoint, std::string_view variant, std::string_view container,
                                  bool direct, const InvocationSample& sample) {
  thread_local std::string key;
  key.assign(endpoint);
  key.push_back('\x1f');
  key.append(variant);
  if (!container.empty()) {
    key.push_back('\x1f');
    key.push_back(direct ? 'd' : 's');
    key.append(container);
  }
  Shard& shard = shards_[ThreadShard(kShards)];
  MutexLock lock(shard.mutex);
  auto it = shard.cells.find(std::string_view(key));
  if (it == shard.cells.end()) {
    it = shard.cells.emplace(key, Cell{}).first;
    it->second.endpoint = endpoint;
    it->second.variant = variant;
    it->second.container = container;
    it->second.direct = direct;
    it->second.second = sample.epoch_second;
  }
  Cell& cell = it->second;
  if (sample.epoch_second != cell.second) {
    if (!cell.current.empty()) {
      // Usually a later second; an earlier one (a clock step back) is kept as its own entry.
      cell.pending.emplace_back(cell.second, cell.current);
      cell.current = InvocationCounts();
    }
    cell.second = sample.epoch_second;
  }
  cell.current.Add(sample);
}

Status InvocationMetrics::Flush(int64_t now_epoch_second, bool everything) {
  MutexLock flush_lock(flush_mutex_);
  struct Taken {
    const std::string* endpoint;  // points into the cell: only cells with nothing taken are erased
    const std::string* variant;
    const std::string* container;
    bool direct;
    int64_t second;
    InvocationCounts counts;
  };
  std::vector<Taken> taken;
  std::set<std::string> endpoints_with_cells;
  for (Shard& shard : shards_) {
    MutexLock lock(shard.mutex);
    for (auto it = shard.cells.begin(); it != shard.cells.end();) {
      Cell& cell = it->second;
      if (cell.pending.empty() && cell.current.empty() && cell.second + options_.idle_cell_seconds < now_epoch_second) {
        it = shard.cells.erase(it);  // idle: everything it counted is in totals_ already
        continue;
      }
      endpoints_with_cells.insert(cell.endpoint);
      for (auto& [second, counts] : cell.pending) {
        taken.push_back({&cell.endpoint, &cell.variant, &cell.container, cell.direct, second, counts});
      }
      cell.pending.clear();
      if (!cell.current.empty() && (everything || cell.second < now_epoch_second)) {
        taken.push_back({&cell.endpoint, &cell.variant, &cell.container, cell.direct, cell.second, cell.current});
        cell.current = InvocationCounts();
      }
      ++it;
    }
  }
  if (options_.is_live) {
    // Totals of a deleted endpoint go once no cell can add to them any more.
    MutexLock lock(totals_mutex_);
    for (auto it = totals_.begin(); it != totals_.end();) {
      const std::string& endpoint = it->first.first;
      if (!endpoints_with_cells.count(endpoint) && !options_.is_live(endpoint)) {
        it = totals_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (taken.empty()) return Status::Ok();

  // The same (endpoint, variant, second) can come from several shards: merge before writing.
  std::sort(taken.begin(), taken.end(), [](const Taken& a, const Taken& b) {
    if (*a.endpoint != *b.endpoint) return *a.endpoint < *b.endpoint;
    if (*a.variant != *b.variant) return *a.variant < *b.variant;
    if (*a.container != *b.container) return *a.container < *b.container;
    if (a.direct != b.direct) return a.direct < b.direct;
    return a.second < b.second;
  });
  std::vector<observe::MetricDatum> batch;
  {
    MutexLock lock(totals_mutex_);
    for (size_t i = 0; i < taken.size();) {
      InvocationCounts merged = taken[i].counts;
      size_t j = i + 1;
      while (j < taken.size() && *taken[j].endpoint == *taken[i].endpoint && *taken[j].variant == *taken[i].variant &&
             *taken[j].container == *taken[i].container && taken[j].direct == taken[i].direct &&
             taken[j].second == taken[i].second) {
        merged.Merge(taken[j].counts);
        ++j;
      }
      if (store_ != nullptr) {
        auto points = PointsFor(*taken[i].endpoint, *taken[i].variant, taken[i].second, merged, *taken[i].container,
                                taken[i].direct);
        batch.insert(batch.end(), std::make_move_iterator(points.begin()), std::make_move_iterator(points.end()));
      }
      // The totals serve Prometheus, whose histograms use the fixed buckets: they keep no
      // sketch, so a long-lived endpoint's totals stay at their fixed size.
      merged.model_latency.sketch = LatencySketch();
      merged.overhead_latency.sketch = LatencySketch();
      if (taken[i].container->empty()) totals_[{*taken[i].endpoint, *taken[i].variant}].Merge(merged);
      i = j;
    }
  }
  if (store_ == nullptr || batch.empty()) return Status::Ok();
  return store_->Put(options_.metric_namespace, batch);
}

std::map<std::pair<std::string, std::string>, InvocationCounts> InvocationMetrics::Totals() const {
  // Excludes a concurrent Flush, which moves counts from the shards into totals_: without it an
  // answer could miss them and a Prometheus counter would seem to go backwards.
  MutexLock flush_lock(flush_mutex_);
  std::map<std::pair<std::string, std::string>, InvocationCounts> out;
  {
    MutexLock lock(totals_mutex_);
    out = totals_;
  }
  for (const Shard& shard : shards_) {
    MutexLock lock(shard.mutex);
    for (const auto& [key, cell] : shard.cells) {
      if (!cell.container.empty()) continue;  // RecordContainer's: CloudWatch only
      InvocationCounts& total = out[{cell.endpoint, cell.variant}];
      for (const auto& [second, counts] : cell.pending) total.Merge(counts);
      total.Merge(cell.current);
    }
  }
  return out;
}

InvocationMetrics::MemoryStats InvocationMetrics::TEST_MemoryStats() const {
  MutexLock flush_lock(flush_mutex_);
  MemoryStats stats;
  for (const Shard& shard : shards_) {
    MutexLock lock(shard.mutex);
    stats.cells += shard.cells.size();
  }
  MutexLock lock(totals_mutex_);
  stats.totals = totals_.size();
  return stats;
}

std::vector<observe::MetricDatum> InvocationMetrics::PointsFor(std::string_view endpoint, std::string_view variant,
                                                               int64_t epoch_second, const InvocationCounts& counts,
                                                               std::string_view container, bool direct) {
  std::vector<observe::MetricDatum> points;
  if (counts.invocations == 0) return points;  // only `unavailable`: nothing AWS would count
  observe::Dimensions dimensions{{"EndpointName", std::string(endpoint)}, {"VariantName", std::string(variant)}};
  if (!container.empty()) dimensions.emplace("ContainerName", std::string(container));
  const int64_t ts = epoch_second * 1000;
  const double n = static_cast<double>(counts.invocations);
  auto add = [&](const char* name, const char* unit, observe::StatisticSet stats,
                 std::vector<std::pair<double, double>> values_counts) {
    points.push_back({.name = name,
                      .dimensions = dimensions,
                      .timestamp_millis = ts,
                      .statistics = stats,
                      .values_counts = std::move(values_counts),
                      .unit = unit});
  };
  // n requests, k of which count (1) and the rest not (0).
  auto count_set = [&](const char* name, uint64_t k_count) {
    double k = static_cast<double>(k_count);
    std::vector<std::pair<double, double>> values_counts;
    if (k > 0 && k < n) values_counts = {{0.0, n - k}, {1.0, k}};  // else implied by Minimum == Maximum
    add(name, "Count", {n, k, k == n ? 1.0 : 0.0, k > 0 ? 1.0 : 0.0}, std::move(values_counts));
  };
  auto latency_set = [&](const char* name, const LatencyHistogram& h) {
    add(name, "Microseconds",
        {static_cast<double>(h.count), static_cast<double>(h.sum_micros), static_cast<double>(h.min_micros),
         static_cast<double>(h.max_micros)},
        h.sketch.ValuesCounts());
  };
  if (!container.empty()) {
    // Multi-container (§8, §15.2): every container's own latency; a pipeline's containers
    // give nothing else (its invocations are the variant's).
    latency_set("ContainerLatency", counts.model_latency);
    if (!direct) return points;
  }
  count_set("Invocations", counts.invocations);
  add("InvocationsPerInstance", "Count",
      {n, counts.invocations_per_instance, counts.per_instance_min, counts.per_instance_max}, {});
  count_set("Invocation4XXErrors", counts.errors_4xx);
  count_set("Invocation5XXErrors", counts.errors_5xx);
  count_set("InvocationModelErrors", counts.model_errors);
  latency_set("ModelLatency", counts.model_latency);
  latency_set("OverheadLatency", counts.overhead_latency);
  return points;
}

}  // namespace kiln::serving
