#include "observe/metric_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "store/migrations.h"
#include "store/test_util/temp_database.h"

namespace kiln::observe {
namespace {

constexpr std::string_view kNs = "/aws/sagemaker/TrainingJobs";

class MetricStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    store_ = std::make_unique<MetricStore>(db_.get());
  }
  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<MetricStore> store_;
  Dimensions job_{{"TrainingJobName", "churn-1"}};
  Dimensions host_{{"TrainingJobName", "churn-1"}, {"Host", "churn-1/algo-1"}};
};

TEST_F(MetricStoreTest, PutQueryInTimeOrder) {
  ASSERT_TRUE(store_
                  ->Put(kNs, {{"train:loss", job_, 3000, 0.3},
                              {"train:loss", job_, 1000, 0.9},
                              {"train:loss", job_, 2000, 0.5},
                              {"val:acc", job_, 2500, 0.7}})
                  .ok());
  auto points = store_->Query(kNs, "train:loss", job_, 0, 10000);
  ASSERT_TRUE(points.ok()) << points.status().ToString();
  EXPECT_EQ(*points, (std::vector<SeriesPoint>{{1000, 0.9}, {2000, 0.5}, {3000, 0.3}}));
  // [start, end)
  points = store_->Query(kNs, "train:loss", job_, 2000, 3000);
  ASSERT_TRUE(points.ok());
  EXPECT_EQ(*points, (std::vector<SeriesPoint>{{2000, 0.5}}));
  // Unknown series and other namespaces are empty, not errors.
  EXPECT_TRUE(store_->Query(kNs, "nope", job_, 0, 10000)->empty());
  EXPECT_TRUE(store_->Query("/aws/other", "train:loss", job_, 0, 10000)->empty());
}

TEST_F(MetricStoreTest, DimensionsAreMatchedAsAWholeSet) {
  ASSERT_TRUE(store_->Put(kNs, "train:loss", job_, 1000, 1.0).ok());
  ASSERT_TRUE(store_->Put(kNs, "train:loss", host_, 1000, 2.0).ok());
  EXPECT_EQ(store_->Query(kNs, "train:loss", job_, 0, 5000)->size(), 1u);
  EXPECT_EQ((*store_->Query(kNs, "train:loss", host_, 0, 5000))[0].value, 2.0);
  EXPECT_TRUE(store_->Query(kNs, "train:loss", {{"Host", "churn-1/algo-1"}}, 0, 5000)->empty());
}

TEST_F(MetricStoreTest, LastIsTheLatestTimestampAndListSeriesGivesFinalMetrics) {
  EXPECT_FALSE(store_->Last(kNs, "train:loss", job_)->has_value());
  ASSERT_TRUE(store_->Put(kNs, {{"train:loss", job_, 2000, 0.5}, {"val:acc", job_, 1500, 0.6}}).ok());
  ASSERT_TRUE(store_->Put(kNs, {{"train:loss", job_, 1000, 0.9}}).ok());  // late arrival, older
  ASSERT_TRUE(store_->Put(kNs, {{"train:loss", job_, 2000, 0.4}}).ok());  // same time, written later
  auto last = store_->Last(kNs, "train:loss", job_);
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ(**last, (SeriesPoint{2000, 0.4}));

  ASSERT_TRUE(store_->Put(kNs, "train:loss", host_, 9000, 0.1).ok());  // another dimension set
  auto series = store_->ListSeries(kNs, std::nullopt, job_);
  ASSERT_TRUE(series.ok()) << series.status().ToString();
  ASSERT_EQ(series->size(), 2u);
  EXPECT_EQ((*series)[0].name, "train:loss");
  EXPECT_EQ((*series)[0].dimensions, job_);
  EXPECT_EQ((*series)[0].last, (SeriesPoint{2000, 0.4}));
  EXPECT_EQ((*series)[1].name, "val:acc");
  EXPECT_EQ(store_->ListSeries(kNs, std::string_view("val:acc"), job_)->size(), 1u);
}

