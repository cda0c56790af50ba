#include "agent/processing_inputs.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>

#include "agent/test_util/agent_fixture.h"

namespace kiln::agent {
namespace {

using nlohmann::json;
using testing::AgentTest;

json Input(const std::string& uri, const std::string& distribution = "FullyReplicated",
           const std::string& compression = "None", const std::string& type = "S3Prefix") {
  return json{{"InputName", "data"},
              {"S3Input",
               {{"S3Uri", uri},
                {"LocalPath", "/opt/ml/processing/input"},
                {"S3DataType", type},
                {"S3InputMode", "File"},
                {"S3DataDistributionType", distribution},
                {"S3CompressionType", compression}}}};
}

std::string Gzip(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(data.size() + 128, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

class ProcessingInputsTest : public AgentTest {
 protected:
  Result<InputStagingReport> Stage(const json& input, int index, int count, const std::string& dir) {
    CancelFlag cancel;
    StageOptions options;
    options.parallelism = 2;
    options.buffer_size = 7;  // several buffers per object
    return StageProcessingInput(*store_, input, "arn:role", index, count, dir, cancel, options);
  }
};

TEST(ProcessingInputChannelTest, MapsTheS3InputToAChannel) {
  const json channel = ProcessingInputChannel(
      json::parse(R"({"InputName":"x","S3Input":{"S3Uri":"s3://b/p","S3InputMode":"Pipe","S3DataType":"ManifestFile",
                      "S3DataDistributionType":"ShardedByS3Key","S3CompressionType":"Gzip"}})"),
      "chan");
  EXPECT_EQ(channel["ChannelName"], "chan");
  EXPECT_EQ(channel["InputMode"], "Pipe");
  EXPECT_EQ(channel["CompressionType"], "Gzip");
  EXPECT_EQ(channel["DataSource"]["S3DataSource"]["S3DataType"], "ManifestFile");
  EXPECT_EQ(channel["DataSource"]["S3DataSource"]["S3Uri"], "s3://b/p");
  EXPECT_EQ(channel["DataSource"]["S3DataSource"]["S3DataDistributionType"], "ShardedByS3Key");
  const json defaults = ProcessingInputChannel(json::parse(R"({"S3Input":{"S3Uri":"s3://b/p"}})"), "c");
  EXPECT_EQ(defaults["InputMode"], "File");
  EXPECT_EQ(defaults["CompressionType"], "None");
  EXPECT_EQ(defaults["DataSource"]["S3DataSource"]["S3DataDistributionType"], "FullyReplicated");
  EXPECT_FALSE(ProcessingInputChannel(json::object(), "c").contains("DataSource"));
}

TEST_F(ProcessingInputsTest, StagesAPrefixWithTheChannelLayout) {
  Put("in/a.csv", "aaaaaaaaaaaaaaaaaaaa");
  Put("in/sub/b.csv", "bb");
  Put("in/", "");  // folder marker
  const std::string dir = work() + "/local";
  auto report = Stage(Input("s3://bkt/in"), 0, 1, dir);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->objects, 2u);
  EXPECT_EQ(report->bytes, 22u);
  EXPECT_EQ(Slurp(dir + "/a.csv"), "aaaaaaaaaaaaaaaaaaaa");
  EXPECT_EQ(Slurp(dir + "/sub/b.csv"), "bb");
}

TEST_F(ProcessingInputsTest, ShardsByKeyAcrossHosts) {
  for (const char* k : {"in/1", "in/2", "in/3"}) Put(k, k);
  const std::string h0 = work() + "/h0", h1 = work() + "/h1";
  ASSERT_TRUE(Stage(Input("s3://bkt/in", "ShardedByS3Key"), 0, 2, h0).ok());
  ASSERT_TRUE(Stage(Input("s3://bkt/in", "ShardedByS3Key"), 1, 2, h1).ok());
  EXPECT_TRUE(std::filesystem::exists(h0 + "/1"));
  EXPECT_FALSE(std::filesystem::exists(h0 + "/2"));
  EXPECT_TRUE(std::filesystem::exists(h0 + "/3"));
  EXPECT_TRUE(std::filesystem::exists(h1 + "/2"));
  EXPECT_FALSE(std::filesystem::exists(h1 + "/1"));
}

TEST_F(ProcessingInputsTest, ManifestFile) {
  Put("data/x.txt", "x");
  Put("data/y/z.txt", "z");
  Put("m.json", R"([{"prefix":"s3://bkt/data/"},"x.txt","y/z.txt"])");
  const std::string dir = work() + "/m";
  ASSERT_TRUE(Stage(Input("s3://bkt/m.json", "FullyReplicated", "None", "ManifestFile"), 0, 1, dir).ok());
  EXPECT_EQ(Slurp(dir + "/x.txt"), "x");
  EXPECT_EQ(Slurp(dir + "/y/z.txt"), "z");
}

TEST_F(ProcessingInputsTest, GzipIsDecompressedAndBadGzipIsAClientError) {
  Put("gz/a.gz", Gzip("hello, processing"));
  const std::string dir = work() + "/gz";
  auto report = Stage(Input("s3://bkt/gz", "FullyReplicated", "Gzip"), 0, 1, dir);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(Slurp(dir + "/a.gz"), "hello, processing");
  EXPECT_EQ(report->bytes, 17u);

  Put("bad/a.gz", "not gzip at all");
  auto bad = Stage(Input("s3://bkt/bad", "FullyReplicated", "Gzip"), 0, 1, work() + "/bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("ClientError: ", 0), 0u) << bad.status().message();
  EXPECT_FALSE(std::filesystem::exists(work() + "/bad/a.gz"));
}

TEST_F(ProcessingInputsTest, EmptySelectionAndCancel) {
  auto none = Stage(Input("s3://bkt/nothing"), 0, 1, work() + "/n");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("No S3 objects found"), std::string::npos);

  Put("in/a", "a");
  CancelFlag cancel;
  cancel.Cancel();
  auto stopped = StageProcessingInput(*store_, Input("s3://bkt/in"), "r", 0, 1, work() + "/c", cancel);
  EXPECT_EQ(stopped.status().code(), StatusCode::kAborted);
}

}  // namespace
}  // namespace kiln::agent
