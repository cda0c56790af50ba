#include "base/ids.h"

#include <sys/random.h>

#include <cstdio>
#include <cstdlib>

#include "base/encoding.h"

namespace kiln {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      std::abort();  // no entropy source: ids would not be unique
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

std::string RandomHex(size_t n_bytes) { return HexEncode(RandomBytes(n_bytes)); }

std::string RandomAlnum(size_t n, bool upper_only) {
  static constexpr char kAll[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static constexpr char kUpper[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const char* alphabet = upper_only ? kUpper : kAll;
  const unsigned size = upper_only ? 36 : 62;
  std::string out;
  out.reserve(n);
  while (out.size() < n) {
    for (unsigned char b : RandomBytes(n)) {
      if (b >= 256 - (256 % size)) continue;  // rejection sampling: no modulo bias
      out += alphabet[b % size];
      if (out.size() == n) break;
    }
  }
  return out;
}

std::string NewUuid() {
  std::string b = RandomBytes(16);
  b[6] = static_cast<char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<char>((b[8] & 0x3f) | 0x80);
  std::string h = HexEncode(b);
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
}

std::string NewS3RequestId() {
  std::string h = RandomHex(8);
  for (char& c : h) {
    if (c >= 'a' && c <= 'f') c = static_cast<char>(c - 'a' + 'A');
  }
  return h;
}

}  // namespace kiln
