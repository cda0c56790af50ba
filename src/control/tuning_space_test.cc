#include "control/tuning_space.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::control::tuning {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json Ranges() {
  return json::parse(R"({
    "IntegerParameterRanges": [{"Name": "epochs", "MinValue": "1", "MaxValue": "5", "ScalingType": "Linear"}],
    "ContinuousParameterRanges": [
      {"Name": "lr", "MinValue": "0.0001", "MaxValue": "1", "ScalingType": "Logarithmic"},
      {"Name": "momentum", "MinValue": "0.5", "MaxValue": "0.999", "ScalingType": "ReverseLogarithmic"},
      {"Name": "dropout", "MinValue": "0", "MaxValue": "0.5"}],
    "CategoricalParameterRanges": [{"Name": "optimizer", "Values": ["sgd", "adam", "rmsprop"]}]
  })");
}

double Num(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

// The InvalidArgument message of parsing `ranges`, or "" when it parsed.
std::string ParseError(const json& ranges, const std::set<std::string>& static_names = {}) {
  Result<SearchSpace> space = SearchSpace::Parse(ranges, static_names);
  if (space.ok()) return "";
  EXPECT_TRUE(space.status().IsInvalidArgument()) << space.status().ToString();
  return space.status().message();
}

json Continuous(const std::string& min, const std::string& max, const std::string& scaling = "Linear") {
  return {
      {"ContinuousParameterRanges", {{{"Name", "x"}, {"MinValue", min}, {"MaxValue", max}, {"ScalingType", scaling}}}}};
}

json Integer(const std::string& min, const std::string& max, const std::string& scaling = "Linear") {
  return {
      {"IntegerParameterRanges", {{{"Name", "n"}, {"MinValue", min}, {"MaxValue", max}, {"ScalingType", scaling}}}}};
}

TEST(TuningSpaceTest, ParsesEveryKindInOrder) {
  Result<SearchSpace> space = SearchSpace::Parse(Ranges());
  ASSERT_TRUE(space.ok()) << space.status().ToString();
  const std::vector<Parameter>& p = space->parameters();
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0].name, "epochs");
  EXPECT_EQ(p[0].kind, ParameterKind::kInteger);
  EXPECT_EQ(p[0].min, 1);
  EXPECT_EQ(p[0].max, 5);
  EXPECT_EQ(p[1].name, "lr");
  EXPECT_EQ(p[1].scaling, Scaling::kLogarithmic);
  EXPECT_EQ(p[2].scaling, Scaling::kReverseLogarithmic);
  EXPECT_EQ(p[3].name, "dropout");
  EXPECT_EQ(p[3].scaling, Scaling::kAuto);
  EXPECT_EQ(p[4].kind, ParameterKind::kCategorical);
  EXPECT_EQ(p[4].values, (std::vector<std::string>{"sgd", "adam", "rmsprop"}));
  // Four numeric coordinates, then a one-hot block of three.
  EXPECT_EQ(space->encoded_dimensions(), 7u);
  EXPECT_EQ(space->offset(4), 4u);
  EXPECT_FALSE(space->all_categorical());
}

