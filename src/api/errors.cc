#include "api/errors.h"

namespace kiln::api {

aws::AwsError AwsErrorFromStatus(const Status& status, ErrorService service) {
  switch (service) {
    case ErrorService::kSageMaker: {
      aws::AwsError e("InternalFailure", status.message(), 500);
      e.sender_fault = false;
      return e;
    }
    case ErrorService::kLogs:
      switch (status.code()) {
        case StatusCode::kNotFound: return aws::AwsError("ResourceNotFoundException", status.message());
        case StatusCode::kAlreadyExists: return aws::AwsError("ResourceAlreadyExistsException", status.message());
        case StatusCode::kInvalidArgument: return aws::AwsError("InvalidParameterException", status.message());
        default: return aws::ErrorFromStatus(aws::Protocol::kJson11, status);
      }
    case ErrorService::kCloudWatch: {
      if (status.code() == StatusCode::kInvalidArgument) {
        return aws::AwsError("InvalidParameterValue", status.message());
      }
      const bool unavailable = status.code() == StatusCode::kUnavailable;
      aws::AwsError e(unavailable ? "ServiceUnavailable" : "InternalServiceError",
                      "The metric store failed: " + status.message(), unavailable ? 503 : 500);
      e.sender_fault = false;
      return e;
    }
  }
  return aws::ErrorFromStatus(aws::Protocol::kJson11, status);
}

}  // namespace kiln::api
