#include "control/warm_pools.h"

#include <gtest/gtest.h>

#include <functional>

namespace kiln::control {
namespace {

using nlohmann::json;

json Request(int64_t keep_alive = 600) {
  return json{{"RoleArn", "arn:aws:iam::1:role/r"},
              {"ResourceConfig",
               {{"InstanceType", "ml.m5.large"},
                {"InstanceCount", 2},
                {"VolumeSizeInGB", 30},
                {"KeepAlivePeriodInSeconds", keep_alive}}},
              {"AlgorithmSpecification", {{"TrainingImage", "img"}}}};
}

TEST(WarmPoolsTest, KeepAliveSecondsReadsTheResourceConfig) {
  EXPECT_EQ(KeepAliveSeconds(Request(600)), 600);
  EXPECT_EQ(KeepAliveSeconds(Request(0)), 0);
  EXPECT_EQ(KeepAliveSeconds(json{{"ResourceConfig", {{"InstanceCount", 1}}}}), 0);
  EXPECT_EQ(KeepAliveSeconds(json::object()), 0);
  EXPECT_EQ(KeepAliveSeconds(json{{"ResourceConfig", {{"KeepAlivePeriodInSeconds", nullptr}}}}), 0);
}

TEST(WarmPoolsTest, GrantIdsNameTheJob) {
  EXPECT_EQ(WarmPoolGrantId("job-1"), "warm-pool/job-1");
  EXPECT_EQ(WarmPoolJobOfGrant("warm-pool/job-1"), "job-1");
  EXPECT_EQ(WarmPoolJobOfGrant("job-1"), "");
}

// §19's key: what the job runs on must be the same; what it runs (image, hyperparameters,
// channels) may differ.
TEST(WarmPoolsTest, MatchesOnTheSection19KeyOnly) {
  const json kept = Request();
  json next = Request(120);
  next["AlgorithmSpecification"]["TrainingImage"] = "another";
  next["HyperParameters"] = {{"lr", "0.1"}};
  EXPECT_TRUE(WarmPoolMatches(kept, next));
  EXPECT_FALSE(WarmPoolMatches(kept, Request(0)));  // the next job must ask for a pool itself
  auto differs = [&](const std::function<void(json&)>& change) {
    json other = Request();
    change(other);
    return !WarmPoolMatches(kept, other);
  };
  EXPECT_TRUE(differs([](json& r) { r["RoleArn"] = "arn:aws:iam::1:role/other"; }));
  EXPECT_TRUE(differs([](json& r) { r["ResourceConfig"]["InstanceCount"] = 1; }));
  EXPECT_TRUE(differs([](json& r) { r["ResourceConfig"]["InstanceType"] = "ml.m5.xlarge"; }));
  EXPECT_TRUE(differs([](json& r) { r["ResourceConfig"]["VolumeSizeInGB"] = 31; }));
  EXPECT_TRUE(differs([](json& r) { r["ResourceConfig"]["VolumeKmsKeyId"] = "key"; }));
  EXPECT_TRUE(differs([](json& r) { r["VpcConfig"] = {{"Subnets", {"s"}}, {"SecurityGroupIds", {"g"}}}; }));
  EXPECT_TRUE(differs([](json& r) { r["EnableNetworkIsolation"] = true; }));
  EXPECT_TRUE(differs([](json& r) { r["EnableInterContainerTrafficEncryption"] = true; }));
  // An explicit false is the same as absent.
  EXPECT_FALSE(differs([](json& r) { r["EnableNetworkIsolation"] = false; }));
}

TEST(WarmPoolsTest, ExpiryIsThePeriodCutAtTheChainsMaximum) {
  EXPECT_EQ(WarmPoolExpiry(1000, 60, 1000), 61000);
  EXPECT_EQ(WarmPoolExpiry(1000, 0, 1000), 1000);
  const int64_t chain = 5000;
  EXPECT_EQ(WarmPoolExpiry(chain + kMaxWarmPoolChainMillis - 10000, 3600, chain), chain + kMaxWarmPoolChainMillis);
}

}  // namespace
}  // namespace kiln::control
