// MetricStore benchmark (not a test: prints numbers; see bench/README.md "Metric store").
//
// (a) Ingest: `--writers` threads (8), each a training job logging `--rate` metric lines per
//     second (1,000) and handing them to the store as the training controller does: one batch
//     every `--batch-ms` (100), every line stored twice (TrainingJobName and Host dimensions).
//     Paced for `--seconds`, then unpaced (each writer puts its next batch as soon as the last
//     returns) for the same time: the sustained rate against the offered one, the headroom, and
//     Put latency. Reference: the same number of transactions each inserting one row into a
//     bare table (the commit/fsync floor of the same database).
// (b) Aggregate: one series of `--points` (100,000) points, one per second, queried at 60 s
//     periods over its whole span as GetMetricData/GetMetricStatistics do (every statistic and
//     the merged distributions): single values, ModelLatency-like points (a statistic set with
//     a ~20-bucket sketch), and the same 100k points at 1 kHz (2 periods of 60,000 points).
//     Reference: a bare SQLite range scan of the same rows reading the same columns.
//
// Durable database (synchronous=FULL, WAL) in a fresh directory under `--dir` ($TMPDIR).
// Usage: metric_store_benchmark [--writers N] [--rate R] [--batch-ms M] [--seconds S]
//                               [--points P] [--runs K] [--dir D]

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "observe/metric_store.h"
#include "store/database.h"

