#include "serving/transform_records.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln::serving {
namespace {

using nlohmann::json;
using namespace std::string_literals;

std::vector<std::string> Framed(const std::vector<Record>& records) {
  std::vector<std::string> out;
  for (const Record& r : records) out.emplace_back(r.framed);
  return out;
}

std::vector<std::string> Payloads(const std::vector<Record>& records) {
  std::vector<std::string> out;
  for (const Record& r : records) out.emplace_back(r.payload());
  return out;
}

// ---- splitting ----

TEST(SplitRecordsTest, NoneIsTheWholeObjectAndAnEmptyObjectHasNoRecord) {
  auto records = SplitRecords("a\nb\n", SplitType::kNone);
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(Framed(*records), (std::vector<std::string>{"a\nb\n"}));
  EXPECT_EQ(Payloads(*records), (std::vector<std::string>{"a\nb\n"}));
  EXPECT_TRUE(SplitRecords("", SplitType::kNone)->empty());
}

TEST(SplitRecordsTest, LinesKeepTheirBreakInFramedAndCarriageReturnIsData) {
  auto records = SplitRecords("1,2\r\n3,4\n\nlast", SplitType::kLine);
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(Framed(*records), (std::vector<std::string>{"1,2\r\n", "3,4\n", "\n", "last"}));
  EXPECT_EQ(Payloads(*records), (std::vector<std::string>{"1,2\r", "3,4", "", "last"}));
  EXPECT_EQ(SplitRecords("x\n", SplitType::kLine)->size(), 1u);  // no empty record after the final '\n'
  EXPECT_TRUE(SplitRecords("", SplitType::kLine)->empty());
}

TEST(SplitRecordsTest, RecordIOWholeRecordsWithPadding) {
  const std::string data = FrameRecordIO("abcde") + FrameRecordIO("") + FrameRecordIO("wxyz");
  EXPECT_EQ(FrameRecordIO("abcde").size(), 16u);  // 8 header + 5 data + 3 padding
  auto records = SplitRecords(data, SplitType::kRecordIO);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  EXPECT_EQ(Payloads(*records), (std::vector<std::string>{"abcde", "", "wxyz"}));
  EXPECT_EQ(Framed(*records),
            (std::vector<std::string>{FrameRecordIO("abcde"), FrameRecordIO(""), FrameRecordIO("wxyz")}));
  // The header as MXNet writes it: magic 0xced7230a little-endian, then the length.
  EXPECT_EQ(data.substr(0, 8), "\x0a\x23\xd7\xce\x05\x00\x00\x00"s);
}

TEST(SplitRecordsTest, RecordIOMultiPartRecordRejoinsTheMagicNumbers) {
  // MXNet splits a record at each magic number it contains: "ab<magic>cd" → parts "ab" (cflag 1)
  // and "cd" (cflag 3).
  const std::string magic = "\x0a\x23\xd7\xce"s;
  std::string data;
  data += magic + "\x02\x00\x00\x20"s + "ab\0\0"s;   // cflag 1 << 29, length 2
  data += magic + "\x01\x00\x00\x40"s + "x\0\0\0"s;  // cflag 2, length 1
  data += magic + "\x02\x00\x00\x60"s + "cd\0\0"s;   // cflag 3, length 2
  data += FrameRecordIO("next");
  auto records = SplitRecords(data, SplitType::kRecordIO);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ(std::string((*records)[0].payload()), "ab" + magic + "x" + magic + "cd");
  EXPECT_EQ((*records)[0].framed.size(), 36u);
  EXPECT_EQ(std::string((*records)[1].payload()), "next");
  // Moving the vector keeps the joined payload valid.
  std::vector<Record> moved = std::move(*records);
  EXPECT_EQ(std::string(moved[0].payload()), "ab" + magic + "x" + magic + "cd");
}

TEST(SplitRecordsTest, RecordIOErrorsNameTheOffset) {
  auto bad_magic = SplitRecords(FrameRecordIO("abcd") + "\x01\x02\x03\x04\x00\x00\x00\x00"s, SplitType::kRecordIO);
  ASSERT_FALSE(bad_magic.ok());
  EXPECT_NE(bad_magic.status().message().find("at byte 12 does not start with the magic number"), std::string::npos)
      << bad_magic.status().message();
  auto truncated = SplitRecords(FrameRecordIO("abcdefgh").substr(0, 12), SplitType::kRecordIO);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("at byte 0 is truncated (length 8, 4 bytes left)"), std::string::npos)
      << truncated.status().message();
  auto short_header = SplitRecords("\x0a\x23\xd7"s, SplitType::kRecordIO);
  EXPECT_FALSE(short_header.ok());
  const std::string magic = "\x0a\x23\xd7\xce"s;
  auto orphan = SplitRecords(magic + "\x00\x00\x00\x60"s, SplitType::kRecordIO);  // a last part alone
  ASSERT_FALSE(orphan.ok());
  EXPECT_NE(orphan.status().message().find("never started"), std::string::npos);
  auto open = SplitRecords(magic + "\x00\x00\x00\x20"s, SplitType::kRecordIO);  // a first part alone
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("has no last part"), std::string::npos);
}

