#pragma once
// MetricStore: durable metric time series (CloudWatch-style: namespace, metric name, dimension
// set), backed by SQLite (store migrations 5 and 7). Training jobs write the points their log
// lines yield (metric_extractor.h), endpoints their invocation statistics
// (serving/invocation_metrics.h), clients theirs through PutMetricData;
// GetMetricStatistics/GetMetricData/ListMetrics and DescribeTrainingJob.FinalMetricDataList read
// them.
//
// A series is identified by (namespace, name, dimensions) with the dimensions compared as a whole
// set (CloudWatch's exact-match rule). Each series keeps its latest point (greatest timestamp;
// among equal timestamps the one written last), so Last() costs one indexed read.
//
// Each point is a statistic set (SampleCount, Sum, Minimum, Maximum) with its unit and storage
// resolution, plus, when the writer gave one, its distribution (distinct values with counts), so
// every CloudWatch statistic of any period is exact: sets merge exactly, and percentiles come
// from the merged distributions. A single value is the set (1, v, v, v) with distribution
// {(v, 1)}; a set with Minimum == Maximum and Sum == Minimum * SampleCount has the implied
// distribution {(Minimum, SampleCount)} (CloudWatch's own rule for percentiles of statistic sets).
//
// Writes go in batches, one transaction each: a training job printing thousands of metric lines
// per second costs one commit per batch, not per point. Points are kept as written; Aggregate
// merges them into periods with one indexed range scan.
//
// Thread-safety: all methods may be called from any thread; writers serialize on the database.

#include <array>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "store/database.h"

namespace kiln::observe {

// Dimension name → value ("TrainingJobName" → "churn-1", "Host" → "churn-1/algo-1").
using Dimensions = std::map<std::string, std::string>;

// A CloudWatch statistic set (PutMetricData StatisticValues; also what each stored point keeps).
struct StatisticSet {
  double sample_count = 0;
  double sum = 0;
  double minimum = 0;
  double maximum = 0;
  bool operator==(const StatisticSet&) const = default;
};

// One point to write. Members carry `{}` initializers so that writers may name only the members
// they use (GCC's -Wmissing-field-initializers is quiet for members with initializers).
struct MetricDatum {
  std::string name{};
  Dimensions dimensions{};
  int64_t timestamp_millis = 0;
  double value = 0;                          // one sample, used when `statistics` is unset and `values_counts` empty
  std::optional<StatisticSet> statistics{};  // a pre-aggregated set (PutMetricData StatisticValues)
  // PutMetricData Values+Counts (counts default 1), or a writer's own distribution (e.g. a latency
  // sketch's bucket values): distinct values with their counts. When set and `statistics` is unset,
  // the stored statistic set is computed from it exactly. Kept per point for percentiles.
  std::vector<std::pair<double, double>> values_counts{};
  std::string unit{};           // CloudWatch StandardUnit name; "" is stored as "None"
  int storage_resolution = 60;  // 1 = high resolution (custom metrics); stored, not yet read back
};

// One GetMetricStatistics/GetMetricData metric stat, already validated by the API layer.
struct MetricQuery {
  std::string ns{};
  std::string name{};
  Dimensions dimensions{};            // exact match of the whole set
  int64_t start_millis = 0;           // inclusive; the API aligns it to the period
  int64_t end_millis = 0;             // exclusive
  int64_t period_seconds = 60;        // > 0
  std::optional<std::string> unit{};  // only points stored with this unit ("" means "None")
  // false: the periods' distributions are not merged (percentiles_available stays false). Over
  // points that carry sketches merging costs ~1.5x the query without it (bench/README.md), so
  // callers that need no percentile statistic should say so.
  bool distributions = true;
};

// The statistics of one period that has at least one point.
struct PeriodAggregate {
  int64_t start_millis = 0;  // query.start_millis + k * period
  StatisticSet stats{};      // exact, merged over the period's points
  std::string unit{};        // the points' unit ("None" when none was given; the first point's when mixed)
  // Merged values_counts of the period (sorted by value, distinct values), empty when any point of
  // the period had no distribution (a bare StatisticValues set): then percentiles are unavailable.
  std::vector<std::pair<double, double>> distribution{};
  bool percentiles_available = false;
};

// p in [0, 100]; nullopt when !percentiles_available or p is out of range. Nearest rank over the
// distribution: the smallest value whose cumulative count reaches ceil(p / 100 * N), N the
// distribution's total count (at least rank 1). When that value is the distribution's first
// (last), the period's exact Minimum (Maximum) is returned instead: the same value for an exact
// distribution, and an actual sample for a writer's approximate sketch; other values are
// clamped into [Minimum, Maximum].
std::optional<double> Percentile(const PeriodAggregate& period, double p);

struct MetricId {
  std::string ns{};
  std::string name{};
  Dimensions dimensions{};
  bool operator==(const MetricId&) const = default;
};

struct MetricListFilter {
  std::optional<std::string> ns{};
  std::optional<std::string> name{};
  // Each filter must be present in the series' dimensions; with a value, with that value.
  std::vector<std::pair<std::string, std::optional<std::string>>> dimensions{};
  std::optional<int64_t> active_since_millis{};  // RecentlyActive=PT3H: last point at/after this
};

struct MetricListPage {
  std::vector<MetricId> metrics{};  // ordered by (ns, name, canonical dimensions)
  std::string next_key{};           // "" at the end; opaque, pass back as `after_key`
};

struct SeriesPoint {
  int64_t timestamp_millis = 0;
  double value = 0;
  bool operator==(const SeriesPoint&) const = default;
};

struct SeriesInfo {
  std::string name{};
  Dimensions dimensions{};
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

