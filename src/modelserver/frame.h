#pragma once
// The wire format between the model server and its Python workers (README.md, "Worker protocol"):
//
//   u32 BE rest_length | u8 type | u32 BE meta_length | meta (JSON object) | payload (raw bytes)
//
// Bodies travel in the payload as they came, never re-encoded (no base64, no JSON strings).
//
//   std::string wire = EncodeFrame(Frame{FrameType::kInvoke, meta, body});
//   FrameDecoder decoder;
//   decoder.Append(bytes_read);
//   while (true) {
//     ASSIGN_OR_RETURN(std::optional<Frame> frame, decoder.Next());
//     if (!frame) break;   // need more bytes
//     ...
//   }
//
// Thread-safety: a FrameDecoder is used by one thread at a time; the functions are pure.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::modelserver {

enum class FrameType : uint8_t {
  kReady = 1,       // worker → server: the model is loaded
  kLoadFailed = 2,  // worker → server: loading failed; the worker exits
  kInvoke = 3,      // server → worker: one request or a batch
  kResult = 4,      // worker → server: the answers to one invoke
};

// A frame larger than this is a protocol error (the peer is broken or hostile).
inline constexpr uint32_t kMaxFrameBytes = 1u << 30;

struct Frame {
  FrameType type = FrameType::kInvoke;
  nlohmann::json meta = nlohmann::json::object();
  std::string payload;
};

// The whole frame as bytes.
std::string EncodeFrame(const Frame& frame);
// Only the 9-byte prefix and the meta, for writing the payload separately (writev) without copying:
// EncodeFrameHead(f) + f.payload == EncodeFrame(f).
std::string EncodeFrameHead(FrameType type, const nlohmann::json& meta, size_t payload_size);

// Reassembles frames from a byte stream.
class FrameDecoder {
 public:
  void Append(std::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // The next complete frame; nullopt when more bytes are needed. InvalidArgument (and the decoder
  // is then unusable) for a frame over kMaxFrameBytes, an unknown type, a meta length past the
  // frame, or meta that is not a JSON object.
  Result<std::optional<Frame>> Next();
  // Bytes held that do not yet form a frame.
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  std::string buffer_;
  size_t consumed_ = 0;
};

}  // namespace kiln::modelserver
