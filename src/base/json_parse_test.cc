#include "base/json_parse.h"

#include <string>

#include <gtest/gtest.h>

namespace kiln {
namespace {

std::string Nested(size_t depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(JsonParseTest, ParsesOrdinaryDocuments) {
  auto doc = ParseJsonBounded(R"({"a": [1, 2, {"b": null}], "c": "x", "d": true, "e": 1.5})");
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ((*doc)["a"][2]["b"], nullptr);
  EXPECT_EQ((*doc)["c"], "x");
  EXPECT_EQ((*doc)["e"], 1.5);
}

TEST(JsonParseTest, DepthAtTheLimitIsAcceptedOneMoreIsRefused) {
  EXPECT_TRUE(ParseJsonBounded(Nested(64), {.max_depth = 64}).ok());
  auto deeper = ParseJsonBounded(Nested(65), {.max_depth = 64});
  ASSERT_FALSE(deeper.ok());
  EXPECT_EQ(deeper.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(deeper.status().message().find("deeper than 64 levels"), std::string::npos);
  EXPECT_FALSE(deeper.status().Is(ErrorReason::kMalformed));  // a limit, not malformed text
}

TEST(JsonParseTest, HugeNestingIsRefusedWithoutRecursion) {
  // 55,000 objects deep crashed the server in a recursive copy; 1,000,000 of either kind must
  // come back as an error, and quickly (the walk stops at the first level past the limit).
  std::string objects;
  for (int i = 0; i < 1000000; ++i) objects += "{\"a\":";
  objects += "1";
  objects += std::string(1000000, '}');
  EXPECT_FALSE(ParseJsonBounded(objects).ok());
  EXPECT_FALSE(ParseJsonBounded(Nested(1000000)).ok());
  EXPECT_FALSE(ParseOrderedJsonBounded(Nested(1000000, '{', '}')).ok());
}

TEST(JsonParseTest, MalformedTextIsInvalidArgumentWithPosition) {
  auto doc = ParseJsonBounded(R"({"a": )");
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(doc.status().message().rfind("malformed JSON", 0), 0u) << doc.status().message();
  EXPECT_TRUE(doc.status().Is(ErrorReason::kMalformed));
  EXPECT_TRUE(ParseJsonBounded("{} x").status().Is(ErrorReason::kMalformed));
  EXPECT_FALSE(ParseJsonBounded("").ok());
}

TEST(JsonParseTest, SizeAndValueCountLimits) {
  auto big = ParseJsonBounded(std::string(100, ' ') + "1", {.max_bytes = 50});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);

  std::string many = "[";
  for (int i = 0; i < 1000; ++i) many += (i ? ",[]" : "[]");
  many += "]";
  EXPECT_TRUE(ParseJsonBounded(many, {.max_values = 1001}).ok());
  auto too_many = ParseJsonBounded(many, {.max_values = 1000});
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.status().message().find("more than 1000 values"), std::string::npos);
}

TEST(JsonParseTest, OrderedKeepsMemberOrder) {
  auto doc = ParseOrderedJsonBounded(R"({"z": 1, "a": 2})");
  ASSERT_TRUE(doc.ok());
  EXPECT_EQ(doc->begin().key(), "z");
}

TEST(WithoutNullsTest, DropsNullMembersAtEveryDepthAndKeepsArrays) {
  nlohmann::json in =
      nlohmann::json::parse(R"({"a": null, "b": {"c": null, "d": 1, "e": [null, {"f": null, "g": "x"}]}, "h": []})");
  EXPECT_EQ(WithoutNulls(in), nlohmann::json::parse(R"({"b": {"d": 1, "e": [null, {"g": "x"}]}, "h": []})"));
  EXPECT_EQ(WithoutNulls(nlohmann::json(3)), nlohmann::json(3));
}

}  // namespace
}  // namespace kiln
