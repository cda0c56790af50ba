#include "aws/payload.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/strings.h"

namespace kiln::aws {
namespace {

constexpr size_t kBufferSize = 64 * 1024;  // upstream read-ahead for chunk framing
constexpr size_t kMaxLineBytes = 4096;     // a chunk header or one trailer line
constexpr size_t kMaxTrailerBytes = 16 * 1024;
constexpr std::string_view kChecksumPrefix = "x-amz-checksum-";

std::string UpperName(S3Checksum::Algorithm algorithm) {
  std::string name(S3Checksum::Name(algorithm));
  for (char& c : name) {
    if (c >= 'a' && c <= 'z') {
      c = static_cast<char>(c - 'a' + 'A');
    }
  }
  return name;
}

// Length in raw bytes of each algorithm's digest, to validate client-sent values.
size_t DigestBytes(S3Checksum::Algorithm algorithm) {
  switch (algorithm) {
    case S3Checksum::Algorithm::kCrc32:
    case S3Checksum::Algorithm::kCrc32c: return 4;
    case S3Checksum::Algorithm::kSha1: return 20;
    case S3Checksum::Algorithm::kSha256: return 32;
    case S3Checksum::Algorithm::kCrc64Nvme: return 8;
  }
  return 0;
}

bool ValidChecksumValue(S3Checksum::Algorithm algorithm, std::string_view value) {
  std::optional<std::string> raw = Base64Decode(value);
  return raw && raw->size() == DigestBytes(algorithm);
}

std::string InvalidChecksumMessage(std::string_view header_name) {
  return "Value for " + std::string(header_name) + " header is invalid.";
}

// One x-amz-checksum-* the client promised, computed while the data streams.
struct PendingChecksum {
  S3Checksum::Algorithm algorithm;
  S3Checksum hasher;
  std::string expected;  // base64; empty until the trailer arrives for trailer checksums
  bool from_trailer = false;
};

// Verification shared by all readers: Content-MD5, x-amz-checksum-* (header or trailer),
// size limits, and sticky errors.
class PayloadReaderBase : public PayloadReader {
 public:
  PayloadErrorKind error_kind() const override { return error_kind_; }
  const std::map<std::string, std::string>& checksums() const override { return checksums_; }

  // Reads that check limits and feed hashers; subclasses implement ReadDecoded.
  Result<size_t> Read(char* buf, size_t n) override {
    if (!error_.ok()) {
      return error_;
    }
    if (done_) {
      return size_t{0};
    }
    if (!first_read_error_.ok()) {
      return Fail(first_error_kind_, first_read_error_);
    }
    Result<size_t> got = ReadDecoded(buf, n);
    if (!got.ok()) {
      if (error_kind_ == PayloadErrorKind::kNone && got.status().code() == StatusCode::kUnavailable) {
        error_kind_ = PayloadErrorKind::kIncomplete;
      }
      error_ = got.status();
      return error_;
    }
    size_t count = *got;
    if (count > 0) {
      total_ += count;
      if (total_ > max_bytes_) {
        return Fail(PayloadErrorKind::kTooLarge,
                    Status::ResourceExhausted("Your proposed upload exceeds the maximum allowed size"));
      }
      std::string_view data(buf, count);
      if (md5_) {
        md5_->Update(data);
      }
      for (PendingChecksum& checksum : pending_) {
        checksum.hasher.Update(data);
      }
      return count;
    }
    RETURN_IF_ERROR(Finish());
    done_ = true;
    return size_t{0};
  }

 protected:
  // Returns decoded bytes; 0 at the verified end of the encoded stream.
  virtual Result<size_t> ReadDecoded(char* buf, size_t n) = 0;
  // Extra end-of-stream checks of the subclass (e.g. the payload SHA-256).
  virtual Status FinishDecoded() { return Status::Ok(); }

  Status Fail(PayloadErrorKind kind, Status status) {
    error_kind_ = kind;
    error_ = std::move(status);
    return error_;
  }

