#pragma once
// Readers that check an S3 request payload while it streams (spec/control-plane-api.md §3.4):
// x-amz-content-sha256 hex, aws-chunked with signed chunks, aws-chunked with trailers, plus
// Content-MD5 and x-amz-checksum-* validation. Each wraps an upstream ByteSource and yields the
// decoded object bytes; a failure surfaces from Read() as a Status whose message says what was
// wrong, with `PayloadError()` telling the S3 front which S3 error code to answer.

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "aws/sigv4.h"
#include "base/io.h"

namespace kiln::aws {

enum class PayloadErrorKind {
  kNone,
  kSha256Mismatch,     // XAmzContentSHA256Mismatch
  kBadDigest,          // Content-MD5 or x-amz-checksum-* mismatch → BadDigest / InvalidRequest
  kSignatureMismatch,  // a chunk signature → SignatureDoesNotMatch
  kMalformed,          // bad chunk framing or trailer → IncompleteBody / InvalidRequest
  kIncomplete,         // fewer bytes than declared → IncompleteBody
  kTooLarge,           // more bytes than declared or allowed → EntityTooLarge / InvalidRequest
};

// A ByteSource decoding and verifying one S3 payload. Build it with OpenPayload().
class PayloadReader : public ByteSource {
 public:
  // Kind of the failure the last Read() returned (kNone if none).
  virtual PayloadErrorKind error_kind() const = 0;
  // After Read() returned 0: the checksums the client sent (x-amz-checksum-* header or trailer)
  // and that verified, keyed by lower-case algorithm name ("crc32", "crc32c", "sha1", "sha256"),
  // base64 values, for the store to keep. Content-MD5 is verified but not listed (the store
  // computes the MD5 for the ETag itself).
  virtual const std::map<std::string, std::string>& checksums() const = 0;
};

struct PayloadOptions {
  // The verified request (signing key, seed signature, payload_mode). Null for unauthenticated.
  const VerifiedRequest* verified = nullptr;
  // Request headers: x-amz-content-sha256, Content-Encoding, x-amz-decoded-content-length,
  // x-amz-trailer, Content-MD5, x-amz-checksum-*, x-amz-sdk-checksum-algorithm.
  const HeaderMap* headers = nullptr;
  uint64_t max_bytes = 5ull * 1024 * 1024 * 1024;  // decoded size limit
  // Verify Content-MD5 while streaming. A caller that computes the MD5 of the data anyway (the
  // object store does, for the ETag) sets this false and compares it itself, so the bytes are
  // hashed once; the header's format is still checked here.
  bool verify_content_md5 = true;
};

// Chooses and builds the reader for the request's payload mode. Errors (InvalidArgument) for an
// unsupported or inconsistent combination (e.g. aws-chunked without decoded length).
Result<std::unique_ptr<PayloadReader>> OpenPayload(ByteSource& upstream, const PayloadOptions& options);

}  // namespace kiln::aws