TEST(TuningSpaceTest, ValidationMessagesNameTheMemberAndTheFix) {
  EXPECT_EQ(ParseError(json::parse(R"({"AutoParameters": [{"Name": "a", "ValueHint": "1"}]})")),
            "AutoParameters is not supported by Kiln.");
  EXPECT_EQ(ParseError(json::object()), "ParameterRanges must define at least one range");
  EXPECT_EQ(ParseError(json::parse(R"({"IntegerParameterRanges": []})")),
            "ParameterRanges must define at least one range");

  std::string m = ParseError(Continuous("abc", "1"));
  EXPECT_THAT(m, HasSubstr("ContinuousParameterRanges[0].MinValue \"abc\" is not a number"));
  m = ParseError(Integer("1.5", "4"));
  EXPECT_THAT(m, HasSubstr("IntegerParameterRanges[0].MinValue \"1.5\" is not an integer"));
  EXPECT_THAT(m, HasSubstr("whole numbers"));
  EXPECT_THAT(ParseError(Integer("1", "")), HasSubstr("IntegerParameterRanges[0].MaxValue \"\" is not an integer"));

  m = ParseError(Continuous("2", "1"));
  EXPECT_THAT(m, HasSubstr("ContinuousParameterRanges[0] (\"x\")"));
  EXPECT_THAT(m, HasSubstr("MinValue 2 is greater than MaxValue 1; make MinValue <= MaxValue"));

  EXPECT_THAT(ParseError(Continuous("0", "1", "Logarithmic")),
              HasSubstr("Logarithmic scaling requires MinValue > 0 (got 0)"));
  EXPECT_THAT(ParseError(Integer("0", "10", "Logarithmic")), HasSubstr("Logarithmic scaling requires MinValue > 0"));
  EXPECT_THAT(ParseError(Integer("1", "10", "ReverseLogarithmic")),
              HasSubstr("ReverseLogarithmic scaling is only for continuous ranges"));
  EXPECT_THAT(ParseError(Continuous("0.5", "1", "ReverseLogarithmic")),
              HasSubstr("ReverseLogarithmic requires 0 <= MinValue <= MaxValue < 1"));
  EXPECT_THAT(ParseError(Continuous("-0.1", "0.5", "ReverseLogarithmic")),
              HasSubstr("ReverseLogarithmic requires 0 <= MinValue <= MaxValue < 1"));
  EXPECT_THAT(ParseError(Continuous("0", "1", "Exponential")),
              HasSubstr("ContinuousParameterRanges[0].ScalingType must be one of Auto, Linear"));

  json twice = Continuous("0", "1");
  twice["IntegerParameterRanges"] = {{{"Name", "x"}, {"MinValue", "1"}, {"MaxValue", "2"}}};
  m = ParseError(twice);
  EXPECT_THAT(m, HasSubstr("\"x\" has more than one range (ContinuousParameterRanges[0])"));

  EXPECT_THAT(ParseError(json::parse(R"({"CategoricalParameterRanges": [{"Name": "c", "Values": []}]})")),
              HasSubstr("CategoricalParameterRanges[0] (\"c\"): Values must list at least one value"));
  EXPECT_THAT(ParseError(json::parse(R"({"CategoricalParameterRanges": [{"Name": "c", "Values": ["a", "b", "a"]}]})")),
              HasSubstr("the value \"a\" is listed twice"));
  EXPECT_THAT(ParseError(json::parse(R"({"CategoricalParameterRanges": [{"Name": "", "Values": ["a"]}]})")),
              HasSubstr("CategoricalParameterRanges[0].Name must not be empty"));
  EXPECT_THAT(ParseError(Continuous("0", "1"), {"x", "epochs"}),
              HasSubstr("\"x\" (ContinuousParameterRanges[0]) is also in StaticHyperParameters"));
  EXPECT_THAT(ParseError(json::parse(R"({"ContinuousParameterRanges": {"Name": "x"}})")),
              HasSubstr("ContinuousParameterRanges must be a list"));
  EXPECT_THAT(
      ParseError(json::parse(R"({"ContinuousParameterRanges": [{"Name": "x", "MinValue": 0, "MaxValue": "1"}]})")),
      HasSubstr("ContinuousParameterRanges[0].MinValue must be a string"));
  EXPECT_THAT(ParseError(json::array()), HasSubstr("ParameterRanges must be an object"));

  // Edge cases that are allowed: equal bounds, ReverseLogarithmic from 0, whole doubles as integers.
  EXPECT_EQ(ParseError(Continuous("0.5", "0.5")), "");
  EXPECT_EQ(ParseError(Continuous("0", "0.99", "ReverseLogarithmic")), "");
  EXPECT_EQ(ParseError(Integer("1", "1e3")), "");
  EXPECT_EQ(ParseError(json::parse(R"({"AutoParameters": [], "IntegerParameterRanges": [
      {"Name": "n", "MinValue": "1", "MaxValue": "2"}]})")),
            "");
}

TEST(TuningSpaceTest, AutoScalingIsLogarithmicOverThreeDecades) {
  auto scaling_of = [](const json& ranges) {
    return EffectiveScaling(SearchSpace::Parse(ranges).value().parameters()[0]);
  };
  EXPECT_EQ(scaling_of(Continuous("0.00001", "0.01", "Auto")), Scaling::kLogarithmic);
  EXPECT_EQ(scaling_of(Continuous("0.0001", "0.01", "Auto")), Scaling::kLinear);
  EXPECT_EQ(scaling_of(Continuous("0", "1000", "Auto")), Scaling::kLinear);
  EXPECT_EQ(scaling_of(Integer("1", "1000", "Auto")), Scaling::kLogarithmic);
  EXPECT_EQ(scaling_of(Integer("1", "999", "Auto")), Scaling::kLinear);
  EXPECT_EQ(scaling_of(Continuous("1", "1e6", "Linear")), Scaling::kLinear);
}

