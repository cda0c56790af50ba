#include "aws/gzip.h"

#include <zlib.h>

#include <algorithm>

#include "base/strings.h"

namespace kiln::aws {

bool IsGzipEncoding(std::string_view content_encoding) {
  for (std::string_view part : Split(content_encoding, ',')) {
    if (EqualsIgnoreCase(Trim(part), "gzip")) return true;
  }
  return false;
}

Result<std::string> Gunzip(std::string_view data, size_t max_bytes) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return Status::Internal("zlib inflateInit2 failed");
  struct End {
    z_stream* zs;
    ~End() { inflateEnd(zs); }
  } end{&zs};
  std::string out;
  char buffer[65536];
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  if (data.size() > 0xffffffffu) return Status::InvalidArgument("gzip body too large");
  for (;;) {
    zs.next_out = reinterpret_cast<Bytef*>(buffer);
    zs.avail_out = sizeof buffer;
    int rc = inflate(&zs, Z_NO_FLUSH);
    size_t produced = sizeof buffer - zs.avail_out;
    if (out.size() + produced > max_bytes) {
      return Status::ResourceExhausted("gzip body decodes to more than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buffer, produced);
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) return out;
      // Another member follows (RFC 1952 allows concatenation).
      if (inflateReset(&zs) != Z_OK) return Status::Internal("zlib inflateReset failed");
      continue;
    }
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && produced == 0) {
      return Status::InvalidArgument("gzip body is truncated");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return Status::InvalidArgument(std::string("gzip body is corrupt (") +
                                     (zs.msg != nullptr ? zs.msg : "inflate failed") + ")");
    }
  }
}

}  // namespace kiln::aws
