#include "agent/processing_layout.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>

#include "base/fs.h"
#include "store/test_util/temp_database.h"

namespace kiln::agent {
namespace {

using nlohmann::json;

json Request() {
  return json::parse(R"j({
    "ProcessingJobName": "p1",
    "RoleArn": "arn:aws:iam::1:role/r",
    "AppSpecification": {"ImageUri": "img"},
    "ProcessingResources": {"ClusterConfig": {"InstanceCount": 2, "InstanceType": "ml.m5.large", "VolumeSizeInGB": 1}},
    "ProcessingInputs": [
      {"InputName": "data", "S3Input": {"S3Uri": "s3://bkt/in", "LocalPath": "/opt/ml/processing/input/data",
                                        "S3DataType": "S3Prefix", "S3InputMode": "File"}},
      {"InputName": "code", "S3Input": {"S3Uri": "s3://bkt/code", "LocalPath": "/opt/ml/processing/input/code/",
                                        "S3DataType": "S3Prefix", "S3InputMode": "File"}}],
    "ProcessingOutputConfig": {"Outputs": [
      {"OutputName": "out", "S3Output": {"S3Uri": "s3://bkt/out", "LocalPath": "/opt/ml/processing/output/train",
                                         "S3UploadMode": "EndOfJob"}}]},
    "ExperimentConfig": {"TrialName": "t"}
  })j");
}

TEST(ProcessingLayoutTest, JobConfigHasTheArnTheContractMembersAndExplicitNulls) {
  const json config = json::parse(ProcessingJobConfigJson(Request(), "arn:p1"));
  EXPECT_EQ(config["ProcessingJobArn"], "arn:p1");
  EXPECT_EQ(config["ProcessingJobName"], "p1");
  EXPECT_EQ(config["AppSpecification"]["ImageUri"], "img");
  ASSERT_TRUE(config.contains("Environment"));
  EXPECT_TRUE(config["Environment"].is_null());
  ASSERT_TRUE(config.contains("StoppingCondition"));
  EXPECT_TRUE(config["StoppingCondition"].is_null());
  EXPECT_TRUE(config["NetworkConfig"].is_null());
  EXPECT_EQ(config["ExperimentConfig"]["TrialName"], "t");  // other members kept
  EXPECT_EQ(config["ProcessingInputs"].size(), 2u);
  // The contract's members come first, in order.
  const std::string text = ProcessingJobConfigJson(Request(), "arn:p1");
  EXPECT_EQ(text.find("{\"ProcessingJobArn\":\"arn:p1\",\"ProcessingJobName\":\"p1\""), 0u) << text;
}

TEST(ProcessingLayoutTest, ResourceConfigSortsTheHosts) {
  EXPECT_EQ(ProcessingResourceConfigJson("algo-2", {"algo-2", "algo-10", "algo-1"}),
            R"({"current_host":"algo-2","hosts":["algo-1","algo-10","algo-2"]})");
}

TEST(ProcessingLayoutTest, WritesConfigFilesAndCreatesEveryLocalPath) {
  store::testing::TempDir dir;
  const std::string opt_ml = dir.path() + "/opt_ml";
  ASSERT_TRUE(WriteProcessingLayout(opt_ml, Request(), "arn:p1", "algo-1", {"algo-1", "algo-2"}).ok());
  namespace fs = std::filesystem;
  EXPECT_TRUE(fs::is_directory(opt_ml + "/processing/input/data"));
  EXPECT_TRUE(fs::is_directory(opt_ml + "/processing/input/code"));
  EXPECT_TRUE(fs::is_directory(opt_ml + "/processing/output/train"));
  EXPECT_TRUE(fs::is_directory(opt_ml + "/output"));
  auto resource = ReadFile(opt_ml + "/config/resourceconfig.json");
  ASSERT_TRUE(resource.ok());
  EXPECT_EQ(json::parse(*resource)["current_host"], "algo-1");
  auto job = ReadFile(opt_ml + "/config/processingjobconfig.json");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(json::parse(*job)["ProcessingJobArn"], "arn:p1");
  struct stat st;
  ASSERT_EQ(stat((opt_ml + "/config/processingjobconfig.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  // A restart rewrites the files over the read-only ones.
  EXPECT_TRUE(WriteProcessingLayout(opt_ml, Request(), "arn:p1", "algo-1", {"algo-1", "algo-2"}).ok());
}

TEST(ProcessingLayoutTest, RefusesALocalPathOutsideOptMl) {
  store::testing::TempDir dir;
  json request = Request();
  request["ProcessingInputs"][0]["S3Input"]["LocalPath"] = "/opt/ml/../etc";
  Status s = WriteProcessingLayout(dir.path() + "/opt_ml", request, "arn", "algo-1", {"algo-1"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message().rfind("ClientError: ", 0), 0u) << s.message();
}

// What `command` printed on stdout (popen: through /bin/sh).
std::string Output(const std::string& command) {
  std::string out;
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return "popen failed";
  char buffer[256];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) out.append(buffer, n);
  pclose(f);
  return out;
}

TEST(ProcessingLayoutTest, InterpreterShimsRunTheInterpreterWithTheirArguments) {
  store::testing::TempDir dir;
  const std::string opt_ml = dir.path() + "/opt_ml";
  // An "interpreter" that shows its arguments, at a path that needs quoting.
  const std::string interpreter = dir.path() + "/it's an interpreter";
  std::filesystem::create_symlink("/bin/echo", interpreter);
  ASSERT_TRUE(WriteInterpreterShims(opt_ml, interpreter).ok());
  const std::string bin = opt_ml + "/.kiln/bin/";
  EXPECT_EQ(Output("'" + bin + "python' a 'b  c'"), "a b  c\n");
  EXPECT_EQ(Output("'" + bin + "python3' -c x"), "-c x\n");
  EXPECT_EQ(Output("'" + bin + "pip' install -r r.txt"), "-m pip install -r r.txt\n");
  EXPECT_EQ(Output("'" + bin + "pip3' --version"), "-m pip --version\n");
  struct stat st;
  ASSERT_EQ(stat((bin + "python").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  // Written again (a restart) over the old ones.
  EXPECT_TRUE(WriteInterpreterShims(opt_ml, "/bin/echo").ok());
  EXPECT_EQ(Output("'" + bin + "python' again"), "again\n");
  EXPECT_EQ(WriteInterpreterShims(opt_ml, "python3").code(), StatusCode::kInvalidArgument);
}

class ExitMessageTest : public ::testing::Test {
 protected:
  std::string Host(int n, const std::string& message) {
    std::string opt_ml = dir_.path() + "/algo-" + std::to_string(n);
    EXPECT_TRUE(MakeDirs(opt_ml + "/output").ok());
    if (!message.empty()) {
      EXPECT_TRUE(WriteFileAtomic(opt_ml + "/output/message", message).ok());
    }
    return opt_ml;
  }
  store::testing::TempDir dir_;
};

TEST_F(ExitMessageTest, ConcatenatesHostsAndCutsAtOneKiB) {
  const std::string a = Host(1, "first;");
  const std::string b = Host(2, "");
  const std::string c = Host(3, "third");
  auto m = ReadExitMessage({a, b, c});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, "first;third");
  EXPECT_EQ(*ReadExitMessage({}), "");

  // 1023 ASCII bytes then a 3-byte character: the character does not fit and is left out whole.
  const std::string d = Host(4, std::string(1023, 'x') + "\xe2\x82\xac" + "tail");
  auto cut = ReadExitMessage({d});
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(*cut, std::string(1023, 'x'));
  const std::string e = Host(5, std::string(5000, 'y'));
  EXPECT_EQ(ReadExitMessage({a, e})->size(), 1024u);
}

TEST_F(ExitMessageTest, InvalidUtf8IsAClientErrorNamingTheHost) {
  const std::string a = Host(1, "ok");
  const std::string b = Host(2, "bad \xff byte");
  auto m = ReadExitMessage({a, b}, {"algo-1", "algo-2"});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("ClientError: /opt/ml/output/message of algo-2 is not valid UTF-8"),
            std::string::npos)
      << m.status().message();
  // A message that is valid but long is cut where our read stops, without an error.
  const std::string c = Host(3, std::string(4095, 'z') + "\xc3\xa9");
  EXPECT_TRUE(ReadExitMessage({c}).ok());
}

}  // namespace
}  // namespace kiln::agent
