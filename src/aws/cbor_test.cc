#include "aws/cbor.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

namespace kiln::aws {
namespace {

std::string Bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

nlohmann::json Decode(const std::string& bytes) {
  auto decoded = DecodeCbor(bytes);
  EXPECT_TRUE(decoded.ok()) << decoded.status().message();
  return decoded.ok() ? *decoded : nlohmann::json("<error>");
}

std::string DecodeError(const std::string& bytes, const CborLimits& limits = {}) {
  auto decoded = DecodeCbor(bytes, limits);
  EXPECT_FALSE(decoded.ok()) << decoded->dump();
  return decoded.ok() ? "" : decoded.status().message();
}

TEST(CborTest, Scalars) {
  EXPECT_EQ(Decode(Bytes({0x00})), 0);
  EXPECT_EQ(Decode(Bytes({0x17})), 23);
  EXPECT_EQ(Decode(Bytes({0x18, 0x18})), 24);
  EXPECT_EQ(Decode(Bytes({0x19, 0x03, 0xe8})), 1000);
  EXPECT_EQ(Decode(Bytes({0x1b, 0, 0, 0, 0xe8, 0xd4, 0xa5, 0x10, 0x00})), 1000000000000LL);
  EXPECT_EQ(Decode(Bytes({0x20})), -1);
  EXPECT_EQ(Decode(Bytes({0x39, 0x03, 0xe7})), -1000);
  EXPECT_EQ(Decode(Bytes({0xf4})), false);
  EXPECT_EQ(Decode(Bytes({0xf5})), true);
  EXPECT_TRUE(Decode(Bytes({0xf6})).is_null());
  EXPECT_TRUE(Decode(Bytes({0xf7})).is_null());
  EXPECT_DOUBLE_EQ(Decode(Bytes({0xf9, 0x3c, 0x00})).get<double>(), 1.0);  // half
  EXPECT_DOUBLE_EQ(Decode(Bytes({0xf9, 0xc4, 0x00})).get<double>(), -4.0);
  EXPECT_DOUBLE_EQ(Decode(Bytes({0xfa, 0x47, 0xc3, 0x50, 0x00})).get<double>(), 100000.0);  // single
  EXPECT_DOUBLE_EQ(Decode(Bytes({0xfb, 0x3f, 0xf1, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a})).get<double>(), 1.1);
  EXPECT_TRUE(std::isnan(Decode(Bytes({0xf9, 0x7e, 0x00})).get<double>()));
  EXPECT_TRUE(std::isinf(Decode(Bytes({0xf9, 0x7c, 0x00})).get<double>()));
  EXPECT_EQ(Decode(Bytes({0x64, 'I', 'E', 'T', 'F'})), "IETF");
  EXPECT_EQ(Decode(Bytes({0x43, 1, 2, 3})), "AQID");  // byte strings → base64 (the blob form)
}

TEST(CborTest, ContainersAndIndefiniteLengths) {
  // {"a": 1, "b": [2, 3]}
  EXPECT_EQ(Decode(Bytes({0xa2, 0x61, 'a', 0x01, 0x61, 'b', 0x82, 0x02, 0x03})),
            nlohmann::json::parse(R"({"a":1,"b":[2,3]})"));
  // {_ "a": [_ 1, 2], "s": (_ "ab" "c")}
  EXPECT_EQ(
      Decode(Bytes({0xbf, 0x61, 'a', 0x9f, 0x01, 0x02, 0xff, 0x61, 's', 0x7f, 0x62, 'a', 'b', 0x61, 'c', 0xff, 0xff})),
      nlohmann::json::parse(R"({"a":[1,2],"s":"abc"})"));
}

TEST(CborTest, TimestampTag) {
  EXPECT_EQ(Decode(Bytes({0xc1, 0x1a, 0x51, 0x4b, 0x67, 0xb0})), 1363896240);
  EXPECT_DOUBLE_EQ(Decode(Bytes({0xc1, 0xfb, 0x41, 0xd4, 0x52, 0xd9, 0xec, 0x20, 0x00, 0x00})).get<double>(),
                   1363896240.5);
  EXPECT_NE(DecodeError(Bytes({0xc1, 0x61, 'x'})).find("tag 1"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0xc2, 0x41, 0x01})).find("unsupported tag 2"), std::string::npos);
}