namespace {

using kiln::observe::Dimensions;
using kiln::observe::MetricDatum;
using kiln::observe::MetricQuery;
using kiln::observe::MetricStore;
using Clock = std::chrono::steady_clock;

struct Options {
  int writers = 8;
  int rate = 1000;
  int batch_ms = 100;
  int seconds = 10;
  int points = 100'000;
  int runs = 20;
  std::string dir = std::filesystem::temp_directory_path().string();
};

double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

void Die(const kiln::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

struct IngestResult {
  double seconds = 0;
  uint64_t lines = 0;
  std::vector<double> put_ms;
};

// One phase of (a). `paced`: a batch every batch_ms per writer; else back to back.
IngestResult Ingest(MetricStore& store, const Options& o, bool paced, int64_t base_millis) {
  const int per_batch = o.rate * o.batch_ms / 1000;
  std::mutex mutex;
  IngestResult result;
  std::atomic<uint64_t> lines{0};
  auto start = Clock::now();
  auto deadline = start + std::chrono::seconds(o.seconds);
  std::vector<std::thread> threads;
  for (int w = 0; w < o.writers; ++w) {
    threads.emplace_back([&, w] {
      const std::string job = "bench-job-" + std::to_string(w) + (paced ? "-paced" : "-unpaced");
      const Dimensions job_dims{{"TrainingJobName", job}};
      const Dimensions host_dims{{"Host", job + "/algo-1"}};
      std::vector<double> latencies;
      int64_t line = 0;
      auto next = start;
      while (Clock::now() < deadline) {
        if (paced) {
          std::this_thread::sleep_until(next);
          next += std::chrono::milliseconds(o.batch_ms);
        }
        std::vector<MetricDatum> batch;
        batch.reserve(2 * per_batch);
        for (int i = 0; i < per_batch; ++i, ++line) {
          // A training script's lines: alternating metrics, one per millisecond of job time.
          const char* name = (line % 2) ? "train:loss" : "train:accuracy";
          double value = 1.0 / static_cast<double>(line + 1);
          int64_t ts = base_millis + line * 1000 / o.rate;
          batch.push_back(
              {.name = name, .dimensions = job_dims, .timestamp_millis = ts, .value = value, .unit = "None"});
          batch.push_back(
              {.name = name, .dimensions = host_dims, .timestamp_millis = ts, .value = value, .unit = "None"});
        }
        auto t0 = Clock::now();
        Die(store.Put("/aws/sagemaker/TrainingJobs", batch), "Put");
        latencies.push_back(Millis(Clock::now() - t0));
        lines += per_batch;
      }
      std::lock_guard<std::mutex> lock(mutex);
      result.put_ms.insert(result.put_ms.end(), latencies.begin(), latencies.end());
    });
  }
  for (auto& t : threads) t.join();
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.lines = lines;
  return result;
}

// The commit floor: `transactions` transactions of one tiny insert each, from `writers` threads.
double CommitFloor(kiln::store::Database& db, int writers, int transactions) {
  Die(db.Exec("CREATE TABLE IF NOT EXISTS bench_commit_floor (x INTEGER)"), "create");
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w) {
    threads.emplace_back([&] {
      for (int i = 0; i < transactions / writers; ++i) {
        Die(db.WithTransaction([](kiln::store::Database& d) -> kiln::Status {
          return d.Exec("INSERT INTO bench_commit_floor (x) VALUES (1)");
        }),
            "commit floor");
      }
    });
  }
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void PrintIngest(const char* row, const IngestResult& r, int writers, int rate) {
  double lines_per_s = static_cast<double>(r.lines) / r.seconds;
  std::printf("%-22s %10.0f %12.0f %10.0f %9.2f %9.2f %9.2f %8zu\n", row, static_cast<double>(writers) * rate,
              lines_per_s, 2 * lines_per_s, Quantile(r.put_ms, 0.5), Quantile(r.put_ms, 0.99), Quantile(r.put_ms, 1.0),
              r.put_ms.size());
}

struct AggregateRow {
  const char* name;
  std::vector<double> ms;
  size_t periods = 0;
};

// A bare scan of the same rows and columns through the SQLite C API (no Kiln code).
double RawScanMillis(const std::string& path, int64_t series_id, int64_t start, int64_t end) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db,
                     "SELECT timestamp_millis, sample_count, sum, minimum, maximum, unit, distribution FROM "
                     "metric_points WHERE series_id = ?1 AND timestamp_millis >= ?2 AND timestamp_millis < ?3",
                     -1, &st, nullptr);
  auto t0 = Clock::now();
  sqlite3_bind_int64(st, 1, series_id);
  sqlite3_bind_int64(st, 2, start);
  sqlite3_bind_int64(st, 3, end);
  double sink = 0;
  while (sqlite3_step(st) == SQLITE_ROW) {
    sink += static_cast<double>(sqlite3_column_int64(st, 0)) + sqlite3_column_double(st, 1) +
            sqlite3_column_double(st, 2) + sqlite3_column_double(st, 3) + sqlite3_column_double(st, 4);
    sink += sqlite3_column_bytes(st, 5) + sqlite3_column_bytes(st, 6);
    if (sqlite3_column_blob(st, 6) != nullptr) sink += 1;
  }
  double ms = Millis(Clock::now() - t0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  if (sink == 42) std::printf(" ");  // keep the loop
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string value = argv[i + 1];
    if (flag == "--writers")
      o.writers = std::atoi(value.c_str());
    else if (flag == "--rate")
      o.rate = std::atoi(value.c_str());
    else if (flag == "--batch-ms")
      o.batch_ms = std::atoi(value.c_str());
    else if (flag == "--seconds")
      o.seconds = std::atoi(value.c_str());
    else if (flag == "--points")
      o.points = std::atoi(value.c_str());
    else if (flag == "--runs")
      o.runs = std::atoi(value.c_str());
    else if (flag == "--dir")
      o.dir = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::string tmpl = o.dir + "/kiln-metric-bench-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string path = tmpl + "/kiln.db";
  auto opened = kiln::store::Database::Open(path, {});
  Die(opened.status(), "open");
  auto db = std::move(opened).value();
  MetricStore store(db.get());
  std::printf("metric store benchmark: %u CPUs, database %s (durable)\n\n", std::thread::hardware_concurrency(),
              path.c_str());

  // (a) ingest
  std::printf("(a) ingest: %d writers x %d lines/s, a batch every %d ms, each line stored twice, %d s per row\n",
              o.writers, o.rate, o.batch_ms, o.seconds);
  std::printf("%-22s %10s %12s %10s %9s %9s %9s %8s\n", "row", "offered/s", "lines/s", "points/s", "put p50", "put p99",
              "put max", "batches");
  IngestResult paced = Ingest(store, o, /*paced=*/true, 1'000'000'000);
  PrintIngest("paced (1 kHz each)", paced, o.writers, o.rate);
  IngestResult unpaced = Ingest(store, o, /*paced=*/false, 1'000'000'000);
  PrintIngest("unpaced (capacity)", unpaced, o.writers, o.rate);
  int floor_transactions = static_cast<int>(unpaced.put_ms.size());
  double floor_seconds = CommitFloor(*db, o.writers, std::max(floor_transactions, o.writers));
  std::printf(
      "paced: sustained %.3fx the offered rate; unpaced: %.1fx headroom over 8 x 1 kHz; "
      "unpaced commits %.0f/s vs bare commits %.0f/s\n\n",
      static_cast<double>(paced.lines) / paced.seconds / (o.writers * o.rate),
      static_cast<double>(unpaced.lines) / unpaced.seconds / (o.writers * o.rate),
      static_cast<double>(unpaced.put_ms.size()) / unpaced.seconds,
      std::max(floor_transactions, o.writers) / floor_seconds);

  // (b) aggregate
  const Dimensions dims{{"EndpointName", "bench"}, {"VariantName", "AllTraffic"}};
  const int64_t t0 = 1'800'000'000'000;
  struct Series {
    const char* name;
    int64_t step_millis;
    bool sketch;
  };
  std::vector<Series> series = {{"SingleValues", 1000, false}, {"ModelLatency", 1000, true}, {"OneKhz", 1, false}};
  for (const auto& s : series) {
    for (int base = 0; base < o.points; base += 1000) {
      std::vector<MetricDatum> batch;
      for (int i = base; i < std::min(o.points, base + 1000); ++i) {
        MetricDatum d{.name = s.name,
                      .dimensions = dims,
                      .timestamp_millis = t0 + i * s.step_millis,
                      .value = static_cast<double>((i * 7919) % 1000)};
        if (s.sketch) {
          // A second of ~50 requests in ~20 latency buckets around 10 ms (as InvocationMetrics writes).
          double sum = 0, count = 0, lo = 1e18, hi = 0;
          for (int b = 0; b < 20; ++b) {
            double v = 9000 * std::pow(1.0202, b + (i % 7));
            double c = 1 + (b * 13 + i) % 4;
            d.values_counts.emplace_back(v, c);
            sum += v * c;
            count += c;
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          d.statistics = kiln::observe::StatisticSet{count, sum, lo, hi};
          d.unit = "Microseconds";
        }
        batch.push_back(std::move(d));
      }
      Die(store.Put("AWS/SageMaker", batch), "Put series");
    }
  }
  std::printf("(b) Aggregate over one series of %d points, all statistics and distributions, %d runs\n", o.points,
              o.runs);
  std::printf("%-40s %8s %9s %9s %9s %12s\n", "row", "periods", "p50 ms", "p90 ms", "min ms", "raw scan ms");
  struct Row {
    const Series& s;
    bool distributions;
  };
  std::vector<Row> rows = {{series[0], true}, {series[1], true}, {series[1], false}, {series[2], true}};
  for (const auto& [s, distributions] : rows) {
    MetricQuery q{.ns = "AWS/SageMaker",
                  .name = s.name,
                  .dimensions = dims,
                  .start_millis = t0,
                  .end_millis = t0 + static_cast<int64_t>(o.points) * s.step_millis + 60'000,
                  .period_seconds = 60,
                  .distributions = distributions};
    std::vector<double> ms, raw;
    size_t periods = 0;
    double p99_sink = 0;
    for (int r = 0; r < o.runs; ++r) {
      auto start = Clock::now();
      auto result = store.Aggregate(q);
      Die(result.status(), "Aggregate");
      // What the API does with each period: every statistic, and p99.
      for (const auto& p : *result) {
        p99_sink += p.stats.sum / p.stats.sample_count + p.stats.minimum + p.stats.maximum;
        if (auto v = kiln::observe::Percentile(p, 99)) p99_sink += *v;
      }
      ms.push_back(Millis(Clock::now() - start));
      periods = result->size();
    }
    auto id_stmt = db->Prepare("SELECT id FROM metric_series WHERE name = ?");
    Die(id_stmt.status(), "prepare");
    auto stmt = std::move(id_stmt).value();
    stmt.BindText(1, s.name);
    Die(stmt.Step().status(), "step");
    int64_t id = stmt.ColumnInt64(0);
    { auto drop = std::move(stmt); }
    for (int r = 0; r < o.runs; ++r) raw.push_back(RawScanMillis(path, id, q.start_millis, q.end_millis));
    char row[64];
    std::snprintf(row, sizeof(row), "%s%s%s", s.name,
                  s.step_millis == 1 ? " (1 kHz)" : (s.sketch ? " (20-bucket sketch)" : " (1/s)"),
                  distributions ? "" : " no pct");
    std::printf("%-40s %8zu %9.2f %9.2f %9.2f %12.2f\n", row, periods, Quantile(ms, 0.5), Quantile(ms, 0.9),
                Quantile(ms, 0.0), Quantile(raw, 0.5));
    if (p99_sink == 42) std::printf(" ");
  }
  std::filesystem::remove_all(tmpl);
  return 0;
}
