#include "observe/metric_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "base/encoding.h"

namespace kiln::observe {

namespace {

using Distribution = std::vector<std::pair<double, double>>;

std::string CacheKey(std::string_view ns, std::string_view name, const std::string& dimensions) {
  std::string key;
  key.reserve(ns.size() + name.size() + dimensions.size() + 2);
  key.append(ns).push_back('\0');
  key.append(name).push_back('\0');
  key.append(dimensions);
  return key;
}

Dimensions ParseDimensions(const std::string& text) {
  Dimensions dimensions;
  auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object()) {
    for (const auto& [key, value] : parsed.items()) {
      if (value.is_string()) dimensions[key] = value.get<std::string>();
    }
  }
  return dimensions;
}

// Whether a set without a stored distribution still determines one: every sample had the same
// value (CloudWatch's rule for percentiles of statistic sets: Minimum == Maximum and
// Sum == Minimum * SampleCount). The tolerance absorbs the rounding of a client's own sum.
bool ImpliesSingleValue(const StatisticSet& stats) {
  if (stats.minimum != stats.maximum) return false;
  double expected = stats.minimum * stats.sample_count;
  return std::fabs(stats.sum - expected) <= 1e-9 * std::max(1.0, std::fabs(expected));
}

// Sorts by value, merges equal values and drops zero counts. InvalidArgument for a non-finite
// number or a negative count.
Status Normalize(const std::string& name, Distribution& values_counts) {
  for (const auto& [value, count] : values_counts) {
    if (!std::isfinite(value) || !std::isfinite(count)) {
      return Status::InvalidArgument("metric " + name + " has a non-finite value or count");
    }
    if (count < 0) return Status::InvalidArgument("metric " + name + " has a negative count");
  }
  std::sort(values_counts.begin(), values_counts.end());
  size_t out = 0;
  for (size_t i = 0; i < values_counts.size(); ++i) {
    if (values_counts[i].second == 0) continue;
    if (out > 0 && values_counts[out - 1].first == values_counts[i].first) {
      values_counts[out - 1].second += values_counts[i].second;
    } else {
      values_counts[out++] = values_counts[i];
    }
  }
  values_counts.resize(out);
  return Status::Ok();
}

// The stored form of a distribution: (value, count) pairs as native doubles, 16 bytes each.
// Kiln's database is local to the machine that wrote it, so native byte order is fine.
std::string EncodeDistribution(const Distribution& values_counts) {
  std::string blob(values_counts.size() * 2 * sizeof(double), '\0');
  char* out = blob.data();
  for (const auto& [value, count] : values_counts) {
    std::memcpy(out, &value, sizeof(double));
    std::memcpy(out + sizeof(double), &count, sizeof(double));
    out += 2 * sizeof(double);
  }
  return blob;
}

void DecodeDistribution(const std::string& blob, Distribution& out) {
  out.clear();
  const char* p = blob.data();
  for (size_t i = 0; i + 2 * sizeof(double) <= blob.size(); i += 2 * sizeof(double)) {
    double value, count;
    std::memcpy(&value, p + i, sizeof(double));
    std::memcpy(&count, p + i + sizeof(double), sizeof(double));
    out.emplace_back(value, count);
  }
}

// Merges sorted (value, count) runs (each point's distribution) into one sorted run of distinct
// values. A run about as large as what is merged so far is merged in directly (linear: the case
// of sketches, whose bucket values repeat from point to point, so the merged run stays small);
// small runs (single values) are buffered and sorted in batches at least as large as the merged
// run, so a period of n distinct values costs O(n log n), not O(n^2).
class DistributionMerger {
 public:
  void Add(const Distribution& run) {
    if (run.size() * 8 >= merged_.size()) {
      MergeIn(run);
    } else {
      pending_.insert(pending_.end(), run.begin(), run.end());
      if (pending_.size() >= merged_.size()) FlushPending();
    }
  }
  void Add(double value, double count) {
    pending_.emplace_back(value, count);
    if (pending_.size() >= std::max<size_t>(merged_.size(), 16)) FlushPending();
  }
  // The merged run; the merger is empty afterwards.
  Distribution Take() {
    FlushPending();
    Distribution out = std::move(merged_);
    merged_.clear();
    return out;
  }
  void Clear() {
    merged_.clear();
    pending_.clear();
  }

