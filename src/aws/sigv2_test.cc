#include "aws/sigv2.h"

#include <gtest/gtest.h>

#include "base/encoding.h"
#include "base/time.h"

namespace kiln::aws {
namespace {

constexpr char kKeyId[] = "AKIAIOSFODNN7EXAMPLE";
constexpr char kSecret[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

class OneKey final : public CredentialProvider {
 public:
  std::optional<Credential> Lookup(std::string_view id) const override {
    if (id != kKeyId) return std::nullopt;
    Credential c;
    c.access_key_id = kKeyId;
    c.secret_access_key = kSecret;
    return c;
  }
};

// Expected strings and signatures computed with botocore 1.26's HmacV1Auth
// (canonical_string / sign_string) for the same requests.
TEST(SigV2Test, HeaderFormMatchesBotocore) {
  OwnedSignable r;
  r.method = "PUT";
  r.raw_path = "/bucket/a%20b/c.txt";
  r.raw_query = "uploadId=xyz&partNumber=3";
  r.headers = {{"Content-Type", "text/plain"},
               {"Content-MD5", "1B2M2Y8AsgTpgAmY7PhCfg=="},
               {"x-amz-meta-b", "2"},
               {"X-Amz-Meta-A", "1"}};
  std::string sts = SigV2StringToSign(r, "Tue, 27 Mar 2007 19:36:42 +0000", r.raw_path, false);
  EXPECT_EQ(sts,
            "PUT\n1B2M2Y8AsgTpgAmY7PhCfg==\ntext/plain\nTue, 27 Mar 2007 19:36:42 +0000\n"
            "x-amz-meta-a:1\nx-amz-meta-b:2\n/bucket/a%20b/c.txt?partNumber=3&uploadId=xyz");
  EXPECT_EQ(SigV2Sign(kSecret, sts), "evUKLVNCfK3TcazjyN219bL4PZI=");
}

TEST(SigV2Test, QueryFormSubresourceValuesAreDecoded) {
  OwnedSignable r;
  r.method = "GET";
  r.raw_path = "/bucket/key";
  r.raw_query = "response-content-type=text%2Fhtml&AWSAccessKeyId=x&Expires=1175139620&Signature=y";
  std::string sts = SigV2StringToSign(r, "1175139620", r.raw_path, true);
  EXPECT_EQ(sts, "GET\n\n\n1175139620\n/bucket/key?response-content-type=text/html");
  EXPECT_EQ(SigV2Sign(kSecret, sts), "k2jljKoDdp46OyRy55Cpla/4Zq4=");
}

OwnedSignable Presigned(int64_t expires, const std::string& secret, const std::string& key_id = kKeyId) {
  OwnedSignable r;
  r.method = "GET";
  r.raw_path = "/bucket/photos/puppy.jpg";
  r.headers = {{"Host", "127.0.0.1:5456"}};
  std::string e = std::to_string(expires);
  std::string sig = SigV2Sign(secret, "GET\n\n\n" + e + "\n/bucket/photos/puppy.jpg");
  r.raw_query = "AWSAccessKeyId=" + key_id + "&Expires=" + e + "&Signature=" + UriEncode(sig);
  return r;
}

TEST(SigV2Test, VerifiesPresignedUrls) {
  OneKey keys;
  int64_t now = NowMillis();
  auto ok = VerifySigV2(Presigned(now / 1000 + 60, kSecret), keys, "us-east-1", now);
  ASSERT_TRUE(std::holds_alternative<VerifiedRequest>(ok));
  EXPECT_EQ(std::get<VerifiedRequest>(ok).payload_mode, kUnsignedPayload);

  auto expired = VerifySigV2(Presigned(now / 1000 - 1, kSecret), keys, "us-east-1", now);
  ASSERT_TRUE(std::holds_alternative<AuthError>(expired));
  EXPECT_EQ(std::get<AuthError>(expired).failure, AuthFailure::kExpired);

  auto bad = VerifySigV2(Presigned(now / 1000 + 60, "not-the-secret"), keys, "us-east-1", now);
  ASSERT_TRUE(std::holds_alternative<AuthError>(bad));
  EXPECT_EQ(std::get<AuthError>(bad).failure, AuthFailure::kBadSignature);

  auto unknown = VerifySigV2(Presigned(now / 1000 + 60, kSecret, "AKIANOBODY"), keys, "us-east-1", now);
  ASSERT_TRUE(std::holds_alternative<AuthError>(unknown));
  EXPECT_EQ(std::get<AuthError>(unknown).failure, AuthFailure::kUnknownKey);
}

// Issue 9: a SigV2 presigned URL's failures as S3 answers them (AccessDenied with these words).
TEST(SigV2Test, PresignedFailuresAsS3) {
  OneKey keys;
  int64_t now = 1714557600000;  // 2024-05-01T10:00:00Z
  auto error_of = [&](const OwnedSignable& r) {
    auto result = VerifySigV2(r, keys, "us-east-1", now);
    EXPECT_TRUE(std::holds_alternative<AuthError>(result));
    return std::holds_alternative<AuthError>(result) ? std::get<AuthError>(result) : AuthError{};
  };
  AuthError expired = error_of(Presigned(now / 1000 - 90, kSecret));
  EXPECT_EQ(expired.failure, AuthFailure::kExpired);
  EXPECT_EQ(expired.form, AuthForm::kQueryV2);
  EXPECT_EQ(expired.message, "Request has expired");
  using Details = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(expired.details, (Details{{"Expires", "2024-05-01T09:58:30Z"}, {"ServerTime", "2024-05-01T10:00:00Z"}}));

  for (const std::string expires : {"tomorrow", "-5", "2147483648", "1e10"}) {
    OwnedSignable r = Presigned(now / 1000 + 60, kSecret);
    r.raw_query.replace(r.raw_query.find("Expires=") + 8, std::to_string(now / 1000 + 60).size(), expires);
    AuthError invalid = error_of(r);
    EXPECT_EQ(invalid.failure, AuthFailure::kMalformed) << expires;
    EXPECT_EQ(invalid.form, AuthForm::kQueryV2) << expires;
    EXPECT_EQ(invalid.message, "Invalid date (should be seconds since epoch): " + expires);
  }
  OwnedSignable missing = Presigned(now / 1000 + 60, kSecret);
  missing.raw_query = missing.raw_query.substr(0, missing.raw_query.find("&Signature="));
  AuthError incomplete = error_of(missing);
  EXPECT_EQ(incomplete.form, AuthForm::kQueryV2);
  EXPECT_EQ(incomplete.message,
            "Query-string authentication requires the Signature, Expires and AWSAccessKeyId parameters");
}

TEST(SigV2Test, HeaderFormChecksClockAndVirtualHostResource) {
  OneKey keys;
  int64_t now = NowMillis();
  OwnedSignable r;
  r.method = "GET";
  r.raw_path = "/photos/puppy.jpg";
  std::string date = FormatRfc1123(now);
  r.headers = {{"Host", "bucket.localhost:5456"}, {"Date", date}};
  std::string sig = SigV2Sign(kSecret, "GET\n\n\n" + date + "\n/bucket/photos/puppy.jpg");
  r.headers.emplace("Authorization", std::string("AWS ") + kKeyId + ":" + sig);
  EXPECT_TRUE(IsSigV2(r));
  EXPECT_TRUE(std::holds_alternative<VerifiedRequest>(VerifySigV2(r, keys, "us-east-1", now)));
  auto skewed = VerifySigV2(r, keys, "us-east-1", now + 20 * 60 * 1000);
  ASSERT_TRUE(std::holds_alternative<AuthError>(skewed));
  EXPECT_EQ(std::get<AuthError>(skewed).failure, AuthFailure::kSkewed);

  r.headers.erase("Authorization");
  r.headers.emplace("Authorization", "AWS missing-colon");
  auto malformed = VerifySigV2(r, keys, "us-east-1", now);
  ASSERT_TRUE(std::holds_alternative<AuthError>(malformed));
  EXPECT_EQ(std::get<AuthError>(malformed).failure, AuthFailure::kMalformed);
}

}  // namespace
}  // namespace kiln::aws
