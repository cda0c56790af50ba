#include "aws/errors.h"

#include <gtest/gtest.h>

#include "base/time.h"

namespace kiln::aws {
namespace {

std::string Header(const WireResponse& response, std::string_view name) {
  const std::string* value = FindHeader(response.headers, name);
  return value ? *value : "<absent>";
}

void ExpectDate(const WireResponse& response) {
  std::string date = Header(response, "Date");
  EXPECT_TRUE(ParseRfc1123(date).has_value()) << date;
}

TEST(ErrorsTest, Json11) {
  AwsError error("ValidationException", "Could not find endpoint \"churn-ep\".");
  WireResponse response = SerializeError(Protocol::kJson11, error, "req-1");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(response.body, R"j({"__type":"ValidationException","message":"Could not find endpoint \"churn-ep\".",)j"
                           R"j("Message":"Could not find endpoint \"churn-ep\"."})j");
  EXPECT_EQ(Header(response, "x-amzn-RequestId"), "req-1");
  EXPECT_EQ(Header(response, "x-amzn-ErrorType"), "ValidationException");
  EXPECT_EQ(Header(response, "Content-Type"), "application/x-amz-json-1.1");
  EXPECT_EQ(Header(response, "x-amzn-query-error"), "<absent>");
  ExpectDate(response);
}

TEST(ErrorsTest, Json11ExtraFields) {
  AwsError error("ModelError", "Received client error (400)", 424);
  error.With("OriginalStatusCode", "400").With("LogStreamArn", "arn:x");
  WireResponse response = SerializeError(Protocol::kJson11, error, "r");
  EXPECT_EQ(response.status, 424);
  EXPECT_EQ(
      response.body,
      R"j({"__type":"ModelError","message":"Received client error (400)","Message":"Received client error (400)",)j"
      R"j("OriginalStatusCode":"400","LogStreamArn":"arn:x"})j");
}

TEST(ErrorsTest, Json10AddsQueryError) {
  AwsError error("InvalidParameterValue", "The parameter Period must be positive.");
  WireResponse response = SerializeError(Protocol::kJson10, error, "req-2");
  EXPECT_EQ(response.body, R"j({"__type":"InvalidParameterValue","message":"The parameter Period must be positive.",)j"
                           R"j("Message":"The parameter Period must be positive."})j");
  EXPECT_EQ(Header(response, "Content-Type"), "application/x-amz-json-1.0");
  EXPECT_EQ(Header(response, "x-amzn-query-error"), "InvalidParameterValue;Sender");
  EXPECT_EQ(Header(response, "x-amzn-ErrorType"), "InvalidParameterValue");
  error.sender_fault = false;
  EXPECT_EQ(Header(SerializeError(Protocol::kJson10, error, "r"), "x-amzn-query-error"),
            "InvalidParameterValue;Receiver");
}

TEST(ErrorsTest, RestJson) {
  AwsError error("ValidationError", "Endpoint x of account 123 not found.");
  WireResponse response = SerializeError(Protocol::kRestJson, error, "req-3");
  EXPECT_EQ(response.body,
            R"j({"message":"Endpoint x of account 123 not found.","Message":"Endpoint x of account 123 not found."})j");
  EXPECT_EQ(Header(response, "Content-Type"), "application/json");
  EXPECT_EQ(Header(response, "x-amzn-ErrorType"), "ValidationError");
  EXPECT_EQ(Header(response, "x-amzn-RequestId"), "req-3");
  ExpectDate(response);
}

TEST(ErrorsTest, RestXmlS3) {
  AwsError error("NoSuchKey", "The specified key does not exist.", 404);
  error.With("Key", "jobs/x/<model>.tar.gz");
  WireResponse response = SerializeError(Protocol::kRestXml, error, "4442587FB7D0A2F9");
  std::string host_id = Header(response, "x-amz-id-2");
  EXPECT_FALSE(host_id.empty());
  EXPECT_EQ(response.status, 404);
  EXPECT_EQ(response.body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey</Code>"
            "<Message>The specified key does not exist.</Message><Key>jobs/x/&lt;model&gt;.tar.gz</Key>"
            "<RequestId>4442587FB7D0A2F9</RequestId><HostId>" +
                host_id + "</HostId></Error>");
  EXPECT_EQ(Header(response, "x-amz-request-id"), "4442587FB7D0A2F9");
  EXPECT_EQ(Header(response, "Content-Type"), "application/xml");
  EXPECT_EQ(Header(response, "x-amzn-RequestId"), "<absent>");
  ExpectDate(response);

  WireResponse head = SerializeError(Protocol::kRestXml, error, "4442587FB7D0A2F9", /*head_request=*/true);
  EXPECT_EQ(head.status, 404);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(Header(head, "x-amz-request-id"), "4442587FB7D0A2F9");
}

TEST(ErrorsTest, QuerySts) {
  AwsError error("InvalidClientTokenId", "The security token included in the request is invalid.", 403);
  WireResponse response = SerializeError(Protocol::kQuery, error, "4d8f");
  EXPECT_EQ(response.status, 403);
  EXPECT_EQ(response.body,
            "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><Error><Type>Sender</Type>"
            "<Code>InvalidClientTokenId</Code><Message>The security token included in the request is invalid."
            "</Message></Error><RequestId>4d8f</RequestId></ErrorResponse>");
  EXPECT_EQ(Header(response, "Content-Type"), "text/xml");
  EXPECT_EQ(Header(response, "x-amzn-RequestId"), "4d8f");
  ExpectDate(response);
  error.sender_fault = false;
  EXPECT_NE(SerializeError(Protocol::kQuery, error, "r").body.find("<Type>Receiver</Type>"), std::string::npos);
}

TEST(ErrorsTest, InvalidUtf8DoesNotThrow) {
  AwsError error("ValidationException", std::string("bad \xff byte"));
  WireResponse response = SerializeError(Protocol::kJson11, error, "r");
  EXPECT_NE(response.body.find("bad "), std::string::npos);
}

TEST(ErrorsTest, ErrorFromStatus) {
  AwsError invalid = ErrorFromStatus(Protocol::kJson11, Status::InvalidArgument("bad name"));
  EXPECT_EQ(invalid.code, "ValidationException");
  EXPECT_EQ(invalid.http_status, 400);
  EXPECT_EQ(invalid.message, "bad name");
  EXPECT_TRUE(invalid.sender_fault);
  EXPECT_EQ(ErrorFromStatus(Protocol::kRestXml, Status::InvalidArgument("x")).code, "InvalidArgument");

  AwsError full = ErrorFromStatus(Protocol::kJson11, Status::ResourceExhausted("disk full"));
  EXPECT_EQ(full.code, "ServiceUnavailable");
  EXPECT_EQ(full.http_status, 503);
  EXPECT_FALSE(full.sender_fault);
  AwsError s3_full = ErrorFromStatus(Protocol::kRestXml, Status::ResourceExhausted("disk full"));
  EXPECT_EQ(s3_full.code, "InternalError");
  EXPECT_EQ(s3_full.http_status, 503);

  AwsError bug = ErrorFromStatus(Protocol::kJson11, Status::Internal("oops"));
  EXPECT_EQ(bug.code, "InternalFailure");
  EXPECT_EQ(bug.http_status, 500);
  EXPECT_EQ(bug.message, "oops");
  AwsError s3_bug = ErrorFromStatus(Protocol::kRestXml, Status::DataLoss("corrupt"));
  EXPECT_EQ(s3_bug.code, "InternalError");
  EXPECT_EQ(s3_bug.http_status, 500);
}

}  // namespace
}  // namespace kiln::aws
