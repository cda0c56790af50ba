#include "store/json_member.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace kiln::store::json_member {
namespace {

using nlohmann::json;

// A wording unlike either state document's, to show the caller's maker is what builds the message.
Status Worded(std::string_view path, std::string_view expected) {
  return Status::InvalidArgument("test: " + std::string(path) + " / " + std::string(expected));
}

struct Case {
  const char* document;
  bool ok;
  const char* message;  // when !ok
};

TEST(JsonMemberTest, ReadStringTable) {
  const Case cases[] = {
      {R"({})", true, ""},
      {R"({"m": null})", true, ""},
      {R"({"m": "x"})", true, ""},
      {R"({"m": 1})", false, "test: p.m / a string"},
      {R"({"m": ["x"]})", false, "test: p.m / a string"},
  };
  for (const Case& c : cases) {
    std::string out = "before";
    Status s = ReadString(json::parse(c.document), "m", "p.", Worded, out);
    EXPECT_EQ(s.ok(), c.ok) << c.document;
    if (!c.ok) {
      EXPECT_EQ(s.message(), c.message) << c.document;
    }
  }
  std::string out = "before";
  ASSERT_TRUE(ReadString(json::parse(R"({"m": null})"), "m", "", Worded, out).ok());
  EXPECT_EQ(out, "before");
  ASSERT_TRUE(ReadString(json::parse(R"({"m": "x"})"), "m", "", Worded, out).ok());
  EXPECT_EQ(out, "x");
}

TEST(JsonMemberTest, ReadInt64Table) {
  struct IntCase {
    const char* document;
    bool ok;
    int64_t value;  // when ok; 7 means untouched
    const char* message;
  };
  const IntCase cases[] = {
      {R"({})", true, 7, ""},
      {R"({"m": null})", true, 7, ""},
      {R"({"m": -5})", true, -5, ""},
      {R"({"m": 9223372036854775807})", true, std::numeric_limits<int64_t>::max(), ""},
      {R"({"m": 9223372036854775808})", false, 0, "test: m / an int64"},
      {R"({"m": 1.5})", false, 0, "test: m / an integer"},
      {R"({"m": "1"})", false, 0, "test: m / an integer"},
      {R"({"m": true})", false, 0, "test: m / an integer"},
  };
  for (const IntCase& c : cases) {
    int64_t out = 7;
    Status s = ReadInt64(json::parse(c.document), "m", "", Worded, out);
    EXPECT_EQ(s.ok(), c.ok) << c.document;
    if (c.ok) {
      EXPECT_EQ(out, c.value) << c.document;
    }
    if (!c.ok) {
      EXPECT_EQ(s.message(), c.message) << c.document;
      EXPECT_EQ(out, 7) << c.document;
    }
  }
}

TEST(JsonMemberTest, ReadDoubleAndBool) {
  double d = 0.25;
  EXPECT_TRUE(ReadDouble(json::parse(R"({})"), "m", "", Worded, d).ok());
  EXPECT_EQ(d, 0.25);
  EXPECT_TRUE(ReadDouble(json::parse(R"({"m": 3})"), "m", "", Worded, d).ok());
  EXPECT_EQ(d, 3.0);
  EXPECT_TRUE(ReadDouble(json::parse(R"({"m": 1.5})"), "m", "", Worded, d).ok());
  EXPECT_EQ(d, 1.5);
  EXPECT_EQ(ReadDouble(json::parse(R"({"m": "1"})"), "m", "a.", Worded, d).message(), "test: a.m / a number");

  bool b = false;
  EXPECT_TRUE(ReadBool(json::parse(R"({"m": null})"), "m", "", Worded, b).ok());
  EXPECT_FALSE(b);
  EXPECT_TRUE(ReadBool(json::parse(R"({"m": true})"), "m", "", Worded, b).ok());
  EXPECT_TRUE(b);
  EXPECT_EQ(ReadBool(json::parse(R"({"m": 1})"), "m", "", Worded, b).message(), "test: m / a boolean");
}

TEST(JsonMemberTest, ReadOptionalSetsOnlyWhenPresent) {
  std::optional<int64_t> n;
  EXPECT_TRUE(ReadOptional(json::parse(R"({"m": null})"), "m", "", Worded, n).ok());
  EXPECT_FALSE(n.has_value());
  EXPECT_TRUE(ReadOptional(json::parse(R"({"m": 0})"), "m", "", Worded, n).ok());
  EXPECT_EQ(n, 0);
  std::optional<std::string> s;
  EXPECT_EQ(ReadOptional(json::parse(R"({"m": 2})"), "m", "x.", Worded, s).message(), "test: x.m / a string");
  EXPECT_FALSE(s.has_value());
  std::optional<double> d;
  EXPECT_TRUE(ReadOptional(json::parse(R"({"m": 2})"), "m", "", Worded, d).ok());
  EXPECT_EQ(d, 2.0);
  std::optional<bool> b;
  EXPECT_TRUE(ReadOptional(json::parse(R"({})"), "m", "", Worded, b).ok());
  EXPECT_FALSE(b.has_value());
}

TEST(JsonMemberTest, ArrayMemberTable) {
  auto absent = ArrayMember(json::parse(R"({})"), "m", "", Worded);
  ASSERT_TRUE(absent.ok());
  EXPECT_TRUE(absent.value()->empty());
  auto null = ArrayMember(json::parse(R"({"m": null})"), "m", "", Worded);
  ASSERT_TRUE(null.ok());
  EXPECT_TRUE(null.value()->empty());
  const json doc = json::parse(R"({"m": [1, 2]})");
  auto present = ArrayMember(doc, "m", "", Worded);
  ASSERT_TRUE(present.ok());
  EXPECT_EQ(present.value()->size(), 2u);
  EXPECT_EQ(ArrayMember(json::parse(R"({"m": {}})"), "m", "p.", Worded).status().message(), "test: p.m / an array");
}

TEST(JsonMemberTest, RequireObjectAndPresent) {
  EXPECT_TRUE(RequireObject(json::object(), "thing", Worded).ok());
  EXPECT_EQ(RequireObject(json::array(), "thing", Worded).message(), "test: thing / an object");
  EXPECT_TRUE(RequirePresent(json::parse(R"({"m": null})"), "m", "where").ok());
  EXPECT_EQ(RequirePresent(json::parse(R"({})"), "m", "where").message(), "where has no m");
  EXPECT_EQ(RequirePresent(json::array(), "m", "where").message(), "where has no m");
}

// Readers on a non-object read nothing (nlohmann's find on a non-object finds nothing).
TEST(JsonMemberTest, NonObjectReadsAsAbsent) {
  std::string out = "keep";
  EXPECT_TRUE(ReadString(json::array(), "m", "", Worded, out).ok());
  EXPECT_EQ(out, "keep");
}

}  // namespace
}  // namespace kiln::store::json_member
