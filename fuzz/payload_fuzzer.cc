// Fuzzes aws::OpenPayload (src/aws/payload.h): the readers that decode and verify S3 request
// bodies as they stream — plain bodies checked against x-amz-content-sha256, UNSIGNED-PAYLOAD,
// aws-chunked with trailers, and aws-chunked with chunk signatures.
//
// Input layout (see README.md; fuzz/make_seeds.py writes valid examples):
//   byte 0      payload mode (% 5, below); bit 3 set: verify_content_md5 = false;
//               bit 4 set: max_bytes = byte 1 (exercises the size limit)
//   byte 1      seed for the sequence of Read() sizes
//   then        request headers, "Name: value\n" per line, ended by an empty line ("\n\n")
//   the rest    the body
// Headers the mode needs (x-amz-content-sha256, Content-Encoding) are added when the input does
// not carry them; everything else (x-amz-decoded-content-length, x-amz-trailer, Content-MD5,
// x-amz-checksum-*) comes from the input.
//
// Checks besides "no crash, no sanitizer report": a failed Read() names an error kind; the end is
// sticky; a plain body that verified decodes to exactly the body; a chunked body that verified
// yields x-amz-decoded-content-length bytes.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "aws/payload.h"
#include "aws/sigv4.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/strings.h"

namespace {

using kiln::aws::PayloadErrorKind;

void Check(bool condition) {
  if (!condition) std::abort();
}

enum Mode : uint8_t { kPlainHash, kUnsigned, kUnsignedTrailer, kSigned, kSignedTrailer, kModeCount };

// The AWS documentation's example credentials and scope; make_seeds.py signs with the same.
constexpr std::string_view kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr std::string_view kSeedSignature = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";

const kiln::aws::VerifiedRequest& SignedRequest(std::string_view payload_mode) {
  static const kiln::aws::VerifiedRequest base = [] {
    kiln::aws::VerifiedRequest v;
    v.credential.access_key_id = "AKIAIOSFODNN7EXAMPLE";
    v.credential.secret_access_key = std::string(kSecret);
    v.region = "us-east-1";
    v.service = "s3";
    v.amz_date = "20130524T000000Z";
    v.scope = "20130524/us-east-1/s3/aws4_request";
    v.signing_key = kiln::aws::DeriveSigningKey(kSecret, "20130524", "us-east-1", "s3");
    v.seed_signature = std::string(kSeedSignature);
    return v;
  }();
  static kiln::aws::VerifiedRequest streaming = [] {
    kiln::aws::VerifiedRequest v = base;
    v.payload_mode = std::string(kiln::aws::kStreamingSigned);
    return v;
  }();
  static kiln::aws::VerifiedRequest trailer = [] {
    kiln::aws::VerifiedRequest v = base;
    v.payload_mode = std::string(kiln::aws::kStreamingSignedTrailer);
    return v;
  }();
  return payload_mode == kiln::aws::kStreamingSigned ? streaming : trailer;
}

// Parses "Name: value" lines up to the first empty line; returns the offset of the body.
size_t ParseHeaders(std::string_view input, kiln::HeaderMap* headers) {
  if (!input.empty() && input[0] == '\n') return 1;  // empty header block
  size_t end = input.find("\n\n");
  if (end == std::string_view::npos) return 0;  // no header block: all body
  std::string_view block = input.substr(0, end);
  for (std::string_view line : kiln::Split(block, '\n')) {
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    headers->emplace(std::string(kiln::Trim(line.substr(0, colon))), std::string(kiln::Trim(line.substr(colon + 1))));
  }
  return end + 2;
}

void AddIfMissing(kiln::HeaderMap& headers, std::string_view name, std::string_view value) {
  if (kiln::FindHeader(headers, name) == nullptr) headers.emplace(std::string(name), std::string(value));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t control = data[0];
  const Mode mode = static_cast<Mode>(control % kModeCount);
  uint32_t rng = data[1] * 2654435761u + 1;
  std::string_view input(reinterpret_cast<const char*>(data) + 2, size - 2);

  kiln::HeaderMap headers;
  std::string_view body = input.substr(ParseHeaders(input, &headers));
  const bool fuzz_headers = !headers.empty();

  kiln::aws::PayloadOptions options;
  options.headers = &headers;
  options.verify_content_md5 = (control & 0x08) == 0;
  if (control & 0x10) options.max_bytes = data[1];
  switch (mode) {
    case kPlainHash: AddIfMissing(headers, "x-amz-content-sha256", kiln::Sha256Hex(body)); break;
    case kUnsigned: AddIfMissing(headers, "x-amz-content-sha256", kiln::aws::kUnsignedPayload); break;
    case kUnsignedTrailer:
      AddIfMissing(headers, "x-amz-content-sha256", kiln::aws::kStreamingUnsignedTrailer);
      AddIfMissing(headers, "Content-Encoding", "aws-chunked");
      break;
    case kSigned:
    case kSignedTrailer:
      options.verified =
          &SignedRequest(mode == kSigned ? kiln::aws::kStreamingSigned : kiln::aws::kStreamingSignedTrailer);
      AddIfMissing(headers, "x-amz-content-sha256", options.verified->payload_mode);
      AddIfMissing(headers, "Content-Encoding", "aws-chunked");
      break;
    case kModeCount: break;
  }

  kiln::StringByteSource upstream(body);
  auto reader = kiln::aws::OpenPayload(upstream, options);
  if (!reader.ok()) {
    if (std::getenv("KILN_FUZZ_DEBUG") != nullptr)
      std::fprintf(stderr, "open: %s\n", reader.status().ToString().c_str());
    return 0;
  }

  std::string out;
  std::string buf;
  bool ok = true;
  for (;;) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    size_t n = 1 + rng % (1u << (1 + rng % 14));  // mostly small reads, sometimes up to 16 KiB
    buf.resize(n);
    auto got = (*reader)->Read(buf.data(), n);
    if (!got.ok()) {
      Check((*reader)->error_kind() != PayloadErrorKind::kNone);
      ok = false;
      break;
    }
    Check(*got <= n);
    if (*got == 0) {
      auto again = (*reader)->Read(buf.data(), 1);
      Check(again.ok() && *again == 0);
      break;
    }
    out.append(buf.data(), *got);
    Check(out.size() <= options.max_bytes);
  }
  if (std::getenv("KILN_FUZZ_DEBUG") != nullptr) {
    std::fprintf(stderr, "mode %d: %s, %zu bytes out, error kind %d\n", static_cast<int>(mode), ok ? "ok" : "failed",
                 out.size(), static_cast<int>((*reader)->error_kind()));
  }
  if (!ok) return 0;
  if ((mode == kPlainHash || mode == kUnsigned) && !fuzz_headers) Check(out == body);
  // The input's own x-amz-content-sha256 wins over the mode's; an empty one reads as a plain body
  // (found by run_all.sh: the check below used to assume the mode's chunked encoding).
  const std::string* content_sha = kiln::FindHeader(headers, "x-amz-content-sha256");
  const bool chunked = content_sha != nullptr && content_sha->starts_with("STREAMING-");
  if ((mode == kUnsignedTrailer || mode == kSigned || mode == kSignedTrailer) && chunked) {
    const std::string* declared = kiln::FindHeader(headers, "x-amz-decoded-content-length");
    Check(declared != nullptr);
    uint64_t value = 0;
    auto [end, error] = std::from_chars(declared->data(), declared->data() + declared->size(), value);
    Check(error == std::errc() && end == declared->data() + declared->size() && value == out.size());
  }
  return 0;
}