  // Set up from request headers; an error here is returned by OpenPayload.
  Status Init(const PayloadOptions& options, bool allow_trailers) {
    max_bytes_ = options.max_bytes;
    static const HeaderMap kEmpty;
    const HeaderMap& headers = options.headers ? *options.headers : kEmpty;
    if (const std::string* md5 = FindHeader(headers, "content-md5")) {
      std::optional<std::string> raw = Base64Decode(Trim(*md5));
      if (!raw || raw->size() != 16) {
        return Status::InvalidArgument("The Content-MD5 you specified was invalid.")
            .WithReason(ErrorReason::kInvalidDigest);
      }
      if (options.verify_content_md5) {
        expected_md5_ = *raw;
        md5_ = std::make_unique<Digest>(Digest::Algorithm::kMd5);
      }
    }
    for (const auto& [name, value] : headers) {
      std::string lower = ToLower(name);
      if (!StartsWith(lower, kChecksumPrefix) || lower == "x-amz-checksum-mode" || lower == "x-amz-checksum-type") {
        continue;
      }
      S3Checksum::Algorithm algorithm;
      if (!S3Checksum::ParseAlgorithm(lower.substr(kChecksumPrefix.size()), &algorithm)) {
        continue;  // an algorithm Kiln does not know (e.g. crc64nvme) is not verified
      }
      std::string trimmed(Trim(value));
      if (!ValidChecksumValue(algorithm, trimmed)) {
        return Status::InvalidArgument(InvalidChecksumMessage(lower));
      }
      if (!pending_.empty()) {
        return Status::InvalidArgument(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.");
      }
      pending_.push_back(PendingChecksum{algorithm, S3Checksum(algorithm), trimmed, false});
    }
    if (const std::string* trailer = FindHeader(headers, "x-amz-trailer")) {
      for (std::string_view part : Split(*trailer, ',')) {
        std::string name = ToLower(Trim(part));
        if (name.empty()) {
          continue;
        }
        if (!allow_trailers) {
          return Status::InvalidArgument("x-amz-trailer is only allowed with a STREAMING-*-TRAILER payload.");
        }
        S3Checksum::Algorithm algorithm;
        if (!StartsWith(name, kChecksumPrefix) ||
            !S3Checksum::ParseAlgorithm(name.substr(kChecksumPrefix.size()), &algorithm)) {
          return Status::InvalidArgument("The value specified in the x-amz-trailer header is not supported");
        }
        if (!pending_.empty()) {
          return Status::InvalidArgument(
              "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.");
        }
        pending_.push_back(PendingChecksum{algorithm, S3Checksum(algorithm), "", true});
      }
    }
    return Status::Ok();
  }

  // A trailer line name:value from the stream (name lower-cased).
  Status AcceptTrailer(const std::string& name, const std::string& value) {
    if (!StartsWith(name, kChecksumPrefix)) {
      return Status::Ok();  // other trailers carry nothing Kiln verifies
    }
    for (PendingChecksum& checksum : pending_) {
      if (checksum.from_trailer &&
          name == std::string(kChecksumPrefix) + std::string(S3Checksum::Name(checksum.algorithm))) {
        if (!ValidChecksumValue(checksum.algorithm, value)) {
          return Fail(PayloadErrorKind::kMalformed, Status::InvalidArgument(InvalidChecksumMessage(name)));
        }
        checksum.expected = value;
        return Status::Ok();
      }
    }
    return Fail(PayloadErrorKind::kMalformed,
                Status::InvalidArgument("The trailer " + name + " was not declared in x-amz-trailer."));
  }

  // Called when the decoded data is complete: every check that needs all the data.
  Status Finish() {
    RETURN_IF_ERROR(FinishDecoded());
    if (declared_length_ && total_ < *declared_length_) {
      return Fail(PayloadErrorKind::kIncomplete,
                  Status::Unavailable("You did not provide the number of bytes specified by the "
                                      "x-amz-decoded-content-length HTTP header"));
    }
    if (md5_ && !ConstantTimeEquals(md5_->Final(), expected_md5_)) {
      return Fail(PayloadErrorKind::kBadDigest,
                  Status::DataLoss("The Content-MD5 you specified did not match what we received."));
    }
    for (PendingChecksum& checksum : pending_) {
      std::string header_name = std::string(kChecksumPrefix) + std::string(S3Checksum::Name(checksum.algorithm));
      if (checksum.expected.empty()) {
        return Fail(PayloadErrorKind::kMalformed,
                    Status::InvalidArgument("The trailer " + header_name + " declared in x-amz-trailer was not sent."));
      }
      std::string actual = checksum.hasher.FinalBase64();
      if (!ConstantTimeEquals(actual, checksum.expected)) {
        return Fail(PayloadErrorKind::kBadDigest,
                    Status::DataLoss("The " + UpperName(checksum.algorithm) +
                                     " you specified did not match the calculated checksum."));
      }
      checksums_[std::string(S3Checksum::Name(checksum.algorithm))] = checksum.expected;
    }
    return Status::Ok();
  }

  uint64_t max_bytes_ = 0;
  uint64_t total_ = 0;
  std::optional<uint64_t> declared_length_;
  // A condition found at open time that must surface from the first Read (so that the S3 front
  // can map its kind), e.g. a declared length above the limit.
  Status first_read_error_;
  PayloadErrorKind first_error_kind_ = PayloadErrorKind::kNone;

 private:
  PayloadErrorKind error_kind_ = PayloadErrorKind::kNone;
  Status error_;
  bool done_ = false;
  std::unique_ptr<Digest> md5_;
  std::string expected_md5_;
  std::vector<PendingChecksum> pending_;
  std::map<std::string, std::string> checksums_;
};

// Plain bodies: UNSIGNED-PAYLOAD, or a 64-hex x-amz-content-sha256 checked at the end.
class PlainPayloadReader final : public PayloadReaderBase {
 public:
  PlainPayloadReader(ByteSource& upstream, std::string expected_sha256_hex)
      : upstream_(upstream), expected_sha256_hex_(ToLower(expected_sha256_hex)) {
    if (!expected_sha256_hex_.empty()) {
      sha256_ = std::make_unique<Digest>(Digest::Algorithm::kSha256);
    }
  }