TEST(SplitRecordsTest, TFRecordFramesAndMaskedCrcs) {
  // A frame of "hello" computed independently (Python: struct + a bitwise CRC-32C).
  const std::string hello =
      "\x05\x00\x00\x00\x00\x00\x00\x00\xea\xb2\x04\x3e"
      "hello"
      "\xbb\x1f\x1c\x19"s;
  EXPECT_EQ(FrameTFRecord("hello"), hello);
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(0xe3069283u), ((0xe3069283u >> 15) | (0xe3069283u << 17)) + 0xa282ead8u);
  const std::string data = hello + FrameTFRecord("") + FrameTFRecord("world!");  // records view it
  auto records = SplitRecords(data, SplitType::kTFRecord);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  EXPECT_EQ(Payloads(*records), (std::vector<std::string>{"hello", "", "world!"}));
  EXPECT_EQ((*records)[0].framed, hello);
}

TEST(SplitRecordsTest, TFRecordCorruptionIsDetected) {
  std::string bad_length = FrameTFRecord("hello");
  bad_length[8] ^= 1;  // the length's CRC
  auto a = SplitRecords(bad_length, SplitType::kTFRecord);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("corrupt length"), std::string::npos);
  std::string bad_data = FrameTFRecord("abc") + FrameTFRecord("hello");
  bad_data[bad_data.size() - 6] ^= 0x20;  // a data byte of the second frame
  auto b = SplitRecords(bad_data, SplitType::kTFRecord);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("TFRecord at byte 19 has corrupt data"), std::string::npos)
      << b.status().message();
  auto c = SplitRecords(FrameTFRecord("hello").substr(0, 15), SplitType::kTFRecord);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("truncated"), std::string::npos);
}

TEST(SplitTypeTest, ParsesTheApiWords) {
  EXPECT_EQ(ParseSplitType(""), SplitType::kNone);
  EXPECT_EQ(ParseSplitType("None"), SplitType::kNone);
  EXPECT_EQ(ParseSplitType("Line"), SplitType::kLine);
  EXPECT_EQ(ParseSplitType("RecordIO"), SplitType::kRecordIO);
  EXPECT_EQ(ParseSplitType("TFRecord"), SplitType::kTFRecord);
  EXPECT_EQ(ParseSplitType("line"), std::nullopt);
  EXPECT_EQ(FormatOfContentType("text/csv; charset=utf-8"), RecordFormat::kCsv);
  EXPECT_EQ(FormatOfContentType("Application/JSON"), RecordFormat::kJson);
  EXPECT_EQ(FormatOfContentType("application/jsonlines"), RecordFormat::kJson);
  EXPECT_EQ(FormatOfContentType("application/x-recordio-protobuf"), RecordFormat::kOther);
}

// ---- batching ----

TEST(PlanBatchesTest, SingleRecordIsOneRecordPerRequest) {
  auto batches = PlanBatches({3, 4, 5}, BatchStrategy::kSingleRecord, 10);
  ASSERT_TRUE(batches.ok());
  ASSERT_EQ(batches->size(), 3u);
  EXPECT_EQ((*batches)[2].first, 2u);
  EXPECT_EQ((*batches)[2].count, 1u);
}

TEST(PlanBatchesTest, MultiRecordFillsUpToTheLimitExactly) {
  auto batches = PlanBatches({4, 4, 2, 1, 10, 3, 3}, BatchStrategy::kMultiRecord, 10);
  ASSERT_TRUE(batches.ok());
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const BatchRange& b : *batches) ranges.emplace_back(b.first, b.count);
  // 4+4+2 = 10 fits exactly; 1 then 10 would make 11; 10 alone; 3+3.
  EXPECT_EQ(ranges, (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 1}, {4, 1}, {5, 2}}));
}

