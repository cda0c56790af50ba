#pragma once
// Random identifiers: request ids, upload ids, internal object ids, secrets. All come from the
// OS CSPRNG (getrandom), so they are unguessable as well as unique.

#include <string>

namespace kiln {

std::string RandomBytes(size_t n);
std::string RandomHex(size_t n_bytes);                       // 2*n lower-case hex chars
std::string RandomAlnum(size_t n, bool upper_only = false);  // [A-Za-z0-9] or [A-Z0-9]
std::string NewUuid();                                       // RFC 4122 version 4, lower-case
// S3-style request id: 16 upper-case hex chars.
std::string NewS3RequestId();

}  // namespace kiln
