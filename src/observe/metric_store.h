#pragma once
// MetricStore: durable metric time series (CloudWatch-style: namespace, metric name, dimension
// set), backed by SQLite (store migration 5). Training jobs write the points their log lines
// yield (metric_extractor.h); GetMetricStatistics/GetMetricData and
// DescribeTrainingJob.FinalMetricDataList read them.
//
// A series is identified by (namespace, name, dimensions) with the dimensions compared as a whole
// set (CloudWatch's exact-match rule). Each series keeps its latest point (greatest timestamp;
// among equal timestamps the one written last), so Last() costs one indexed read.
//
// Writes go in batches, one transaction each: a training job printing thousands of metric lines
// per second costs one commit per batch, not per point. Points are kept as written (no
// aggregation here; the API layer aggregates to periods).
//
// Thread-safety: all methods may be called from any thread; writers serialize on the database.

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "store/database.h"

namespace kiln::observe {

// Dimension name → value ("TrainingJobName" → "churn-1", "Host" → "churn-1/algo-1").
using Dimensions = std::map<std::string, std::string>;

struct MetricDatum {
  std::string name;
  Dimensions dimensions;
  int64_t timestamp_millis = 0;
  double value = 0;
};

struct SeriesPoint {
  int64_t timestamp_millis = 0;
  double value = 0;
  bool operator==(const SeriesPoint&) const = default;
};

struct SeriesInfo {
  std::string name;
  Dimensions dimensions;
  SeriesPoint last;
};

class MetricStore {
 public:
  // `db` must outlive the store and carry migration 5 (store::AllMigrations() does).
  // `max_cached_series`: series ids remembered in memory, least recently used evicted (~150
  // bytes each); a miss costs one indexed SQLite read. Series are never deleted, so an unbounded
  // cache would grow with every training job and endpoint ever run.
  explicit MetricStore(store::Database* db, size_t max_cached_series = 4096)
      : db_(db), max_cached_series_(max_cached_series == 0 ? 1 : max_cached_series) {}
  MetricStore(const MetricStore&) = delete;
  MetricStore& operator=(const MetricStore&) = delete;

  // Appends `batch` to namespace `ns` in one transaction: all points or none. Non-finite values
  // are refused (InvalidArgument, nothing written); an empty batch is a no-op. Errors from
  // SQLite come back as its Status (Unavailable when locked too long, Internal otherwise).
  Status Put(std::string_view ns, const std::vector<MetricDatum>& batch);
  Status Put(std::string_view ns, std::string_view name, const Dimensions& dimensions, int64_t timestamp_millis,
             double value);

  // Points of one series with start_millis <= timestamp < end_millis, in time order (equal
  // timestamps in write order). An unknown series gives an empty list.
  Result<std::vector<SeriesPoint>> Query(std::string_view ns, std::string_view name, const Dimensions& dimensions,
                                         int64_t start_millis, int64_t end_millis) const;

  // The latest point of one series; nullopt when the series has none.
  Result<std::optional<SeriesPoint>> Last(std::string_view ns, std::string_view name,
                                          const Dimensions& dimensions) const;

  // Every series of `ns` (optionally only metric `name`) whose dimensions are exactly
  // `dimensions`, with its latest point, ordered by name. FinalMetricDataList is
  // ListSeries("/aws/sagemaker/TrainingJobs", std::nullopt, {{"TrainingJobName", job}}).
  Result<std::vector<SeriesInfo>> ListSeries(std::string_view ns, std::optional<std::string_view> name,
                                             const Dimensions& dimensions) const;

  // The canonical text of a dimension set (a JSON object with sorted keys), as stored.
  static std::string CanonicalDimensions(const Dimensions& dimensions);

  // Entries in the series-id cache (at most max_cached_series).
  size_t TEST_CachedSeries() const;

 private:
  // The id of the series, creating it when `create`; nullopt when absent and !create. `cache`:
  // remember an id found in the table. Put passes false and caches only after its transaction
  // commits, so a rollback never leaves an id that names no row.
  Result<std::optional<int64_t>> SeriesId(std::string_view ns, std::string_view name, const std::string& dimensions,
                                          bool create, bool cache) const;
  // Inserts or refreshes `key`, evicting the least recently used entry beyond the bound.
  void CachePut(std::string key, int64_t id) const;  // requires cache_mutex_

  store::Database* db_;
  const size_t max_cached_series_;
  // (namespace, name, dimensions) key → series id and its place in lru_ (most recent first);
  // series are never deleted, so entries never go stale. Guarded by cache_mutex_.
  mutable std::mutex cache_mutex_;
  mutable std::list<std::string> lru_;
  mutable std::unordered_map<std::string, std::pair<int64_t, std::list<std::string>::iterator>> series_ids_;
};

}  // namespace kiln::observe
