#include "serving/invocation_metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>
#include <vector>

#include "serving/prometheus.h"
#include "store/test_util/temp_database.h"

namespace kiln::serving {
namespace {

constexpr std::string_view kNs = "AWS/SageMaker";

InvocationSample Sample(int64_t second, int status, int64_t model_us, int64_t overhead_us, double per_instance = 0.5) {
  InvocationSample s;
  s.epoch_second = second;
  s.per_instance = per_instance;
  s.model_status = status;
  s.model_error = status < 200 || status > 299;
  s.model_micros = model_us;
  s.overhead_micros = overhead_us;
  return s;
}

class InvocationMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    store_ = std::make_unique<observe::MetricStore>(db_.get());
  }
  // The statistic set stored for one second (exactly one point expected).
  observe::PeriodAggregate Second(std::string_view name, int64_t second, std::string_view variant = "AllTraffic") {
    auto periods = store_->Aggregate({.ns = std::string(kNs),
                                      .name = std::string(name),
                                      .dimensions = {{"EndpointName", "ep"}, {"VariantName", std::string(variant)}},
                                      .start_millis = second * 1000,
                                      .end_millis = second * 1000 + 1000,
                                      .period_seconds = 1});
    EXPECT_TRUE(periods.ok());
    if (!periods.ok() || periods->size() != 1) {
      ADD_FAILURE() << name << " @" << second << ": " << (periods.ok() ? periods->size() : 0) << " periods";
      return {};
    }
    return (*periods)[0];
  }
  // The Sum of one second (what the old tests read as the point's value).
  double Point(std::string_view name, int64_t second, std::string_view variant = "AllTraffic") {
    return Second(name, second, variant).stats.sum;
  }
  size_t Count(std::string_view name, std::string_view variant = "AllTraffic") {
    auto points =
        store_->Query(kNs, name, {{"EndpointName", "ep"}, {"VariantName", std::string(variant)}}, 0, INT64_MAX);
    return points.ok() ? points->size() : 0;
  }
  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> store_;
};

TEST_F(InvocationMetricsTest, AggregatesPerSecondAndWritesSumsAndAverages) {
  InvocationMetrics metrics({}, store_.get());
  metrics.Record("ep", "AllTraffic", Sample(100, 200, 1000, 100));
  metrics.Record("ep", "AllTraffic", Sample(100, 404, 3000, 300));
  metrics.Record("ep", "AllTraffic", Sample(100, 503, 2000, 200));
  metrics.Record("ep", "AllTraffic", Sample(101, 200, 500, 50, 1.0));
  // From other threads (other shards): merged into the same points.
  std::thread other([&] { metrics.Record("ep", "AllTraffic", Sample(100, 200, 2000, 400)); });
  other.join();

  // Only finished seconds are written.
  ASSERT_TRUE(metrics.Flush(101).ok());
  EXPECT_EQ(Point("Invocations", 100), 4);
  EXPECT_EQ(Point("InvocationsPerInstance", 100), 2.0);
  EXPECT_EQ(Point("Invocation4XXErrors", 100), 1);
  EXPECT_EQ(Point("Invocation5XXErrors", 100), 1);
  EXPECT_EQ(Point("InvocationModelErrors", 100), 2);
  EXPECT_EQ(Point("ModelLatency", 100), 8000);     // 1000+3000+2000+2000
  EXPECT_EQ(Point("OverheadLatency", 100), 1000);  // 100+300+200+400
  EXPECT_EQ(Count("Invocations"), 1u);
  // Whole statistic sets: one sample per request.
  using observe::StatisticSet;
  EXPECT_EQ(Second("Invocations", 100).stats, (StatisticSet{4, 4, 1, 1}));
  EXPECT_EQ(Second("Invocations", 100).unit, "Count");
  EXPECT_EQ(Second("InvocationsPerInstance", 100).stats, (StatisticSet{4, 2, 0.5, 0.5}));
  EXPECT_EQ(Second("Invocation4XXErrors", 100).stats, (StatisticSet{4, 1, 0, 1}));  // Average 0.25 = the rate
  EXPECT_EQ(Second("InvocationModelErrors", 100).stats, (StatisticSet{4, 2, 0, 1}));
  EXPECT_EQ(observe::Percentile(Second("InvocationModelErrors", 100), 50), 0.0);
  EXPECT_EQ(observe::Percentile(Second("InvocationModelErrors", 100), 51), 1.0);
  auto latency = Second("ModelLatency", 100);
  EXPECT_EQ(latency.stats, (StatisticSet{4, 8000, 1000, 3000}));
  EXPECT_EQ(latency.unit, "Microseconds");
  ASSERT_TRUE(latency.percentiles_available);
  EXPECT_EQ(observe::Percentile(latency, 0), 1000.0);    // the exact minimum bounds the sketch
  EXPECT_EQ(observe::Percentile(latency, 100), 3000.0);  // and the exact maximum
  EXPECT_NEAR(*observe::Percentile(latency, 50), 2000.0, 20.0);
  EXPECT_EQ(Second("OverheadLatency", 100).stats, (StatisticSet{4, 1000, 100, 400}));

  ASSERT_TRUE(metrics.Flush(102).ok());
  EXPECT_EQ(Point("Invocations", 101), 1);
  EXPECT_EQ(Point("InvocationsPerInstance", 101), 1.0);
  EXPECT_EQ(Point("Invocation4XXErrors", 101), 0);
  // Nothing new: no zero points.
  ASSERT_TRUE(metrics.Flush(110).ok());
  EXPECT_EQ(Count("Invocations"), 2u);
}

