#include "api/service_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace kiln::api {
namespace {

using nlohmann::json;

json ValidTrainingJob() {
  return json::parse(R"json({
    "TrainingJobName": "churn-xgb-2024-05-01",
    "HyperParameters": {"epochs": "10", "lr": "0.01"},
    "AlgorithmSpecification": {
      "TrainingImage": "kiln/xgboost:1.7",
      "TrainingInputMode": "File",
      "MetricDefinitions": [{"Name": "train:loss", "Regex": "Train Loss = (.*?);"},
                            {"Name": "val:acc", "Regex": "Val Accuracy = ([0-9.]+)"}],
      "EnableSageMakerMetricsTimeSeries": true
    },
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
    "InputDataConfig": [
      {"ChannelName": "train", "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
        "S3Uri": "s3://bucket/train/", "S3DataDistributionType": "FullyReplicated"}},
       "ContentType": "text/csv", "CompressionType": "None", "InputMode": "File"},
      {"ChannelName": "validation", "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
        "S3Uri": "s3://bucket/validation/"}}}
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/output/"},
    "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
    "Tags": [{"Key": "team", "Value": "ml platform"}, {"Key": "Équipe", "Value": "東京"}],
    "EnableNetworkIsolation": false,
    "Environment": {"MY_VAR": "1", "_OTHER": "x y"},
    "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints/"},
    "SomeFutureMember": {"anything": [1, 2, 3]}
  })json");
}

class ServiceModelTest : public ::testing::Test {
 protected:
  std::shared_ptr<const ServiceModel> model_ = ServiceModel::SageMaker();

  // The whole error message for `request`, or "" when valid.
  std::string Message(const json& request, const std::string& operation = "CreateTrainingJob") {
    auto error = model_->ValidateInput(operation, request);
    if (!error) return "";
    return error->code + ": " + error->message;
  }
};

TEST_F(ServiceModelTest, EmbeddedModelParsesAndKnowsOperations) {
  ASSERT_NE(model_, nullptr);
  EXPECT_EQ(model_, ServiceModel::SageMaker());  // parsed once
  EXPECT_GT(model_->TEST_ShapeCount(), 2000u);
  EXPECT_TRUE(model_->HasOperation("CreateTrainingJob"));
  EXPECT_TRUE(model_->HasOperation("DescribeEndpoint"));
  EXPECT_FALSE(model_->HasOperation("CreateTrainingJobs"));
  EXPECT_GT(EmbeddedSageMakerModelJson().size(), 100000u);
  EXPECT_EQ(EmbeddedSageMakerModelJson().find("\"documentation\""), std::string_view::npos);
}

TEST_F(ServiceModelTest, EveryModelPatternCompiles) {
  Status status = model_->TEST_CompileAllPatterns();
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST_F(ServiceModelTest, ValidFullRequestPasses) {
  EXPECT_EQ(Message(ValidTrainingJob()), "");
  EXPECT_EQ(Message(json::parse(R"({"TrainingJobName": "a"})"), "DescribeTrainingJob"), "");
}

TEST_F(ServiceModelTest, BadNamePattern) {
  json request = ValidTrainingJob();
  request["TrainingJobName"] = "x y";
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value 'x y' at 'trainingJobName' failed to satisfy "
            "constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}");
}

TEST_F(ServiceModelTest, NameTooLongGivesLengthAndPatternErrors) {
  json request = ValidTrainingJob();
  std::string name(64, 'a');
  request["TrainingJobName"] = name;
  EXPECT_EQ(Message(request),
            "ValidationException: 2 validation errors detected: Value '" + name +
                "' at 'trainingJobName' failed to satisfy constraint: Member must have length less than or equal to "
                "63; Value '" +
                name +
                "' at 'trainingJobName' failed to satisfy constraint: Member must satisfy regular expression "
                "pattern: [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}");
}

