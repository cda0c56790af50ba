// Fuzzes the decoders in src/base that see client bytes: Base64Decode (Content-MD5,
// x-amz-checksum-*), UriDecode (S3 keys, query strings), HexDecode (x-amz-content-sha256, chunk
// signatures) and the date parsers (X-Amz-Date, Date, If-Modified-Since, ISO-8601 bodies).
//
// Besides "does not crash", it checks the round trips the encoders promise: whatever decodes
// re-encodes to a string that decodes to the same bytes, and a parsed date formats and parses
// back to the same instant.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/encoding.h"
#include "base/time.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

// Every formatted date has a four-digit year (years before 1000 were unpadded until this fuzzer
// found it), so the round trip holds for years 0001-9998 (an ISO-8601 offset can move a date
// a day either way).
bool RoundTrippable(int64_t millis) {
  static const int64_t kMin = *kiln::ParseAmzDate("00010102T000000Z");
  static const int64_t kMax = *kiln::ParseAmzDate("99981231T235959Z");
  return millis >= kMin && millis <= kMax;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);

  if (auto raw = kiln::Base64Decode(input)) {
    auto again = kiln::Base64Decode(kiln::Base64Encode(*raw));
    Check(again.has_value() && *again == *raw);
  }
  for (bool plus_is_space : {false, true}) {
    if (auto decoded = kiln::UriDecode(input, plus_is_space)) {
      for (bool keep_slash : {false, true}) {
        auto again = kiln::UriDecode(kiln::UriEncode(*decoded, keep_slash), plus_is_space);
        Check(again.has_value() && *again == *decoded);
      }
    }
  }
  if (auto raw = kiln::HexDecode(input)) {
    Check(raw->size() * 2 == input.size());
    auto again = kiln::HexDecode(kiln::HexEncode(*raw));
    Check(again.has_value() && *again == *raw);
  }
  (void)kiln::XmlEscape(input);

  if (auto millis = kiln::ParseIso8601(input); millis && RoundTrippable(*millis)) {
    auto again = kiln::ParseIso8601(kiln::FormatIso8601Millis(*millis));
    Check(again.has_value() && *again == *millis);
  }
  if (auto millis = kiln::ParseRfc1123(input); millis && RoundTrippable(*millis)) {
    auto again = kiln::ParseRfc1123(kiln::FormatRfc1123(*millis));
    Check(again.has_value() && *again == *millis);
  }
  if (auto millis = kiln::ParseAmzDate(input); millis && RoundTrippable(*millis)) {
    auto again = kiln::ParseAmzDate(kiln::FormatAmzDate(*millis));
    Check(again.has_value() && *again == *millis);
  }
  return 0;
}