TEST_F(InvocationMetricsTest, UnavailableIsNotAnInvocationAndNotWritten) {
  InvocationMetrics metrics({}, store_.get());
  InvocationSample s;
  s.epoch_second = 100;
  s.reached_model = false;
  metrics.Record("ep", "AllTraffic", s);
  ASSERT_TRUE(metrics.Flush(200).ok());
  EXPECT_EQ(Count("Invocations"), 0u);
  auto totals = metrics.Totals();
  EXPECT_EQ((totals[{"ep", "AllTraffic"}].unavailable), 1u);
  EXPECT_EQ((totals[{"ep", "AllTraffic"}].invocations), 0u);
}

TEST_F(InvocationMetricsTest, TotalsIncludeUnflushedAndAreCumulative) {
  InvocationMetrics metrics({}, nullptr);
  metrics.Record("ep", "A", Sample(100, 200, 10, 1));
  metrics.Record("ep", "B", Sample(100, 500, 10, 1));
  EXPECT_EQ((metrics.Totals()[{"ep", "A"}].invocations), 1u);
  ASSERT_TRUE(metrics.Flush(101).ok());
  // Flushed totals keep the counters but no sketch (Prometheus uses the fixed buckets).
  EXPECT_EQ((metrics.Totals()[{"ep", "A"}].model_latency.count), 1u);
  EXPECT_EQ((metrics.Totals()[{"ep", "A"}].model_latency.sketch.buckets()), 0u);
  metrics.Record("ep", "A", Sample(101, 200, 10, 1));
  auto totals = metrics.Totals();
  EXPECT_EQ((totals[{"ep", "A"}].invocations), 2u);
  EXPECT_EQ((totals[{"ep", "B"}].errors_5xx), 1u);
  EXPECT_EQ((totals[{"ep", "A"}].model_latency.count), 2u);
}

TEST_F(InvocationMetricsTest, LateFlushStillPutsPointsInTheirSecond) {
  InvocationMetrics metrics({}, store_.get());
  metrics.Record("ep", "AllTraffic", Sample(100, 200, 10, 1));
  metrics.Record("ep", "AllTraffic", Sample(101, 200, 10, 1));
  metrics.Record("ep", "AllTraffic", Sample(101, 200, 10, 1));
  metrics.Record("ep", "AllTraffic", Sample(102, 200, 10, 1));
  ASSERT_TRUE(metrics.Flush(103).ok());
  EXPECT_EQ(Point("Invocations", 100), 1);
  EXPECT_EQ(Point("Invocations", 101), 2);
  EXPECT_EQ(Point("Invocations", 102), 1);
}

TEST_F(InvocationMetricsTest, StopFlushesTheCurrentSecond) {
  auto metrics = std::make_unique<InvocationMetrics>(InvocationMetricsOptions{}, store_.get());
  metrics->Start();
  int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  metrics->Record("ep", "AllTraffic", Sample(now, 200, 10, 1));
  metrics->Stop();
  EXPECT_EQ(Point("Invocations", now), 1);
}

