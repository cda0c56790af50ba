#include "api/metric_math.h"

#include <gtest/gtest.h>

namespace kiln::api {
namespace {

MathValue Series(std::map<int64_t, double> points) {
  MathValue v;
  v.is_series = true;
  v.points = std::move(points);
  return v;
}

class MetricMathTest : public ::testing::Test {
 protected:
  std::variant<MathValue, std::string> Eval(std::string_view text) {
    return EvaluateMath(text, [&](const std::string& id) -> std::variant<const MathValue*, std::string> {
      auto it = ids_.find(id);
      if (it == ids_.end()) return "Unknown id " + id;
      return &it->second;
    });
  }
  double Scalar(std::string_view text) {
    auto r = Eval(text);
    EXPECT_TRUE(std::holds_alternative<MathValue>(r)) << text;
    if (!std::holds_alternative<MathValue>(r)) return 0;
    EXPECT_FALSE(std::get<MathValue>(r).is_series) << text;
    return std::get<MathValue>(r).scalar;
  }
  std::map<int64_t, double> Points(std::string_view text) {
    auto r = Eval(text);
    EXPECT_TRUE(std::holds_alternative<MathValue>(r))
        << (std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : "");
    if (!std::holds_alternative<MathValue>(r)) return {};
    EXPECT_TRUE(std::get<MathValue>(r).is_series) << text;
    return std::get<MathValue>(r).points;
  }
  std::string Error(std::string_view text) {
    auto r = Eval(text);
    return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : "(no error)";
  }

  std::map<std::string, MathValue> ids_ = {{"a", Series({{1, 2}, {2, 4}, {3, 6}})},
                                           {"b", Series({{2, 1}, {3, 0}, {4, 8}})}};
};

TEST_F(MetricMathTest, ScalarsFollowPrecedenceParenthesesAndUnaryMinus) {
  EXPECT_DOUBLE_EQ(Scalar("1 + 2 * 3"), 7);
  EXPECT_DOUBLE_EQ(Scalar("(1 + 2) * 3"), 9);
  EXPECT_DOUBLE_EQ(Scalar("10 - 4 - 3"), 3);
  EXPECT_DOUBLE_EQ(Scalar("8 / 4 / 2"), 1);
  EXPECT_DOUBLE_EQ(Scalar("-2 * -(3)"), 6);
  EXPECT_DOUBLE_EQ(Scalar(" 1.5 "), 1.5);
}

TEST_F(MetricMathTest, SeriesKeepSharedTimestampsAndDropNonFiniteValues) {
  EXPECT_EQ(Points("a + b"), (std::map<int64_t, double>{{2, 5}, {3, 6}}));
  EXPECT_EQ(Points("a / b"), (std::map<int64_t, double>{{2, 4}}));  // 6 / 0 left out
  EXPECT_EQ(Points("a * 2 - 1"), (std::map<int64_t, double>{{1, 3}, {2, 7}, {3, 11}}));
  EXPECT_EQ(Points("12 / a"), (std::map<int64_t, double>{{1, 6}, {2, 3}, {3, 2}}));
}

TEST_F(MetricMathTest, FunctionsReduceAcrossListsPerTimestamp) {
  EXPECT_EQ(Points("SUM([a, b])"), (std::map<int64_t, double>{{1, 2}, {2, 5}, {3, 6}, {4, 8}}));
  EXPECT_EQ(Points("MAX([a, b, 5])"), (std::map<int64_t, double>{{1, 5}, {2, 5}, {3, 6}, {4, 8}}));
  EXPECT_EQ(Points("MIN([a, b])"), (std::map<int64_t, double>{{1, 2}, {2, 1}, {3, 0}, {4, 8}}));
  EXPECT_EQ(Points("AVG([a, b])"), (std::map<int64_t, double>{{1, 2}, {2, 2.5}, {3, 3}, {4, 8}}));
  EXPECT_EQ(Points("SUM(a)"), ids_["a"].points);
  EXPECT_DOUBLE_EQ(Scalar("AVG([1, 2, 6])"), 3);
}

TEST_F(MetricMathTest, ErrorsSayWhatIsWrong) {
  EXPECT_EQ(Error("(1 + "), "Unexpected end of expression");
  EXPECT_EQ(Error("(1 + 2"), "Missing \")\"");
  EXPECT_EQ(Error("SUM([a, b)"), "Missing \"]\"");
  EXPECT_EQ(Error("1 + 2 )"), "Unexpected \")\" at position 7");
  EXPECT_EQ(Error("1 + $"), "Unexpected \"$\" at position 5");
  EXPECT_EQ(Error("c * 2"), "Unknown id c");
  EXPECT_EQ(Error("1..2"), "Invalid number 1..2");
  EXPECT_EQ(Error("RATE(a)"), "Unsupported Metric Math function: RATE (Kiln evaluates SUM, AVG, MIN and MAX)");
  EXPECT_EQ(Error(std::string(100, '(') + "1" + std::string(100, ')')), "Expression nested too deeply");
}

}  // namespace
}  // namespace kiln::api
