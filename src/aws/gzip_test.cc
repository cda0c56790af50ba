#include "aws/gzip.h"

#include <zlib.h>

#include <gtest/gtest.h>

namespace kiln::aws {
namespace {

std::string Gzip(const std::string& text) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, text.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  zs.avail_in = static_cast<uInt>(text.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

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
