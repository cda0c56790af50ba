#pragma once
// Byte encodings used on the wire: hex, base64, RFC 3986 percent-encoding, XML escaping.

#include <optional>
#include <string>
#include <string_view>

namespace kiln {

std::string HexEncode(std::string_view bytes);  // lower-case
std::optional<std::string> HexDecode(std::string_view hex);
std::string Base64Encode(std::string_view bytes);
// Strict standard alphabet with padding; nullopt on any invalid character or length.
std::optional<std::string> Base64Decode(std::string_view text);

// Percent-encodes every byte outside the RFC 3986 unreserved set (A-Z a-z 0-9 - _ . ~), using
// upper-case hex, as SigV4 requires. '/' is kept when `keep_slash` (S3 canonical paths).
std::string UriEncode(std::string_view s, bool keep_slash = false);
// Decodes %XX escapes; when `plus_is_space`, '+' becomes ' ' (form bodies). nullopt on a bad escape.
std::optional<std::string> UriDecode(std::string_view s, bool plus_is_space = false);

// Escapes &, <, >, " and ' for XML text and attributes. Control characters that XML 1.0 cannot
// carry are written as character references so that keys survive round trips.
std::string XmlEscape(std::string_view s);

}  // namespace kiln