TEST_F(ServiceModelTest, MissingAndNullRequiredMembers) {
  json request = ValidTrainingJob();
  request.erase("RoleArn");
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value null at 'roleArn' failed to satisfy constraint: "
            "Member must not be null");
  request["RoleArn"] = nullptr;  // null and absent are the same
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value null at 'roleArn' failed to satisfy constraint: "
            "Member must not be null");
  EXPECT_EQ(Message(json::object()),
            "ValidationException: 3 validation errors detected: "
            "Value null at 'trainingJobName' failed to satisfy constraint: Member must not be null; "
            "Value null at 'roleArn' failed to satisfy constraint: Member must not be null; "
            "Value null at 'outputDataConfig' failed to satisfy constraint: Member must not be null");
}

TEST_F(ServiceModelTest, BadInstanceTypeEnumListsValuesInModelOrder) {
  json request = ValidTrainingJob();
  request["ResourceConfig"]["InstanceType"] = "ml.t2.medium";
  std::string message = Message(request);
  EXPECT_EQ(message.rfind("ValidationException: 1 validation error detected: Value 'ml.t2.medium' at "
                          "'resourceConfig.instanceType' failed to satisfy constraint: Member must satisfy enum value "
                          "set: [ml.m4.xlarge, ml.m4.2xlarge, ml.m4.4xlarge, ",
                          0),
            0u)
      << message;
  EXPECT_EQ(message.back(), ']');
}

TEST_F(ServiceModelTest, NumericRanges) {
  json request = ValidTrainingJob();
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = 0;
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value '0' at 'stoppingCondition.maxRuntimeInSeconds' "
            "failed to satisfy constraint: Member must have value greater than or equal to 1");
  // The current model allows VolumeSizeInGB 0 (OptionalVolumeSizeInGB, min 0); below that fails.
  request = ValidTrainingJob();
  request["ResourceConfig"]["VolumeSizeInGB"] = 0;
  EXPECT_EQ(Message(request), "");
  request["ResourceConfig"]["VolumeSizeInGB"] = -1;
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value '-1' at 'resourceConfig.volumeSizeInGB' failed "
            "to satisfy constraint: Member must have value greater than or equal to 0");
  // A fractional number for an integer is truncated, as AWS does.
  request["ResourceConfig"]["VolumeSizeInGB"] = 0.5;
  EXPECT_EQ(Message(request), "");
}

TEST_F(ServiceModelTest, TooManyChannels) {
  json request = ValidTrainingJob();
  json channel = request["InputDataConfig"][0];
  request["InputDataConfig"] = json::array();
  for (int i = 0; i < 21; ++i) {
    channel["ChannelName"] = "c" + std::to_string(i);
    request["InputDataConfig"].push_back(channel);
  }
  std::string message = Message(request);
  EXPECT_EQ(message.rfind("ValidationException: 1 validation error detected: Value '[{ChannelName=c0, ", 0), 0u)
      << message;
  EXPECT_NE(message.find("' at 'inputDataConfig' failed to satisfy constraint: Member must have length less than or "
                         "equal to 20"),
            std::string::npos)
      << message;
}

TEST_F(ServiceModelTest, HyperParameterValueTooLong) {
  json request = ValidTrainingJob();
  std::string value(2501, 'v');
  request["HyperParameters"] = {{"big", value}};
  // The value is quoted up to 1,024 bytes, then "...".
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value '{big=" + value.substr(0, 1024 - 5) +
                "...' at 'hyperParameters' failed to satisfy constraint: Map value must satisfy constraint: [Member "
                "must have length less than or equal to 2500, Member must have length greater than or equal to 0, "
                "Member must satisfy regular expression pattern: .*]");
}

