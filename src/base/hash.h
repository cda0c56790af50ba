#pragma once
// Digests and checksums: SHA-256, SHA-1, MD5 (OpenSSL EVP), HMAC-SHA256, CRC32 (zlib) and CRC32C.
// Hashers are incremental so that request bodies are hashed while they stream. A hasher is a value
// owned by one thread; it is not thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

// Incremental message digest. Final() returns the raw digest bytes and may be called once.
class Digest {
 public:
  enum class Algorithm { kSha256, kSha1, kMd5 };
  explicit Digest(Algorithm algorithm);
  ~Digest();
  Digest(Digest&&) noexcept;
  Digest& operator=(Digest&&) noexcept;
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  void Update(std::string_view data);
  std::string Final();  // raw bytes (32, 20 or 16)

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string Sha256(std::string_view data);                            // raw 32 bytes
std::string Sha256Hex(std::string_view data);                         // 64 lower-case hex chars
std::string Md5(std::string_view data);                               // raw 16 bytes
std::string HmacSha256(std::string_view key, std::string_view data);  // raw 32 bytes
std::string HmacSha1(std::string_view key, std::string_view data);    // raw 20 bytes (S3 SigV2)

// Constant-time comparison for secrets and signatures.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// CRC-32 (IEEE, as zlib and S3's x-amz-checksum-crc32) and CRC-32C (Castagnoli).
uint32_t Crc32Update(uint32_t crc, std::string_view data);
uint32_t Crc32cUpdate(uint32_t crc, std::string_view data);
// CRC-64/NVME (S3's x-amz-checksum-crc64nvme; reflected poly 0xAD93D23594C93659, init and
// xorout all ones). Like the CRC-32 functions, pass 0 to start and the previous value to continue.
uint64_t Crc64NvmeUpdate(uint64_t crc, std::string_view data);
// Big-endian 4 bytes, the form S3 base64-encodes in x-amz-checksum-crc32(c).
std::string Crc32ToBytes(uint32_t crc);

// The S3 checksum algorithms clients send (x-amz-checksum-<name>). One object computes any of
// them incrementally; Final() returns the base64 text S3 puts on the wire.
class S3Checksum {
 public:
  enum class Algorithm { kCrc32, kCrc32c, kSha1, kSha256, kCrc64Nvme };
  // Parses "crc32", "CRC32C", "sha1", "sha256", "crc64nvme" (any case); false for anything else.
  static bool ParseAlgorithm(std::string_view name, Algorithm* out);
  static std::string_view Name(Algorithm algorithm);  // lower-case: "crc32", ...

  explicit S3Checksum(Algorithm algorithm);
  void Update(std::string_view data);
  std::string FinalBase64();
  Algorithm algorithm() const { return algorithm_; }

 private:
  Algorithm algorithm_;
  uint32_t crc_ = 0;
  uint64_t crc64_ = 0;
  std::unique_ptr<Digest> digest_;
};

}  // namespace kiln
