#include "modelserver/frame.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln::modelserver {
namespace {

std::string U32(uint32_t v) {
  std::string out(4, '\0');
  out[0] = static_cast<char>(v >> 24);
  out[1] = static_cast<char>(v >> 16);
  out[2] = static_cast<char>(v >> 8);
  out[3] = static_cast<char>(v);
  return out;
}

// A frame written by hand, so the tests check the wire format and not only Encode ∘ Decode.
std::string RawFrame(uint8_t type, const std::string& meta, const std::string& payload) {
  return U32(static_cast<uint32_t>(5 + meta.size() + payload.size())) + std::string(1, static_cast<char>(type)) +
         U32(static_cast<uint32_t>(meta.size())) + meta + payload;
}

TEST(FrameTest, EncodesTheDocumentedLayout) {
  Frame frame{FrameType::kInvoke, {{"id", 7}}, std::string("ab\0c", 4)};
  EXPECT_EQ(EncodeFrame(frame), RawFrame(3, R"({"id":7})", std::string("ab\0c", 4)));
  EXPECT_EQ(EncodeFrameHead(frame.type, frame.meta, frame.payload.size()) + frame.payload, EncodeFrame(frame));
}

TEST(FrameTest, RoundTripsSeveralFramesInOneAppend) {
  std::string wire;
  for (int i = 0; i < 3; ++i) {
    wire += EncodeFrame(Frame{FrameType::kResult, {{"id", i}}, std::string(static_cast<size_t>(i) * 10, 'x')});
  }
  FrameDecoder decoder;
  decoder.Append(wire);
  for (int i = 0; i < 3; ++i) {
    Result<std::optional<Frame>> next = decoder.Next();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    ASSERT_TRUE(next->has_value());
    EXPECT_EQ((*next)->type, FrameType::kResult);
    EXPECT_EQ((*next)->meta["id"], i);
    EXPECT_EQ((*next)->payload, std::string(static_cast<size_t>(i) * 10, 'x'));
  }
  Result<std::optional<Frame>> end = decoder.Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameTest, ReassemblesFramesSplitAtEveryByte) {
  std::string wire = EncodeFrame(Frame{FrameType::kReady, {{"pid", 12}, {"load_ms", 3}}, ""}) +
                     EncodeFrame(Frame{FrameType::kResult, {{"id", 1}}, "payload bytes"});
  for (size_t split = 0; split <= wire.size(); ++split) {
    FrameDecoder decoder;
    std::vector<Frame> frames;
    for (std::string_view part : {std::string_view(wire).substr(0, split), std::string_view(wire).substr(split)}) {
      decoder.Append(part);
      while (true) {
        Result<std::optional<Frame>> next = decoder.Next();
        ASSERT_TRUE(next.ok()) << "split " << split << ": " << next.status().ToString();
        if (!next->has_value()) break;
        frames.push_back(std::move(**next));
      }
    }
    ASSERT_EQ(frames.size(), 2u) << "split " << split;
    EXPECT_EQ(frames[0].type, FrameType::kReady);
    EXPECT_EQ(frames[0].meta["pid"], 12);
    EXPECT_EQ(frames[1].payload, "payload bytes");
  }
}

TEST(FrameTest, ByteByByteKeepsTheBufferBounded) {
  // Many frames fed one byte at a time: everything comes out, and the decoder does not keep what
  // it has handed out (buffered() is only the incomplete tail).
  std::string one = EncodeFrame(Frame{FrameType::kResult, {{"id", 1}}, std::string(100, 'p')});
  FrameDecoder decoder;
  int frames = 0;
  for (int i = 0; i < 200; ++i) {
    for (char c : one) {
      decoder.Append(std::string_view(&c, 1));
      Result<std::optional<Frame>> next = decoder.Next();
      ASSERT_TRUE(next.ok());
      if (next->has_value()) ++frames;
      ASSERT_LT(decoder.buffered(), one.size());
    }
  }
  EXPECT_EQ(frames, 200);
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameTest, RejectsAFrameOverTheLimitFromItsPrefix) {
  FrameDecoder decoder;
  decoder.Append(U32(kMaxFrameBytes + 1));
  Result<std::optional<Frame>> next = decoder.Next();
  ASSERT_FALSE(next.ok());
  EXPECT_TRUE(next.status().IsInvalidArgument());
  EXPECT_NE(next.status().message().find("over the limit"), std::string::npos);
}

TEST(FrameTest, RejectsUnknownTypes) {
  for (uint8_t type : {uint8_t{0}, uint8_t{5}, uint8_t{255}}) {
    FrameDecoder decoder;
    decoder.Append(RawFrame(type, "{}", ""));
    Result<std::optional<Frame>> next = decoder.Next();
    ASSERT_FALSE(next.ok()) << int{type};
    EXPECT_NE(next.status().message().find("unknown worker frame type"), std::string::npos);
  }
}

TEST(FrameTest, RejectsBadMeta) {
  struct Case {
    std::string wire;
    std::string error;
  };
  std::vector<Case> cases = {
      {RawFrame(4, "[1,2]", ""), "not a JSON object"},
      {RawFrame(4, "{\"id\":", ""), "not JSON"},
      {RawFrame(4, "", "xyz"), "not JSON"},
      // meta_length past the frame's end
      {U32(5 + 2) + std::string(1, '\4') + U32(3) + "{}", "past the frame's end"},
      // rest_length too short to hold the type and meta_length
      {U32(3) + "abc", "too short"},
      {RawFrame(4, std::string(100, '[') + std::string(100, ']'), ""), "not JSON"},
  };
  for (const Case& c : cases) {
    FrameDecoder decoder;
    decoder.Append(c.wire);
    Result<std::optional<Frame>> next = decoder.Next();
    ASSERT_FALSE(next.ok()) << c.error;
    EXPECT_TRUE(next.status().IsInvalidArgument());
    EXPECT_NE(next.status().message().find(c.error), std::string::npos) << next.status().message();
    // Unusable afterwards: the same error again, however many bytes follow.
    decoder.Append(EncodeFrame(Frame{}));
    EXPECT_FALSE(decoder.Next().ok());
  }
}

TEST(FrameTest, InvalidUtf8InMetaIsReplacedNotThrown) {
  Frame frame{FrameType::kInvoke,
              {{"content_type", std::string("a\xff"
                                            "b")}},
              ""};
  std::string wire = EncodeFrame(frame);
  FrameDecoder decoder;
  decoder.Append(wire);
  Result<std::optional<Frame>> next = decoder.Next();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ASSERT_TRUE(next->has_value());
  EXPECT_TRUE((*next)->meta["content_type"].is_string());
}

TEST(FrameTest, EmptyMetaObjectAndLargePayload) {
  std::string payload(3 << 20, '\x01');
  FrameDecoder decoder;
  decoder.Append(EncodeFrame(Frame{FrameType::kResult, nlohmann::json::object(), payload}));
  Result<std::optional<Frame>> next = decoder.Next();
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ((*next)->payload.size(), payload.size());
  EXPECT_TRUE((*next)->meta.empty());
}

}  // namespace
}  // namespace kiln::modelserver
