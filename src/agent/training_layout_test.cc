#include "agent/training_layout.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "agent/artifacts.h"
#include "agent/test_util/agent_fixture.h"

namespace kiln::agent {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using testing::AgentTest;

// The request behind the examples of training-contract.md §4.1-§4.3.
json ReferenceRequest() {
  return json::parse(R"({
    "TrainingJobName": "pt-job-2024-05-01-10-00-00-000",
    "RoleArn": "arn:aws:iam::123456789012:role/r",
    "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
    "HyperParameters": {
      "epochs": "25", "batch-size": "64", "lr": "0.001", "use-amp": "true",
      "sagemaker_program": "\"train.py\"",
      "sagemaker_submit_directory": "\"s3://my-bucket/pt-job-2024-05-01-10-00-00-000/source/sourcedir.tar.gz\"",
      "sagemaker_container_log_level": "20",
      "sagemaker_job_name": "\"pt-job-2024-05-01-10-00-00-000\"",
      "sagemaker_region": "\"us-east-1\"",
      "sagemaker_torch_distributed_enabled": "true",
      "sagemaker_instance_type": "\"ml.g5.12xlarge\""},
    "InputDataConfig": [
      {"ChannelName": "train", "ContentType": "text/csv",
       "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/train/",
                                        "S3DataDistributionType": "ShardedByS3Key"}}},
      {"ChannelName": "validation", "InputMode": "FastFile", "CompressionType": "None",
       "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/val/"}}},
      {"ChannelName": "images", "ContentType": "application/x-recordio", "InputMode": "Pipe",
       "RecordWrapperType": "RecordIO", "CompressionType": "Gzip",
       "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/img/",
                                        "S3DataDistributionType": "FullyReplicated"}}}],
    "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
    "ResourceConfig": {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 3, "VolumeSizeInGB": 50},
    "DebugHookConfig": {"S3OutputPath": "s3://b/debug/job-1",
                        "HookParameters": {"train.save_interval": "100"},
                        "CollectionConfigurations": [{"CollectionName": "losses", "CollectionParameters": {}}]},
    "CheckpointConfig": {"S3Uri": "s3://b/ckpt", "LocalPath": "/opt/ml/checkpoints/run1"}
  })");
}

// §4.2 example, verbatim.
constexpr const char* kInputDataConfigExample = R"({
  "train":      {"ContentType": "text/csv", "TrainingInputMode": "File",
                 "S3DistributionType": "ShardedByS3Key", "RecordWrapperType": "None"},
  "validation": {"TrainingInputMode": "FastFile",
                 "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"},
  "images":     {"ContentType": "application/x-recordio", "TrainingInputMode": "Pipe",
                 "S3DistributionType": "FullyReplicated", "RecordWrapperType": "RecordIO",
                 "CompressionType": "Gzip"}
})";

// §4.3 example, verbatim.
constexpr const char* kResourceConfigExample = R"({
  "current_host": "algo-2",
  "hosts": ["algo-1", "algo-2", "algo-3"],
  "network_interface_name": "eth0",
  "current_instance_type": "ml.g5.12xlarge",
  "current_group_name": "homogeneousCluster",
  "instance_groups": [
    {"instance_group_name": "homogeneousCluster",
     "instance_type": "ml.g5.12xlarge",
     "hosts": ["algo-1", "algo-2", "algo-3"]}
  ]
})";

class LayoutTest : public AgentTest {};

