#include "api/transform_jobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/service_model.h"
#include "store/endpoint_repository.h"
#include "store/test_util/temp_database.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kArnPrefix = "arn:aws:sagemaker:us-east-1:123456789012:";

class FakeClock : public Clock {
 public:
  int64_t NowMillis() const override { return now; }
  int64_t now = 1714557600000;
};

// What the SageMaker Python SDK's Transformer.transform sends.
json Request(const std::string& name) {
  json request = json::parse(R"({
    "ModelName": "m",
    "BatchStrategy": "MultiRecord", "MaxConcurrentTransforms": 2, "MaxPayloadInMB": 1,
    "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/in/"}},
                       "ContentType": "text/csv", "SplitType": "Line", "CompressionType": "None"},
    "TransformOutput": {"S3OutputPath": "s3://b/out", "Accept": "text/csv", "AssembleWith": "Line"},
    "TransformResources": {"InstanceType": "ml.m5.large", "InstanceCount": 2},
    "DataProcessing": {"InputFilter": "$[1:]", "JoinSource": "Input"},
    "Environment": {"K": "v"},
    "Tags": [{"Key": "team", "Value": "ml"}]
  })");
  request["TransformJobName"] = name;
  return request;
}

class TransformJobsApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    store::DefinitionRepository models(db_.get(), store::DefinitionRepository::Kind::kModel);
    for (const auto& [name, model] :
         {std::pair<std::string, json>{"m", {{"ModelName", "m"}, {"PrimaryContainer", {{"Image", "local:/x"}}}}},
          {"pipeline", {{"ModelName", "pipeline"}, {"Containers", {{{"Image", "local:/a"}}, {{"Image", "local:/b"}}}}}},
          {"direct",
           {{"ModelName", "direct"},
            {"InferenceExecutionConfig", {{"Mode", "Direct"}}},
            {"Containers",
             {{{"Image", "local:/a"}, {"ContainerHostname", "a"}},
              {{"Image", "local:/b"}, {"ContainerHostname", "b"}}}}}},
          {"mme", {{"ModelName", "mme"}, {"PrimaryContainer", {{"Image", "local:/x"}, {"Mode", "MultiModel"}}}}}}) {
      ASSERT_TRUE(models.Insert({name, std::string(kArnPrefix) + "model/" + name, model, 1}).ok());
    }
    service_.SetModel(ServiceModel::SageMaker());
    TransformJobsContext ctx;
    ctx.database = db_.get();
    ctx.on_created = [this](const std::string& name) { created_.push_back(name); };
    ctx.on_stop_requested = [this](const std::string& name) { stopped_.push_back(name); };
    ctx.account_id = "123456789012";
    ctx.region = "us-east-1";
    ctx.clock = &clock_;
    ctx.check_feasible = [](const std::string& type, int count) {
      if (count > 3) return Status::ResourceExhausted(std::to_string(count) + " x " + type + " do not fit");
      return Status::Ok();
    };
    RegisterTransformJobOperations(&service_, ctx);
  }

  std::pair<int, json> Call(const std::string& operation, const json& input) {
    aws::RequestContext context;
    context.request_id = "req";
    auto response = service_.Handle(context, operation, input.dump());
    return {response.status, response.body.empty() ? json::object() : json::parse(response.body)};
  }
  json Ok(const std::string& operation, const json& input) {
    auto [status, body] = Call(operation, input);
    EXPECT_EQ(status, 200) << operation << ": " << body.dump();
    return body;
  }
  std::string Error(const std::string& type, const std::string& operation, const json& input) {
    auto [status, body] = Call(operation, input);
    EXPECT_EQ(status, 400) << body.dump();
    EXPECT_EQ(body.value("__type", ""), type) << body.dump();
    return body.value("message", "");
  }
  std::string Invalid(const json& request) { return Error("ValidationException", "CreateTransformJob", request); }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  FakeClock clock_;
  JsonService service_{"SageMaker", "sagemaker", aws::Protocol::kJson11};
  std::vector<std::string> created_, stopped_;
};

