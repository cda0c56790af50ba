#include "aws/gzip.h"

#include <gtest/gtest.h>

#include "aws/test_util/gzip_for_test.h"

namespace kiln::aws {
namespace {

std::string Gzip(const std::string& text) { return aws::testing::GzipForTest(text); }

TEST(GzipTest, Encodings) {
  EXPECT_TRUE(IsGzipEncoding("gzip"));
  EXPECT_TRUE(IsGzipEncoding(" GZIP "));
  EXPECT_TRUE(IsGzipEncoding("identity, gzip"));
  EXPECT_FALSE(IsGzipEncoding("deflate"));
  EXPECT_FALSE(IsGzipEncoding(""));
}

TEST(GzipTest, RoundTripAndConcatenatedMembers) {
  std::string text(100000, 'x');
  auto one = Gunzip(Gzip(text), 1 << 20);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, text);
  auto two = Gunzip(Gzip("ab") + Gzip("cd"), 100);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, "abcd");
}

TEST(GzipTest, BoundsAndCorruption) {
  auto bomb = Gunzip(Gzip(std::string(10 << 20, '\0')), 1 << 20);
  ASSERT_FALSE(bomb.ok());
  EXPECT_EQ(bomb.status().code(), StatusCode::kResourceExhausted);
  std::string good = Gzip("hello world");
  EXPECT_EQ(Gunzip(good.substr(0, good.size() - 4), 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Gunzip("not gzip at all", 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Gunzip("", 100).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::aws
