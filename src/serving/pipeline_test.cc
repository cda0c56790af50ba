#include "serving/pipeline.h"

#include <gtest/gtest.h>

namespace kiln::serving {
namespace {

TEST(PipelineTest, FindContainerByHostname) {
  InstanceTarget instance;
  instance.containers = {{.hostname = "pre", .host = "10.0.0.2", .port = 8080, .log_stream = "v/i/pre"},
                         {.hostname = "model", .host = "10.0.0.2", .port = 8180, .log_stream = "v/i/model"}};
  EXPECT_EQ(FindContainer(instance, "pre"), 0);
  EXPECT_EQ(FindContainer(instance, "model"), 1);
  EXPECT_EQ(FindContainer(instance, "Model"), -1);  // hostnames are matched exactly
  EXPECT_EQ(FindContainer(instance, ""), -1);
  EXPECT_EQ(FindContainer(InstanceTarget{}, "pre"), -1);
}

// serving-contract.md §8.2: Content-Type from the previous answer, Accept only to the last,
// custom attributes and ids to every container.
TEST(PipelineTest, HopHeaders) {
  const HeaderMap forward = {{"Content-Type", "text/csv"},
                             {"Accept", "application/json"},
                             {"X-Amzn-SageMaker-Custom-Attributes", "trace=1"},
                             {"X-Amzn-RequestId", "req-1"}};
  const std::string json = "application/json";
  HeaderMap first = PipelineHopHeaders(forward, 0, 3, nullptr);
  EXPECT_EQ(*FindHeader(first, "Content-Type"), "text/csv");
  EXPECT_EQ(FindHeader(first, "Accept"), nullptr);
  EXPECT_EQ(*FindHeader(first, "X-Amzn-SageMaker-Custom-Attributes"), "trace=1");
  EXPECT_EQ(*FindHeader(first, "X-Amzn-RequestId"), "req-1");
  HeaderMap middle = PipelineHopHeaders(forward, 1, 3, &json);
  EXPECT_EQ(middle.count("Content-Type"), 1u);
  EXPECT_EQ(*FindHeader(middle, "Content-Type"), "application/json");
  EXPECT_EQ(FindHeader(middle, "Accept"), nullptr);
  EXPECT_EQ(*FindHeader(middle, "X-Amzn-SageMaker-Custom-Attributes"), "trace=1");
  HeaderMap last = PipelineHopHeaders(forward, 2, 3, nullptr);
  EXPECT_EQ(*FindHeader(last, "Content-Type"), "application/octet-stream");  // the previous gave none
  EXPECT_EQ(*FindHeader(last, "Accept"), "application/json");
  // A one-container chain is the client's request unchanged.
  HeaderMap only = PipelineHopHeaders(forward, 0, 1, nullptr);
  EXPECT_EQ(only, forward);
}

TEST(PipelineTest, TheBudgetCoversTheWholeChain) {
  const int64_t ms = 1000000;
  EXPECT_EQ(RemainingBudgetMs(0, 0, 60000), 60000);
  EXPECT_EQ(RemainingBudgetMs(0, 2500 * ms, 60000), 57500);
  EXPECT_EQ(RemainingBudgetMs(0, 60000 * ms, 60000), 0);
  EXPECT_EQ(RemainingBudgetMs(0, 90000 * ms, 60000), 0);
  EXPECT_EQ(RemainingBudgetMs(5 * ms, 0, 100), 100);  // never above the budget
}

}  // namespace
}  // namespace kiln::serving
