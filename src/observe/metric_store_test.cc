#include "observe/metric_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

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
  ASSERT_TRUE(store_->Put(kNs, {{"train:loss", job_, 3000, 0.3}, {"train:loss", job_, 1000, 0.9},
                                {"train:loss", job_, 2000, 0.5}, {"val:acc", job_, 2500, 0.7}})
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
