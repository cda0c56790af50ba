#include "base/hash.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <zlib.h>

#include <array>
#include <cstdlib>

#include "base/encoding.h"
#include "base/strings.h"

namespace kiln {

struct Digest::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Digest::Digest(Algorithm algorithm) : ctx_(std::make_unique<Ctx>()) {
  const EVP_MD* md = algorithm == Algorithm::kSha256 ? EVP_sha256()
                     : algorithm == Algorithm::kSha1 ? EVP_sha1()
                                                     : EVP_md5();
  ctx_->md = EVP_MD_CTX_new();
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, md, nullptr) != 1) {
    std::abort();  // allocation failure or a broken OpenSSL: nothing sensible to do
  }
}

Digest::~Digest() = default;
Digest::Digest(Digest&&) noexcept = default;
Digest& Digest::operator=(Digest&&) noexcept = default;

void Digest::Update(std::string_view data) {
  if (!data.empty()) EVP_DigestUpdate(ctx_->md, data.data(), data.size());
}

std::string Digest::Final() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string Sha256(std::string_view data) {
  Digest d(Digest::Algorithm::kSha256);
  d.Update(data);
  return d.Final();
}

std::string Sha256Hex(std::string_view data) { return HexEncode(Sha256(data)); }

std::string Md5(std::string_view data) {
  Digest d(Digest::Algorithm::kMd5);
  d.Update(data);
  return d.Final();
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string HmacSha1(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha1(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

uint32_t Crc32Update(uint32_t crc, std::string_view data) {
  // zlib takes uInt lengths; feed large buffers in pieces.
  while (!data.empty()) {
    size_t n = std::min<size_t>(data.size(), 1u << 30);
    crc = static_cast<uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(n)));
    data.remove_prefix(n);
  }
  return crc;
}

namespace {
// Slicing-by-8 tables for CRC-32C (reflected polynomial 0x82F63B78).
struct Crc32cTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};
const Crc32cTables& Tables() {
  static const Crc32cTables tables;
  return tables;
}
}  // namespace

uint32_t Crc32cUpdate(uint32_t crc, std::string_view data) {
  const auto& t = Tables().t;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo = crc ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

namespace {
// Slicing-by-8 tables for CRC-64/NVME (reflected polynomial 0x9A6C9329AC4BC9B5).
struct Crc64Tables {
  std::array<std::array<uint64_t, 256>, 8> t{};
  Crc64Tables() {
    for (uint64_t i = 0; i < 256; ++i) {
      uint64_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x9A6C9329AC4BC9B5ull : c >> 1;
      t[0][i] = c;
    }
    for (int i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};
const Crc64Tables& Tables64() {
  static const Crc64Tables tables;
  return tables;
}
}  // namespace

uint64_t Crc64NvmeUpdate(uint64_t crc, std::string_view data) {
  const auto& t = Tables64().t;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  crc = ~crc;
  while (n >= 8) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    v ^= crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
          t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::string Crc32ToBytes(uint32_t crc) {
  std::string out(4, '\0');
  out[0] = static_cast<char>(crc >> 24);
  out[1] = static_cast<char>((crc >> 16) & 0xff);
  out[2] = static_cast<char>((crc >> 8) & 0xff);
  out[3] = static_cast<char>(crc & 0xff);
  return out;
}

bool S3Checksum::ParseAlgorithm(std::string_view name, Algorithm* out) {
  std::string n = ToLower(name);
  if (n == "crc32")
    *out = Algorithm::kCrc32;
  else if (n == "crc32c")
    *out = Algorithm::kCrc32c;
  else if (n == "sha1")
    *out = Algorithm::kSha1;
  else if (n == "sha256")
    *out = Algorithm::kSha256;
  else if (n == "crc64nvme")
    *out = Algorithm::kCrc64Nvme;
  else
    return false;
  return true;
}

std::string_view S3Checksum::Name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kCrc32: return "crc32";
    case Algorithm::kCrc32c: return "crc32c";
    case Algorithm::kSha1: return "sha1";
    case Algorithm::kSha256: return "sha256";
    case Algorithm::kCrc64Nvme: return "crc64nvme";
  }
  return "crc32";
}

S3Checksum::S3Checksum(Algorithm algorithm) : algorithm_(algorithm) {
  if (algorithm == Algorithm::kSha1) digest_ = std::make_unique<Digest>(Digest::Algorithm::kSha1);
  if (algorithm == Algorithm::kSha256) digest_ = std::make_unique<Digest>(Digest::Algorithm::kSha256);
}

void S3Checksum::Update(std::string_view data) {
  switch (algorithm_) {
    case Algorithm::kCrc32: crc_ = Crc32Update(crc_, data); break;
    case Algorithm::kCrc32c: crc_ = Crc32cUpdate(crc_, data); break;
    case Algorithm::kCrc64Nvme: crc64_ = Crc64NvmeUpdate(crc64_, data); break;
    default: digest_->Update(data);
  }
}

std::string S3Checksum::FinalBase64() {
  if (digest_) return Base64Encode(digest_->Final());
  if (algorithm_ == Algorithm::kCrc64Nvme) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((crc64_ >> (56 - 8 * i)) & 0xff);
    return Base64Encode(bytes);
  }
  return Base64Encode(Crc32ToBytes(crc_));
}

}  // namespace kiln
