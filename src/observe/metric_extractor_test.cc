#include "observe/metric_extractor.h"

#include <gtest/gtest.h>

namespace kiln::observe {
namespace {

TEST(MetricExtractorTest, ContractExample) {
  auto extractor =
      MetricExtractor::Create({{"train:loss", "Train Loss = (.*?);"}, {"val:acc", "Val Accuracy = ([0-9.]+)"}});
  ASSERT_TRUE(extractor.ok()) << extractor.status().ToString();
  auto points = (*extractor)->Extract("Epoch 3 Train Loss = 0.4131; Val Accuracy = 0.8184", 1000);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0], (MetricPoint{"train:loss", 0.4131, 1000}));
  EXPECT_EQ(points[1], (MetricPoint{"val:acc", 0.8184, 1000}));
  EXPECT_TRUE((*extractor)->Extract("nothing here", 1).empty());
}

TEST(MetricExtractorTest, OnePointPerDefinitionPerLineFirstMatch) {
  auto extractor = MetricExtractor::Create({{"loss", "loss=([0-9.]+)"}});
  ASSERT_TRUE(extractor.ok());
  auto points = (*extractor)->Extract("loss=1.5 loss=2.5", 7);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_DOUBLE_EQ(points[0].value, 1.5);
}

TEST(MetricExtractorTest, ValuesParsedWithSpacesIgnoredAndJunkDropped) {
  auto extractor = MetricExtractor::Create({{"m", "m=(.*?);"}});
  ASSERT_TRUE(extractor.ok());
  auto value = [&](const std::string& line) -> std::optional<double> {
    auto points = (*extractor)->Extract(line, 0);
    if (points.empty()) return std::nullopt;
    return points[0].value;
  };
  EXPECT_EQ(value("m=  -1.25e-3  ;"), -1.25e-3);
  EXPECT_EQ(value("m=42;"), 42.0);
  EXPECT_EQ(value("m=nan;"), std::nullopt);
  EXPECT_EQ(value("m=inf;"), std::nullopt);
  EXPECT_EQ(value("m=-Infinity;"), std::nullopt);
  EXPECT_EQ(value("m=1.5abc;"), std::nullopt);
  EXPECT_EQ(value("m=;"), std::nullopt);
  EXPECT_EQ(value("m=0x10;"), std::nullopt);
  EXPECT_EQ(value("m=1e999;"), std::nullopt);  // overflows to inf
}

TEST(MetricExtractorTest, RegexWithoutGroupProducesNothing) {
  auto extractor = MetricExtractor::Create({{"m", "loss=[0-9.]+"}, {"n", "acc=([0-9.]+)"}});
  ASSERT_TRUE(extractor.ok());
  auto points = (*extractor)->Extract("loss=1.0 acc=0.5", 0);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].name, "n");
}

TEST(MetricExtractorTest, GroupThatDidNotTakePartProducesNothing) {
  auto extractor = MetricExtractor::Create({{"m", "loss(?:=([0-9.]+)|: n/a)"}});
  ASSERT_TRUE(extractor.ok());
  EXPECT_TRUE((*extractor)->Extract("loss: n/a", 0).empty());
  EXPECT_EQ((*extractor)->Extract("loss=3", 0).size(), 1u);
}

TEST(MetricExtractorTest, InvalidRegexNamesTheMetric) {
  auto extractor = MetricExtractor::Create({{"ok", "a=(\\d+)"}, {"train:loss", "Train Loss = (.*?;"}});
  ASSERT_FALSE(extractor.ok());
  EXPECT_TRUE(extractor.status().IsInvalidArgument());
  EXPECT_EQ(extractor.status().message().rfind("Metric definition 'train:loss' has an invalid regex: ", 0), 0u)
      << extractor.status().message();
}

TEST(MetricExtractorTest, AtMostFortyDefinitions) {
  std::vector<MetricDefinition> definitions(41, MetricDefinition{"m", "m=(.*)"});
  EXPECT_FALSE(MetricExtractor::Create(definitions).ok());
  definitions.pop_back();
  EXPECT_TRUE(MetricExtractor::Create(definitions).ok());
  EXPECT_TRUE(MetricExtractor::Create({}).ok());
}

TEST(MetricExtractorTest, PythonStyleLazyAndUnicode) {
  auto extractor = MetricExtractor::Create({{"m", R"(\bépoque\s+\d+\s+perte=(\S+?),)"}});
  ASSERT_TRUE(extractor.ok()) << extractor.status().ToString();
  auto points = (*extractor)->Extract("époque 3 perte=0.25, suite", 0);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_DOUBLE_EQ(points[0].value, 0.25);
}

}  // namespace
}  // namespace kiln::observe