TEST_F(InvocationMetricsTest, FlusherWritesWithinAboutASecond) {
  InvocationMetrics metrics({}, store_.get());
  metrics.Start();
  int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  metrics.Record("ep", "AllTraffic", Sample(now, 200, 10, 1));
  for (int i = 0; i < 50 && Count("Invocations") == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(Count("Invocations"), 1u);
  metrics.Stop();
}

// Stored points keep exact statistics per second, and periods of several seconds merge them
// exactly; percentiles of a period come from the merged sketches within 1%.
TEST_F(InvocationMetricsTest, LatencyStatisticsAreExactAndPercentilesWithinOnePercent) {
  InvocationMetrics metrics({}, store_.get());
  std::vector<int64_t> all;
  for (int64_t second = 200; second < 260; ++second) {
    for (int i = 0; i < 50; ++i) {
      int64_t us = 100 + (second - 200) * 997 + i * i * 31;  // spread over ~100 us .. ~136 ms
      all.push_back(us);
      metrics.Record("ep", "AllTraffic", Sample(second, 200, us, us / 10, i % 2 ? 0.5 : 1.0));
    }
  }
  ASSERT_TRUE(metrics.Flush(300).ok());
  auto periods = store_->Aggregate({.ns = std::string(kNs),
                                    .name = "ModelLatency",
                                    .dimensions = {{"EndpointName", "ep"}, {"VariantName", "AllTraffic"}},
                                    .start_millis = 200'000,
                                    .end_millis = 260'000,
                                    .period_seconds = 60});
  ASSERT_TRUE(periods.ok());
  ASSERT_EQ(periods->size(), 1u);
  const auto& minute = (*periods)[0];
  std::sort(all.begin(), all.end());
  double sum = 0;
  for (int64_t us : all) sum += static_cast<double>(us);
  EXPECT_EQ(minute.stats, (observe::StatisticSet{3000, sum, double(all.front()), double(all.back())}));
  for (double p : {1.0, 10.0, 50.0, 90.0, 99.0, 99.9}) {
    size_t rank = static_cast<size_t>(std::ceil(p / 100 * all.size() - 1e-6));  // p99.9 of 3000: 2997
    double exact = static_cast<double>(all[rank - 1]);
    auto estimate = observe::Percentile(minute, p);
    ASSERT_TRUE(estimate.has_value()) << p;
    EXPECT_NEAR(*estimate, exact, exact * 0.01) << "p" << p;
  }
  // InvocationsPerInstance: exact extremes across seconds (half the requests saw 2 instances).
  periods = store_->Aggregate({.ns = std::string(kNs),
                               .name = "InvocationsPerInstance",
                               .dimensions = {{"EndpointName", "ep"}, {"VariantName", "AllTraffic"}},
                               .start_millis = 200'000,
                               .end_millis = 260'000,
                               .period_seconds = 60});
  ASSERT_EQ(periods->size(), 1u);
  EXPECT_EQ((*periods)[0].stats, (observe::StatisticSet{3000, 2250, 0.5, 1.0}));
}

TEST(LatencySketchTest, EveryValueIsWithinOnePercentOfItsBucket) {
  for (int64_t us : {int64_t(1), int64_t(2), int64_t(7), int64_t(99), int64_t(100), int64_t(101), int64_t(12345),
                     int64_t(999999), int64_t(60'000'000), int64_t(1) << 40}) {
    double value = LatencySketch::ValueOf(LatencySketch::BucketOf(us));
    EXPECT_LE(std::fabs(value - double(us)), double(us) * LatencySketch::kRelativeError * (1 + 1e-9)) << us;
  }
  EXPECT_EQ(LatencySketch::ValueOf(LatencySketch::BucketOf(0)), 0.0);
  LatencySketch a, b;
  a.Add(100);
  a.Add(100);
  a.Add(0);
  b.Add(100);
  b.Add(5000);
  a.Merge(b);
  auto values = a.ValuesCounts();
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0], (std::pair<double, double>{0.0, 1.0}));
  EXPECT_EQ(values[1].second, 3.0);
  EXPECT_NEAR(values[1].first, 100.0, 1.0);
  EXPECT_EQ(values[2].second, 1.0);
  // Sparse: a second of similar latencies needs few buckets.
  LatencySketch c;
  for (int64_t us = 10'000; us < 11'000; ++us) c.Add(us);
  EXPECT_LE(c.buckets(), 6u);
}

