#include "observe/metric_store.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace kiln::observe {

namespace {

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

}  // namespace

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
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = series_ids_.find(key); it != series_ids_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return std::optional<int64_t>(it->second.first);
    }
  }
  {
    ASSIGN_OR_RETURN(auto select, db_->Prepare("SELECT id FROM metric_series WHERE namespace = ? AND name = ? AND dimensions = ?"));
    select.BindText(1, ns).BindText(2, name).BindText(3, dimensions);
    ASSIGN_OR_RETURN(bool row, select.Step());
    if (row) {
      int64_t id = select.ColumnInt64(0);
      if (cache) {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        CachePut(std::move(key), id);
      }
      return std::optional<int64_t>(id);
    }
  }
  if (!create) {
    return std::optional<int64_t>();
  }
  ASSIGN_OR_RETURN(auto insert, db_->Prepare("INSERT INTO metric_series (namespace, name, dimensions) VALUES (?, ?, ?)"));
  insert.BindText(1, ns).BindText(2, name).BindText(3, dimensions);
  RETURN_IF_ERROR(insert.Run());
  int64_t id = db_->LastInsertRowId();
  return std::optional<int64_t>(id);
}

Status MetricStore::Put(std::string_view ns, const std::vector<MetricDatum>& batch) {
  if (batch.empty()) {
    return Status::Ok();
  }
  for (const auto& datum : batch) {
    if (!std::isfinite(datum.value)) {
      return Status::InvalidArgument("metric " + datum.name + " has a non-finite value");
    }
  }
  std::vector<std::pair<std::string, int64_t>> created;
  Status status = db_->WithTransaction([&](store::Database& db) -> Status {
    created.clear();
    ASSIGN_OR_RETURN(auto insert, db.Prepare("INSERT INTO metric_points (series_id, timestamp_millis, value) VALUES (?, ?, ?)"));
    ASSIGN_OR_RETURN(auto update_last,
                     db.Prepare("UPDATE metric_series SET last_millis = ?1, last_value = ?2 "
                                "WHERE id = ?3 AND (last_millis IS NULL OR last_millis <= ?1)"));
    // Consecutive points of one series (the common case: a job's lines) resolve the id once.
    std::string previous_name;
    const Dimensions* previous_dimensions = nullptr;
    int64_t series_id = -1;
    for (const auto& datum : batch) {
      if (series_id < 0 || datum.name != previous_name || previous_dimensions == nullptr ||
          datum.dimensions != *previous_dimensions) {
        std::string dimensions = CanonicalDimensions(datum.dimensions);
        ASSIGN_OR_RETURN(auto id, SeriesId(ns, datum.name, dimensions, /*create=*/true, /*cache=*/false));
        series_id = *id;
        created.emplace_back(CacheKey(ns, datum.name, dimensions), series_id);
        previous_name = datum.name;
        previous_dimensions = &datum.dimensions;
      }
      insert.Reset();
      insert.BindInt64(1, series_id).BindInt64(2, datum.timestamp_millis).BindDouble(3, datum.value);
      RETURN_IF_ERROR(insert.Run());
      update_last.Reset();
      update_last.BindInt64(1, datum.timestamp_millis).BindDouble(2, datum.value).BindInt64(3, series_id);
      RETURN_IF_ERROR(update_last.Run());
    }
    return Status::Ok();
  });
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
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
  std::lock_guard<std::mutex> lock(cache_mutex_);
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
                   db_->Prepare("SELECT timestamp_millis, value FROM metric_points WHERE series_id = ? AND "
                                "timestamp_millis >= ? AND timestamp_millis < ? ORDER BY timestamp_millis, rowid"));
  select.BindInt64(1, *id).BindInt64(2, start_millis).BindInt64(3, end_millis);
  while (true) {
    ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) break;
    points.push_back(SeriesPoint{select.ColumnInt64(0), select.ColumnDouble(1)});
  }
  return points;
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
  ASSIGN_OR_RETURN(auto select,
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
