#include "api/errors.h"

#include <gtest/gtest.h>

namespace kiln::api {
namespace {

TEST(AwsErrorFromStatusTest, SageMakerAnswersEveryStoreFailureAsInternalFailure) {
  for (const Status& s : {Status::Internal("disk I/O error"), Status::Unavailable("database is locked"),
                          Status::ResourceExhausted("disk full"), Status::NotFound("row vanished")}) {
    aws::AwsError e = AwsErrorFromStatus(s, ErrorService::kSageMaker);
    EXPECT_EQ(e.code, "InternalFailure") << s.ToString();
    EXPECT_EQ(e.http_status, 500) << s.ToString();
    EXPECT_EQ(e.message, s.message());
    EXPECT_FALSE(e.sender_fault);
  }
}

TEST(AwsErrorFromStatusTest, LogsNamesItsResourceErrors) {
  aws::AwsError missing =
      AwsErrorFromStatus(Status::NotFound("The specified log group does not exist."), ErrorService::kLogs);
  EXPECT_EQ(missing.code, "ResourceNotFoundException");
  EXPECT_EQ(missing.message, "The specified log group does not exist.");
  EXPECT_EQ(missing.http_status, 400);
  aws::AwsError exists =
      AwsErrorFromStatus(Status::AlreadyExists("The specified log group already exists"), ErrorService::kLogs);
  EXPECT_EQ(exists.code, "ResourceAlreadyExistsException");
  EXPECT_EQ(exists.http_status, 400);
  aws::AwsError invalid = AwsErrorFromStatus(Status::InvalidArgument("bad token"), ErrorService::kLogs);
  EXPECT_EQ(invalid.code, "InvalidParameterException");
  EXPECT_EQ(invalid.http_status, 400);
  // The rest: the generic JSON 1.1 mapping.
  aws::AwsError busy = AwsErrorFromStatus(Status::Unavailable("busy"), ErrorService::kLogs);
  EXPECT_EQ(busy.code, "ServiceUnavailable");
  EXPECT_EQ(busy.http_status, 503);
  aws::AwsError broken = AwsErrorFromStatus(Status::Internal("broken"), ErrorService::kLogs);
  EXPECT_EQ(broken.code, "InternalFailure");
  EXPECT_EQ(broken.http_status, 500);
  EXPECT_EQ(broken.message, "broken");
}

TEST(AwsErrorFromStatusTest, CloudWatchSaysTheMetricStoreFailed) {
  aws::AwsError invalid =
      AwsErrorFromStatus(Status::InvalidArgument("The parameter X is invalid."), ErrorService::kCloudWatch);
  EXPECT_EQ(invalid.code, "InvalidParameterValue");
  EXPECT_EQ(invalid.message, "The parameter X is invalid.");
  EXPECT_EQ(invalid.http_status, 400);
  EXPECT_TRUE(invalid.sender_fault);
  aws::AwsError busy = AwsErrorFromStatus(Status::Unavailable("locked"), ErrorService::kCloudWatch);
  EXPECT_EQ(busy.code, "ServiceUnavailable");
  EXPECT_EQ(busy.message, "The metric store failed: locked");
  EXPECT_EQ(busy.http_status, 503);
  EXPECT_FALSE(busy.sender_fault);
  aws::AwsError broken = AwsErrorFromStatus(Status::ResourceExhausted("disk full"), ErrorService::kCloudWatch);
  EXPECT_EQ(broken.code, "InternalServiceError");
  EXPECT_EQ(broken.message, "The metric store failed: disk full");
  EXPECT_EQ(broken.http_status, 500);
  EXPECT_FALSE(broken.sender_fault);
}

}  // namespace
}  // namespace kiln::api
