#include "api/json_service.h"

#include <gtest/gtest.h>

#include "api/service_model.h"

namespace kiln::api {
namespace {

using nlohmann::json;

class JsonServiceModelTest : public ::testing::Test {
 protected:
  JsonServiceModelTest() {
    context_.request_id = "req-1";
    service_.Register("DescribeTrainingJob", [this](const aws::RequestContext&, const json& input) -> JsonOutcome {
      ++calls_;
      return json{{"TrainingJobName", input.value("TrainingJobName", "")}};
    });
    service_.Register("NotInTheModel", [this](const aws::RequestContext&, const json&) -> JsonOutcome {
      ++calls_;
      return json::object();
    });
  }

  aws::RequestContext context_;
  JsonService service_{"SageMaker", "sagemaker", aws::Protocol::kJson11};
  int calls_ = 0;
};

TEST_F(JsonServiceModelTest, InvalidInputIsAnsweredBeforeTheHandler) {
  service_.SetModel(ServiceModel::SageMaker());
  auto response = service_.Handle(context_, "DescribeTrainingJob", R"({"TrainingJobName": "bad name"})");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(calls_, 0);
  json body = json::parse(response.body);
  EXPECT_EQ(body["__type"], "ValidationException");
  EXPECT_EQ(body["message"],
            "1 validation error detected: Value 'bad name' at 'trainingJobName' failed to satisfy constraint: Member "
            "must satisfy regular expression pattern: [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}");

  response = service_.Handle(context_, "DescribeTrainingJob", "{}");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(json::parse(response.body)["message"],
            "1 validation error detected: Value null at 'trainingJobName' failed to satisfy constraint: Member must "
            "not be null");

  response = service_.Handle(context_, "DescribeTrainingJob", R"({"TrainingJobName": 7})");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(json::parse(response.body)["__type"], "SerializationException");
  EXPECT_EQ(calls_, 0);
}

TEST_F(JsonServiceModelTest, ValidInputReachesTheHandler) {
  service_.SetModel(ServiceModel::SageMaker());
  auto response = service_.Handle(context_, "DescribeTrainingJob", R"({"TrainingJobName": "good-name"})");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(calls_, 1);
  // Operations the model does not know are not validated.
  response = service_.Handle(context_, "NotInTheModel", R"({"anything": 1})");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(calls_, 2);
}

TEST_F(JsonServiceModelTest, UnregisteredOperationStillAnswersUnknownOperationFirst) {
  service_.SetModel(ServiceModel::SageMaker());
  auto response = service_.Handle(context_, "CreateTrainingJob", "{}");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(json::parse(response.body)["__type"], "UnknownOperationException");
}

TEST_F(JsonServiceModelTest, WithoutAModelNothingIsValidated) {
  auto response = service_.Handle(context_, "DescribeTrainingJob", R"({"TrainingJobName": "bad name"})");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(calls_, 1);
}

TEST_F(JsonServiceModelTest, DeepNestingIsRefusedBeforeAnyCopy) {
  service_.SetModel(ServiceModel::SageMaker());
  // The finding: ~280 KB nested 55,000 objects deep, with an unknown member, crashed the server.
  std::string body = R"({"TrainingJobName": "good-name", "Unknown": )";
  for (int i = 0; i < 55000; ++i) body += "{\"a\":";
  body += "1" + std::string(55000, '}') + "}";
  auto response = service_.Handle(context_, "DescribeTrainingJob", body);
  EXPECT_EQ(response.status, 400);
  json answer = json::parse(response.body);
  EXPECT_EQ(answer["__type"], "SerializationException");
  EXPECT_NE(answer["message"].get<std::string>().find("deeper than 64 levels"), std::string::npos) << answer;
  EXPECT_EQ(calls_, 0);

  // At the limit the request is an ordinary one (unknown members are ignored).
  body = R"({"TrainingJobName": "good-name", "Unknown": )" + std::string(63, '[') + std::string(63, ']') + "}";
  response = service_.Handle(context_, "DescribeTrainingJob", body);
  EXPECT_EQ(response.status, 200) << response.body;
}

TEST_F(JsonServiceModelTest, DocumentsWithTooManyValuesAreRefused) {
  std::string body = R"({"TrainingJobName": "good-name", "Unknown": [)";
  for (size_t i = 0; i < JsonService::kRequestLimits.max_values; ++i) body += i ? ",0" : "0";
  body += "]}";
  auto response = service_.Handle(context_, "DescribeTrainingJob", body);
  EXPECT_EQ(response.status, 400);
  EXPECT_NE(json::parse(response.body)["message"].get<std::string>().find("more than 200000 values"),
            std::string::npos);
  EXPECT_EQ(calls_, 0);
}

}  // namespace
}  // namespace kiln::api
