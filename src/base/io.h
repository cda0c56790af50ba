#pragma once
// Streaming byte interfaces shared across modules, so request bodies, decoders and object data
// flow in bounded buffers and are never held whole in memory.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "base/strings.h"

namespace kiln {

// HTTP-style header map: case-insensitive names, repeated names allowed, insertion order kept
// among equal names.
using HeaderMap = std::multimap<std::string, std::string, CaseInsensitiveLess>;

// Returns the first value of `name`, or nullptr.
const std::string* FindHeader(const HeaderMap& headers, std::string_view name);

// A pull source of bytes (a request body, a decoded aws-chunked stream, a file).
// Not thread-safe: one reader at a time.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `n` (> 0) bytes into `buf`. Returns the number read; 0 means the end of the
  // data (and every later call returns 0 again). On error the source is unusable afterwards.
  // Errors: Unavailable (peer closed / truncated), DeadlineExceeded (peer too slow),
  // ResourceExhausted (more data than allowed), DataLoss / InvalidArgument (a decoder found a
  // corrupt or malformed stream; the message says what), Unauthenticated (a chunk signature
  // did not verify).
  virtual Result<size_t> Read(char* buf, size_t n) = 0;
  // Total length when known in advance (Content-Length, decoded length); nullopt otherwise.
  virtual std::optional<uint64_t> size_hint() const { return std::nullopt; }
};

// A ByteSource over a string_view; the viewed bytes must outlive it.
class StringByteSource final : public ByteSource {
 public:
  explicit StringByteSource(std::string_view data) : data_(data) {}
  Result<size_t> Read(char* buf, size_t n) override;
  std::optional<uint64_t> size_hint() const override { return data_.size(); }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

// Reads the rest of `source` into a string, failing with ResourceExhausted past `limit` bytes.
// Only for bodies that are small by contract (XML/JSON requests).
Result<std::string> ReadAll(ByteSource& source, size_t limit);

}  // namespace kiln