TEST_F(MetricStoreTest, BatchIsAllOrNothing) {
  EXPECT_TRUE(store_->Put(kNs, {{"a", job_, 1, 1.0}, {"b", job_, 2, NAN}}).IsInvalidArgument());
  EXPECT_TRUE(store_->Query(kNs, "a", job_, 0, 10)->empty());
  EXPECT_TRUE(store_->Put(kNs, {}).ok());
}

TEST_F(MetricStoreTest, DurableAcrossReopen) {
  ASSERT_TRUE(store_->Put(kNs, "train:loss", job_, 1000, 1.5).ok());
  store_.reset();
  db_.reset();
  db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
  store_ = std::make_unique<MetricStore>(db_.get());
  EXPECT_EQ(*store_->Query(kNs, "train:loss", job_, 0, 5000), (std::vector<SeriesPoint>{{1000, 1.5}}));
}

TEST_F(MetricStoreTest, ConcurrentWritersAndReaders) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Dimensions dims{{"TrainingJobName", "job-" + std::to_string(t)}};
      for (int batch = 0; batch < 20; ++batch) {
        std::vector<MetricDatum> data;
        for (int i = 0; i < 10; ++i) data.push_back({"loss", dims, batch * 10 + i, double(i)});
        EXPECT_TRUE(store_->Put(kNs, data).ok());
        EXPECT_TRUE(store_->Last(kNs, "loss", dims).ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(store_->Query(kNs, "loss", {{"TrainingJobName", "job-" + std::to_string(t)}}, 0, 1000)->size(), 200u);
  }
}

// Series are never deleted, so the id cache must not grow with every series ever written: it
// keeps the most recently used ones, and evicted series read and write as before.
TEST_F(MetricStoreTest, SeriesIdCacheIsBounded) {
  MetricStore store(db_.get(), /*max_cached_series=*/8);
  for (int job = 0; job < 100; ++job) {
    Dimensions dims{{"TrainingJobName", "job-" + std::to_string(job)}};
    ASSERT_TRUE(store.Put(kNs, "loss", dims, 1000, job).ok());
    ASSERT_TRUE(store.Last(kNs, "loss", dims).ok());
    EXPECT_LE(store.TEST_CachedSeries(), 8u);
  }
  EXPECT_EQ(store.TEST_CachedSeries(), 8u);
  for (int job = 0; job < 100; job += 7) {
    Dimensions dims{{"TrainingJobName", "job-" + std::to_string(job)}};
    ASSERT_TRUE(store.Put(kNs, "loss", dims, 2000, job + 0.5).ok());
    EXPECT_EQ(*store.Query(kNs, "loss", dims, 0, 5000),
              (std::vector<SeriesPoint>{{1000, double(job)}, {2000, job + 0.5}}));
    EXPECT_EQ(store.Last(kNs, "loss", dims)->value().value, job + 0.5);
  }
  EXPECT_EQ(store.ListSeries(kNs, "loss", {{"TrainingJobName", "job-3"}})->size(), 1u);
  EXPECT_LE(store.TEST_CachedSeries(), 8u);
}

// Helpers for the statistic-set tests.
MetricDatum Value(const std::string& name, const Dimensions& dims, int64_t ts, double value, std::string unit = "") {
  return MetricDatum{.name = name, .dimensions = dims, .timestamp_millis = ts, .value = value, .unit = std::move(unit)};
}
MetricDatum Set(const std::string& name, const Dimensions& dims, int64_t ts, StatisticSet stats,
                std::vector<std::pair<double, double>> values_counts = {}) {
  return MetricDatum{.name = name,
                     .dimensions = dims,
                     .timestamp_millis = ts,
                     .statistics = stats,
                     .values_counts = std::move(values_counts)};
}
MetricDatum Values(const std::string& name, const Dimensions& dims, int64_t ts,
                   std::vector<std::pair<double, double>> values_counts) {
  return MetricDatum{
      .name = name, .dimensions = dims, .timestamp_millis = ts, .values_counts = std::move(values_counts)};
}