TEST(PlanBatchesTest, ManySmallRecordsFillWholeBatches) {
  // 300,000 records of 100 bytes under 1 MiB: 10,485 per batch (linear in the records: the plan of
  // a large object must not cost a pass over the batch per record).
  std::vector<size_t> sizes(300000, 100);
  auto batches = PlanBatches(sizes, BatchStrategy::kMultiRecord, 1048576);
  ASSERT_TRUE(batches.ok());
  ASSERT_EQ(batches->size(), 29u);
  EXPECT_EQ((*batches)[0].count, 10485u);
  EXPECT_EQ((*batches)[28].first, 28u * 10485);
  EXPECT_EQ((*batches)[28].count, 300000u - 28 * 10485);
}

TEST(PlanBatchesTest, ARecordOverTheLimitFailsNamingIt) {
  auto batches = PlanBatches({4, 11, 2}, BatchStrategy::kMultiRecord, 10);
  ASSERT_FALSE(batches.ok());
  EXPECT_EQ(batches.status().message(), "record 2 is 11 bytes, more than MaxPayloadInMB allows (10 bytes)");
  EXPECT_FALSE(PlanBatches({11}, BatchStrategy::kSingleRecord, 10).ok());
  // 0: no limit.
  auto unlimited = PlanBatches({100, 200}, BatchStrategy::kMultiRecord, 0);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->size(), 1u);
  EXPECT_TRUE(PlanBatches({}, BatchStrategy::kMultiRecord, 10)->empty());
}

// ---- JSONPath ----

json Apply(const std::string& path, const json& value) {
  auto parsed = JsonPath::Parse(path);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  auto applied = parsed->Apply(value);
  EXPECT_TRUE(applied.ok()) << applied.status().ToString();
  return applied.ok() ? *applied : json();
}

TEST(JsonPathTest, SelectsMembersIndexesSlicesAndWildcards) {
  const json row = json::array({"id7", "1", "2", "3"});
  EXPECT_TRUE(JsonPath::Parse("$")->identity());
  EXPECT_EQ(Apply("$", row), row);
  EXPECT_EQ(Apply("$[0]", row), "id7");
  EXPECT_EQ(Apply("$[-1]", row), "3");
  EXPECT_EQ(Apply("$[0,-1]", row), json::array({"id7", "3"}));
  EXPECT_EQ(Apply("$[1:]", row), json::array({"1", "2", "3"}));
  EXPECT_EQ(Apply("$[:2]", row), json::array({"id7", "1"}));
  EXPECT_EQ(Apply("$[1:-1]", row), json::array({"1", "2"}));
  EXPECT_EQ(Apply("$[2:100]", row), json::array({"2", "3"}));  // slices clamp
  EXPECT_EQ(Apply("$[*]", row), row);
  const json obj = {{"id", 1}, {"features", {1, 2, 3}}, {"meta", {{"a", "x"}}}};
  EXPECT_EQ(Apply("$.id", obj), 1);
  EXPECT_EQ(Apply("$['id']", obj), 1);
  EXPECT_EQ(Apply("$[\"id\"]", obj), 1);
  EXPECT_EQ(Apply("$.features", obj), json::array({1, 2, 3}));
  EXPECT_EQ(Apply("$.features[1:]", obj), json::array({2, 3}));
  EXPECT_EQ(Apply("$.meta.a", obj), "x");
  EXPECT_EQ(Apply("$['id','meta']", obj), (json{{"id", 1}, {"meta", {{"a", "x"}}}}));
  EXPECT_EQ(Apply("$[ 0 , 2 ]", row), json::array({"id7", "2"}));
}

TEST(JsonPathTest, OutOfRangeAndMissingMembersFail) {
  const json row = json::array({"a", "b"});
  auto path = JsonPath::Parse("$[0,2]");
  ASSERT_TRUE(path.ok());
  auto applied = path->Apply(row);
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().message(),
            "The JSONPath '$[0,2]' does not apply to the record: index 2 is out of range for 2 values");
  EXPECT_FALSE(JsonPath::Parse("$[-3]")->Apply(row).ok());
  EXPECT_FALSE(JsonPath::Parse("$.missing")->Apply(json{{"a", 1}}).ok());
  EXPECT_FALSE(JsonPath::Parse("$.a")->Apply(row).ok());  // members of an array
  EXPECT_FALSE(JsonPath::Parse("$[0]")->Apply(json{{"a", 1}}).ok());
}

