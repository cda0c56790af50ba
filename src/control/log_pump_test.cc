#include "control/log_pump.h"

#include <gtest/gtest.h>

#include <fstream>

#include "base/fs.h"
#include "store/test_util/temp_database.h"

namespace kiln::control {
namespace {

class LogPumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    auto logs = observe::LogStore::Open({dir_.path() + "/logs", db_.get(), nullptr});
    ASSERT_TRUE(logs.ok()) << logs.status().ToString();
    logs_ = std::move(logs).value();
  }
  void Append(const std::string& records) { std::ofstream(output(), std::ios::app) << records; }
  std::string output() const { return dir_.path() + "/output.log"; }
  LogPump::Options Options(int64_t start = 0) {
    LogPump::Options o;
    o.output_path = output();
    o.offset_path = dir_.path() + "/log.offset";
    o.start_offset = start;
    o.group = "/aws/sagemaker/TrainingJobs";
    o.stream = "job/algo-1-1";
    return o;
  }
  std::vector<std::string> Messages() {
    observe::EventsQuery q;
    q.start_from_head = true;
    auto page = logs_->GetEvents("/aws/sagemaker/TrainingJobs", "job/algo-1-1", q);
    std::vector<std::string> out;
    if (!page.ok()) return out;
    for (const auto& e : page->events) out.push_back(e.message);
    return out;
  }
  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::LogStore> logs_;
};

TEST_F(LogPumpTest, LinesBecomeEventsMetricsAndAnOffset) {
  Append("1000 o epoch=1 loss=0.5\n1001 e warning: slow\n1002 o \n");
  auto extractor = observe::MetricExtractor::Create({{"loss", "loss=([0-9.]+)"}});
  ASSERT_TRUE(extractor.ok());
  std::vector<observe::MetricPoint> points;
  auto options = Options();
  options.extractor = std::shared_ptr<const observe::MetricExtractor>(std::move(extractor).value());
  options.on_metrics = [&](const std::vector<observe::MetricPoint>& p) {
    points.insert(points.end(), p.begin(), p.end());
  };
  LogPump pump(options, logs_.get());
  pump.Start();
  Append("1003 o epoch=2 loss=0.25\n1004 o partial");  // the last record is not complete yet
  pump.Stop(/*drain=*/true);
  // The empty line is skipped (CloudWatch events are 1..256 KiB); the partial record waits.
  EXPECT_EQ(Messages(), (std::vector<std::string>{"epoch=1 loss=0.5", "warning: slow", "epoch=2 loss=0.25"}));
  ASSERT_EQ(points.size(), 2u);
  EXPECT_DOUBLE_EQ(points[1].value, 0.25);
  EXPECT_EQ(points[1].timestamp_millis, 1003);
  EXPECT_EQ(pump.last_stderr_line(), "warning: slow");
  auto size = ReadFile(output());
  EXPECT_EQ(LogPump::ReadOffset(dir_.path() + "/log.offset"),
            static_cast<int64_t>(size->size() - std::string("1004 o partial").size()));
}

TEST_F(LogPumpTest, ResumesAtTheRecordedOffsetWithoutRepeats) {
  Append("1 o one\n2 o two\n");
  {
    LogPump first(Options(), logs_.get());
    first.Start();
    first.Stop(true);
  }
  Append("3 o three\n");
  LogPump second(Options(LogPump::ReadOffset(dir_.path() + "/log.offset")), logs_.get());
  second.Start();
  second.Stop(true);
  EXPECT_EQ(Messages(), (std::vector<std::string>{"one", "two", "three"}));
}

}  // namespace
}  // namespace kiln::control
