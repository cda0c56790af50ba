#include "base/io.h"

#include <cstring>

namespace kiln {

const std::string* FindHeader(const HeaderMap& headers, std::string_view name) {
  auto it = headers.find(name);
  return it == headers.end() ? nullptr : &it->second;
}

Result<size_t> StringByteSource::Read(char* buf, size_t n) {
  size_t take = std::min(n, data_.size() - pos_);
  if (take == 0) return size_t{0};  // an empty view may have a null data(): no memcpy from it
  std::memcpy(buf, data_.data() + pos_, take);
  pos_ += take;
  return take;
}

Result<std::string> ReadAll(ByteSource& source, size_t limit) {
  std::string out;
  char buf[16384];
  while (true) {
    ASSIGN_OR_RETURN(size_t n, source.Read(buf, sizeof buf));
    if (n == 0) return out;
    if (out.size() + n > limit) {
      return Status::ResourceExhausted("body larger than " + std::to_string(limit) + " bytes");
    }
    out.append(buf, n);
  }
}

}  // namespace kiln