 private:
  void FlushPending() {
    if (pending_.empty()) return;
    std::sort(pending_.begin(), pending_.end());
    MergeIn(pending_);
    pending_.clear();
  }
  // Two-way merge of a sorted run (equal values within it allowed) into merged_.
  void MergeIn(const Distribution& run) {
    scratch_.clear();
    scratch_.reserve(merged_.size() + run.size());
    size_t i = 0, j = 0;
    auto push = [&](const std::pair<double, double>& e) {
      if (!scratch_.empty() && scratch_.back().first == e.first) {
        scratch_.back().second += e.second;
      } else {
        scratch_.push_back(e);
      }
    };
    while (i < merged_.size() || j < run.size()) {
      if (j == run.size() || (i < merged_.size() && merged_[i].first <= run[j].first)) {
        push(merged_[i++]);
      } else {
        push(run[j++]);
      }
    }
    merged_.swap(scratch_);
  }

  Distribution merged_;
  Distribution pending_;
  Distribution scratch_;
};

// One datum as it is stored: its exact statistic set and its distribution ("" = none stored;
// then ImpliesSingleValue(stats) says whether it has one).
struct StoredPoint {
  StatisticSet stats;
  std::string distribution;
};

Result<StoredPoint> ToStoredPoint(const MetricDatum& datum) {
  StoredPoint point;
  Distribution values_counts = datum.values_counts;
  RETURN_IF_ERROR(Normalize(datum.name, values_counts));
  if (datum.statistics) {
    const StatisticSet& s = *datum.statistics;
    if (!std::isfinite(s.sample_count) || !std::isfinite(s.sum) || !std::isfinite(s.minimum) ||
        !std::isfinite(s.maximum)) {
      return Status::InvalidArgument("metric " + datum.name + " has a non-finite statistic");
    }
    if (s.sample_count <= 0) {
      return Status::InvalidArgument("metric " + datum.name + " has a statistic set with SampleCount <= 0");
    }
    if (s.minimum > s.maximum) {
      return Status::InvalidArgument("metric " + datum.name + " has a statistic set with Minimum > Maximum");
    }
    point.stats = s;
    bool implied = values_counts.size() == 1 && ImpliesSingleValue(s) && values_counts[0].first == s.minimum &&
                   values_counts[0].second == s.sample_count;
    if (!values_counts.empty() && !implied) point.distribution = EncodeDistribution(values_counts);
    return point;
  }
  if (!datum.values_counts.empty()) {
    if (values_counts.empty()) {
      return Status::InvalidArgument("metric " + datum.name + " has values whose counts are all zero");
    }
    StatisticSet s;
    s.minimum = values_counts.front().first;
    s.maximum = values_counts.back().first;
    for (const auto& [value, count] : values_counts) {
      s.sample_count += count;
      s.sum += value * count;
    }
    if (!std::isfinite(s.sum) || !std::isfinite(s.sample_count)) {
      return Status::InvalidArgument("metric " + datum.name + " overflows: its sum is not finite");
    }
    point.stats = s;
    // One distinct value is implied by the set itself (sum == value * count exactly here).
    if (values_counts.size() > 1) point.distribution = EncodeDistribution(values_counts);
    return point;
  }
  if (!std::isfinite(datum.value)) {
    return Status::InvalidArgument("metric " + datum.name + " has a non-finite value");
  }
  point.stats = StatisticSet{1, datum.value, datum.value, datum.value};
  return point;
}

// The value a point contributes to Query/Last: its average.
double Average(const StatisticSet& stats) {
  return stats.sample_count > 0 ? stats.sum / stats.sample_count : stats.sum;
}

// List's paging key: base64 of the JSON array [namespace, name, canonical dimensions] of the
// last series returned. Series are never deleted or renamed, so a key stays meaningful.
std::string EncodeListKey(const std::string& ns, const std::string& name, const std::string& dimensions) {
  return Base64Encode(
      nlohmann::json::array({ns, name, dimensions}).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

std::optional<double> Percentile(const PeriodAggregate& period, double p) {
  if (!period.percentiles_available || period.distribution.empty() || !(p >= 0 && p <= 100)) {
    return std::nullopt;
  }
  double total = 0;
  for (const auto& [value, count] : period.distribution) total += count;
  // Nearest rank: the smallest value whose cumulative count reaches ceil(p/100 * N), at least 1.
  double rank = std::max(1.0, std::ceil(p / 100.0 * total - 1e-9 * total));
  double cumulative = 0;
  size_t index = period.distribution.size() - 1;
  for (size_t i = 0; i < period.distribution.size(); ++i) {
    cumulative += period.distribution[i].second;
    if (cumulative >= rank) {
      index = i;
      break;
    }
  }
  // A writer's sketch approximates values (its buckets' representatives); the exact extremes
  // are actual samples of the first and last bucket, and bound every percentile. For an exact
  // distribution they are its first and last values anyway.
  if (index == 0) return period.stats.minimum;
  if (index == period.distribution.size() - 1) return period.stats.maximum;
  return std::clamp(period.distribution[index].first, period.stats.minimum, period.stats.maximum);
}

std::string MetricStore::CanonicalDimensions(const Dimensions& dimensions) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [key, value] : dimensions) {
    object[key] = value;
  }
  return object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // std::map: keys sorted
}

Result<std::optional<int64_t>> MetricStore::SeriesId(std::string_view ns, std::string_view name,
                                                     const std::string& dimensions, bool create, bool cache) const {
  std::string key = CacheKey(ns, name, dimensions);
  {
    MutexLock lock(cache_mutex_);
    if (auto it = series_ids_.find(key); it != series_ids_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return std::optional<int64_t>(it->second.first);
    }
  }
  {
    ASSIGN_OR_RETURN(auto select,
                     db_->Prepare("SELECT id FROM metric_series WHERE namespace = ? AND name = ? AND dimensions = ?"));
    select.BindText(1, ns).BindText(2, name).BindText(3, dimensions);
    ASSIGN_OR_RETURN(bool row, select.Step());
    if (row) {
      int64_t id = select.ColumnInt64(0);
      if (cache) {
        MutexLock lock(cache_mutex_);
        CachePut(std::move(key), id);
      }
      return std::optional<int64_t>(id);
    }
  }
  if (!create) {
    return std::optional<int64_t>();
  }
  ASSIGN_OR_RETURN(auto insert,
                   db_->Prepare("INSERT INTO metric_series (namespace, name, dimensions) VALUES (?, ?, ?)"));
  insert.BindText(1, ns).BindText(2, name).BindText(3, dimensions);
  RETURN_IF_ERROR(insert.Run());
  int64_t id = db_->LastInsertRowId();
  return std::optional<int64_t>(id);
}

Status MetricStore::Put(std::string_view ns, const std::vector<MetricDatum>& batch) {
  if (batch.empty()) {
    return Status::Ok();
  }
  // Validate and convert everything before the transaction: a bad datum writes nothing.
  std::vector<StoredPoint> stored;
  stored.reserve(batch.size());
  for (const auto& datum : batch) {
    ASSIGN_OR_RETURN(auto point, ToStoredPoint(datum));
    stored.push_back(std::move(point));
  }
  std::vector<std::pair<std::string, int64_t>> created;
  Status status = db_->WithTransaction([&](store::Database& db) -> Status {
    created.clear();
    // seq: one more than the greatest of the same (series, timestamp), so equal timestamps keep
    // their write order; the lookup is one seek in the clustered key the insert lands in anyway.
    ASSIGN_OR_RETURN(auto insert,
                     db.Prepare("INSERT INTO metric_points (series_id, timestamp_millis, seq, sample_count, sum, "
                                "minimum, maximum, unit, storage_resolution, distribution) VALUES (?1, ?2, "
                                "COALESCE((SELECT MAX(seq) + 1 FROM metric_points WHERE series_id = ?1 AND "
                                "timestamp_millis = ?2), 0), ?3, ?4, ?5, ?6, ?7, ?8, ?9)"));
    // The series of this batch, most recent first: a batch names few series (a job's metrics, an
    // endpoint's seven), so a short linear search beats building canonical dimension text per
    // datum. Each entry also tracks the series' latest point in the batch for metric_series.
    struct BatchSeries {
      const std::string* name;
      const Dimensions* dimensions;
      int64_t id;
      int64_t last_millis;
      double last_value;
    };
    std::vector<BatchSeries> series;
    for (size_t i = 0; i < batch.size(); ++i) {
      const MetricDatum& datum = batch[i];
      BatchSeries* entry = nullptr;
      for (auto& s : series) {
        if (*s.name == datum.name && (s.dimensions == &datum.dimensions || *s.dimensions == datum.dimensions)) {
          entry = &s;
          break;
        }
      }
      if (entry == nullptr) {
        std::string dimensions = CanonicalDimensions(datum.dimensions);
        ASSIGN_OR_RETURN(auto id, SeriesId(ns, datum.name, dimensions, /*create=*/true, /*cache=*/false));
        created.emplace_back(CacheKey(ns, datum.name, dimensions), *id);
        series.push_back({&datum.name, &datum.dimensions, *id, datum.timestamp_millis, Average(stored[i].stats)});
        entry = &series.back();
      } else if (datum.timestamp_millis >= entry->last_millis) {
        entry->last_millis = datum.timestamp_millis;
        entry->last_value = Average(stored[i].stats);
      }
      const StoredPoint& point = stored[i];
      insert.Reset();
      insert.BindInt64(1, entry->id).BindInt64(2, datum.timestamp_millis);
      insert.BindDouble(3, point.stats.sample_count).BindDouble(4, point.stats.sum);
      insert.BindDouble(5, point.stats.minimum).BindDouble(6, point.stats.maximum);
      insert.BindText(7, datum.unit.empty() ? std::string_view("None") : std::string_view(datum.unit));
      insert.BindInt64(8, datum.storage_resolution);
      if (point.distribution.empty()) {
        insert.BindNull(9);
      } else {
        insert.BindBlob(9, point.distribution);
      }
      RETURN_IF_ERROR(insert.Run());
    }
    ASSIGN_OR_RETURN(auto update_last, db.Prepare("UPDATE metric_series SET last_millis = ?1, last_value = ?2 "
                                                  "WHERE id = ?3 AND (last_millis IS NULL OR last_millis <= ?1)"));
    for (const auto& s : series) {
      update_last.Reset();
      update_last.BindInt64(1, s.last_millis).BindDouble(2, s.last_value).BindInt64(3, s.id);
      RETURN_IF_ERROR(update_last.Run());
    }
    return Status::Ok();
  });
  if (status.ok()) {
    MutexLock lock(cache_mutex_);
    for (auto& [key, id] : created) {
      CachePut(std::move(key), id);
    }
  }
  return status;
}

void MetricStore::CachePut(std::string key, int64_t id) const {
  if (auto it = series_ids_.find(key); it != series_ids_.end()) {
    it->second.first = id;
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return;
  }
  while (series_ids_.size() >= max_cached_series_ && !lru_.empty()) {
    series_ids_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(key);
  series_ids_.emplace(std::move(key), std::make_pair(id, lru_.begin()));
}

size_t MetricStore::TEST_CachedSeries() const {
  MutexLock lock(cache_mutex_);
  return series_ids_.size();
}

Status MetricStore::Put(std::string_view ns, std::string_view name, const Dimensions& dimensions,
                        int64_t timestamp_millis, double value) {
  return Put(ns, {MetricDatum{std::string(name), dimensions, timestamp_millis, value}});
}

Result<std::vector<SeriesPoint>> MetricStore::Query(std::string_view ns, std::string_view name,
                                                    const Dimensions& dimensions, int64_t start_millis,
                                                    int64_t end_millis) const {
  std::vector<SeriesPoint> points;
  ASSIGN_OR_RETURN(auto id, SeriesId(ns, name, CanonicalDimensions(dimensions), /*create=*/false, /*cache=*/true));
  if (!id) {
    return points;
  }
  ASSIGN_OR_RETURN(auto select,
                   db_->Prepare("SELECT timestamp_millis, sample_count, sum FROM metric_points WHERE series_id = ? AND "
                                "timestamp_millis >= ? AND timestamp_millis < ? ORDER BY timestamp_millis, seq"));
  select.BindInt64(1, *id).BindInt64(2, start_millis).BindInt64(3, end_millis);
  while (true) {
    ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    StatisticSet stats{select.ColumnDouble(1), select.ColumnDouble(2), 0, 0};
    points.push_back(SeriesPoint{select.ColumnInt64(0), Average(stats)});
  }
  return points;
}

Result<std::vector<PeriodAggregate>> MetricStore::Aggregate(const MetricQuery& query) const {
  if (query.period_seconds <= 0) {
    return Status::InvalidArgument("period must be a positive number of seconds, got " +
                                   std::to_string(query.period_seconds));
  }
  std::vector<PeriodAggregate> periods;
  if (query.end_millis <= query.start_millis) return periods;
  ASSIGN_OR_RETURN(auto id, SeriesId(query.ns, query.name, CanonicalDimensions(query.dimensions), /*create=*/false,
                                     /*cache=*/true));
  if (!id) return periods;
  const int64_t period_millis = query.period_seconds * 1000;
  // One range scan of the clustered key, in (timestamp, seq) order; periods are filled as the
  // rows pass, so memory is the answer plus one period's distribution.
  ASSIGN_OR_RETURN(auto select,
                   db_->Prepare("SELECT timestamp_millis, sample_count, sum, minimum, maximum, unit, distribution "
                                "FROM metric_points WHERE series_id = ?1 AND timestamp_millis >= ?2 AND "
                                "timestamp_millis < ?3 AND (?4 IS NULL OR unit = ?4) ORDER BY timestamp_millis, seq"));
  select.BindInt64(1, *id).BindInt64(2, query.start_millis).BindInt64(3, query.end_millis);
  if (query.unit) {
    select.BindText(4, query.unit->empty() ? std::string_view("None") : std::string_view(*query.unit));
  } else {
    select.BindNull(4);
  }
  int64_t current = -1;  // index k of the period being filled
  PeriodAggregate* period = nullptr;
  DistributionMerger merger;
  auto finish = [&merger](PeriodAggregate& p) {
    if (p.percentiles_available) p.distribution = merger.Take();
    merger.Clear();
  };
  std::string blob;
  Distribution run;
  while (true) {
    ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    int64_t k = (select.ColumnInt64(0) - query.start_millis) / period_millis;
    StatisticSet s{select.ColumnDouble(1), select.ColumnDouble(2), select.ColumnDouble(3), select.ColumnDouble(4)};
    if (k != current) {
      if (period != nullptr) finish(*period);
      current = k;
      period = &periods.emplace_back();
      period->start_millis = query.start_millis + k * period_millis;
      period->stats = s;
      period->unit = select.ColumnText(5);
      period->percentiles_available = query.distributions;
    } else {
      period->stats.sample_count += s.sample_count;
      period->stats.sum += s.sum;
      period->stats.minimum = std::min(period->stats.minimum, s.minimum);
      period->stats.maximum = std::max(period->stats.maximum, s.maximum);
    }
    if (!period->percentiles_available) continue;
    if (!select.IsNull(6)) {
      blob = select.ColumnBlob(6);
      DecodeDistribution(blob, run);
      merger.Add(run);
    } else if (ImpliesSingleValue(s)) {
      merger.Add(s.minimum, s.sample_count);
    } else {
      // A bare statistic set: the period's percentiles cannot be known.
      period->percentiles_available = false;
      merger.Clear();
    }
  }
  if (period != nullptr) finish(*period);
  return periods;
}

Result<MetricListPage> MetricStore::List(const MetricListFilter& filter, std::string_view after_key,
                                         size_t limit) const {
  std::optional<std::array<std::string, 3>> after;
  if (!after_key.empty()) {
    auto bytes = Base64Decode(after_key);
    auto parsed = bytes ? nlohmann::json::parse(*bytes, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
    if (!parsed.is_array() || parsed.size() != 3 || !parsed[0].is_string() || !parsed[1].is_string() ||
        !parsed[2].is_string()) {
      return Status::InvalidArgument("the paging key is not one this server issued");
    }
    after = {parsed[0].get<std::string>(), parsed[1].get<std::string>(), parsed[2].get<std::string>()};
  }
  // Only the conditions in use appear in the SQL, so a namespace (and name) equality can seek the
  // (namespace, name, dimensions) unique index, which also gives the order.
  std::string sql = "SELECT namespace, name, dimensions FROM metric_series WHERE last_millis IS NOT NULL";
  if (filter.ns) sql += " AND namespace = ?1";
  if (filter.name) sql += " AND name = ?2";
  if (filter.active_since_millis) sql += " AND last_millis >= ?3";
  if (after) sql += " AND (namespace, name, dimensions) > (?4, ?5, ?6)";
  sql += " ORDER BY namespace, name, dimensions";
  ASSIGN_OR_RETURN(auto select, db_->Prepare(sql));
  if (filter.ns) select.BindText(1, *filter.ns);
  if (filter.name) select.BindText(2, *filter.name);
  if (filter.active_since_millis) select.BindInt64(3, *filter.active_since_millis);
  if (after) select.BindText(4, (*after)[0]).BindText(5, (*after)[1]).BindText(6, (*after)[2]);
  MetricListPage page;
  std::string last_dimensions;
  while (true) {
    ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    std::string dimensions_text = select.ColumnText(2);
    Dimensions dimensions = ParseDimensions(dimensions_text);
    bool match = true;
    for (const auto& [key, value] : filter.dimensions) {
      auto it = dimensions.find(key);
      if (it == dimensions.end() || (value && it->second != *value)) {
        match = false;
        break;
      }
    }
    if (!match) continue;
    if (limit != 0 && page.metrics.size() == limit) {
      // A further match exists: the page ends at the last series returned.
      const MetricId& last = page.metrics.back();
      page.next_key = EncodeListKey(last.ns, last.name, last_dimensions);
      break;
    }
    page.metrics.push_back(MetricId{select.ColumnText(0), select.ColumnText(1), std::move(dimensions)});
    last_dimensions = std::move(dimensions_text);
  }
  return page;
}

Result<std::optional<SeriesPoint>> MetricStore::Last(std::string_view ns, std::string_view name,
                                                     const Dimensions& dimensions) const {
  ASSIGN_OR_RETURN(auto select, db_->Prepare("SELECT last_millis, last_value FROM metric_series WHERE namespace = ? "
                                             "AND name = ? AND dimensions = ? AND last_millis IS NOT NULL"));
  select.BindText(1, ns).BindText(2, name).BindText(3, CanonicalDimensions(dimensions));
  ASSIGN_OR_RETURN(bool row, select.Step());
  if (!row) {
    return std::optional<SeriesPoint>();
  }
  return std::optional<SeriesPoint>(SeriesPoint{select.ColumnInt64(0), select.ColumnDouble(1)});
}

Result<std::vector<SeriesInfo>> MetricStore::ListSeries(std::string_view ns, std::optional<std::string_view> name,
                                                        const Dimensions& dimensions) const {
  std::vector<SeriesInfo> out;
  ASSIGN_OR_RETURN(
      auto select,
      db_->Prepare("SELECT name, dimensions, last_millis, last_value FROM metric_series WHERE namespace = ? "
                   "AND dimensions = ? AND (?3 IS NULL OR name = ?3) AND last_millis IS NOT NULL "
                   "ORDER BY name"));
  select.BindText(1, ns).BindText(2, CanonicalDimensions(dimensions));
  if (name) {
    select.BindText(3, *name);
  } else {
    select.BindNull(3);
  }
  while (true) {
    ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    out.push_back(SeriesInfo{select.ColumnText(0), ParseDimensions(select.ColumnText(1)),
                             SeriesPoint{select.ColumnInt64(2), select.ColumnDouble(3)}});
  }
  return out;
}

}  // namespace kiln::observe
