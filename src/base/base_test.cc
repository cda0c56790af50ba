#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/io.h"
#include "base/status.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln {
namespace {

Result<int> Half(int v) {
  if (v % 2) return Status::InvalidArgument("odd");
  return v / 2;
}

Status UseHalf(int v, int* out) {
  ASSIGN_OR_RETURN(*out, Half(v));
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Status::NotFound("x");
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_EQ(s.ToString(), "NotFound: x");
  int v = 0;
  EXPECT_TRUE(UseHalf(4, &v).ok());
  EXPECT_EQ(v, 2);
  EXPECT_TRUE(UseHalf(3, &v).IsInvalidArgument());
  Result<int> from_ok(Status::Ok());
  EXPECT_EQ(from_ok.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, ReasonTravelsWithTheErrorAndLeavesTheMessageAlone) {
  EXPECT_EQ(Status::Ok().reason(), ErrorReason::kNone);
  EXPECT_EQ(Status::NotFound("x").reason(), ErrorReason::kNone);
  Status s = Status::NotFound("NoSuchKey: gone").WithReason(ErrorReason::kNoSuchKey);
  EXPECT_TRUE(s.Is(ErrorReason::kNoSuchKey));
  EXPECT_FALSE(s.Is(ErrorReason::kNoSuchBucket));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "NoSuchKey: gone");
  EXPECT_EQ(s.ToString(), "NotFound: NoSuchKey: gone");  // the reason is not in the text
  Status copy = s;
  EXPECT_EQ(copy.reason(), ErrorReason::kNoSuchKey);
  Status moved = std::move(copy);
  EXPECT_EQ(moved.reason(), ErrorReason::kNoSuchKey);
  Status prefixed = s.WithPrefix("reading");
  EXPECT_EQ(prefixed.message(), "reading: NoSuchKey: gone");
  EXPECT_EQ(prefixed.reason(), ErrorReason::kNoSuchKey);
  EXPECT_EQ(s.WithReason(ErrorReason::kNone).reason(), ErrorReason::kNone);
  EXPECT_EQ(s.reason(), ErrorReason::kNoSuchKey);                      // WithReason copies; the original is unchanged
  EXPECT_TRUE(Status::Ok().WithReason(ErrorReason::kNoSuchKey).ok());  // OK stays OK, without one
  EXPECT_EQ(Status::Ok().WithReason(ErrorReason::kNoSuchKey).reason(), ErrorReason::kNone);
  Status direct(StatusCode::kUnavailable, "full", ErrorReason::kDoesNotFitNow);
  EXPECT_TRUE(direct.Is(ErrorReason::kDoesNotFitNow));
  EXPECT_EQ(Status(StatusCode::kOk, "", ErrorReason::kNoSuchKey).reason(), ErrorReason::kNone);
  Result<int> r(s);
  EXPECT_EQ(r.status().reason(), ErrorReason::kNoSuchKey);
  EXPECT_EQ(ErrorReasonName(ErrorReason::kNoSuchUpload), "NoSuchUpload");
}

TEST(EncodingTest, Base64RoundTripAndRejects) {
  for (std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    EXPECT_EQ(Base64Decode(Base64Encode(s)).value(), s);
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_FALSE(Base64Decode("Zm9=v").has_value());
  EXPECT_FALSE(Base64Decode("Zg=").has_value());
  EXPECT_FALSE(Base64Decode("Z===").has_value());
}

TEST(EncodingTest, UriEncodeIsRfc3986) {
  EXPECT_EQ(UriEncode("a b/c~d*e"), "a%20b%2Fc~d%2Ae");
  EXPECT_EQ(UriEncode("a b/c", true), "a%20b/c");
  EXPECT_EQ(UriDecode("a%2Fb+c", true).value(), "a/b c");
  EXPECT_FALSE(UriDecode("%zz").has_value());
  EXPECT_FALSE(UriDecode("%4").has_value());
}

TEST(HashTest, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexEncode(Md5("")), "d41d8cd98f00b204e9800998ecf8427e");
  // Published check values for "123456789".
  EXPECT_EQ(Crc32Update(0, "123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32cUpdate(0, "123456789"), 0xE3069283u);
  // Incremental equals one-shot.
  EXPECT_EQ(Crc32cUpdate(Crc32cUpdate(0, "1234"), "56789"), 0xE3069283u);
  S3Checksum c(S3Checksum::Algorithm::kCrc32);
  c.Update("hello world");
  EXPECT_EQ(c.FinalBase64(), "DUoRhQ==");
  // CRC-64/NVME catalogue check value; the base64 value is what S3 answers for "hello world".
  EXPECT_EQ(Crc64NvmeUpdate(0, "123456789"), 0xAE8B14860A799888ull);
  EXPECT_EQ(Crc64NvmeUpdate(Crc64NvmeUpdate(0, "1234567"), "89"), 0xAE8B14860A799888ull);
  S3Checksum c64(S3Checksum::Algorithm::kCrc64Nvme);
  c64.Update("hello ");
  c64.Update("world");
  EXPECT_EQ(c64.FinalBase64(), "jSnVw/bqjr4=");
}

TEST(TimeTest, FormatsAndParses) {
  int64_t t = 1714557600123;  // 2024-05-01T10:00:00.123Z
  EXPECT_EQ(FormatIso8601Millis(t), "2024-05-01T10:00:00.123Z");
  EXPECT_EQ(FormatAmzDate(t), "20240501T100000Z");
  EXPECT_EQ(FormatRfc1123(t), "Wed, 01 May 2024 10:00:00 GMT");
  EXPECT_EQ(ParseAmzDate("20240501T100000Z").value(), 1714557600000);
  EXPECT_EQ(ParseRfc1123("Wed, 01 May 2024 10:00:00 GMT").value(), 1714557600000);
  EXPECT_EQ(ParseIso8601("2024-05-01T10:00:00.123Z").value(), t);
  EXPECT_EQ(ParseIso8601("2024-05-01T12:00:00+02:00").value(), 1714557600000);
  EXPECT_FALSE(ParseAmzDate("2024-05-01").has_value());
  EXPECT_FALSE(ParseIso8601("garbage").has_value());
}

// Found by fuzz/base_fuzzer: years before 1000 were formatted with fewer than four digits.
TEST(TimeTest, EarlyYearsRoundTrip) {
  int64_t t = *ParseRfc1123("Fri, 01 May 0296 10:00:00 GMT");
  EXPECT_EQ(FormatRfc1123(t), "Fri, 01 May 0296 10:00:00 GMT");
  EXPECT_EQ(ParseIso8601(FormatIso8601Millis(t)).value(), t);
  EXPECT_EQ(ParseAmzDate(FormatAmzDate(t)).value(), t);
  EXPECT_FALSE(ParseRfc1123("Wed, 01 May 2024 10:00:00XGMT").has_value());
}

// Found by fuzz/base_fuzzer (UBSan): memcpy from an empty view's null pointer.
TEST(IoTest, EmptyStringByteSource) {
  StringByteSource source{std::string_view()};
  char b;
  EXPECT_EQ(source.Read(&b, 1).value(), 0u);
}

TEST(StringsTest, SplitTrimParse) {
  auto parts = Split("a,,b", ',');
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1], "");
  EXPECT_EQ(Trim("  x \r\n"), "x");
  EXPECT_EQ(ParseUint64("18446744073709551615").value(), UINT64_MAX);
  EXPECT_FALSE(ParseUint64("18446744073709551616").has_value());
  EXPECT_FALSE(ParseUint64("12a").has_value());
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(IdsTest, UuidsAndRequestIdsAreWellFormedAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 5000; ++i) {
    std::string id = NewUuid();
    ASSERT_EQ(id.size(), 36u);
    EXPECT_EQ(id[14], '4');
    EXPECT_TRUE(id[19] == '8' || id[19] == '9' || id[19] == 'a' || id[19] == 'b') << id;
    EXPECT_TRUE(seen.insert(id).second) << id;
    std::string s3 = NewS3RequestId();
    ASSERT_EQ(s3.size(), 16u);
    EXPECT_EQ(s3.find_first_not_of("0123456789ABCDEF"), std::string::npos) << s3;
    EXPECT_TRUE(seen.insert(s3).second) << s3;
  }
}

TEST(IdsTest, ThreadsAndForkedChildrenNeverShareIdBytes) {
  (void)NewUuid();  // this thread's pool holds bytes now
  std::string other;
  std::thread([&] { other = NewUuid(); }).join();
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string id = NewUuid();
    (void)!::write(pipe_fds[1], id.data(), id.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  char buf[36];
  ASSERT_EQ(::read(pipe_fds[0], buf, sizeof(buf)), 36);
  ::close(pipe_fds[0]);
  ::waitpid(child, nullptr, 0);
  std::string in_child(buf, 36);
  std::string mine = NewUuid();  // the bytes the child would have taken without the fork guard
  EXPECT_NE(in_child, mine);
  EXPECT_NE(other, mine);
}

}  // namespace
}  // namespace kiln
