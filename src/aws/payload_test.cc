#include "aws/payload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/time.h"

namespace kiln::aws {
namespace {

// An upstream that hands out at most `step` bytes per Read, to exercise framing split anywhere.
class SteppingSource final : public ByteSource {
 public:
  SteppingSource(std::string_view data, size_t step) : data_(data), step_(step) {}
  Result<size_t> Read(char* buf, size_t n) override {
    size_t count = std::min({n, step_, data_.size() - pos_});
    std::memcpy(buf, data_.data() + pos_, count);
    pos_ += count;
    return count;
  }

 private:
  std::string_view data_;
  size_t step_;
  size_t pos_ = 0;
};

struct Outcome {
  Status status;
  std::string data;
  PayloadErrorKind kind = PayloadErrorKind::kNone;
  std::map<std::string, std::string> checksums;
};

Outcome Drain(std::string_view body, const HeaderMap& headers, const VerifiedRequest* verified, size_t step,
              size_t read_size = 7000, uint64_t max_bytes = 5ull << 30, bool verify_content_md5 = true) {
  SteppingSource source(body, step);
  PayloadOptions options;
  options.verify_content_md5 = verify_content_md5;
  options.verified = verified;
  options.headers = &headers;
  options.max_bytes = max_bytes;
  Outcome outcome;
  Result<std::unique_ptr<PayloadReader>> opened = OpenPayload(source, options);
  if (!opened.ok()) {
    outcome.status = opened.status();
    return outcome;
  }
  PayloadReader& reader = **opened;
  std::string buf(read_size, '\0');
  while (true) {
    Result<size_t> got = reader.Read(buf.data(), buf.size());
    if (!got.ok()) {
      outcome.status = got.status();
      outcome.kind = reader.error_kind();
      // Errors are sticky.
      Result<size_t> again = reader.Read(buf.data(), buf.size());
      EXPECT_FALSE(again.ok());
      return outcome;
    }
    if (*got == 0) {
      break;
    }
    outcome.data.append(buf.data(), *got);
  }
  outcome.checksums = reader.checksums();
  return outcome;
}

HeaderMap Headers(std::initializer_list<std::pair<const std::string, std::string>> list) { return HeaderMap(list); }

std::string Crc32Base64(std::string_view data) { return Base64Encode(Crc32ToBytes(Crc32Update(0, data))); }

// ---- Plain bodies ----

TEST(PayloadTest, Sha256PassThroughAndMismatch) {
  std::string body = "Welcome to Amazon S3.";
  VerifiedRequest verified;
  verified.payload_mode = Sha256Hex(body);
  for (size_t step : {1ul, 3ul, 1000ul}) {
    Outcome ok = Drain(body, {}, &verified, step);
    ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
    EXPECT_EQ(ok.data, body);
  }
  Outcome bad = Drain("Welcome to Amazon S3!", {}, &verified, 5);
  EXPECT_EQ(bad.kind, PayloadErrorKind::kSha256Mismatch);
  EXPECT_EQ(bad.status.message(), "The provided 'x-amz-content-sha256' header does not match what was computed.");
}

TEST(PayloadTest, UnsignedPassThroughWithContentMd5AndChecksumHeader) {
  std::string body(100000, 'z');
  VerifiedRequest verified;
  verified.payload_mode = std::string(kUnsignedPayload);
  HeaderMap headers = Headers({{"Content-MD5", Base64Encode(Md5(body))}, {"x-amz-checksum-crc32", Crc32Base64(body)}});
  Outcome ok = Drain(body, headers, &verified, 4096);
  ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
  EXPECT_EQ(ok.data, body);
  EXPECT_EQ(ok.checksums, (std::map<std::string, std::string>{{"crc32", Crc32Base64(body)}}));

  HeaderMap wrong_md5 = Headers({{"Content-MD5", Base64Encode(Md5("other"))}});
  Outcome md5 = Drain(body, wrong_md5, &verified, 4096);
  EXPECT_EQ(md5.kind, PayloadErrorKind::kBadDigest);
  EXPECT_EQ(md5.status.message(), "The Content-MD5 you specified did not match what we received.");

  HeaderMap wrong_crc = Headers({{"x-amz-checksum-crc32", Crc32Base64("other")}});
  Outcome crc = Drain(body, wrong_crc, &verified, 4096);
  EXPECT_EQ(crc.kind, PayloadErrorKind::kBadDigest);
  EXPECT_EQ(crc.status.message(), "The CRC32 you specified did not match the calculated checksum.");

  HeaderMap sha = Headers({{"x-amz-checksum-sha256", Base64Encode(Sha256(body))}});
  EXPECT_EQ(Drain(body, sha, &verified, 999).checksums.at("sha256"), Base64Encode(Sha256(body)));
}

TEST(PayloadTest, ContentMd5LeftToTheCallerIsOnlyFormatChecked) {
  std::string body(5000, 'q');
  VerifiedRequest verified;
  verified.payload_mode = std::string(kUnsignedPayload);
  HeaderMap wrong_md5 = Headers({{"Content-MD5", Base64Encode(Md5("other"))}});
  Outcome passed = Drain(body, wrong_md5, &verified, 512, 7000, 5ull << 30, /*verify_content_md5=*/false);
  ASSERT_TRUE(passed.status.ok()) << passed.status.ToString();
  EXPECT_EQ(passed.data, body);
  Outcome malformed = Drain(body, Headers({{"Content-MD5", "nope"}}), &verified, 512, 7000, 5ull << 30, false);
  EXPECT_EQ(malformed.status.message(), "The Content-MD5 you specified was invalid.");
}

TEST(PayloadTest, OpenRejectsBadHeaders) {
  VerifiedRequest verified;
  verified.payload_mode = std::string(kUnsignedPayload);
  EXPECT_EQ(Drain("x", Headers({{"Content-MD5", "nope"}}), &verified, 1).status.message(),
            "The Content-MD5 you specified was invalid.");
  EXPECT_EQ(Drain("x", Headers({{"x-amz-checksum-crc32", "AAAA"}}), &verified, 1).status.message(),
            "Value for x-amz-checksum-crc32 header is invalid.");
  EXPECT_TRUE(Drain("x",
                    Headers({{"x-amz-checksum-crc32", Crc32Base64("x")},
                             {"x-amz-checksum-sha1", Base64Encode(std::string(20, 'a'))}}),
                    &verified, 1)
                  .status.IsInvalidArgument());
  VerifiedRequest chunked;
  chunked.payload_mode = std::string(kStreamingUnsignedTrailer);
  EXPECT_TRUE(Drain("0\r\n\r\n", {}, &chunked, 1).status.IsInvalidArgument());  // no decoded length
  VerifiedRequest signed_without_key;
  signed_without_key.payload_mode = std::string(kStreamingSigned);
  EXPECT_TRUE(Drain("0\r\n\r\n", Headers({{"x-amz-decoded-content-length", "0"}}), &signed_without_key, 1)
                  .status.IsInvalidArgument());
}

TEST(PayloadTest, MaxBytes) {
  VerifiedRequest verified;
  verified.payload_mode = std::string(kUnsignedPayload);
  Outcome big = Drain(std::string(50, 'a'), {}, &verified, 7, 7000, /*max_bytes=*/10);
  EXPECT_EQ(big.kind, PayloadErrorKind::kTooLarge);
}

// ---- STREAMING-UNSIGNED-PAYLOAD-TRAILER ----

// Captured from botocore 1.43.11: s3.put_object(Bucket="bucket", Key="dir/a b+c.txt",
// Body=BytesIO(b"Hello, Kiln! " * 10), ChecksumAlgorithm="CRC32") over HTTPS (the request
// headers are in sigv4_test.cc, S3PutObjectStreamingUnsignedTrailer).
constexpr std::string_view kBotocoreBody =
    "82\r\nHello, Kiln! Hello, Kiln! Hello, Kiln! Hello, Kiln! Hello, Kiln! Hello, Kiln! Hello, Kiln! Hello, "
    "Kiln! Hello, Kiln! Hello, Kiln! \r\n0\r\nx-amz-checksum-crc32:RECGxQ==\r\n\r\n";

HeaderMap BotocoreHeaders() {
  return Headers({{"x-amz-sdk-checksum-algorithm", "CRC32"},
                  {"Content-Encoding", "aws-chunked"},
                  {"X-Amz-Trailer", "x-amz-checksum-crc32"},
                  {"X-Amz-Decoded-Content-Length", "130"},
                  {"X-Amz-Content-SHA256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"}});
}

std::string HelloKiln() {
  std::string out;
  for (int i = 0; i < 10; ++i) {
    out += "Hello, Kiln! ";
  }
  return out;
}

TEST(PayloadTest, BotocoreUnsignedTrailerStream) {
  VerifiedRequest verified;
  verified.payload_mode = std::string(kStreamingUnsignedTrailer);
  for (size_t step : {1ul, 2ul, 17ul, 4096ul}) {
    for (size_t read_size : {1ul, 13ul, 8192ul}) {
      Outcome ok = Drain(kBotocoreBody, BotocoreHeaders(), &verified, step, read_size);
      ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
      EXPECT_EQ(ok.data, HelloKiln());
      EXPECT_EQ(ok.checksums, (std::map<std::string, std::string>{{"crc32", "RECGxQ=="}}));
    }
  }
  // Also without a verified request (an unauthenticated listener): mode from the header.
  Outcome anonymous = Drain(kBotocoreBody, BotocoreHeaders(), nullptr, 5);
  ASSERT_TRUE(anonymous.status.ok()) << anonymous.status.ToString();
  EXPECT_EQ(anonymous.data, HelloKiln());
}

TEST(PayloadTest, UnsignedTrailerFailures) {
  VerifiedRequest verified;
  verified.payload_mode = std::string(kStreamingUnsignedTrailer);
  std::string body(kBotocoreBody);

  std::string wrong_checksum = body;
  wrong_checksum.replace(wrong_checksum.find("RECGxQ=="), 8, Crc32Base64("nope"));
  Outcome bad = Drain(wrong_checksum, BotocoreHeaders(), &verified, 3);
  EXPECT_EQ(bad.kind, PayloadErrorKind::kBadDigest);

  std::string tampered = body;
  tampered[10] = 'X';
  EXPECT_EQ(Drain(tampered, BotocoreHeaders(), &verified, 3).kind, PayloadErrorKind::kBadDigest);

  for (size_t cut : {2ul, 20ul, body.find("0\r\n"), body.size() - 2}) {
    SCOPED_TRACE(cut);
    Outcome truncated = Drain(body.substr(0, cut), BotocoreHeaders(), &verified, 3);
    EXPECT_EQ(truncated.kind, PayloadErrorKind::kIncomplete);
    EXPECT_FALSE(truncated.status.ok());
  }

  HeaderMap longer = BotocoreHeaders();
  longer.find("x-amz-decoded-content-length")->second = "131";
  EXPECT_EQ(Drain(body, longer, &verified, 3).kind, PayloadErrorKind::kIncomplete);
  HeaderMap shorter = BotocoreHeaders();
  shorter.find("x-amz-decoded-content-length")->second = "129";
  EXPECT_EQ(Drain(body, shorter, &verified, 3).kind, PayloadErrorKind::kTooLarge);

  std::string bad_size = "zz\r\n" + body.substr(4);
  EXPECT_EQ(Drain(bad_size, BotocoreHeaders(), &verified, 3).kind, PayloadErrorKind::kMalformed);
  std::string no_crlf = body;
  no_crlf.erase(no_crlf.find(" \r\n0") + 1, 2);
  EXPECT_EQ(Drain(no_crlf, BotocoreHeaders(), &verified, 3).kind, PayloadErrorKind::kMalformed);

  // Trailer declared but not sent.
  std::string no_trailer = "3\r\nabc\r\n0\r\n\r\n";
  HeaderMap three = BotocoreHeaders();
  three.find("x-amz-decoded-content-length")->second = "3";
  EXPECT_EQ(Drain(no_trailer, three, &verified, 1).kind, PayloadErrorKind::kMalformed);
}

TEST(PayloadTest, ChunkExtensionsAndBareLfTolerated) {
  VerifiedRequest verified;
  verified.payload_mode = std::string(kStreamingUnsignedTrailer);
  HeaderMap headers = Headers({{"x-amz-decoded-content-length", "6"}, {"x-amz-trailer", "x-amz-checksum-crc32c"}});
  std::string crc32c = Base64Encode(Crc32ToBytes(Crc32cUpdate(0, "abcdef")));
  std::string body = "3;foo=bar\r\nabc\r\n3\nde\x66\r\n0\r\nx-amz-checksum-crc32c: " + crc32c + "\r\n\r\n";
  Outcome ok = Drain(body, headers, &verified, 1);
  ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
  EXPECT_EQ(ok.data, "abcdef");
  EXPECT_EQ(ok.checksums.at("crc32c"), crc32c);
}

TEST(PayloadTest, LargeChunkIsStreamedNotBuffered) {
  // One 9 MiB chunk read in 64 KiB pieces: every Read returns at most what was asked for, and
  // data arrives before the chunk ends.
  constexpr size_t kSize = 9 * 1024 * 1024;
  std::string data(kSize, 'q');
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%zx", kSize);
  std::string body =
      std::string(hex) + "\r\n" + data + "\r\n0\r\nx-amz-checksum-crc32:" + Crc32Base64(data) + "\r\n\r\n";
  VerifiedRequest verified;
  verified.payload_mode = std::string(kStreamingUnsignedTrailer);
  HeaderMap headers =
      Headers({{"x-amz-decoded-content-length", std::to_string(kSize)}, {"x-amz-trailer", "x-amz-checksum-crc32"}});
  StringByteSource source(body);
  PayloadOptions options;
  options.verified = &verified;
  options.headers = &headers;
  auto reader = OpenPayload(source, options);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->size_hint(), kSize);
  std::string buf(65536, '\0');
  Result<size_t> first = (*reader)->Read(buf.data(), buf.size());
  ASSERT_TRUE(first.ok());
  EXPECT_GT(*first, 0u);
  EXPECT_LE(*first, buf.size());
  size_t total = *first;
  while (true) {
    Result<size_t> got = (*reader)->Read(buf.data(), buf.size());
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (*got == 0) {
      break;
    }
    total += *got;
  }
  EXPECT_EQ(total, kSize);
}

// ---- STREAMING-AWS4-HMAC-SHA256-PAYLOAD: AWS's documented example ("Signature Calculations
// for the Authorization Header: Transferring Payload in Multiple Chunks"): 65536 + 1024 bytes
// of 'a', secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY, 20130524T000000Z. ----

constexpr std::string_view kSeed = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";
constexpr std::string_view kChunk1 = "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648";
constexpr std::string_view kChunk2 = "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497";
constexpr std::string_view kChunk3 = "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9";

class FakeCredentials final : public CredentialProvider {
 public:
  std::optional<Credential> Lookup(std::string_view id) const override {
    if (id != "AKIAIOSFODNN7EXAMPLE") {
      return std::nullopt;
    }
    Credential credential;
    credential.access_key_id = "AKIAIOSFODNN7EXAMPLE";
    credential.secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    return credential;
  }
};

// Verifies the example's header signature with VerifyRequest, so the chunk chain starts from a
// seed that Kiln computed itself.
VerifiedRequest VerifyDocExample(bool trailer) {
  OwnedSignable request{"PUT", "/examplebucket/chunkObject.txt", "", {}};
  request.headers.emplace("Host", "s3.amazonaws.com");
  request.headers.emplace("Content-Encoding", "aws-chunked");
  request.headers.emplace("x-amz-date", "20130524T000000Z");
  request.headers.emplace("x-amz-decoded-content-length", "66560");
  request.headers.emplace("x-amz-storage-class", "REDUCED_REDUNDANCY");
  std::string signed_headers;
  std::string seed;
  if (trailer) {
    request.headers.emplace("x-amz-content-sha256", std::string(kStreamingSignedTrailer));
    request.headers.emplace("x-amz-trailer", "x-amz-checksum-crc32c");
    signed_headers =
        "content-encoding;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;"
        "x-amz-storage-class;x-amz-trailer";
    seed = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e";
  } else {
    request.headers.emplace("Content-Length", "66824");
    request.headers.emplace("x-amz-content-sha256", std::string(kStreamingSigned));
    signed_headers =
        "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
        "x-amz-decoded-content-length;x-amz-storage-class";
    seed = std::string(kSeed);
  }
  request.headers.emplace("Authorization",
                          "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                          "SignedHeaders=" +
                              signed_headers + ",Signature=" + seed);
  VerifyOptions options;
  options.expected_service = "s3";
  options.regions = {"us-east-1"};
  options.s3 = true;
  FakeCredentials credentials;
  auto result = VerifyRequest(request, credentials, options, *ParseAmzDate("20130524T000000Z"), std::nullopt);
  if (const AuthError* error = std::get_if<AuthError>(&result)) {
    ADD_FAILURE() << error->message << "\n" << error->canonical_request;
    return VerifiedRequest();
  }
  return std::get<VerifiedRequest>(result);
}

std::string DocBody(std::string_view sig1, std::string_view sig2, std::string_view sig3,
                    std::string_view trailers = "") {
  std::string body;
  body += "10000;chunk-signature=" + std::string(sig1) + "\r\n" + std::string(65536, 'a') + "\r\n";
  body += "400;chunk-signature=" + std::string(sig2) + "\r\n" + std::string(1024, 'a') + "\r\n";
  body += "0;chunk-signature=" + std::string(sig3) + "\r\n";
  body += trailers;
  body += "\r\n";
  return body;
}

HeaderMap DocHeaders() {
  return Headers({{"Content-Encoding", "aws-chunked"}, {"x-amz-decoded-content-length", "66560"}});
}

TEST(PayloadSignedTest, DocumentedChunkedUpload) {
  VerifiedRequest verified = VerifyDocExample(false);
  ASSERT_EQ(verified.seed_signature, kSeed);
  ASSERT_EQ(verified.payload_mode, kStreamingSigned);
  std::string body = DocBody(kChunk1, kChunk2, kChunk3);
  ASSERT_EQ(body.size(), 66824u);  // the documented Content-Length
  for (size_t step : {1ul, 997ul, 100000ul}) {
    SCOPED_TRACE(step);
    Outcome ok = Drain(body, DocHeaders(), &verified, step, step == 1 ? 65536 : 4096);
    ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
    EXPECT_EQ(ok.data, std::string(66560, 'a'));
  }
}

TEST(PayloadSignedTest, BadChunkSignatureOrData) {
  VerifiedRequest verified = VerifyDocExample(false);
  std::string wrong(64, '1');
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    std::string body = DocBody(i == 0 ? wrong : std::string(kChunk1), i == 1 ? wrong : std::string(kChunk2),
                               i == 2 ? wrong : std::string(kChunk3));
    Outcome bad = Drain(body, DocHeaders(), &verified, 4096);
    EXPECT_EQ(bad.kind, PayloadErrorKind::kSignatureMismatch);
    EXPECT_EQ(bad.status.code(), StatusCode::kUnauthenticated);
  }
  std::string tampered = DocBody(kChunk1, kChunk2, kChunk3);
  tampered[1000] = 'b';  // inside the first chunk's data
  EXPECT_EQ(Drain(tampered, DocHeaders(), &verified, 4096).kind, PayloadErrorKind::kSignatureMismatch);
  // Chunks without signatures in a signed stream are malformed.
  std::string unsigned_frames = "3\r\nabc\r\n0\r\n\r\n";
  EXPECT_EQ(Drain(unsigned_frames, Headers({{"x-amz-decoded-content-length", "3"}}), &verified, 4096).kind,
            PayloadErrorKind::kMalformed);
  // Truncated.
  std::string body = DocBody(kChunk1, kChunk2, kChunk3);
  EXPECT_EQ(Drain(body.substr(0, 40000), DocHeaders(), &verified, 4096).kind, PayloadErrorKind::kIncomplete);
}

// STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER: AWS's documented example with a CRC32C trailer
// (chunk and trailer signatures from the AWS S3 docs "sigv4-streaming-trailers").
TEST(PayloadSignedTest, DocumentedChunkedUploadWithSignedTrailer) {
  VerifiedRequest verified = VerifyDocExample(true);
  ASSERT_EQ(verified.seed_signature, "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e");
  HeaderMap headers = DocHeaders();
  headers.emplace("x-amz-trailer", "x-amz-checksum-crc32c");
  std::string trailers =
      "x-amz-checksum-crc32c:sOO8/Q==\r\n"
      "x-amz-trailer-signature:d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435\r\n";
  std::string body = DocBody("b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
                             "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
                             "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992", trailers);
  Outcome ok = Drain(body, headers, &verified, 333);
  ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
  EXPECT_EQ(ok.data, std::string(66560, 'a'));
  EXPECT_EQ(ok.checksums, (std::map<std::string, std::string>{{"crc32c", "sOO8/Q=="}}));

  std::string bad_trailer_sig = body;
  bad_trailer_sig.replace(bad_trailer_sig.find("d81f82fc"), 8, "00000000");
  EXPECT_EQ(Drain(bad_trailer_sig, headers, &verified, 333).kind, PayloadErrorKind::kSignatureMismatch);
  // Changing the trailer value breaks the trailer signature before the checksum is compared.
  std::string bad_value = body;
  bad_value.replace(bad_value.find("sOO8/Q=="), 8, "AAAAAA==");
  EXPECT_EQ(Drain(bad_value, headers, &verified, 333).kind, PayloadErrorKind::kSignatureMismatch);
}

}  // namespace
}  // namespace kiln::aws