  Status Open(const PayloadOptions& options) {
    RETURN_IF_ERROR(Init(options, /*allow_trailers=*/false));
    std::optional<uint64_t> hint = upstream_.size_hint();
    if (hint && *hint > max_bytes_) {
      first_error_kind_ = PayloadErrorKind::kTooLarge;
      first_read_error_ = Status::ResourceExhausted("Your proposed upload exceeds the maximum allowed size");
    }
    return Status::Ok();
  }

  std::optional<uint64_t> size_hint() const override { return upstream_.size_hint(); }

 protected:
  Result<size_t> ReadDecoded(char* buf, size_t n) override {
    ASSIGN_OR_RETURN(size_t got, upstream_.Read(buf, n));
    if (sha256_ && got > 0) {
      sha256_->Update(std::string_view(buf, got));
    }
    return got;
  }

  Status FinishDecoded() override {
    if (sha256_ && !ConstantTimeEquals(HexEncode(sha256_->Final()), expected_sha256_hex_)) {
      return Fail(PayloadErrorKind::kSha256Mismatch,
                  Status::DataLoss("The provided 'x-amz-content-sha256' header does not match what was computed."));
    }
    return Status::Ok();
  }

 private:
  ByteSource& upstream_;
  std::string expected_sha256_hex_;
  std::unique_ptr<Digest> sha256_;
};

// aws-chunked bodies, signed or not, with or without trailers (spec §3.4). Decodes incrementally
// with a fixed read-ahead buffer: chunk data goes straight to the caller, so a chunk of any
// size never sits in memory whole.
class ChunkedPayloadReader final : public PayloadReaderBase {
 public:
  ChunkedPayloadReader(ByteSource& upstream, const VerifiedRequest* verified, bool signed_chunks, bool trailers)
      : upstream_(upstream), verified_(verified), signed_(signed_chunks), trailers_(trailers) {
    if (signed_) {
      previous_signature_ = verified_->seed_signature;
    }
    buffer_.resize(kBufferSize);
  }

