#pragma once
// AWS Signature Version 4: signing (for Kiln's own outbound requests and tests) and verification
// of inbound requests in header and presigned-query form (spec/control-plane-api.md §3).
//
// Verification covers everything but the payload: the caller wraps the body with the reader that
// matches `VerifiedRequest::payload_mode` (see aws/payload.h) so the body is checked as it streams.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "aws/credentials.h"
#include "base/io.h"
#include "base/status.h"
#include "base/time.h"

namespace kiln::aws {

inline constexpr std::string_view kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";
inline constexpr std::string_view kStreamingSigned = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
inline constexpr std::string_view kStreamingSignedTrailer = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
inline constexpr std::string_view kStreamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

// The parts of an HTTP request that SigV4 covers, as a non-owning view: the server verifies the
// request it received in place (net::HttpRequest's own strings), nothing is copied or moved.
// The viewed strings and header map must outlive every call given the view.
struct SignableRequest {
  std::string_view method;
  std::string_view raw_path;   // percent-encoded, as on the wire
  std::string_view raw_query;  // without '?'
  const HeaderMap& headers;
};

// An owned request to sign (client side) or to build in tests; it views as a SignableRequest
// (implicitly), so every function below takes either.
struct OwnedSignable {
  std::string method;
  std::string raw_path;   // percent-encoded, as on the wire
  std::string raw_query;  // without '?'
  HeaderMap headers;

  SignableRequest view() const { return {method, raw_path, raw_query, headers}; }
  operator SignableRequest() const { return view(); }  // NOLINT(google-explicit-constructor)
};

// The hex SHA-256 of a payload, as VerifyRequest's `body_sha256_hex` wants it: the same value as
// base's Sha256Hex, computed with the verifier's once-fetched algorithm and per-thread context
// (no OpenSSL 3 provider lookup, and so no process-wide lock, per call).
std::string PayloadSha256Hex(std::string_view payload);

// kSigning = HMAC chain over date, region, service, "aws4_request" (raw 32 bytes).
std::string DeriveSigningKey(std::string_view secret, std::string_view yyyymmdd, std::string_view region,
                             std::string_view service);

// Canonical URI per §3.2: for S3 (`s3_rules`) the raw path as sent (each byte outside the
// unreserved set and '/' encoded once, existing escapes decoded first); otherwise normalised and
// encoded twice.
std::string CanonicalUri(std::string_view raw_path, bool s3_rules);
// Canonical query per §3.2, excluding X-Amz-Signature.
std::string CanonicalQuery(std::string_view raw_query);
// The full canonical request for the given signed header names (lower-case, sorted).
std::string CanonicalRequest(const SignableRequest& request, const std::vector<std::string>& signed_headers,
                             std::string_view payload_hash, bool s3_rules);
std::string StringToSign(std::string_view amz_date, std::string_view scope, std::string_view canonical_request);

// ---- Signing (client side) ----

struct SignOptions {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // added as X-Amz-Security-Token when non-empty
  std::string region = "us-east-1";
  std::string service;      // "s3", "sagemaker", ...
  int64_t time_millis = 0;  // 0 = now
  // Hex SHA-256 of the body, or UNSIGNED-PAYLOAD / a STREAMING-* literal. Empty = hash of "".
  std::string payload_hash;
  // S3 puts the payload hash in x-amz-content-sha256 and uses S3 canonical URI rules.
  bool s3 = false;
};

// Adds X-Amz-Date, (X-Amz-Content-Sha256 for S3), X-Amz-Security-Token and Authorization to
// `request.headers`, signing every header present (Host must be present). Returns the signature.
std::string SignRequest(OwnedSignable& request, const SignOptions& options);

// Returns the query string (without '?') of a presigned URL for `request` (the request's own
// query parameters first), valid for `expires_seconds`; signs only `host`.
std::string PresignQuery(const SignableRequest& request, const SignOptions& options, int64_t expires_seconds);

// ---- Verification (server side) ----

enum class AuthFailure {
  kMissing,           // no Authorization header and no presigned parameters
  kMalformed,         // a part missing or unparsable
  kUnknownKey,        // access key id not known
  kBadToken,          // security token missing/wrong for a key that has one
  kBadSignature,      // signature mismatch (includes wrong scope service/region in message)
  kSkewed,            // X-Amz-Date outside ±15 min
  kExpired,           // presigned URL past X-Amz-Date + X-Amz-Expires
  kBadContentSha256,  // S3 x-amz-content-sha256 missing or not a valid value
};

// Where the failing credentials were carried. S3 names query-string failures differently from
// header ones: AuthorizationQueryParametersError (SigV4) or AccessDenied (SigV2) instead of
// AuthorizationHeaderMalformed.
enum class AuthForm {
  kHeader,   // Authorization header (either version)
  kQueryV4,  // presigned X-Amz-Algorithm/-Credential/-Date/-Expires/-SignedHeaders/-Signature
  kQueryV2,  // presigned AWSAccessKeyId/Expires/Signature
};

struct AuthError {
  AuthFailure failure;
  std::string message;  // AWS-style text for the client
  // For debugging signature mismatches (Kiln logs these at debug level only).
  std::string canonical_request;
  std::string string_to_sign;
  AuthForm form = AuthForm::kHeader;
  // Extra children S3 writes into its <Error> for this failure, in order. An expired presigned
  // URL: X-Amz-Expires (SigV4 only), Expires and ServerTime (both yyyy-mm-ddThh:mm:ssZ); one not
  // yet valid: X-Amz-Date (epoch milliseconds, as S3 writes it), Expires, ServerTime.
  std::vector<std::pair<std::string, std::string>> details = {};
};

struct VerifyOptions {
  std::string expected_service;      // signing name of the service hit ("s3", "sts", ...)
  std::vector<std::string> regions;  // accepted scope regions
  bool accept_any_region = false;
  bool s3 = false;  // S3 canonical rules, x-amz-content-sha256 required
  int64_t max_skew_millis = 15 * 60 * 1000;
};

struct VerifiedRequest {
  Credential credential;
  std::string region;
  std::string service;
  std::string amz_date;        // yyyymmddThhmmssZ from the request
  std::string scope;           // yyyymmdd/region/service/aws4_request
  std::string signing_key;     // raw kSigning, for chunk signatures
  std::string seed_signature;  // hex header signature: the first "previous signature" of chunks
  // What the payload claims: a 64-hex hash, UNSIGNED-PAYLOAD, or a STREAMING-* literal. For
  // non-S3 header-signed requests this is x-amz-content-sha256 if present, else "" meaning the
  // caller must hash the body and compare with `signed_payload_hash` computed by the signature.
  std::string payload_mode;
  bool presigned = false;
};

// Verifies the signature of `request`. `now_millis` is the server clock. For requests whose
// canonical payload hash is the body's SHA-256 and no x-amz-content-sha256 header is present
// (JSON and query services), `body_sha256_hex` must be supplied by the caller (those bodies are
// small and read before verification); pass nullopt for S3.
std::variant<VerifiedRequest, AuthError> VerifyRequest(const SignableRequest& request,
                                                       const CredentialProvider& credentials,
                                                       const VerifyOptions& options, int64_t now_millis,
                                                       std::optional<std::string_view> body_sha256_hex);

// The signing name from a request's credential scope (header or presigned form), or "" when the
// request carries no parsable SigV4 credential. Used for dispatch before verification.
std::string ScopeServiceOf(const SignableRequest& request);

}  // namespace kiln::aws
