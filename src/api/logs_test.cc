#include "api/logs.h"

#include <gtest/gtest.h>

#include "store/test_util/temp_database.h"

namespace kiln::api {
namespace {

using nlohmann::json;

class LogsApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), false);
    auto s = observe::LogStore::Open({dir_.path() + "/logs", db_.get(), nullptr});
    ASSERT_TRUE(s.ok());
    store_ = std::move(s).value();
    RegisterLogsOperations(&service_, store_.get(), "123456789012", "us-east-1");
    context_.request_id = "req";
    context_.account_id = "111122223333";
    context_.region = "eu-west-1";
  }
  // Returns (status, body).
  std::pair<int, json> Call(const std::string& op, const json& input) {
    auto r = service_.Handle(context_, op, input.dump());
    return {r.status, json::parse(r.body)};
  }
  json Ok(const std::string& op, const json& input) {
    auto [status, body] = Call(op, input);
    EXPECT_EQ(status, 200) << op << " " << body.dump();
    return body;
  }
  std::string ErrorCode(const std::string& op, const json& input) {
    auto [status, body] = Call(op, input);
    EXPECT_EQ(status, 400) << op << " " << body.dump();
    return body.value("__type", "");
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::LogStore> store_;
  JsonService service_{"Logs_20140328", "logs", aws::Protocol::kJson11};
  aws::RequestContext context_;
};

TEST_F(LogsApiTest, RoundTrip) {
  Ok("CreateLogGroup", {{"logGroupName", "/aws/sagemaker/TrainingJobs"}});
  Ok("CreateLogStream", {{"logGroupName", "/aws/sagemaker/TrainingJobs"}, {"logStreamName", "job/algo-1"}});
  json put =
      Ok("PutLogEvents",
         {{"logGroupName", "/aws/sagemaker/TrainingJobs"},
          {"logStreamName", "job/algo-1"},
          {"logEvents", {{{"timestamp", 10}, {"message", "hello"}}, {{"timestamp", 11}, {"message", "world"}}}}});
  EXPECT_TRUE(put["nextSequenceToken"].is_string());
  json groups = Ok("DescribeLogGroups", json::object());
  ASSERT_EQ(groups["logGroups"].size(), 1u);
  EXPECT_EQ(groups["logGroups"][0]["arn"],
            "arn:aws:logs:eu-west-1:111122223333:log-group:/aws/sagemaker/TrainingJobs:*");
  EXPECT_EQ(groups["logGroups"][0]["storedBytes"], 10);
  json streams =
      Ok("DescribeLogStreams",
         {{"logGroupIdentifier", "arn:aws:logs:eu-west-1:111122223333:log-group:/aws/sagemaker/TrainingJobs"}});
  ASSERT_EQ(streams["logStreams"].size(), 1u);
  EXPECT_EQ(streams["logStreams"][0]["arn"],
            "arn:aws:logs:eu-west-1:111122223333:log-group:/aws/sagemaker/TrainingJobs:log-stream:job/algo-1");
  EXPECT_EQ(streams["logStreams"][0]["firstEventTimestamp"], 10);
  EXPECT_EQ(streams["logStreams"][0]["lastEventTimestamp"], 11);
  json events =
      Ok("GetLogEvents",
         {{"logGroupName", "/aws/sagemaker/TrainingJobs"}, {"logStreamName", "job/algo-1"}, {"startFromHead", true}});
  ASSERT_EQ(events["events"].size(), 2u);
  EXPECT_EQ(events["events"][1]["message"], "world");
  EXPECT_EQ(events["nextForwardToken"].get<std::string>().substr(0, 2), "f/");
  EXPECT_EQ(events["nextBackwardToken"].get<std::string>().substr(0, 2), "b/");
  json again = Ok("GetLogEvents", {{"logGroupName", "/aws/sagemaker/TrainingJobs"},
                                   {"logStreamName", "job/algo-1"},
                                   {"nextToken", events["nextForwardToken"]}});
  EXPECT_TRUE(again["events"].empty());
  EXPECT_EQ(again["nextForwardToken"], events["nextForwardToken"]);
  json filtered = Ok("FilterLogEvents", {{"logGroupName", "/aws/sagemaker/TrainingJobs"}, {"filterPattern", "wor"}});
  ASSERT_EQ(filtered["events"].size(), 1u);
  EXPECT_EQ(filtered["events"][0]["logStreamName"], "job/algo-1");
  EXPECT_FALSE(filtered.contains("nextToken"));
  Ok("DeleteLogStream", {{"logGroupName", "/aws/sagemaker/TrainingJobs"}, {"logStreamName", "job/algo-1"}});
  Ok("DeleteLogGroup", {{"logGroupName", "/aws/sagemaker/TrainingJobs"}});
}

