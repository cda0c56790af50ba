// Fuzzes request authentication (src/aws/sigv4.h, src/aws/sigv2.h): aws::VerifyRequest and
// aws::VerifySigV2 on a request whose Authorization header, raw path, raw query and date header
// come from the input, plus CanonicalUri / CanonicalQuery / ScopeServiceOf / IsSigV2 on the raw
// bytes. Credentials and the server clock are fixed (the AWS documentation's example key,
// 2013-05-24T00:00:00Z).
//
// Input layout: byte 0 = flags (below), then up to five '\n'-separated fields:
//   Authorization value (empty: no header) \n raw path \n raw query \n X-Amz-Date / Date value \n
//   one extra header "name:value"
// Flags: bit 0 S3 rules, bit 1 accept any region, bits 2-3 method, bit 4 add
// x-amz-content-sha256: UNSIGNED-PAYLOAD, bit 5 pass a body hash, bit 6 sign-then-verify.
//
// Round trip (bit 6): the request, with the fuzzed path and query, signed by aws::SignRequest
// with the known key must verify. That holds for any path/query a client could send, so a
// rejection is a bug in one of the two sides (or in the canonicalisation they share).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "aws/credentials.h"
#include "aws/sigv2.h"
#include "aws/sigv4.h"
#include "base/strings.h"
#include "base/time.h"

namespace {

using kiln::aws::AuthError;
using kiln::aws::VerifiedRequest;

constexpr std::string_view kAccessKey = "AKIAIOSFODNN7EXAMPLE";
constexpr std::string_view kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr std::string_view kTokenKey = "ASIAEXAMPLETOKENKEY1";

class FixedCredentials final : public kiln::aws::CredentialProvider {
 public:
  std::optional<kiln::aws::Credential> Lookup(std::string_view id) const override {
    kiln::aws::Credential c;
    c.access_key_id = std::string(id);
    c.secret_access_key = std::string(kSecret);
    c.account_id = "123456789012";
    if (id == kAccessKey) return c;
    if (id == kTokenKey) {
      c.session_token = "session-token";
      return c;
    }
    return std::nullopt;
  }
};

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const FixedCredentials credentials;
  static const int64_t now = *kiln::ParseAmzDate("20130524T000000Z");
  const uint8_t flags = data[0];
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<std::string_view> fields = kiln::Split(input, '\n');
  fields.resize(5);  // missing fields are empty
  const bool s3 = flags & 0x01;
  static const char* const kMethods[] = {"GET", "PUT", "POST", "HEAD"};

  kiln::aws::OwnedSignable request;
  request.method = kMethods[(flags >> 2) & 3];
  request.raw_path = std::string(fields[1]);
  request.raw_query = std::string(fields[2]);
  request.headers.emplace("Host", "s3.amazonaws.com");
  if (!fields[0].empty()) request.headers.emplace("Authorization", std::string(fields[0]));
  if (!fields[3].empty()) {
    request.headers.emplace("X-Amz-Date", std::string(fields[3]));
    request.headers.emplace("Date", std::string(fields[3]));
  }
  if (size_t colon = fields[4].find(':'); colon != std::string_view::npos && colon > 0) {
    request.headers.emplace(std::string(fields[4].substr(0, colon)), std::string(fields[4].substr(colon + 1)));
  }
  if (flags & 0x10) request.headers.emplace("x-amz-content-sha256", std::string(kiln::aws::kUnsignedPayload));

  (void)kiln::aws::CanonicalUri(request.raw_path, true);
  (void)kiln::aws::CanonicalUri(request.raw_path, false);
  (void)kiln::aws::CanonicalQuery(request.raw_query);
  (void)kiln::aws::ScopeServiceOf(request);

  kiln::aws::VerifyOptions options;
  options.expected_service = s3 ? "s3" : "sts";
  options.regions = {"us-east-1"};
  options.accept_any_region = flags & 0x02;
  options.s3 = s3;
  std::optional<std::string_view> body_hash;
  if (flags & 0x20) body_hash = kiln::aws::kEmptySha256;
  (void)kiln::aws::VerifyRequest(request, credentials, options, now, body_hash);
  if (kiln::aws::IsSigV2(request)) (void)kiln::aws::VerifySigV2(request, credentials, "us-east-1", now);

  if (flags & 0x40) {
    // Sign a clean copy (no fuzzed auth or date headers) and verify it.
    kiln::aws::OwnedSignable clean;
    clean.method = request.method;
    clean.raw_path = request.raw_path.empty() ? "/" : request.raw_path;
    clean.raw_query = request.raw_query;
    clean.headers.emplace("Host", "s3.amazonaws.com");
    std::string lower_query = kiln::ToLower(clean.raw_query);
    if (lower_query.find("x-amz-") != std::string::npos || lower_query.find("awsaccesskeyid") != std::string::npos ||
        lower_query.find("signature") != std::string::npos) {
      return 0;  // the query would itself look like a (conflicting) presigned request
    }
    kiln::aws::SignOptions sign;
    sign.access_key_id = std::string(kAccessKey);
    sign.secret_access_key = std::string(kSecret);
    sign.service = options.expected_service;
    sign.time_millis = now;
    sign.s3 = s3;
    if (s3) sign.payload_hash = std::string(kiln::aws::kUnsignedPayload);
    kiln::aws::SignRequest(clean, sign);
    auto result = kiln::aws::VerifyRequest(
        clean, credentials, options, now, s3 ? std::nullopt : std::optional<std::string_view>(kiln::aws::kEmptySha256));
    if (const AuthError* error = std::get_if<AuthError>(&result)) {
      // A path or query that is not valid percent-encoding may be refused as malformed; a
      // well-formed request must verify.
      if (std::getenv("KILN_FUZZ_DEBUG") != nullptr) {
        std::fprintf(stderr, "round trip: %d %s\n%s\n", static_cast<int>(error->failure), error->message.c_str(),
                     error->canonical_request.c_str());
      }
      Check(error->failure == kiln::aws::AuthFailure::kMalformed);
    }
  }
  return 0;
}
