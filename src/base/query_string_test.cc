#include "base/query_string.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kiln {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

Pairs Parse(std::string_view text, const QueryStringOptions& options = {}) {
  Result<std::vector<QueryParam>> params = ParseQueryString(text, options);
  EXPECT_TRUE(params.ok()) << params.status().ToString();
  Pairs out;
  if (params.ok()) {
    for (const QueryParam& p : *params) out.emplace_back(p.name, p.value);
  }
  return out;
}

TEST(QueryStringTest, SplitsInOrderKeepingRepeatedNames) {
  EXPECT_EQ(Parse("b=2&a=1&b=3"), (Pairs{{"b", "2"}, {"a", "1"}, {"b", "3"}}));
}

TEST(QueryStringTest, EmptyValuesAndBareNames) {
  EXPECT_EQ(Parse("a=&b&c=1"), (Pairs{{"a", ""}, {"b", ""}, {"c", "1"}}));
  EXPECT_EQ(Parse("=v"), (Pairs{{"", "v"}}));
}

TEST(QueryStringTest, EmptySegmentsAreSkipped) {
  EXPECT_TRUE(Parse("").empty());
  EXPECT_TRUE(Parse("&&").empty());
  EXPECT_EQ(Parse("&a=1&&b=2&"), (Pairs{{"a", "1"}, {"b", "2"}}));
}

TEST(QueryStringTest, OnlyTheFirstEqualsSplits) { EXPECT_EQ(Parse("a=b=c"), (Pairs{{"a", "b=c"}})); }

TEST(QueryStringTest, PercentDecodesNamesAndValues) {
  EXPECT_EQ(Parse("x%2Dy=a%20b%26c%3D"), (Pairs{{"x-y", "a b&c="}}));
}

TEST(QueryStringTest, PlusIsLiteralForSignaturesAndSpaceForForms) {
  EXPECT_EQ(Parse("a+b=c+d%2B"), (Pairs{{"a+b", "c+d+"}}));
  EXPECT_EQ(Parse("a+b=c+d%2B", {.plus_is_space = true}), (Pairs{{"a b", "c d+"}}));
}

TEST(QueryStringTest, BadEscapeKeptRawFieldByField) {
  EXPECT_EQ(Parse("a%zz=b%20c&d=%4"), (Pairs{{"a%zz", "b c"}, {"d", "%4"}}));
  // The plus rule still applies to the field that did decode.
  EXPECT_EQ(Parse("a+%zz=b+c", {.plus_is_space = true}), (Pairs{{"a+%zz", "b c"}}));
}

TEST(QueryStringTest, BadEscapeDropsThePair) {
  QueryStringOptions drop{.plus_is_space = true, .bad_escape = QueryBadEscape::kDropPair};
  EXPECT_EQ(Parse("a=1&b=%zz&c%=3&d=4", drop), (Pairs{{"a", "1"}, {"d", "4"}}));
}

TEST(QueryStringTest, BadEscapeRefusedNamingTheParameter) {
  QueryStringOptions refuse{.plus_is_space = true, .bad_escape = QueryBadEscape::kRefuse};
  Result<std::vector<QueryParam>> parsed = ParseQueryString("ok=1&Name%41=%G1", refuse);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(), "The parameter Name%41 is not correctly percent-encoded.");
  // The name in the message is bounded.
  Result<std::vector<QueryParam>> long_name = ParseQueryString(std::string(300, 'n') + "%", refuse);
  ASSERT_FALSE(long_name.ok());
  EXPECT_EQ(long_name.status().message(),
            "The parameter " + std::string(128, 'n') + " is not correctly percent-encoded.");
}

TEST(QueryStringTest, NamesCanBeLeftUndecoded) {
  EXPECT_EQ(Parse("a%20b=c%20d&e+f=+", {.decode_names = false}), (Pairs{{"a%20b", "c d"}, {"e+f", "+"}}));
}

TEST(QueryStringTest, FindTakesTheFirstAndMapTheLast) {
  std::vector<QueryParam> params = *ParseQueryString("k=1&j=2&k=3");
  ASSERT_NE(FindQueryParam(params, "k"), nullptr);
  EXPECT_EQ(*FindQueryParam(params, "k"), "1");
  EXPECT_EQ(FindQueryParam(params, "K"), nullptr);
  std::map<std::string, std::string> map = QueryParamMap(params);
  EXPECT_EQ(map, (std::map<std::string, std::string>{{"j", "2"}, {"k", "3"}}));
}

}  // namespace
}  // namespace kiln