TEST_F(LayoutTest, WritesTreeAndFilesForReferenceRequest) {
  json request = ReferenceRequest();
  auto hosts = HostLayoutsForRequest(request);
  ASSERT_EQ(hosts.size(), 3u);
  std::string opt_ml = work() + "/algo-2";
  ASSERT_TRUE(WriteTrainingLayout(opt_ml, request, hosts[1]).ok());
  for (const char* d :
       {"input/config", "input/data", "code", "model", "output", "output/data", "checkpoints", "checkpoints/run1"}) {
    struct stat st;
    ASSERT_EQ(stat((opt_ml + "/" + d).c_str(), &st), 0) << d;
    EXPECT_TRUE(S_ISDIR(st.st_mode)) << d;
  }
  // Byte for byte: the contract's examples in compact form, members in the contract's order.
  EXPECT_EQ(Slurp(opt_ml + "/input/config/inputdataconfig.json"), ordered_json::parse(kInputDataConfigExample).dump());
  EXPECT_EQ(Slurp(opt_ml + "/input/config/resourceconfig.json"), ordered_json::parse(kResourceConfigExample).dump());
  std::string hp = Slurp(opt_ml + "/input/config/hyperparameters.json");
  EXPECT_EQ(json::parse(hp), request["HyperParameters"]);
  EXPECT_NE(hp.find(R"("sagemaker_program":"\"train.py\"")"), std::string::npos) << hp;
  EXPECT_EQ(hp.substr(0, 40), R"({"batch-size":"64","epochs":"25","lr":"0)");
  json debug = json::parse(Slurp(opt_ml + "/input/config/debughookconfig.json"));
  EXPECT_EQ(debug["LocalPath"], "/opt/ml/output/tensors");
  EXPECT_EQ(debug["HookParameters"]["train.save_interval"], "100");
  EXPECT_EQ(debug["CollectionConfigurations"][0]["CollectionName"], "losses");
  EXPECT_FALSE(PathExists(opt_ml + "/input/config/tensorboardoutputconfig.json"));
  EXPECT_FALSE(PathExists(opt_ml + "/input/config/profilerconfig.json"));
  struct stat st;
  ASSERT_EQ(stat((opt_ml + "/input/config/hyperparameters.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  // A restart rewrites the read-only files.
  EXPECT_TRUE(WriteTrainingLayout(opt_ml, request, hosts[1]).ok());
}

TEST_F(LayoutTest, OptionalFilesKeepGivenLocalPath) {
  json request = json::parse(R"({"AlgorithmSpecification": {"TrainingInputMode": "Pipe"},
      "TensorBoardOutputConfig": {"S3OutputPath": "s3://b/tb", "LocalPath": "/opt/ml/output/tb2"},
      "ProfilerConfig": {"S3OutputPath": "s3://b/prof", "ProfilingIntervalInMilliseconds": 500},
      "InputDataConfig": [{"ChannelName": "c", "ShuffleConfig": {"Seed": 7},
          "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/c"}}},
        {"ChannelName": "fs", "DataSource": {"FileSystemDataSource": {"FileSystemId": "fs-1",
          "FileSystemType": "EFS", "DirectoryPath": "/x", "FileSystemAccessMode": "ro"}}}]})");
  HostLayout host;
  host.current_host = "algo-1";
  host.hosts = {"algo-1"};
  host.instance_type = "ml.m5.xlarge";
  std::string opt_ml = work() + "/h";
  ASSERT_TRUE(WriteTrainingLayout(opt_ml, request, host).ok());
  EXPECT_EQ(json::parse(Slurp(opt_ml + "/input/config/tensorboardoutputconfig.json"))["LocalPath"],
            "/opt/ml/output/tb2");
  EXPECT_EQ(json::parse(Slurp(opt_ml + "/input/config/profilerconfig.json"))["ProfilingIntervalInMilliseconds"], 500);
  EXPECT_EQ(Slurp(opt_ml + "/input/config/inputdataconfig.json"),
            R"({"c":{"TrainingInputMode":"Pipe","S3DistributionType":"FullyReplicated","RecordWrapperType":"None",)"
            R"("ShuffleConfig":{"Seed":7}},"fs":{"TrainingInputMode":"Pipe","S3DistributionType":"FullyReplicated",)"
            R"("RecordWrapperType":"None"}})");
  EXPECT_EQ(Slurp(opt_ml + "/input/config/hyperparameters.json"), "{}");
}

TEST_F(LayoutTest, NoChannelsGivesEmptyObject) {
  EXPECT_EQ(InputDataConfigJson(json::parse(R"({"AlgorithmSpecification": {"TrainingInputMode": "File"}})")), "{}");
}

TEST(HostLayoutTest, HostsSortLexicographically) {
  auto hosts = HostLayoutsForRequest(json::parse(R"({"ResourceConfig": {"InstanceType": "ml.c5.xlarge",
                                                       "InstanceCount": 11}})"));
  ASSERT_EQ(hosts.size(), 11u);
  json rc = json::parse(ResourceConfigJson(hosts[1]));
  EXPECT_EQ(rc["current_host"], "algo-2");
  EXPECT_EQ(rc["hosts"][0], "algo-1");
  EXPECT_EQ(rc["hosts"][1], "algo-10");
  EXPECT_EQ(rc["hosts"][2], "algo-11");
  EXPECT_EQ(rc["hosts"][3], "algo-2");
  EXPECT_EQ(hosts[1].ShardIndex(), 3);
  EXPECT_EQ(hosts[9].ShardIndex(), 1);
}