TEST(JsonPathTest, TextsOutsideTheSubsetAreRefused) {
  for (const char* bad :
       {"", "id", "$.", "$[", "$[0", "$[a]", "$['a'", "$[1:2:1]", "$[*].a", "$[0,1][0]", "$..a", "$[1:]x"}) {
    auto parsed = JsonPath::Parse(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    if (!parsed.ok()) {
      EXPECT_NE(parsed.status().message().find("The JSONPath"), std::string::npos);
    }
  }
}

// ---- CSV, filters, joins ----

TEST(CsvTest, QuotedFieldsRoundTrip) {
  EXPECT_EQ(ParseCsvLine("a,\"b,c\",\"say \"\"hi\"\"\",,d\r"),
            (std::vector<std::string>{"a", "b,c", "say \"hi\"", "", "d"}));
  EXPECT_EQ(WriteCsvLine({"a", "b,c", "say \"hi\"", "", "d"}), "a,\"b,c\",\"say \"\"hi\"\"\",,d");
  EXPECT_EQ(ParseCsvLine(""), (std::vector<std::string>{""}));
}

TEST(FilterTest, CsvInputFilterDropsTheIdColumn) {
  auto path = JsonPath::Parse("$[1:]");
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*ApplyFilter(*path, "id-1,0.5,\"x,y\",7", RecordFormat::kCsv), "0.5,\"x,y\",7");
  auto single = JsonPath::Parse("$[0]");
  EXPECT_EQ(*ApplyFilter(*single, "id-1,0.5", RecordFormat::kCsv), "id-1");
  // Identity leaves the text alone (no CSV rewrite).
  EXPECT_EQ(*ApplyFilter(*JsonPath::Parse("$"), "a, b ,\"c\"", RecordFormat::kCsv), "a, b ,\"c\"");
}

TEST(FilterTest, JsonInputFilterSelectsAMember) {
  auto path = JsonPath::Parse("$.features");
  EXPECT_EQ(*ApplyFilter(*path, R"({"id": 3, "features": [1, 2.5]})", RecordFormat::kJson), "[1,2.5]");
  auto bad = ApplyFilter(*path, "{not json", RecordFormat::kJson);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "a record is not valid JSON");
  EXPECT_FALSE(ApplyFilter(*path, "x", RecordFormat::kOther).ok());
}

TEST(JoinTest, CsvOutputColumnsAreAppended) {
  EXPECT_EQ(*JoinRecord("id-1,0.5,7", "0.93\n", RecordFormat::kCsv), "id-1,0.5,7,0.93");
  EXPECT_EQ(*JoinRecord("a\r", "1,2", RecordFormat::kCsv), "a,1,2");
  // An OutputFilter on the joined record keeps the id and the prediction.
  auto path = JsonPath::Parse("$[0,-1]");
  EXPECT_EQ(*ApplyFilter(*path, *JoinRecord("id-1,0.5,7", "0.93", RecordFormat::kCsv), RecordFormat::kCsv),
            "id-1,0.93");
}

TEST(JoinTest, JsonOutputGoesUnderSageMakerOutput) {
  EXPECT_EQ(*JoinRecord(R"({"id":1,"x":[1,2]})", R"({"score":0.5})", RecordFormat::kJson),
            R"({"SageMakerOutput":{"score":0.5},"id":1,"x":[1,2]})");
  EXPECT_EQ(*JoinRecord("[1,2]", "0.5", RecordFormat::kJson), R"({"SageMakerInput":[1,2],"SageMakerOutput":0.5})");
  EXPECT_EQ(*JoinRecord(R"({"id":1})", "label-a", RecordFormat::kJson), R"({"SageMakerOutput":"label-a","id":1})");
  auto path = JsonPath::Parse("$['id','SageMakerOutput']");
  EXPECT_EQ(*ApplyFilter(*path, *JoinRecord(R"({"id":1,"x":[1,2]})", "0.5", RecordFormat::kJson), RecordFormat::kJson),
            R"({"SageMakerOutput":0.5,"id":1})");
  EXPECT_FALSE(JoinRecord("{bad", "1", RecordFormat::kJson).ok());
  EXPECT_FALSE(JoinRecord("x", "1", RecordFormat::kOther).ok());
}