TEST(TuningSpaceTest, DecodeAppliesEachScaling) {
  SearchSpace space = SearchSpace::Parse(Ranges()).value();
  // epochs, lr, momentum, dropout, optimizer one-hot
  Assignment low = space.Decode({0, 0, 0, 0, 1, 0, 0});
  EXPECT_EQ(low, (Assignment{
                     {"epochs", "1"}, {"lr", "0.0001"}, {"momentum", "0.5"}, {"dropout", "0"}, {"optimizer", "sgd"}}));
  Assignment high = space.Decode({1, 1, 1, 1, 0, 0, 1});
  EXPECT_EQ(
      high,
      (Assignment{{"epochs", "5"}, {"lr", "1"}, {"momentum", "0.999"}, {"dropout", "0.5"}, {"optimizer", "rmsprop"}}));
  Assignment mid = space.Decode({0.5, 0.5, 0.5, 0.5, 0.2, 0.9, 0.3});
  EXPECT_EQ(mid.at("epochs"), "3");
  EXPECT_NEAR(Num(mid.at("lr")), 0.01, 1e-12);  // geometric midpoint of 1e-4..1
  // log(1 - x) halfway between log 0.5 and log 0.001: 1 - x = sqrt(0.5 * 0.001)
  EXPECT_NEAR(Num(mid.at("momentum")), 1 - std::sqrt(0.0005), 1e-12);
  EXPECT_EQ(mid.at("dropout"), "0.25");
  EXPECT_EQ(mid.at("optimizer"), "adam");
  // Out-of-range coordinates are clamped.
  EXPECT_EQ(space.Decode({-3, 7, -1, 2, 0, 0, 0}).at("lr"), "1");
  EXPECT_EQ(space.Decode({-3, 7, -1, 2, 0, 0, 0}).at("epochs"), "1");
}

TEST(TuningSpaceTest, IntegersOwnEqualSharesOfTheAxis) {
  SearchSpace space = SearchSpace::Parse(Integer("1", "5")).value();
  std::map<std::string, int> counts;
  constexpr int kSteps = 10000;
  for (int i = 0; i < kSteps; ++i) ++counts[space.Decode({(i + 0.5) / kSteps}).at("n")];
  ASSERT_EQ(counts.size(), 5u);
  for (const auto& [value, count] : counts) EXPECT_EQ(count, kSteps / 5) << value;

  // Logarithmic integers: each value's share is proportional to log((v + 0.5) / (v - 0.5)).
  SearchSpace log_space = SearchSpace::Parse(Integer("1", "100", "Logarithmic")).value();
  EXPECT_EQ(log_space.Decode({0}).at("n"), "1");
  EXPECT_EQ(log_space.Decode({1}).at("n"), "100");
  counts.clear();
  for (int i = 0; i < kSteps; ++i) ++counts[log_space.Decode({(i + 0.5) / kSteps}).at("n")];
  double total = std::log(100.5 / 0.5);
  EXPECT_NEAR(counts["1"], kSteps * std::log(1.5 / 0.5) / total, 2);
  EXPECT_NEAR(counts["10"], kSteps * std::log(10.5 / 9.5) / total, 2);
}

TEST(TuningSpaceTest, EncodeInvertsDecode) {
  SearchSpace space = SearchSpace::Parse(Ranges()).value();
  for (int i = 0; i < 200; ++i) {
    std::vector<double> u(space.encoded_dimensions());
    for (size_t d = 0; d < u.size(); ++d) u[d] = std::fmod(0.137 * (i + 1) * (d + 3) + 0.01 * i, 1.0);
    Assignment a = space.Decode(u);
    std::optional<std::vector<double>> back = space.Encode(a);
    ASSERT_TRUE(back.has_value());
    // The same values; a continuous value may differ in its last bit through the scaling's log/exp.
    Assignment again = space.Decode(*back);
    for (const auto& [name, value] : a) {
      if (again.at(name) != value) {
        EXPECT_NEAR(Num(again.at(name)), Num(value), 1e-12 * std::fabs(Num(value))) << name;
      }
    }
    EXPECT_EQ(again.at("epochs"), a.at("epochs"));
    EXPECT_EQ(again.at("optimizer"), a.at("optimizer"));
    EXPECT_EQ(space.Decode(space.Snap(u)), a) << i;
    // Continuous coordinates come back where they were (up to the scaling's rounding).
    EXPECT_NEAR((*back)[1], u[1], 1e-9);
    EXPECT_NEAR((*back)[3], u[3], 1e-9);
  }
  // An integer sits at the centre of its share; a categorical value is one-hot.
  std::vector<double> e = space
                              .Encode({{"epochs", "2"},
                                       {"lr", "0.01"},
                                       {"momentum", "0.5"},
                                       {"dropout", "0"},
                                       {"optimizer", "rmsprop"},
                                       {"unrelated", "x"}})
                              .value();
  EXPECT_NEAR(e[0], 1.5 / 5, 1e-12);
  EXPECT_NEAR(e[1], 0.5, 1e-12);
  EXPECT_EQ(std::vector<double>(e.begin() + 4, e.end()), (std::vector<double>{0, 0, 1}));
}

