#include "control/training_controller.h"

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using nlohmann::json;

TEST(RecordSecondaryStatusTest, AppendsOnChangeAndReplacesMessageWithinAStatus) {
  store::TrainingJobRecord record;
  RecordSecondaryStatus(record, "Starting", "Starting the training job", 1000);
  RecordSecondaryStatus(record, "Starting", "Preparing the instances for training", 1500);
  RecordSecondaryStatus(record, "Downloading", "Downloading input data", 2000);
  const json& t = record.state["transitions"];
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0]["Status"], "Starting");
  EXPECT_EQ(t[0]["StartTime"], 1000);
  EXPECT_EQ(t[0]["EndTime"], 2000);  // closed when the status changed
  EXPECT_EQ(t[0]["StatusMessage"], "Preparing the instances for training");
  EXPECT_EQ(t[1]["Status"], "Downloading");
  EXPECT_FALSE(t[1].contains("EndTime"));
  EXPECT_EQ(record.secondary_status, "Downloading");
  EXPECT_EQ(record.state["status_message"], "Downloading input data");
  EXPECT_EQ(record.last_modified_millis, 2000);
}

TEST(MetricDefinitionsFromJsonTest, TakesNameAndRegexAndSkipsJunk) {
  auto defs = MetricDefinitionsFromJson(json::parse(R"j([{"Name":"loss","Regex":"loss=(\\S+)"}, 3, {"Name":"acc"}])j"));
  ASSERT_EQ(defs.size(), 2u);
  EXPECT_EQ(defs[0].name, "loss");
  EXPECT_EQ(defs[0].regex, "loss=(\\S+)");
  EXPECT_EQ(defs[1].name, "acc");
  EXPECT_EQ(defs[1].regex, "");
  EXPECT_TRUE(MetricDefinitionsFromJson(json::object()).empty());
}

}  // namespace
}  // namespace kiln::control