  // Appends `batch` to namespace `ns` in one transaction: all points or none. Each datum is stored
  // as `statistics` when set (with `values_counts` kept as its distribution), else as the exact set
  // of `values_counts` when non-empty (zero counts are dropped), else as the single `value`.
  // Non-finite numbers, negative counts, values whose counts are all zero, SampleCount <= 0 and
  // Minimum > Maximum are refused
  // (InvalidArgument, nothing written); an empty batch is a no-op. Other AWS limits (150 values,
  // unit names, dimension counts) are the API layer's to check. Errors from
  // SQLite come back as its Status (Unavailable when locked too long, Internal otherwise).
  Status Put(std::string_view ns, const std::vector<MetricDatum>& batch);
  Status Put(std::string_view ns, std::string_view name, const Dimensions& dimensions, int64_t timestamp_millis,
             double value);

  // Points of one series with start_millis <= timestamp < end_millis, in time order (equal
  // timestamps in write order); a point's value is its Sum / SampleCount (the value itself for a
  // single-value point). An unknown series gives an empty list.
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

  // Every period of the query that has points, in time order. Periods are
  // [start_millis + k * period, start_millis + (k + 1) * period) clipped to end_millis. An unknown
  // series gives an empty list; InvalidArgument when period_seconds <= 0. Holds the database
  // for one indexed range scan (~27 ms per 100k points), so writers wait that long at most.
  Result<std::vector<PeriodAggregate>> Aggregate(const MetricQuery& query) const;

  // Series matching `filter`, after `after_key` (exclusive; "" = from the start), at most `limit`
  // (0 = no limit). next_key is set when more may follow. InvalidArgument for a malformed key.
  Result<MetricListPage> List(const MetricListFilter& filter, std::string_view after_key, size_t limit) const;

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
  void CachePut(std::string key, int64_t id) const REQUIRES(cache_mutex_);

  store::Database* db_;
  const size_t max_cached_series_;
  // (namespace, name, dimensions) key → series id and its place in lru_ (most recent first);
  // series are never deleted, so entries never go stale.
  mutable Mutex cache_mutex_;
  mutable std::list<std::string> lru_ GUARDED_BY(cache_mutex_);
  mutable std::unordered_map<std::string, std::pair<int64_t, std::list<std::string>::iterator>> series_ids_
      GUARDED_BY(cache_mutex_);
};

}  // namespace kiln::observe