TEST(LatencyHistogramTest, Buckets) {
  LatencyHistogram h;
  h.Add(400);       // ≤ 0.0005
  h.Add(500);       // ≤ 0.0005 (upper bound inclusive)
  h.Add(501);       // ≤ 0.001
  h.Add(90000000);  // +Inf
  EXPECT_EQ(h.buckets[0], 2u);
  EXPECT_EQ(h.buckets[1], 1u);
  EXPECT_EQ(h.buckets.back(), 1u);
  EXPECT_EQ(h.count, 4u);
  EXPECT_EQ(h.sum_micros, 90001401);
  EXPECT_EQ(h.min_micros, 400);
  EXPECT_EQ(h.max_micros, 90000000);
  EXPECT_EQ(h.sketch.buckets(), 3u);  // 500 and 501 share a 1% bucket
}

TEST(PrometheusTest, RendersCountersHistogramsAndGauges) {
  InvocationMetrics metrics({}, nullptr);
  metrics.Record("ep", "AllTraffic", Sample(100, 200, 2000, 300));
  metrics.Record("ep", "AllTraffic", Sample(100, 404, 600, 100));
  RoutingTable routes;
  auto route = std::make_shared<EndpointRoute>();
  route->name = "ep";
  route->status = "InService";
  VariantRoute variant;
  variant.name = "AllTraffic";
  auto instance = std::make_shared<InstanceTarget>();
  instance->instance_id = "i-1";
  instance->outstanding = 3;
  variant.instances = {instance, std::make_shared<InstanceTarget>()};
  route->variants.push_back(variant);
  routes.Publish(route);

  PrometheusExporter exporter(&metrics, &routes, nullptr);
  std::string text;
  exporter.Render(&text);
  auto has = [&](std::string_view line) { return text.find(std::string(line) + "\n") != std::string::npos; };
  EXPECT_TRUE(has("# TYPE kiln_invocations_total counter")) << text;
  EXPECT_TRUE(has("kiln_invocations_total{endpoint=\"ep\",variant=\"AllTraffic\"} 2")) << text;
  EXPECT_TRUE(has("kiln_invocation_4xx_errors_total{endpoint=\"ep\",variant=\"AllTraffic\"} 1")) << text;
  EXPECT_TRUE(has("kiln_invocation_5xx_errors_total{endpoint=\"ep\",variant=\"AllTraffic\"} 0")) << text;
  EXPECT_TRUE(has("kiln_invocation_model_errors_total{endpoint=\"ep\",variant=\"AllTraffic\"} 1")) << text;
  EXPECT_TRUE(has("# TYPE kiln_model_latency_seconds histogram")) << text;
  EXPECT_TRUE(has("kiln_model_latency_seconds_bucket{endpoint=\"ep\",variant=\"AllTraffic\",le=\"0.001\"} 1")) << text;
  EXPECT_TRUE(has("kiln_model_latency_seconds_bucket{endpoint=\"ep\",variant=\"AllTraffic\",le=\"0.0025\"} 2")) << text;
  EXPECT_TRUE(has("kiln_model_latency_seconds_bucket{endpoint=\"ep\",variant=\"AllTraffic\",le=\"+Inf\"} 2")) << text;
  EXPECT_TRUE(has("kiln_model_latency_seconds_sum{endpoint=\"ep\",variant=\"AllTraffic\"} 0.002600")) << text;
  EXPECT_TRUE(has("kiln_model_latency_seconds_count{endpoint=\"ep\",variant=\"AllTraffic\"} 2")) << text;
  EXPECT_TRUE(has("kiln_overhead_latency_seconds_count{endpoint=\"ep\",variant=\"AllTraffic\"} 2")) << text;
  EXPECT_TRUE(has("kiln_routable_instances{endpoint=\"ep\",variant=\"AllTraffic\"} 2")) << text;
  EXPECT_TRUE(has("kiln_instance_outstanding_requests{endpoint=\"ep\",variant=\"AllTraffic\",instance=\"i-1\"} 3"))
      << text;
  // Every non-comment line is `name{labels} value`.
  for (std::string_view rest = text; !rest.empty();) {
    size_t nl = rest.find('\n');
    ASSERT_NE(nl, std::string_view::npos);
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl + 1);
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    EXPECT_TRUE(line.starts_with("kiln_")) << line;
    EXPECT_NE(line.rfind(' '), std::string_view::npos) << line;
  }
}

