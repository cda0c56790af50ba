// Fuzzes the model server's worker frame decoder (src/modelserver/frame.h): the bytes a Python
// worker (running the user's code) writes back on its socket.
//
// Input layout: byte 0 = flags:
//   bits 0-1  how the rest is fed to the decoder: 0 all at once, 1 one byte at a time, 2 in 7-byte
//             pieces, 3 in pieces whose sizes come from the input itself (each piece's first byte)
// the rest = the byte stream.
//
// Checks besides "no crash, no sanitizer report": the frames and the outcome (how many frames, then
// an error or a need for more bytes) do not depend on how the stream was split; every frame has a
// known type and an object as meta, and EncodeFrame of it decodes back to the same frame; once
// Next() fails it keeps failing; buffered() never exceeds what was appended.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "modelserver/frame.h"

namespace {

using kiln::modelserver::EncodeFrame;
using kiln::modelserver::Frame;
using kiln::modelserver::FrameDecoder;
using kiln::modelserver::FrameType;

void Check(bool condition) {
  if (!condition) std::abort();
}

struct Outcome {
  std::vector<Frame> frames;
  bool failed = false;
};

bool SameFrame(const Frame& a, const Frame& b) {
  return a.type == b.type && a.meta == b.meta && a.payload == b.payload;
}

// Drains the decoder into `out`; false once it has failed.
bool Drain(FrameDecoder& decoder, Outcome& out) {
  while (true) {
    kiln::Result<std::optional<Frame>> next = decoder.Next();
    if (!next.ok()) {
      Check(next.status().IsInvalidArgument());
      Check(!decoder.Next().ok());  // unusable afterwards
      out.failed = true;
      return false;
    }
    if (!next->has_value()) return true;
    out.frames.push_back(std::move(**next));
  }
}

Outcome Decode(std::string_view stream, int mode) {
  FrameDecoder decoder;
  Outcome out;
  size_t appended = 0;
  size_t pos = 0;
  while (pos < stream.size()) {
    size_t piece = stream.size() - pos;
    if (mode == 1) piece = 1;
    if (mode == 2) piece = std::min<size_t>(piece, 7);
    if (mode == 3) piece = std::min<size_t>(piece, 1 + static_cast<uint8_t>(stream[pos]) % 64);
    decoder.Append(stream.substr(pos, piece));
    appended += piece;
    pos += piece;
    Check(decoder.buffered() <= appended);
    if (!Drain(decoder, out)) return out;
  }
  Drain(decoder, out);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] & 3;
  std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);

  Outcome split = Decode(stream, mode);
  Outcome whole = mode == 0 ? split : Decode(stream, 0);
  // Splitting only changes when an error is seen, never what: a chunked decode may stop at the
  // same bad frame, with the same frames before it.
  Check(split.failed == whole.failed);
  Check(split.frames.size() == whole.frames.size());
  for (size_t i = 0; i < split.frames.size(); ++i) Check(SameFrame(split.frames[i], whole.frames[i]));

  for (const Frame& frame : whole.frames) {
    Check(frame.type >= FrameType::kReady && frame.type <= FrameType::kResult);
    Check(frame.meta.is_object());
    FrameDecoder again;
    again.Append(EncodeFrame(frame));
    kiln::Result<std::optional<Frame>> next = again.Next();
    Check(next.ok() && next->has_value());
    Check(SameFrame(**next, frame));
    Check(again.buffered() == 0);
  }
  return 0;
}