// ---- responses and assembly ----

TEST(SplitResponseTest, LinesOrAJsonArray) {
  EXPECT_EQ(*SplitResponse("0.1\n0.2\r\n0.3\n", 3), (std::vector<std::string>{"0.1", "0.2", "0.3"}));
  EXPECT_EQ(*SplitResponse("0.1\n0.2", 2), (std::vector<std::string>{"0.1", "0.2"}));
  EXPECT_EQ(*SplitResponse("[0.1, {\"a\": 1}]", 2), (std::vector<std::string>{"0.1", "{\"a\":1}"}));
  EXPECT_EQ(*SplitResponse("[0.1, 0.2]", 1), (std::vector<std::string>{"[0.1, 0.2]"}));  // one record: whole
  auto mismatch = SplitResponse("1\n2\n", 3);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("2 output records for 3 input records"), std::string::npos);
}

TEST(AssembleTest, NoneConcatenatesAndLineAddsMissingBreaks) {
  std::string none;
  AppendAssembled(none, "a", AssembleWith::kNone);
  AppendAssembled(none, "b\n", AssembleWith::kNone);
  EXPECT_EQ(none, "ab\n");
  std::string line;
  AppendAssembled(line, "a", AssembleWith::kLine);
  AppendAssembled(line, "b\n", AssembleWith::kLine);
  AppendAssembled(line, "", AssembleWith::kLine);
  EXPECT_EQ(line, "a\nb\n\n");
}

// ---- parameters and output names ----

TEST(ResolveTransformParametersTest, RequestThenExecutionParametersThenDefaults) {
  TransformParameters defaults = ResolveTransformParameters(json::object(), json());
  EXPECT_EQ(defaults.max_concurrent, 1);
  EXPECT_EQ(defaults.max_payload_mb, 6);
  EXPECT_EQ(defaults.max_payload_bytes(), 6u * 1048576);
  EXPECT_EQ(defaults.strategy, BatchStrategy::kMultiRecord);
  const json answer = {{"MaxConcurrentTransforms", 8}, {"BatchStrategy", "SINGLE_RECORD"}, {"MaxPayloadInMB", 2}};
  TransformParameters from_container = ResolveTransformParameters(json::object(), answer);
  EXPECT_EQ(from_container.max_concurrent, 8);
  EXPECT_EQ(from_container.max_payload_mb, 2);
  EXPECT_EQ(from_container.strategy, BatchStrategy::kSingleRecord);
  TransformParameters from_request = ResolveTransformParameters(
      {{"MaxConcurrentTransforms", 3}, {"MaxPayloadInMB", 1}, {"BatchStrategy", "MultiRecord"}}, answer);
  EXPECT_EQ(from_request.max_concurrent, 3);
  EXPECT_EQ(from_request.max_payload_mb, 1);
  EXPECT_EQ(from_request.strategy, BatchStrategy::kMultiRecord);
  // A request's 0 is "not set"; nonsense in the answer is ignored.
  EXPECT_EQ(ResolveTransformParameters({{"MaxConcurrentTransforms", 0}}, answer).max_concurrent, 8);
  TransformParameters odd = ResolveTransformParameters(
      json::object(), {{"MaxConcurrentTransforms", "8"}, {"MaxPayloadInMB", 500}, {"BatchStrategy", "ALL"}});
  EXPECT_EQ(odd.max_concurrent, 1);
  EXPECT_EQ(odd.max_payload_mb, 6);
  EXPECT_EQ(odd.strategy, BatchStrategy::kMultiRecord);
  EXPECT_EQ(ResolveTransformParameters({{"MaxPayloadInMB", 0}}, json()).max_payload_bytes(), 0u);
}

TEST(TransformOutputKeyTest, RelativeKeyPlusOut) {
  EXPECT_EQ(TransformOutputKey("out", "2024/a.csv"), "out/2024/a.csv.out");
  EXPECT_EQ(TransformOutputKey("out/", "/a.csv"), "out/a.csv.out");
  EXPECT_EQ(TransformOutputKey("", "a.csv"), "a.csv.out");
}

}  // namespace
}  // namespace kiln::serving