TEST(TuningSpaceTest, EncodeRejectsValuesOutsideTheSpace) {
  SearchSpace space = SearchSpace::Parse(Ranges()).value();
  Assignment good{{"epochs", "2"}, {"lr", "0.01"}, {"momentum", "0.9"}, {"dropout", "0.1"}, {"optimizer", "adam"}};
  ASSERT_TRUE(space.Encode(good).has_value());
  auto with = [&](const std::string& key, const std::string& value) {
    Assignment a = good;
    a[key] = value;
    return space.Encode(a);
  };
  EXPECT_FALSE(with("epochs", "6").has_value());
  EXPECT_FALSE(with("epochs", "2.5").has_value());
  EXPECT_FALSE(with("lr", "2").has_value());
  EXPECT_FALSE(with("lr", "fast").has_value());
  EXPECT_FALSE(with("optimizer", "adagrad").has_value());
  Assignment missing = good;
  missing.erase("dropout");
  EXPECT_FALSE(space.Encode(missing).has_value());
}

TEST(TuningSpaceTest, GridEnumeratesTheProductFirstParameterSlowest) {
  SearchSpace space = SearchSpace::Parse(json::parse(R"({"CategoricalParameterRanges": [
      {"Name": "b", "Values": ["b1", "b2"]}, {"Name": "a", "Values": ["a1", "a2", "a3"]}]})"))
                          .value();
  EXPECT_TRUE(space.all_categorical());
  ASSERT_EQ(space.grid_size(), 6u);
  std::vector<Assignment> expected = {{{"b", "b1"}, {"a", "a1"}}, {{"b", "b1"}, {"a", "a2"}},
                                      {{"b", "b1"}, {"a", "a3"}}, {{"b", "b2"}, {"a", "a1"}},
                                      {{"b", "b2"}, {"a", "a2"}}, {{"b", "b2"}, {"a", "a3"}}};
  for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(space.GridPoint(i), expected[i]) << i;
  EXPECT_TRUE(space.GridPoint(6).empty());
}

TEST(TuningSpaceTest, GridSizeSaturates) {
  json values = json::array();
  for (int v = 0; v < 30; ++v) values.push_back("v" + std::to_string(v));
  json ranges = {{"CategoricalParameterRanges", json::array()}};
  for (int p = 0; p < 30; ++p)
    ranges["CategoricalParameterRanges"].push_back({{"Name", "p" + std::to_string(p)}, {"Values", values}});
  SearchSpace space = SearchSpace::Parse(ranges).value();
  EXPECT_EQ(space.grid_size(), std::numeric_limits<uint64_t>::max());  // 30^30 > 2^64
  EXPECT_EQ(space.encoded_dimensions(), 900u);
}

TEST(TuningSpaceTest, FormatContinuousIsShortestRoundTrip) {
  EXPECT_EQ(FormatContinuous(0.1), "0.1");
  EXPECT_EQ(FormatContinuous(3.0), "3");
  EXPECT_EQ(FormatContinuous(1e-4), "0.0001");
  EXPECT_EQ(FormatContinuous(1e-5), "1e-05");
  EXPECT_EQ(FormatContinuous(123.5), "123.5");
  EXPECT_EQ(FormatContinuous(1e21), "1e+21");
  EXPECT_EQ(FormatContinuous(-2.5), "-2.5");
  for (double v : {1.0 / 3, 2.0 / 7, 1e-300, 123456789.123, 0.1 + 0.2}) {
    std::string text = FormatContinuous(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
    EXPECT_LE(text.size(), 24u);
  }
}

}  // namespace
}  // namespace kiln::control::tuning
