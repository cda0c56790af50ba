#include "modelserver/frame.h"

#include <cstring>

#include "base/json_parse.h"

namespace kiln::modelserver {
namespace {

// u32 rest_length + u8 type + u32 meta_length.
constexpr size_t kPrefixBytes = 9;
// Buffered bytes already handed out are dropped once they are this many and at least half the
// buffer: each byte moves O(1) times on average, so a long stream of frames costs linear time.
constexpr size_t kCompactBytes = 64 * 1024;

void PutU32(char* out, uint32_t v) {
  out[0] = static_cast<char>(v >> 24);
  out[1] = static_cast<char>(v >> 16);
  out[2] = static_cast<char>(v >> 8);
  out[3] = static_cast<char>(v);
}

uint32_t GetU32(const char* in) {
  const auto* p = reinterpret_cast<const unsigned char*>(in);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool KnownType(uint8_t type) {
  return type >= static_cast<uint8_t>(FrameType::kReady) && type <= static_cast<uint8_t>(FrameType::kResult);
}

}  // namespace

std::string EncodeFrameHead(FrameType type, const nlohmann::json& meta, size_t payload_size) {
  // Header values from clients (content types, custom attributes) may hold invalid UTF-8: replace
  // it rather than throw.
  std::string meta_text = meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string head(kPrefixBytes, '\0');
  const uint64_t rest = 5 + uint64_t{meta_text.size()} + payload_size;
  // Callers bound bodies far below kMaxFrameBytes (SAGEMAKER_MAX_PAYLOAD_IN_MB); a larger frame is
  // written with its length truncated only if a caller breaks that, and the peer then rejects it.
  PutU32(head.data(), static_cast<uint32_t>(rest));
  head[4] = static_cast<char>(type);
  PutU32(head.data() + 5, static_cast<uint32_t>(meta_text.size()));
  head += meta_text;
  return head;
}

std::string EncodeFrame(const Frame& frame) {
  std::string out = EncodeFrameHead(frame.type, frame.meta, frame.payload.size());
  out += frame.payload;
  return out;
}

Result<std::optional<Frame>> FrameDecoder::Next() {
  const size_t available = buffer_.size() - consumed_;
  if (available < 4) return std::optional<Frame>();
  const char* start = buffer_.data() + consumed_;
  const uint32_t rest = GetU32(start);
  // Checked as soon as the prefix is here, so a hostile length is refused before we buffer for it.
  if (rest > kMaxFrameBytes) {
    return Status::InvalidArgument("worker frame of " + std::to_string(rest) + " bytes is over the limit of " +
                                   std::to_string(kMaxFrameBytes));
  }
  if (rest < 5) return Status::InvalidArgument("worker frame of " + std::to_string(rest) + " bytes is too short");
  if (available >= 5 && !KnownType(static_cast<uint8_t>(start[4]))) {
    return Status::InvalidArgument("unknown worker frame type " + std::to_string(static_cast<uint8_t>(start[4])));
  }
  if (available >= kPrefixBytes && GetU32(start + 5) > rest - 5) {
    return Status::InvalidArgument("worker frame meta length " + std::to_string(GetU32(start + 5)) +
                                   " is past the frame's end");
  }
  if (available - 4 < rest) return std::optional<Frame>();

  const uint32_t meta_length = GetU32(start + 5);
  std::string_view meta_text(start + kPrefixBytes, meta_length);
  Result<nlohmann::json> meta = ParseJsonBounded(meta_text, {.max_depth = 32});
  if (!meta.ok()) return Status::InvalidArgument("worker frame meta is not JSON: " + meta.status().message());
  if (!meta->is_object()) return Status::InvalidArgument("worker frame meta is not a JSON object");

  Frame frame;
  frame.type = static_cast<FrameType>(static_cast<uint8_t>(start[4]));
  frame.meta = std::move(*meta);
  frame.payload.assign(start + kPrefixBytes + meta_length, rest - 5 - meta_length);
  consumed_ += 4 + size_t{rest};

  if (consumed_ == buffer_.size()) {
    buffer_.clear();  // keeps the capacity: the next reads append without reallocating
    consumed_ = 0;
  } else if (consumed_ >= kCompactBytes && consumed_ * 2 >= buffer_.size()) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  return std::optional<Frame>(std::move(frame));
}

}  // namespace kiln::modelserver