  Status Open(const PayloadOptions& options) {
    RETURN_IF_ERROR(Init(options, trailers_));
    static const HeaderMap kEmpty;
    const HeaderMap& headers = options.headers ? *options.headers : kEmpty;
    const std::string* decoded = FindHeader(headers, "x-amz-decoded-content-length");
    if (decoded == nullptr) {
      return Status::InvalidArgument("aws-chunked payloads require the x-amz-decoded-content-length header.");
    }
    std::optional<uint64_t> length = ParseUint64(Trim(*decoded));
    if (!length) {
      return Status::InvalidArgument("x-amz-decoded-content-length is not a valid length.");
    }
    declared_length_ = *length;
    if (*length > max_bytes_) {
      first_error_kind_ = PayloadErrorKind::kTooLarge;
      first_read_error_ = Status::ResourceExhausted("Your proposed upload exceeds the maximum allowed size");
    }
    return Status::Ok();
  }

  std::optional<uint64_t> size_hint() const override { return declared_length_; }

 protected:
  Result<size_t> ReadDecoded(char* buf, size_t n) override {
    while (true) {
      switch (state_) {
        case State::kHeader: {
          ASSIGN_OR_RETURN(bool have_line, ReadLine());
          if (!have_line) {
            return Truncated();
          }
          RETURN_IF_ERROR(ParseChunkHeader());
          break;
        }
        case State::kData: {
          if (chunk_remaining_ == 0) {
            RETURN_IF_ERROR(EndOfChunkData());
            break;
          }
          size_t want = static_cast<size_t>(std::min<uint64_t>(n, chunk_remaining_));
          size_t got = 0;
          if (pos_ < end_) {
            got = std::min(want, end_ - pos_);
            std::memcpy(buf, buffer_.data() + pos_, got);
            pos_ += got;
          } else {
            ASSIGN_OR_RETURN(got, upstream_.Read(buf, want));
            if (got == 0) {
              return Truncated();
            }
          }
          chunk_remaining_ -= got;
          if (chunk_sha256_) {
            chunk_sha256_->Update(std::string_view(buf, got));
          }
          if (declared_length_ && total_ + got > *declared_length_) {
            return Fail(PayloadErrorKind::kTooLarge,
                        Status::ResourceExhausted("The aws-chunked body is longer than x-amz-decoded-content-length."));
          }
          return got;
        }
        case State::kDataEnd: {
          ASSIGN_OR_RETURN(bool have_line, ReadLine());
          if (!have_line) {
            return Truncated();
          }
          if (!line_.empty()) {
            return Malformed("Chunk data is not followed by CRLF.");
          }
          state_ = State::kHeader;
          break;
        }
        case State::kTrailer: {
          ASSIGN_OR_RETURN(bool have_line, ReadLine());
          if (!have_line) {
            // Unsigned-trailer streams must end with an empty line; signed streams without
            // trailers are accepted when the final CRLF is missing.
            if (!trailers_ && trailer_bytes_ == 0) {
              state_ = State::kDone;
              break;
            }
            return Truncated();
          }
          if (line_.empty()) {
            RETURN_IF_ERROR(EndOfTrailers());
            state_ = State::kDone;
            break;
          }
          trailer_bytes_ += line_.size() + 2;
          if (trailer_bytes_ > kMaxTrailerBytes) {
            return Malformed("The aws-chunked trailer is too large.");
          }
          RETURN_IF_ERROR(ParseTrailerLine());
          break;
        }
        case State::kDone: return size_t{0};
      }
    }
  }

 private:
  enum class State { kHeader, kData, kDataEnd, kTrailer, kDone };

  Status Malformed(std::string message) {
    return Fail(PayloadErrorKind::kMalformed, Status::InvalidArgument(std::move(message)));
  }

  Status Truncated() {
    return Fail(PayloadErrorKind::kIncomplete,
                Status::Unavailable("The aws-chunked body ended before its final chunk and trailers."));
  }