TEST_F(TransformJobsApiTest, CreateDescribeListStop) {
  json created = Ok("CreateTransformJob", Request("job-1"));
  EXPECT_EQ(created["TransformJobArn"], std::string(kArnPrefix) + "transform-job/job-1");
  EXPECT_EQ(created_, std::vector<std::string>{"job-1"});
  json d = Ok("DescribeTransformJob", {{"TransformJobName", "JOB-1"}});
  EXPECT_EQ(d["TransformJobName"], "job-1");
  EXPECT_EQ(d["TransformJobStatus"], "InProgress");
  EXPECT_EQ(d["ModelName"], "m");
  EXPECT_EQ(d["DataProcessing"], Request("x")["DataProcessing"]);
  EXPECT_EQ(d["TransformInput"], Request("x")["TransformInput"]);
  EXPECT_EQ(d["CreationTime"], 1714557600.0);
  EXPECT_FALSE(d.contains("Tags"));
  EXPECT_FALSE(d.contains("TransformEndTime"));
  // The model snapshot is kept with the job.
  store::TransformJobRepository jobs(db_.get());
  EXPECT_EQ(jobs.Get("job-1")->state.model["PrimaryContainer"]["Image"], "local:/x");

  EXPECT_THAT(Error("ResourceInUse", "CreateTransformJob", Request("Job-1")), HasSubstr("already exists"));
  clock_.now += 1000;
  Ok("CreateTransformJob", Request("job-2"));
  json list = Ok("ListTransformJobs", json::object());
  ASSERT_EQ(list["TransformJobSummaries"].size(), 2u);
  EXPECT_EQ(list["TransformJobSummaries"][0]["TransformJobName"], "job-2");  // newest first
  Ok("StopTransformJob", {{"TransformJobName", "job-1"}});
  EXPECT_EQ(stopped_, std::vector<std::string>{"job-1"});
  EXPECT_EQ(Ok("DescribeTransformJob", {{"TransformJobName", "job-1"}})["TransformJobStatus"], "Stopping");
  Ok("StopTransformJob", {{"TransformJobName", "job-1"}});  // again while Stopping: accepted, no new request
  EXPECT_EQ(stopped_.size(), 1u);
  ASSERT_TRUE(jobs.Mutate("job-1",
                          [](store::TransformJobRecord& r) {
                            r.status = store::TransformJobStatus::kStopped;
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_EQ(Error("ValidationException", "StopTransformJob", {{"TransformJobName", "job-1"}}),
            "The job status is Stopped; only InProgress jobs can be stopped.");
  list = Ok("ListTransformJobs", {{"StatusEquals", "Stopped"}});
  ASSERT_EQ(list["TransformJobSummaries"].size(), 1u);
}

TEST_F(TransformJobsApiTest, MissingJobsAndModels) {
  EXPECT_EQ(Error("ValidationException", "DescribeTransformJob", {{"TransformJobName", "nope"}}),
            "Could not find requested job with name nope");
  EXPECT_EQ(Error("ValidationException", "StopTransformJob", {{"TransformJobName", "nope"}}),
            "Could not find requested job with name nope");
  json request = Request("j");
  request["ModelName"] = "missing";
  EXPECT_EQ(Invalid(request), "Could not find model \"" + std::string(kArnPrefix) + "model/missing\".");
  // An inference pipeline runs (serving-contract.md §8.2); a Direct multi-container model cannot.
  request["ModelName"] = "direct";
  EXPECT_THAT(Invalid(request), HasSubstr("Mode Direct, which batch transform cannot call"));
  request["ModelName"] = "mme";
  EXPECT_THAT(Invalid(request), HasSubstr("Mode MultiModel"));
  EXPECT_TRUE(created_.empty());
}

TEST_F(TransformJobsApiTest, AwsRulesBeyondTheModel) {
  json request = Request("j");
  request["MaxPayloadInMB"] = 101;
  request["MaxConcurrentTransforms"] = 1;
  EXPECT_THAT(Invalid(request), HasSubstr("more than 100"));
  request["MaxPayloadInMB"] = 10;
  request["MaxConcurrentTransforms"] = 11;
  EXPECT_EQ(Invalid(request),
            "MaxConcurrentTransforms (11) x MaxPayloadInMB (10) must not exceed 100 MB; lower one "
            "of them.");
  request = Request("j");
  request["MaxPayloadInMB"] = 0;
  EXPECT_THAT(Invalid(request), HasSubstr("only allowed with SplitType None"));
  request = Request("j");
  request["TransformInput"]["SplitType"] = "None";
  EXPECT_THAT(Invalid(request), HasSubstr("BatchStrategy MultiRecord requires a SplitType other than None"));
  request = Request("j");
  request["TransformInput"]["DataSource"]["S3DataSource"]["S3DataType"] = "AugmentedManifestFile";
  EXPECT_THAT(Invalid(request), HasSubstr("use S3Prefix or ManifestFile"));
  request = Request("j");
  request["TransformOutput"]["S3OutputPath"] = "https://b.s3.amazonaws.com/out";
  EXPECT_THAT(Invalid(request), HasSubstr("must be an s3:// URI"));
  request = Request("j");
  request["DataProcessing"]["OutputFilter"] = "$..x";
  EXPECT_THAT(Invalid(request), HasSubstr("DataProcessing.OutputFilter: The JSONPath '$..x'"));
  request = Request("j");
  request["DataCaptureConfig"] = {{"DestinationS3Uri", "s3://b/capture"}};
  EXPECT_THAT(Invalid(request), HasSubstr("DataCaptureConfig is not supported"));
  request = Request("j");
  request["TransformResources"]["InstanceCount"] = 5;
  auto [status, body] = Call("CreateTransformJob", request);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["__type"], "ResourceLimitExceeded");
  EXPECT_THAT(body.value("message", ""), HasSubstr("lower TransformResources.InstanceCount to at most 3"));
  request = Request("j");
  request["Tags"] = {{{"Key", "aws:x"}, {"Value", "y"}}};
  EXPECT_THAT(Invalid(request), HasSubstr("reserved"));
  // The service model's own checks come first.
  request = Request("j");
  request["Environment"] = json::object();
  for (int i = 0; i < 17; ++i) request["Environment"]["K" + std::to_string(i)] = "v";
  Invalid(request);
  EXPECT_TRUE(created_.empty());
}

}  // namespace
}  // namespace kiln::api