TEST(CborTest, MalformedInputsAreRefused) {
  EXPECT_NE(DecodeError("").find("empty"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0x01, 0x02})).find("trailing"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0x19, 0x01})).find("end of input"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0x1c})).find("reserved"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0xff})).find("break"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0xa1, 0x01, 0x02})).find("not a text string"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0xa2, 0x61, 'a', 0x01, 0x61, 'a', 0x02})).find("duplicate"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0x62, 0xc3, 0x28})).find("UTF-8"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0x9f, 0x01})).find("end of input"), std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})).find("out of range"),
            std::string::npos);
  EXPECT_NE(DecodeError(Bytes({0xf8, 0x20})).find("simple"), std::string::npos);
  // A 4 GiB string declared in 5 bytes: refused without allocating.
  EXPECT_NE(DecodeError(Bytes({0x5a, 0xff, 0xff, 0xff, 0xff, 0x00})).find("longer than the input"), std::string::npos);
  // Chunks of an indefinite text string must be text strings.
  EXPECT_NE(DecodeError(Bytes({0x7f, 0x41, 'a', 0xff})).find("chunk"), std::string::npos);
}

TEST(CborTest, LimitsBoundDepthAndValues) {
  std::string deep(100000, static_cast<char>(0x81));
  deep.push_back(0x00);
  EXPECT_NE(DecodeError(deep).find("nested deeper than 64"), std::string::npos);
  std::string many = Bytes({0x9a, 0x00, 0x0f, 0x42, 0x40});  // array of 1,000,000
  many.append(1000000, '\0');
  EXPECT_NE(DecodeError(many, CborLimits{.max_depth = 64, .max_values = 1000}).find("more than 1000"),
            std::string::npos);
}

TEST(CborTest, WriterRoundTrips) {
  nlohmann::json value = nlohmann::json::parse(
      R"({"s":"text","i":-5,"u":100000,"big":5000000000,"d":1.5,"b":true,"n":null,"l":[1,"two",[3]],"m":{"k":"v"}})");
  CborWriter writer;
  writer.Json(value);
  EXPECT_EQ(Decode(writer.bytes()), value);
  EXPECT_EQ(nlohmann::json::from_cbor(writer.bytes()), value);  // an independent reader agrees
}

TEST(CborTest, ShapedEncodingTagsTimestampsAndWritesDoubles) {
  nlohmann::json shapes = nlohmann::json::parse(R"({
    "Out": {"type": "structure", "members": {"When": {"shape": "Ts"}, "V": {"shape": "D"}, "N": {"shape": "I"},
            "L": {"shape": "TsList"}}},
    "Ts": {"type": "timestamp"}, "D": {"type": "double"}, "I": {"type": "integer"},
    "TsList": {"type": "list", "member": {"shape": "Ts"}}})");
  nlohmann::json value = {{"When", 1700000000}, {"V", 2}, {"N", 3}, {"L", {1700000060.5}}, {"Unknown", 1}};
  std::string bytes = EncodeCborShaped(shapes, "Out", value);
  // Tag 1 over an integer, a double for the double shape even though the JSON value is 2.
  EXPECT_NE(bytes.find(Bytes({0x64, 'W', 'h', 'e', 'n', static_cast<char>(0xc1), 0x1a})), std::string::npos);
  EXPECT_NE(bytes.find(Bytes({0x61, 'V', static_cast<char>(0xfb), 0x40, 0x00})), std::string::npos);
  EXPECT_NE(bytes.find(Bytes({static_cast<char>(0xc1), static_cast<char>(0xfb)})), std::string::npos);
  nlohmann::json back = Decode(bytes);
  EXPECT_EQ(back["When"], 1700000000);
  EXPECT_DOUBLE_EQ(back["V"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(back["L"][0].get<double>(), 1700000060.5);
  EXPECT_FALSE(back.contains("Unknown"));
}

}  // namespace
}  // namespace kiln::aws
