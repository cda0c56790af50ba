#include "base/ids.h"

#include <pthread.h>
#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

namespace {

// Bumped in a forked child, so that it never hands out ids from bytes its parent also holds.
std::atomic<uint64_t> fork_generation{0};

// Fills `out` with `n` random bytes from a per-thread buffer refilled by getrandom 4 KiB at a
// time: ids are minted per request (request ids, UUIDs) and a syscall each cost more than the rest
// of minting one. The bytes are the kernel's CSPRNG's either way; each is handed out once.
void IdBytes(char* out, size_t n) {
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1); }); });
  struct Pool {
    char bytes[4096];
    size_t left = 0;
    uint64_t generation = 0;
  };
  thread_local Pool pool;
  const uint64_t generation = fork_generation.load(std::memory_order_relaxed);
  if (pool.generation != generation) {
    pool.left = 0;
    pool.generation = generation;
  }
  while (n > 0) {
    if (pool.left == 0) {
      std::string fresh = RandomBytes(sizeof(pool.bytes));
      std::memcpy(pool.bytes, fresh.data(), sizeof(pool.bytes));
      pool.left = sizeof(pool.bytes);
    }
    const size_t take = std::min(n, pool.left);
    char* from = pool.bytes + sizeof(pool.bytes) - pool.left;
    std::memcpy(out, from, take);
    std::memset(from, 0, take);  // handed out once
    pool.left -= take;
    out += take;
    n -= take;
  }
}

}  // namespace

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
  std::string b(16, '\0');
  IdBytes(b.data(), b.size());
  b[6] = static_cast<char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<char>((b[8] & 0x3f) | 0x80);
  std::string h = HexEncode(b);
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
}

std::string NewS3RequestId() {
  std::string b(8, '\0');
  IdBytes(b.data(), b.size());
  std::string h = HexEncode(b);
  for (char& c : h) {
    if (c >= 'a' && c <= 'f') c = static_cast<char>(c - 'a' + 'A');
  }
  return h;
}

}  // namespace kiln