TEST_F(LogsApiTest, Errors) {
  EXPECT_EQ(ErrorCode("CreateLogGroup", json::object()), "InvalidParameterException");
  EXPECT_EQ(ErrorCode("CreateLogGroup", {{"logGroupName", "bad name"}}), "InvalidParameterException");
  EXPECT_EQ(ErrorCode("CreateLogGroup", {{"logGroupName", std::string(513, 'a')}}), "InvalidParameterException");
  Ok("CreateLogGroup", {{"logGroupName", "g"}});
  EXPECT_EQ(ErrorCode("CreateLogGroup", {{"logGroupName", "g"}}), "ResourceAlreadyExistsException");
  EXPECT_EQ(ErrorCode("CreateLogStream", {{"logGroupName", "g"}, {"logStreamName", "a:b"}}),
            "InvalidParameterException");
  EXPECT_EQ(ErrorCode("CreateLogStream", {{"logGroupName", "nope"}, {"logStreamName", "s"}}),
            "ResourceNotFoundException");
  Ok("CreateLogStream", {{"logGroupName", "g"}, {"logStreamName", "s"}});
  EXPECT_EQ(ErrorCode("CreateLogStream", {{"logGroupName", "g"}, {"logStreamName", "s"}}),
            "ResourceAlreadyExistsException");
  auto [status, body] = Call("GetLogEvents", {{"logGroupName", "g"}, {"logStreamName", "x"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["message"], "The specified log stream does not exist.");
  auto [status2, body2] = Call("DescribeLogStreams", {{"logGroupName", "nope"}});
  EXPECT_EQ(status2, 400);
  EXPECT_EQ(body2["__type"], "ResourceNotFoundException");
  EXPECT_EQ(body2["message"], "The specified log group does not exist.");
  EXPECT_EQ(ErrorCode("DescribeLogStreams",
                      {{"logGroupName", "g"}, {"logStreamNamePrefix", "s"}, {"orderBy", "LastEventTime"}}),
            "InvalidParameterException");
  EXPECT_EQ(ErrorCode("DescribeLogStreams", {{"logGroupName", "g"}, {"limit", 51}}), "InvalidParameterException");
  EXPECT_EQ(ErrorCode("DescribeLogGroups", {{"limit", 0}}), "InvalidParameterException");
  EXPECT_EQ(ErrorCode("GetLogEvents", {{"logGroupName", "g"}, {"logStreamName", "s"}, {"limit", 10001}}),
            "InvalidParameterException");
  EXPECT_EQ(ErrorCode("GetLogEvents", {{"logGroupName", "g"}, {"logStreamName", "s"}, {"nextToken", "f/zzz"}}),
            "InvalidParameterException");
  EXPECT_EQ(
      ErrorCode("FilterLogEvents", {{"logGroupName", "g"}, {"logStreamNames", {"s"}}, {"logStreamNamePrefix", "s"}}),
      "InvalidParameterException");
  EXPECT_EQ(ErrorCode("PutLogEvents",
                      {{"logGroupName", "g"},
                       {"logStreamName", "s"},
                       {"logEvents", {{{"timestamp", 2}, {"message", "a"}}, {{"timestamp", 1}, {"message", "b"}}}}}),
            "InvalidParameterException");
  EXPECT_EQ(ErrorCode("PutLogEvents", {{"logGroupName", "g"}, {"logStreamName", "s"}, {"logEvents", json::array()}}),
            "InvalidParameterException");
  EXPECT_EQ(ErrorCode("PutLogEvents", {{"logGroupName", "g"},
                                       {"logStreamName", "nope"},
                                       {"logEvents", {{{"timestamp", 2}, {"message", "a"}}}}}),
            "ResourceNotFoundException");
  EXPECT_EQ(ErrorCode("DeleteLogGroup", {{"logGroupName", "nope"}}), "ResourceNotFoundException");
}

}  // namespace
}  // namespace kiln::api