TEST_F(ServiceModelTest, HugeValuesAreQuotedAsABoundedPrefix) {
  // A 10 MB member used to be quoted whole (a 42 MB message). UTF-8 is cut on a boundary.
  json request = ValidTrainingJob();
  std::string huge = "é" + std::string(10 * 1024 * 1024, 'x');
  request["TrainingJobName"] = huge;
  std::string message = Message(request);
  EXPECT_LT(message.size(), 4096u) << message.substr(0, 200);
  EXPECT_NE(message.find("Value 'éxxx"), std::string::npos);
  EXPECT_NE(message.find("x...' at 'trainingJobName'"), std::string::npos);

  request = ValidTrainingJob();
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = "é" + std::string(1 << 20, 'y');
  message = Message(request);
  EXPECT_LT(message.size(), 512u);
  EXPECT_EQ(message,
            "SerializationException: class java.lang.String can not be converted to an Integer (at "
            "'stoppingCondition.maxRuntimeInSeconds')");

  request = ValidTrainingJob();
  request["EnableNetworkIsolation"] = std::string(1 << 20, 'z');
  EXPECT_LT(Message(request).size(), 512u);

  // Map keys are part of the path: bounded too.
  request = ValidTrainingJob();
  request["Environment"] = {{std::string(1 << 20, 'K'), "v"}};
  message = Message(request);
  EXPECT_LT(message.size(), 8192u);
  EXPECT_EQ(message.rfind("ValidationException: ", 0), 0u);
}

TEST_F(ServiceModelTest, IntegersOutsideJavaRangesAreSerializationExceptions) {
  json request = ValidTrainingJob();
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = int64_t{1} << 62;
  EXPECT_EQ(Message(request),
            "SerializationException: Numeric value (4611686018427387904) out of range of int "
            "(-2147483648 - 2147483647) (at 'stoppingCondition.maxRuntimeInSeconds')");
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = 2147483648LL;
  EXPECT_NE(Message(request).find("out of range of int"), std::string::npos);
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = 2147483647LL;  // in range; no max in the model
  EXPECT_EQ(Message(request), "");
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = 1e300;
  EXPECT_NE(Message(request).find("out of range of int"), std::string::npos);
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = uint64_t{18446744073709551615ULL};
  EXPECT_NE(Message(request).find("(18446744073709551615) out of range of int"), std::string::npos);
  request["ResourceConfig"]["VolumeSizeInGB"] = -2147483649LL;
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = 60;
  EXPECT_NE(Message(request).find("out of range of int"), std::string::npos);

  // A long: DescribePipeline's PipelineVersionId.
  json describe = {{"PipelineName", "p"}, {"PipelineVersionId", int64_t{1} << 62}};
  EXPECT_EQ(Message(describe, "DescribePipeline"), "");
  describe["PipelineVersionId"] = uint64_t{1} << 63;
  EXPECT_EQ(Message(describe, "DescribePipeline"),
            "SerializationException: Numeric value (9223372036854775808) out of range of long (-9223372036854775808 - "
            "9223372036854775807) (at 'pipelineVersionId')");
  describe["PipelineVersionId"] = 9.3e18;
  EXPECT_NE(Message(describe, "DescribePipeline").find("out of range of long"), std::string::npos);
}

TEST_F(ServiceModelTest, BadEnvironmentKey) {
  json request = ValidTrainingJob();
  request["Environment"] = {{"1BAD", "x"}};
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value '{1BAD=x}' at 'environment' failed to satisfy "
            "constraint: Map keys must satisfy constraint: [Member must have length less than or equal to 512, "
            "Member must have length greater than or equal to 0, Member must satisfy regular expression pattern: "
            "[a-zA-Z_][a-zA-Z0-9_]*]");
}

TEST_F(ServiceModelTest, MetricDefinitionRegexTooLongHasNestedListPath) {
  json request = ValidTrainingJob();
  std::string regex(501, 'r');
  request["AlgorithmSpecification"]["MetricDefinitions"][1]["Regex"] = regex;
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value '" + regex +
                "' at 'algorithmSpecification.metricDefinitions.2.member.regex' failed to satisfy constraint: Member "
                "must have length less than or equal to 500");
}

TEST_F(ServiceModelTest, TagKeyWithBadCharacters) {
  json request = ValidTrainingJob();
  request["Tags"][1]["Key"] = "bad#key";
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value 'bad#key' at 'tags.2.member.key' failed to "
            "satisfy constraint: Member must satisfy regular expression pattern: ([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)");
}

