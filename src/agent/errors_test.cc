#include "agent/errors.h"

#include <gtest/gtest.h>

#include "agent/transfer.h"

namespace kiln::agent {
namespace {

TEST(AgentErrorsTest, ClientAndInternalErrorsCarryTheirPrefixAndReason) {
  Status client = ClientError("the manifest is invalid.");
  EXPECT_EQ(client.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client.message(), "ClientError: the manifest is invalid.");
  EXPECT_TRUE(client.Is(ErrorReason::kClientError));
  EXPECT_EQ(ClientError("disk full", StatusCode::kResourceExhausted).code(), StatusCode::kResourceExhausted);

  Status internal = InternalServerError("scan failed");
  EXPECT_EQ(internal.code(), StatusCode::kInternal);
  EXPECT_EQ(internal.message(), "InternalServerError: scan failed");
  EXPECT_TRUE(internal.Is(ErrorReason::kInternalServerError));
  EXPECT_EQ(InternalServerError("x", StatusCode::kUnavailable).code(), StatusCode::kUnavailable);

  EXPECT_TRUE(IsFailureReason(client));
  EXPECT_TRUE(IsFailureReason(internal));
  // The text alone does not make a FailureReason: callers test the reason.
  EXPECT_FALSE(IsFailureReason(Status::InvalidArgument("ClientError: typed by hand")));
  EXPECT_FALSE(IsFailureReason(Status::Ok()));
}

TEST(AgentErrorsTest, ObjectErrorPassesFailureReasonsOnAndWrapsTheRest) {
  for (const Status& given :
       {ClientError("already said"), InternalServerError("already said", StatusCode::kUnavailable)}) {
    Status passed = ObjectError(given, "Download", "b", "k");
    EXPECT_EQ(passed.code(), given.code());
    EXPECT_EQ(passed.reason(), given.reason());
    EXPECT_EQ(passed.message(), given.message());
  }

  Status wrapped = ObjectError(Status::InvalidArgument("bad part"), "Download", "b", "k");
  EXPECT_EQ(wrapped.code(), StatusCode::kInternal);
  EXPECT_TRUE(wrapped.Is(ErrorReason::kInternalServerError));
  EXPECT_EQ(wrapped.message(), "InternalServerError: Download \"s3://b/k\" failed: InvalidArgument: bad part");

  Status missing =
      ObjectError(Status::NotFound("NoSuchBucket: b").WithReason(ErrorReason::kNoSuchBucket), "Download", "b", "k");
  EXPECT_TRUE(missing.Is(ErrorReason::kClientError));
  EXPECT_EQ(missing.message().rfind("ClientError: Download \"s3://b/k\" failed: bucket \"b\" does not exist.", 0), 0u)
      << missing.message();
}

}  // namespace
}  // namespace kiln::agent