  // Reads one line (without its CRLF; a bare LF is tolerated) into line_. False at the end of
  // upstream data with no partial line.
  Result<bool> ReadLine() {
    line_.clear();
    while (true) {
      if (pos_ == end_) {
        ASSIGN_OR_RETURN(size_t got, upstream_.Read(buffer_.data(), buffer_.size()));
        if (got == 0) {
          if (line_.empty()) {
            return false;
          }
          return Truncated();
        }
        pos_ = 0;
        end_ = got;
      }
      const char* start = buffer_.data() + pos_;
      const void* newline = std::memchr(start, '\n', end_ - pos_);
      size_t take = newline ? static_cast<size_t>(static_cast<const char*>(newline) - start) : end_ - pos_;
      if (line_.size() + take > kMaxLineBytes) {
        return Malformed("An aws-chunked header or trailer line is too long.");
      }
      line_.append(start, take);
      pos_ += take;
      if (newline) {
        ++pos_;
        if (!line_.empty() && line_.back() == '\r') {
          line_.pop_back();
        }
        return true;
      }
    }
  }

  Status ParseChunkHeader() {
    std::string_view header = line_;
    size_t semicolon = header.find(';');
    std::string_view size_text = Trim(header.substr(0, semicolon));
    if (size_text.empty() || size_text.size() > 16) {
      return Malformed("Invalid aws-chunked chunk size '" + std::string(size_text) + "'.");
    }
    uint64_t size = 0;
    for (char c : size_text) {
      int digit = (c >= '0' && c <= '9')   ? c - '0'
                  : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                           : -1;
      if (digit < 0) {
        return Malformed("Invalid aws-chunked chunk size '" + std::string(size_text) + "'.");
      }
      size = size * 16 + static_cast<uint64_t>(digit);
    }
    std::string signature;
    if (semicolon != std::string_view::npos) {
      for (std::string_view extension : Split(header.substr(semicolon + 1), ';')) {
        extension = Trim(extension);
        if (StartsWith(extension, "chunk-signature=")) {
          signature = std::string(extension.substr(16));
        }
      }
    }
    if (signed_) {
      if (signature.size() != 64) {
        return Malformed("The aws-chunked chunk header has no valid chunk-signature.");
      }
      chunk_signature_ = ToLower(signature);
      chunk_sha256_ = std::make_unique<Digest>(Digest::Algorithm::kSha256);
    }
    if (declared_length_ && total_ + size > *declared_length_) {
      return Fail(PayloadErrorKind::kTooLarge,
                  Status::ResourceExhausted("The aws-chunked body is longer than x-amz-decoded-content-length."));
    }
    chunk_remaining_ = size;
    last_chunk_ = size == 0;
    state_ = State::kData;
    return Status::Ok();
  }

  Status EndOfChunkData() {
    if (signed_) {
      std::string string_to_sign = "AWS4-HMAC-SHA256-PAYLOAD\n" + verified_->amz_date + "\n" + verified_->scope + "\n" +
                                   previous_signature_ + "\n" + std::string(kEmptySha256) + "\n" +
                                   HexEncode(chunk_sha256_->Final());
      std::string expected = HexEncode(HmacSha256(verified_->signing_key, string_to_sign));
      if (!ConstantTimeEquals(expected, chunk_signature_)) {
        return Fail(PayloadErrorKind::kSignatureMismatch,
                    Status::Unauthenticated("The request signature we calculated does not match the signature "
                                            "you provided. Check your key and signing method."));
      }
      previous_signature_ = expected;
      chunk_sha256_.reset();
    }
    state_ = last_chunk_ ? State::kTrailer : State::kDataEnd;
    return Status::Ok();
  }