TEST_F(ServiceModelTest, DeeplyNestedPathAndListOfScalars) {
  json request = ValidTrainingJob();
  request["InputDataConfig"][1]["DataSource"]["S3DataSource"]["S3DataType"] = "Folder";
  std::string message = Message(request);
  EXPECT_EQ(message.rfind("ValidationException: 1 validation error detected: Value 'Folder' at "
                          "'inputDataConfig.2.member.dataSource.s3DataSource.s3DataType' failed to satisfy constraint: "
                          "Member must satisfy enum value set: [ManifestFile, S3Prefix, AugmentedManifestFile",
                          0),
            0u)
      << message;
  request = ValidTrainingJob();
  request["VpcConfig"] = {{"SecurityGroupIds", {"sg-1", "sg_2"}}, {"Subnets", {"subnet-1"}}};
  EXPECT_EQ(Message(request),
            "ValidationException: 1 validation error detected: Value '[sg-1, sg_2]' at 'vpcConfig.securityGroupIds' "
            "failed to satisfy constraint: Member must satisfy constraint: [Member must have length less than or "
            "equal to 32, Member must have length greater than or equal to 0, Member must satisfy regular "
            "expression pattern: [-0-9a-zA-Z]+]");
}

TEST_F(ServiceModelTest, MultipleErrorsCountedJoinedAndInMemberOrder) {
  json request = ValidTrainingJob();
  request["TrainingJobName"] = "bad_name";
  request.erase("OutputDataConfig");
  request["StoppingCondition"]["MaxRuntimeInSeconds"] = 0;
  EXPECT_EQ(Message(request),
            "ValidationException: 3 validation errors detected: "
            "Value 'bad_name' at 'trainingJobName' failed to satisfy constraint: Member must satisfy regular "
            "expression pattern: [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}; "
            "Value null at 'outputDataConfig' failed to satisfy constraint: Member must not be null; "
            "Value '0' at 'stoppingCondition.maxRuntimeInSeconds' failed to satisfy constraint: Member must have "
            "value greater than or equal to 1");
}

TEST_F(ServiceModelTest, ErrorsAreCapped) {
  json request = ValidTrainingJob();
  request["Tags"] = json::array();
  for (int i = 0; i < 15; ++i) {
    request["Tags"].push_back({{"Key", "bad#" + std::to_string(i)}, {"Value", "v"}});
  }
  std::string message = Message(request);
  EXPECT_EQ(message.rfind("ValidationException: 10 validation errors detected: ", 0), 0u) << message;
  EXPECT_NE(message.find("tags.10.member.key"), std::string::npos);
  EXPECT_EQ(message.find("tags.11.member.key"), std::string::npos);
}

TEST_F(ServiceModelTest, LengthCountsCodePointsNotBytes) {
  json request = ValidTrainingJob();
  // 128 characters, 256 bytes in UTF-8: fits the 128 limit of a tag key.
  std::string key;
  for (int i = 0; i < 128; ++i) key += "é";
  request["Tags"][0]["Key"] = key;
  EXPECT_EQ(Message(request), "");
  request["Tags"][0]["Key"] = key + "é";
  EXPECT_NE(Message(request).find("at 'tags.1.member.key' failed to satisfy constraint: Member must have length "
                                  "less than or equal to 128"),
            std::string::npos);
}