TEST_F(MetricStoreTest, AggregateIsExactAcrossPointsAndPeriods) {
  // Periods of 60 s aligned on the query's start (10 s past a minute), not on the minute.
  const int64_t t0 = 1'700'000'010'000;
  ASSERT_TRUE(store_
                  ->Put(kNs, {Value("lat", job_, t0 + 1'000, 5),                           // period 0
                              Set("lat", job_, t0 + 2'000, {4, 10, 1, 4}),                 // period 0
                              Values("lat", job_, t0 + 59'999, {{2, 3}, {7, 1}, {2, 1}}),  // period 0
                              Value("lat", job_, t0 + 60'000, -3),                         // period 1
                              Value("lat", job_, t0 + 180'000, 0.25),                      // period 3
                              Value("lat", job_, t0 + 180'000, 0.5),                       // period 3, same ms
                              Value("lat", job_, t0 - 1, 1e9),                             // before start
                              Value("lat", job_, t0 + 240'000, 1e9)})                      // at end: excluded
                  .ok());
  MetricQuery query{.ns = std::string(kNs),
                    .name = "lat",
                    .dimensions = job_,
                    .start_millis = t0,
                    .end_millis = t0 + 240'000,
                    .period_seconds = 60};
  auto periods = store_->Aggregate(query);
  ASSERT_TRUE(periods.ok()) << periods.status().ToString();
  ASSERT_EQ(periods->size(), 3u);  // period 2 has no points: absent
  const PeriodAggregate& p0 = (*periods)[0];
  EXPECT_EQ(p0.start_millis, t0);
  // 1 sample of 5; a set of 4 summing to 10 in [1, 4]; values 2 x4 and 7 x1.
  EXPECT_EQ(p0.stats, (StatisticSet{1 + 4 + 5, 5 + 10 + 15, 1, 7}));
  EXPECT_EQ(p0.unit, "None");
  EXPECT_FALSE(p0.percentiles_available);  // the bare set (1..4) has no distribution
  EXPECT_EQ(Percentile(p0, 50), std::nullopt);
  EXPECT_EQ((*periods)[1].start_millis, t0 + 60'000);
  EXPECT_EQ((*periods)[1].stats, (StatisticSet{1, -3, -3, -3}));
  EXPECT_EQ((*periods)[2].start_millis, t0 + 180'000);
  EXPECT_EQ((*periods)[2].stats, (StatisticSet{2, 0.75, 0.25, 0.5}));

  // One 300 s period merges everything in [t0, t0 + 240 s).
  query.period_seconds = 300;
  periods = store_->Aggregate(query);
  ASSERT_TRUE(periods.ok());
  ASSERT_EQ(periods->size(), 1u);
  EXPECT_EQ((*periods)[0].stats, (StatisticSet{13, 30 - 3 + 0.75, -3, 7}));

  // An empty range, an unknown series: no periods. A non-positive period: InvalidArgument.
  query.end_millis = query.start_millis;
  EXPECT_TRUE(store_->Aggregate(query)->empty());
  query.end_millis = t0 + 240'000;
  query.name = "nope";
  EXPECT_TRUE(store_->Aggregate(query)->empty());
  query.name = "lat";
  query.period_seconds = 0;
  EXPECT_TRUE(store_->Aggregate(query).status().IsInvalidArgument());

  // Query/Last see a set's average.
  auto points = store_->Query(kNs, "lat", job_, t0 + 2'000, t0 + 2'001);
  ASSERT_EQ(points->size(), 1u);
  EXPECT_EQ((*points)[0].value, 2.5);
}

TEST_F(MetricStoreTest, PercentilesAreNearestRankOverMergedDistributions) {
  const int64_t t0 = 60'000;
  // 1..100 spread over four points of one period: values, values+counts, an implied set and a
  // set with its own distribution.
  std::vector<MetricDatum> data;
  for (int v = 1; v <= 40; ++v) data.push_back(Value("lat", job_, t0 + v, v));
  std::vector<std::pair<double, double>> mid;
  for (int v = 41; v <= 80; ++v) mid.emplace_back(v, 1);
  data.push_back(Values("lat", job_, t0 + 100, mid));
  data.push_back(Set("lat", job_, t0 + 200, {1, 81, 81, 81}));  // implies {(81, 1)}
  std::vector<std::pair<double, double>> high;
  double high_sum = 0;
  for (int v = 82; v <= 100; ++v) {
    high.emplace_back(v, 1);
    high_sum += v;
  }
  data.push_back(Set("lat", job_, t0 + 300, {19, high_sum, 82, 100}, high));
  ASSERT_TRUE(store_->Put(kNs, data).ok());
  auto periods = store_->Aggregate(
      {.ns = std::string(kNs), .name = "lat", .dimensions = job_, .start_millis = t0, .end_millis = t0 + 60'000});
  ASSERT_TRUE(periods.ok());
  ASSERT_EQ(periods->size(), 1u);
  const PeriodAggregate& p = (*periods)[0];
  EXPECT_EQ(p.stats, (StatisticSet{100, 5050, 1, 100}));
  ASSERT_TRUE(p.percentiles_available);
  EXPECT_EQ(p.distribution.size(), 100u);
  EXPECT_EQ(Percentile(p, 0), 1.0);
  EXPECT_EQ(Percentile(p, 1), 1.0);
  EXPECT_EQ(Percentile(p, 50), 50.0);
  EXPECT_EQ(Percentile(p, 50.5), 51.0);
  EXPECT_EQ(Percentile(p, 90), 90.0);
  EXPECT_EQ(Percentile(p, 99.9), 100.0);
  EXPECT_EQ(Percentile(p, 100), 100.0);
  EXPECT_EQ(Percentile(p, 101), std::nullopt);

  // Repeated values merge: 3 x 10 and 1 x 20 → p75 = 10, p76 = 20.
  ASSERT_TRUE(store_->Put(kNs, {Values("c", job_, t0, {{10, 2}, {20, 1}}), Value("c", job_, t0 + 1, 10)}).ok());
  periods = store_->Aggregate(
      {.ns = std::string(kNs), .name = "c", .dimensions = job_, .start_millis = t0, .end_millis = t0 + 60'000});
  ASSERT_EQ(periods->size(), 1u);
  EXPECT_EQ((*periods)[0].distribution, (std::vector<std::pair<double, double>>{{10, 3}, {20, 1}}));
  EXPECT_EQ(Percentile((*periods)[0], 75), 10.0);
  EXPECT_EQ(Percentile((*periods)[0], 76), 20.0);
}

// Many distinct values in random order, mixed with multi-value points, merge into the same
// distribution a brute-force count gives; without `distributions` nothing is merged.
TEST_F(MetricStoreTest, MergedDistributionMatchesABruteForceCount) {
  std::map<double, double> expected;
  std::vector<MetricDatum> data;
  uint64_t x = 12345;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (int i = 0; i < 5000; ++i) {
    if (i % 50 == 0) {
      std::vector<std::pair<double, double>> values;
      for (int j = 0; j < 20; ++j) values.emplace_back(double(next() % 300), double(1 + next() % 3));
      for (const auto& [v, c] : values) expected[v] += c;
      data.push_back(Values("d", job_, 1'000 + i, values));
    } else {
      double v = double(next() % 100000) / 7;
      expected[v] += 1;
      data.push_back(Value("d", job_, 1'000 + i, v));
    }
  }
  ASSERT_TRUE(store_->Put(kNs, data).ok());
  MetricQuery query{.ns = std::string(kNs), .name = "d", .dimensions = job_, .start_millis = 0, .end_millis = 60'000};
  auto periods = store_->Aggregate(query);
  ASSERT_EQ(periods->size(), 1u);
  ASSERT_TRUE((*periods)[0].percentiles_available);
  EXPECT_EQ((*periods)[0].distribution, (std::vector<std::pair<double, double>>(expected.begin(), expected.end())));
  query.distributions = false;
  periods = store_->Aggregate(query);
  ASSERT_EQ(periods->size(), 1u);
  EXPECT_FALSE((*periods)[0].percentiles_available);
  EXPECT_TRUE((*periods)[0].distribution.empty());
  EXPECT_EQ(Percentile((*periods)[0], 50), std::nullopt);
}

TEST_F(MetricStoreTest, PercentilesOfASketchStayWithinTheExactExtremes) {
  // A writer's sketch may place a sample's bucket value slightly outside the true range.
  ASSERT_TRUE(
      store_->Put(kNs, {Set("lat", job_, 1'000, {3, 300.5, 99.5, 101}, {{99.0, 1}, {100.0, 1}, {101.5, 1}})}).ok());
  auto periods = store_->Aggregate(
      {.ns = std::string(kNs), .name = "lat", .dimensions = job_, .start_millis = 0, .end_millis = 60'000});
  ASSERT_EQ(periods->size(), 1u);
  EXPECT_EQ(Percentile((*periods)[0], 0), 99.5);
  EXPECT_EQ(Percentile((*periods)[0], 50), 100.0);
  EXPECT_EQ(Percentile((*periods)[0], 100), 101.0);
}

TEST_F(MetricStoreTest, UnitFilterSelectsPointsStoredWithThatUnit) {
  ASSERT_TRUE(store_
                  ->Put(kNs, {Value("m", job_, 1'000, 1, "Count"), Value("m", job_, 2'000, 10, "Seconds"),
                              Value("m", job_, 3'000, 100, "Count"), Value("m", job_, 4'000, 1000)})
                  .ok());
  MetricQuery query{.ns = std::string(kNs),
                    .name = "m",
                    .dimensions = job_,
                    .start_millis = 0,
                    .end_millis = 60'000,
                    .unit = "Count"};
  auto periods = store_->Aggregate(query);
  ASSERT_EQ(periods->size(), 1u);
  EXPECT_EQ((*periods)[0].stats, (StatisticSet{2, 101, 1, 100}));
  EXPECT_EQ((*periods)[0].unit, "Count");
  query.unit = "None";  // no unit given is stored as None
  periods = store_->Aggregate(query);
  ASSERT_EQ(periods->size(), 1u);
  EXPECT_EQ((*periods)[0].stats, (StatisticSet{1, 1000, 1000, 1000}));
  query.unit = "Bytes";
  EXPECT_TRUE(store_->Aggregate(query)->empty());
  query.unit.reset();
  EXPECT_EQ((*store_->Aggregate(query))[0].stats.sample_count, 4);
}

TEST_F(MetricStoreTest, InvalidDataIsRefusedAndNothingIsWritten) {
  std::vector<std::vector<MetricDatum>> bad = {
      {Set("x", job_, 1, {1, 5, 6, 4})},         // Minimum > Maximum
      {Set("x", job_, 1, {0, 0, 0, 0})},         // no samples
      {Set("x", job_, 1, {1, INFINITY, 1, 1})},  // non-finite
      {Values("x", job_, 1, {{1, -1}})},         // negative count
      {Values("x", job_, 1, {{NAN, 1}})},        // non-finite value
      {Values("x", job_, 1, {{1, 0}, {2, 0}})},  // every count zero
      {Values("x", job_, 1, {{1e308, 10}})},     // sum overflows
  };
  for (const auto& batch : bad) {
    std::vector<MetricDatum> with_good = {Value("x", job_, 0, 1)};
    with_good.insert(with_good.end(), batch.begin(), batch.end());
    EXPECT_TRUE(store_->Put(kNs, with_good).IsInvalidArgument());
  }
  EXPECT_TRUE(store_->Query(kNs, "x", job_, -10, 10)->empty());
  // Zero counts beside real ones are dropped, not refused.
  ASSERT_TRUE(store_->Put(kNs, {Values("x", job_, 1, {{1, 0}, {2, 3}})}).ok());
  auto periods = store_->Aggregate(
      {.ns = std::string(kNs), .name = "x", .dimensions = job_, .start_millis = 0, .end_millis = 60'000});
  EXPECT_EQ((*periods)[0].stats, (StatisticSet{3, 6, 2, 2}));
}

TEST_F(MetricStoreTest, ListFiltersAndPagesInAStableOrder) {
  const Dimensions ep_a{{"EndpointName", "a"}, {"VariantName", "v1"}};
  const Dimensions ep_b{{"EndpointName", "b"}, {"VariantName", "v1"}};
  ASSERT_TRUE(store_
                  ->Put("AWS/SageMaker", {Value("Invocations", ep_a, 10'000, 1), Value("Invocations", ep_b, 20'000, 1),
                                          Value("ModelLatency", ep_a, 30'000, 1)})
                  .ok());
  ASSERT_TRUE(
      store_->Put(kNs, {Value("loss", job_, 5'000, 1), Value("loss", host_, 40'000, 1), Value("acc", {}, 1'000, 1)})
          .ok());
  auto ids = [](const MetricListPage& page) {
    std::vector<std::string> out;
    for (const auto& m : page.metrics)
      out.push_back(m.ns + "|" + m.name + "|" + MetricStore::CanonicalDimensions(m.dimensions));
    return out;
  };
  auto all = store_->List({}, "", 0);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(ids(*all), (std::vector<std::string>{
                           R"(/aws/sagemaker/TrainingJobs|acc|{})",
                           R"(/aws/sagemaker/TrainingJobs|loss|{"Host":"churn-1/algo-1","TrainingJobName":"churn-1"})",
                           R"(/aws/sagemaker/TrainingJobs|loss|{"TrainingJobName":"churn-1"})",
                           R"(AWS/SageMaker|Invocations|{"EndpointName":"a","VariantName":"v1"})",
                           R"(AWS/SageMaker|Invocations|{"EndpointName":"b","VariantName":"v1"})",
                           R"(AWS/SageMaker|ModelLatency|{"EndpointName":"a","VariantName":"v1"})",
                       }));
  EXPECT_EQ(all->next_key, "");

  EXPECT_EQ(store_->List({.ns = "AWS/SageMaker"}, "", 0)->metrics.size(), 3u);
  EXPECT_EQ(store_->List({.ns = "AWS/SageMaker", .name = "Invocations"}, "", 0)->metrics.size(), 2u);
  // A dimension filter with a value must match; without one, the dimension must only be present.
  auto filtered = store_->List({.dimensions = {{"EndpointName", "a"}}}, "", 0);
  ASSERT_EQ(filtered->metrics.size(), 2u);
  EXPECT_EQ(filtered->metrics[0].dimensions, ep_a);
  EXPECT_EQ(store_->List({.dimensions = {{"TrainingJobName", std::nullopt}}}, "", 0)->metrics.size(), 2u);
  EXPECT_EQ(
      store_->List({.dimensions = {{"TrainingJobName", std::nullopt}, {"Host", std::nullopt}}}, "", 0)->metrics.size(),
      1u);
  EXPECT_TRUE(store_->List({.dimensions = {{"EndpointName", "c"}}}, "", 0)->metrics.empty());
  // RecentlyActive: series whose last point is at/after the bound.
  auto recent = store_->List({.active_since_millis = 20'000}, "", 0);
  EXPECT_EQ(ids(*recent),
            (std::vector<std::string>{
                R"(/aws/sagemaker/TrainingJobs|loss|{"Host":"churn-1/algo-1","TrainingJobName":"churn-1"})",
                R"(AWS/SageMaker|Invocations|{"EndpointName":"b","VariantName":"v1"})",
                R"(AWS/SageMaker|ModelLatency|{"EndpointName":"a","VariantName":"v1"})",
            }));

  // Pages of 2 walk the same order; a series created between pages, before the key, is not
  // returned and does not shift later pages; one after the key is.
  std::vector<std::string> walked;
  std::string key;
  int pages = 0;
  do {
    auto page = store_->List({}, key, 2);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    auto page_ids = ids(*page);
    EXPECT_LE(page_ids.size(), 2u);
    walked.insert(walked.end(), page_ids.begin(), page_ids.end());
    key = page->next_key;
    if (++pages == 1) {
      ASSERT_TRUE(store_->Put(kNs, {Value("aaa", job_, 1, 1), Value("zzz", job_, 1, 1)}).ok());
    }
  } while (!key.empty() && pages < 10);
  std::vector<std::string> expected = ids(*all);
  expected.insert(expected.begin() + 3, R"(/aws/sagemaker/TrainingJobs|zzz|{"TrainingJobName":"churn-1"})");
  EXPECT_EQ(walked, expected);
  EXPECT_EQ(pages, 4);  // 7 series in pages of 2

  EXPECT_TRUE(store_->List({}, "not a key", 2).status().IsInvalidArgument());
  EXPECT_TRUE(store_->List({}, "WzFd", 2).status().IsInvalidArgument());  // base64 of [1]
}

// A database written before migration 7 (one value per point) opens with its points as
// single-sample statistic sets, in their original order.
TEST(MetricStoreMigrationTest, OldPointsBecomeSingleSamplePoints) {
  store::testing::TempDir dir;
  const auto& all = store::AllMigrations();
  std::vector<store::Migration> before(all.begin(), all.begin() + 6);
  ASSERT_EQ(before.back().version, 6);
  const Dimensions job{{"TrainingJobName", "old"}};
  {
    store::Database::Options options;
    options.durable = false;
    options.migrations = &before;
    auto db = store::Database::Open(dir.path() + "/kiln.db", options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    ASSERT_TRUE(
        (*db)
            ->Exec("INSERT INTO metric_series (id, namespace, name, dimensions, last_millis, last_value) "
                   "VALUES (1, '/aws/sagemaker/TrainingJobs', 'loss', '{\"TrainingJobName\":\"old\"}', 2000, 0.4);"
                   "INSERT INTO metric_points (series_id, timestamp_millis, value) VALUES "
                   "(1, 2000, 0.5), (1, 1000, 0.9), (1, 2000, 0.4), (1, 61000, 0.1)")
            .ok());
  }
  auto db = store::testing::OpenTestDatabase(dir.path(), /*durable=*/false);
  EXPECT_EQ(db->schema_version(), all.back().version);
  MetricStore store(db.get());
  EXPECT_EQ(*store.Query(kNs, "loss", job, 0, 100'000),
            (std::vector<SeriesPoint>{{1000, 0.9}, {2000, 0.5}, {2000, 0.4}, {61000, 0.1}}));
  EXPECT_EQ(store.Last(kNs, "loss", job)->value(), (SeriesPoint{2000, 0.4}));
  auto periods = store.Aggregate(
      {.ns = std::string(kNs), .name = "loss", .dimensions = job, .start_millis = 0, .end_millis = 120'000});
  ASSERT_TRUE(periods.ok()) << periods.status().ToString();
  ASSERT_EQ(periods->size(), 2u);
  EXPECT_EQ((*periods)[0].stats, (StatisticSet{3, 0.9 + 0.5 + 0.4, 0.4, 0.9}));
  EXPECT_EQ((*periods)[0].unit, "None");
  EXPECT_EQ(Percentile((*periods)[0], 50), 0.5);
  EXPECT_EQ((*periods)[1].stats, (StatisticSet{1, 0.1, 0.1, 0.1}));
  // New points after old ones at the same millisecond keep write order.
  ASSERT_TRUE(store.Put(kNs, "loss", job, 2000, 0.3).ok());
  EXPECT_EQ(store.Query(kNs, "loss", job, 2000, 2001)->back().value, 0.3);
  EXPECT_EQ(store.Last(kNs, "loss", job)->value(), (SeriesPoint{2000, 0.3}));
  EXPECT_EQ(store.List({.ns = std::string(kNs)}, "", 0)->metrics.size(), 1u);
}

TEST_F(MetricStoreTest, WriteThroughput) {
  // Not asserted: how many points per second one writer gets in batches of 500 (durable commits).
  store::testing::TempDir other;
  auto db = store::testing::OpenTestDatabase(other.path(), /*durable=*/true);
  MetricStore store(db.get());
  constexpr int kBatches = 40, kPerBatch = 500;
  auto start = std::chrono::steady_clock::now();
  for (int batch = 0; batch < kBatches; ++batch) {
    std::vector<MetricDatum> data;
    for (int i = 0; i < kPerBatch; ++i) {
      data.push_back({i % 2 ? "train:loss" : "val:acc", host_, int64_t(batch) * kPerBatch + i, 0.5});
    }
    ASSERT_TRUE(store.Put(kNs, data).ok());
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("MetricStore::Put: %.0f points/s (batches of %d, durable)\n", kBatches * kPerBatch / seconds, kPerBatch);
}

}  // namespace
}  // namespace kiln::observe