  Status ParseTrailerLine() {
    size_t colon = line_.find(':');
    if (colon == std::string::npos) {
      return Malformed("Malformed aws-chunked trailer line.");
    }
    std::string name = ToLower(Trim(std::string_view(line_).substr(0, colon)));
    std::string value(Trim(std::string_view(line_).substr(colon + 1)));
    if (!trailers_) {
      return Malformed("Trailers are not allowed for this x-amz-content-sha256 value.");
    }
    if (name == "x-amz-trailer-signature") {
      if (!signed_) {
        return Status::Ok();  // an unsigned stream has nothing to check it against
      }
      trailer_signature_ = ToLower(value);
      return Status::Ok();
    }
    if (!trailer_signature_.empty()) {
      return Malformed("x-amz-trailer-signature must be the last trailer.");
    }
    canonical_trailers_.append(name).append(":").append(value).append("\n");
    return AcceptTrailer(name, value);
  }

  Status EndOfTrailers() {
    if (!signed_ || !trailers_) {
      return Status::Ok();
    }
    if (trailer_signature_.empty()) {
      return Malformed("The aws-chunked trailer has no x-amz-trailer-signature.");
    }
    std::string string_to_sign = "AWS4-HMAC-SHA256-TRAILER\n" + verified_->amz_date + "\n" + verified_->scope + "\n" +
                                 previous_signature_ + "\n" + Sha256Hex(canonical_trailers_);
    std::string expected = HexEncode(HmacSha256(verified_->signing_key, string_to_sign));
    if (!ConstantTimeEquals(expected, trailer_signature_)) {
      return Fail(PayloadErrorKind::kSignatureMismatch,
                  Status::Unauthenticated("The request signature we calculated does not match the signature you "
                                          "provided. Check your key and signing method."));
    }
    return Status::Ok();
  }

  ByteSource& upstream_;
  const VerifiedRequest* verified_;
  const bool signed_;
  const bool trailers_;
  State state_ = State::kHeader;
  std::vector<char> buffer_;
  size_t pos_ = 0;  // buffer_[pos_, end_) holds read-ahead bytes not yet consumed
  size_t end_ = 0;
  std::string line_;
  uint64_t chunk_remaining_ = 0;
  bool last_chunk_ = false;
  std::string previous_signature_;
  std::string chunk_signature_;
  std::unique_ptr<Digest> chunk_sha256_;
  size_t trailer_bytes_ = 0;
  std::string canonical_trailers_;  // "name:value\n" per trailer, as signed
  std::string trailer_signature_;
};

}  // namespace

Result<std::unique_ptr<PayloadReader>> OpenPayload(ByteSource& upstream, const PayloadOptions& options) {
  std::string mode;
  if (options.verified != nullptr) {
    mode = options.verified->payload_mode;
  } else if (options.headers != nullptr) {
    if (const std::string* value = FindHeader(*options.headers, "x-amz-content-sha256")) {
      mode = std::string(Trim(*value));
    }
  }
  if (mode == kStreamingSigned || mode == kStreamingSignedTrailer) {
    if (options.verified == nullptr || options.verified->signing_key.empty()) {
      return Status::InvalidArgument(std::string(mode) + " requires a signed request.");
    }
    auto reader = std::make_unique<ChunkedPayloadReader>(upstream, options.verified, /*signed_chunks=*/true,
                                                         /*trailers=*/mode == kStreamingSignedTrailer);
    RETURN_IF_ERROR(reader->Open(options));
    return std::unique_ptr<PayloadReader>(std::move(reader));
  }
  if (mode == kStreamingUnsignedTrailer) {
    auto reader = std::make_unique<ChunkedPayloadReader>(upstream, options.verified, /*signed_chunks=*/false,
                                                         /*trailers=*/true);
    RETURN_IF_ERROR(reader->Open(options));
    return std::unique_ptr<PayloadReader>(std::move(reader));
  }
  std::string expected_hash;
  if (mode.size() == 64 && HexDecode(mode)) {
    expected_hash = mode;
  } else if (!mode.empty() && mode != kUnsignedPayload) {
    return Status::InvalidArgument("Unsupported x-amz-content-sha256 value '" + mode + "'.");
  }
  auto reader = std::make_unique<PlainPayloadReader>(upstream, std::move(expected_hash));
  RETURN_IF_ERROR(reader->Open(options));
  return std::unique_ptr<PayloadReader>(std::move(reader));
}

}  // namespace kiln::aws