TEST_F(ServiceModelTest, TypeMismatchesAreSerializationExceptions) {
  json request = ValidTrainingJob();
  request["TrainingJobName"] = 42;
  auto error = model_->ValidateInput("CreateTrainingJob", request);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "SerializationException");
  EXPECT_EQ(error->http_status, 400);
  EXPECT_EQ(error->message,
            "class com.amazon.coral.value.json.numbers.TruncatingBigNumber can not be converted to an String (at "
            "'trainingJobName')");

  request = ValidTrainingJob();
  request["ResourceConfig"]["InstanceCount"] = "1";
  EXPECT_EQ(Message(request),
            "SerializationException: class java.lang.String can not be converted to an Integer (at "
            "'resourceConfig.instanceCount')");
  request = ValidTrainingJob();
  request["ResourceConfig"] = "ml.m5.xlarge";
  EXPECT_EQ(Message(request), "SerializationException: Expected null (at 'resourceConfig')");
  request = ValidTrainingJob();
  request["InputDataConfig"] = {{"ChannelName", "train"}};
  EXPECT_EQ(Message(request),
            "SerializationException: Start of structure or map found where not expected. (at 'inputDataConfig')");
  request = ValidTrainingJob();
  request["EnableNetworkIsolation"] = "yes";
  EXPECT_EQ(Message(request),
            "SerializationException: 'yes' can not be converted to an Boolean (at "
            "'enableNetworkIsolation')");
  request = ValidTrainingJob();
  request["HyperParameters"] = {{"epochs", 10}};
  EXPECT_EQ(Message(request).rfind("SerializationException: ", 0), 0u);
  // A type error wins over constraint violations found before it.
  request["TrainingJobName"] = "bad name";
  EXPECT_EQ(Message(request).rfind("SerializationException: ", 0), 0u);
}

TEST_F(ServiceModelTest, TimestampsAcceptEpochAndIso8601) {
  auto model = ServiceModel::Parse(R"({"operations": {"Op": {"input": {"shape": "In"}}},
    "shapes": {"In": {"type": "structure", "members": {"T": {"shape": "Ts"}}}, "Ts": {"type": "timestamp"}}})");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_FALSE((*model)->ValidateInput("Op", json{{"T", 1714557600}}));
  EXPECT_FALSE((*model)->ValidateInput("Op", json{{"T", 1714557600.123}}));
  EXPECT_FALSE((*model)->ValidateInput("Op", json{{"T", "2024-05-01T10:00:00Z"}}));
  auto error = (*model)->ValidateInput("Op", json{{"T", "yesterday"}});
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "SerializationException");
}

TEST_F(ServiceModelTest, UnionsNeedExactlyOneMember) {
  auto model = ServiceModel::Parse(R"({"operations": {"Op": {"input": {"shape": "In"}}},
    "shapes": {"In": {"type": "structure", "members": {"U": {"shape": "Un"}}},
               "Un": {"type": "structure", "union": true, "members": {"A": {"shape": "S"}, "B": {"shape": "S"}}},
               "S": {"type": "string"}}})");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_FALSE((*model)->ValidateInput("Op", json::parse(R"({"U": {"A": "x"}})")));
  auto error = (*model)->ValidateInput("Op", json::parse(R"({"U": {"A": "x", "B": "y"}})"));
  ASSERT_TRUE(error);
  EXPECT_EQ(error->message,
            "1 validation error detected: Value '{A=x, B=y}' at 'u' failed to satisfy constraint: Member must have "
            "exactly one member set");
  EXPECT_TRUE((*model)->ValidateInput("Op", json::parse(R"({"U": {}})")));
}

TEST_F(ServiceModelTest, ParseRejectsDanglingReferences) {
  auto model = ServiceModel::Parse(R"({"shapes": {"In": {"type": "structure", "members": {"X": {"shape": "Nope"}}}}})");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("Nope"), std::string::npos);
  EXPECT_FALSE(ServiceModel::Parse("not json").ok());
}

TEST_F(ServiceModelTest, UnknownOperationIsNotValidated) {
  EXPECT_FALSE(model_->ValidateInput("NoSuchOperation", json{{"x", 1}}));
}

TEST_F(ServiceModelTest, ValidationTiming) {
  json request = ValidTrainingJob();
  ASSERT_EQ(Message(request), "");  // warm the lazily compiled patterns
  constexpr int kRounds = 2000;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    auto error = model_->ValidateInput("CreateTrainingJob", request);
    ASSERT_FALSE(error);
  }
  double micros = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kRounds;
  std::printf("ValidateInput(CreateTrainingJob, typical request): %.2f us per call\n", micros);
}

}  // namespace
}  // namespace kiln::api
