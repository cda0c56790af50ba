#include "control/instance_placement.h"

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

TEST(InstancePlacement, TagsSetPartitionQosAndAccount) {
  auto placement = PlacementFromTags({{"kiln:slurm-partition", "gpu"},
                                      {"kiln:slurm-qos", "high"},
                                      {"kiln:slurm-account", "ml"},
                                      {"kiln:slurm-partition-x", "no"},
                                      {"team", "a"}});
  EXPECT_EQ(placement, (std::map<std::string, std::string>{{"partition", "gpu"}, {"qos", "high"}, {"account", "ml"}}));
  EXPECT_TRUE(PlacementFromTags({{"kiln:slurm-qos", ""}}).empty());
}

TEST(InstancePlacement, TimeLimitIsMaxRuntimePlusGraceAndMargin) {
  nlohmann::json request = {{"StoppingCondition", {{"MaxRuntimeInSeconds", 600}}}};
  EXPECT_EQ(InstanceTimeLimitSeconds(request, std::chrono::seconds(120)), 600 + 120 + 300);
  EXPECT_EQ(InstanceTimeLimitSeconds(nlohmann::json::object(), std::chrono::seconds(30), std::chrono::seconds(0)),
            86400 + 30);
}

}  // namespace
}  // namespace kiln::control