TEST(HostLayoutTest, InstanceGroupsNumberAcrossGroups) {
  auto hosts = HostLayoutsForRequest(json::parse(R"({"ResourceConfig": {"InstanceGroups": [
      {"InstanceGroupName": "data", "InstanceType": "ml.c5.xlarge", "InstanceCount": 2},
      {"InstanceGroupName": "gpu", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1}]}})"));
  ASSERT_EQ(hosts.size(), 3u);
  json rc = json::parse(ResourceConfigJson(hosts[2]));
  EXPECT_EQ(rc["current_host"], "algo-3");
  EXPECT_EQ(rc["current_group_name"], "gpu");
  EXPECT_EQ(rc["current_instance_type"], "ml.p4d.24xlarge");
  EXPECT_EQ(rc["hosts"], json::parse(R"(["algo-1","algo-2","algo-3"])"));
  EXPECT_EQ(rc["instance_groups"], json::parse(R"([
      {"instance_group_name": "data", "instance_type": "ml.c5.xlarge", "hosts": ["algo-1", "algo-2"]},
      {"instance_group_name": "gpu", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-3"]}])"));
}

TEST(SandboxPathTest, MapsUnderOptMlOnly) {
  EXPECT_EQ(*SandboxPathToHost("/srv/j/algo-1", "/opt/ml/checkpoints/"), "/srv/j/algo-1/checkpoints");
  EXPECT_EQ(*SandboxPathToHost("/srv/j/algo-1/", "/opt/ml"), "/srv/j/algo-1");
  EXPECT_EQ(*SandboxPathToHost("/h", "/opt/ml/a/./b/../c"), "/h/a/c");
  for (const char* bad : {"/tmp/ckpt", "opt/ml/x", "/opt/ml/../etc", "/opt/mlx", "", "/opt"}) {
    auto r = SandboxPathToHost("/h", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
    EXPECT_NE(r.status().message().find("/opt/ml"), std::string::npos);
  }
  json request = json::parse(R"({"CheckpointConfig": {"S3Uri": "s3://b/c", "LocalPath": "/data/ckpt"}})");
  HostLayout host;
  host.current_host = "algo-1";
  host.hosts = {"algo-1"};
  EXPECT_FALSE(WriteTrainingLayout(::testing::TempDir() + "/kiln-layout-bad", request, host).ok());
}

TEST(S3UriTest, Parses) {
  auto a = ParseS3Uri("s3://bucket/some/prefix/");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->bucket, "bucket");
  EXPECT_EQ(a->key, "some/prefix/");
  EXPECT_EQ(ParseS3Uri("s3://bucket")->key, "");
  EXPECT_EQ(ParseS3Uri("S3://bucket/k")->key, "k");
  for (const char* bad : {"http://b/k", "s3:/b/k", "s3:///k", "/local/path", "gs://b/k"}) {
    auto r = ParseS3Uri(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
    EXPECT_NE(r.status().message().find(bad), std::string::npos);
  }
  EXPECT_EQ(JoinKey("a/b/", "/c"), "a/b/c");
  EXPECT_EQ(JoinKey("a", "c"), "a/c");
  EXPECT_EQ(JoinKey("", "c"), "c");
}

TEST_F(LayoutTest, FailureReasonIsFirst1024CharactersUtf8Safe) {
  EXPECT_EQ(ReadFailureReason(work()), "");
  ASSERT_TRUE(MakeDirs(work() + "/output").ok());
  ASSERT_TRUE(WriteFileAtomic(work() + "/output/failure", "ValueError: bad lr\n").ok());
  EXPECT_EQ(ReadFailureReason(work()), "ValueError: bad lr\n");
  std::string euro = "\xe2\x82\xac";  // 3 bytes, one character
  std::string text;
  for (int i = 0; i < 2000; ++i) text += euro;
  ASSERT_TRUE(WriteFileAtomic(work() + "/output/failure", text).ok());
  std::string r = ReadFailureReason(work());
  EXPECT_EQ(r.size(), 1024u * 3);
  EXPECT_EQ(r, text.substr(0, 1024 * 3));
  ASSERT_TRUE(WriteFileAtomic(work() + "/output/failure", std::string("a\xff") + "b").ok());
  EXPECT_EQ(ReadFailureReason(work()),
            "a\xef\xbf\xbd"
            "b");
}

}  // namespace
}  // namespace kiln::agent