TEST(PrometheusTest, EscapesLabelValues) { EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd"); }

// Memory follows live endpoints: endpoints that come and go (each with traffic from several
// threads) leave no cells once idle and no totals once deleted; a live endpoint's totals stay.
TEST_F(InvocationMetricsTest, CellsAndTotalsOfGoneEndpointsAreDropped) {
  std::set<std::string> live = {"keep"};
  InvocationMetricsOptions options;
  options.idle_cell_seconds = 60;
  options.is_live = [&](std::string_view endpoint) { return live.count(std::string(endpoint)) > 0; };
  InvocationMetrics metrics(options, store_.get());
  int64_t second = 1000;
  for (int round = 0; round < 50; ++round, second += 100) {
    std::string name = "churn-" + std::to_string(round);
    live.insert(name);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        metrics.Record(name, "AllTraffic", Sample(second, 200, 100, 10));
        metrics.Record("keep", "AllTraffic", Sample(second, 200, 100, 10));
      });
    }
    for (auto& thread : threads) thread.join();
    ASSERT_TRUE(metrics.Flush(second + 1).ok());
    EXPECT_EQ((metrics.Totals()[{name, "AllTraffic"}].invocations), 4u);
    live.erase(name);  // deleted; its cells idle out, then its totals go
  }
  ASSERT_TRUE(metrics.Flush(second + 61).ok());
  auto stats = metrics.TEST_MemoryStats();
  EXPECT_EQ(stats.cells, 0u);
  EXPECT_EQ(stats.totals, 1u);
  auto totals = metrics.Totals();
  ASSERT_EQ(totals.size(), 1u);
  EXPECT_EQ((totals[{"keep", "AllTraffic"}].invocations), 200u);  // cumulative across idle spells
  // A later request recreates the cell and adds to the same total.
  metrics.Record("keep", "AllTraffic", Sample(second + 70, 200, 100, 10));
  EXPECT_EQ((metrics.Totals()[{"keep", "AllTraffic"}].invocations), 201u);
  EXPECT_EQ(metrics.TEST_MemoryStats().cells, 1u);
}

// Multi-container endpoints (serving-contract.md §8, §15.2): a pipeline container's cell gives
// ContainerLatency only, a Direct container's the invocation metrics too, each with ContainerName;
// Prometheus totals keep the variant's only.
TEST(InvocationMetricsContainerTest, ContainerLatencyAndDirectMetricsCarryContainerName) {
  InvocationMetrics metrics({}, nullptr);
  InvocationSample sample;
  sample.epoch_second = 1000;
  sample.model_micros = 250;
  metrics.RecordContainer("ep", "v", "pre", /*direct=*/false, sample);
  metrics.Record("ep", "v", sample);
  auto totals = metrics.Totals();
  ASSERT_EQ(totals.size(), 1u);
  EXPECT_EQ(totals.begin()->second.invocations, 1u);

  InvocationCounts counts;
  counts.Add(sample);
  auto serial = InvocationMetrics::PointsFor("ep", "v", 1000, counts, "pre", false);
  ASSERT_EQ(serial.size(), 1u);
  EXPECT_EQ(serial[0].name, "ContainerLatency");
  EXPECT_EQ(serial[0].unit, "Microseconds");
  EXPECT_EQ(serial[0].dimensions.at("ContainerName"), "pre");
  EXPECT_EQ(serial[0].dimensions.at("EndpointName"), "ep");
  EXPECT_DOUBLE_EQ(serial[0].statistics->sum, 250);
  auto direct = InvocationMetrics::PointsFor("ep", "v", 1000, counts, "model", true);
  std::set<std::string> names;
  for (const auto& point : direct) {
    names.insert(point.name);
    EXPECT_EQ(point.dimensions.at("ContainerName"), "model");
  }
  EXPECT_TRUE(names.count("ContainerLatency") && names.count("Invocations") && names.count("ModelLatency"));
  for (const auto& point : InvocationMetrics::PointsFor("ep", "v", 1000, counts)) {
    EXPECT_FALSE(point.dimensions.count("ContainerName"));
    EXPECT_NE(point.name, "ContainerLatency");
  }
}

}  // namespace
}  // namespace kiln::serving
