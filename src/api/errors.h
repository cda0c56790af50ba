#pragma once
// Status → AWS error, one mapper per service vocabulary the api module answers in. A handler
// returns its own specific errors (validation, "Could not find ...") itself; a Status it did not
// expect (the store failed, the disk is full) goes through AwsErrorFromStatus, so every such
// failure of a service is answered the same way. S3 has its own (objects/s3api StoreError) and
// the generic per-protocol fallback is aws::ErrorFromStatus, which the Logs mapping extends.

#include "aws/errors.h"
#include "base/status.h"

namespace kiln::api {

enum class ErrorService {
  // SageMaker (JSON 1.1): every unexpected Status is InternalFailure (500) with the Status's
  // message; SageMaker's own not-found and conflict texts are written by the handlers.
  kSageMaker,
  // CloudWatch Logs (JSON 1.1): NotFound → ResourceNotFoundException, AlreadyExists →
  // ResourceAlreadyExistsException, InvalidArgument → InvalidParameterException (400); the rest
  // as aws::ErrorFromStatus for JSON 1.1 (ServiceUnavailable 503, InternalFailure 500, ...).
  kLogs,
  // CloudWatch metrics (JSON 1.0, Query, CBOR): InvalidArgument → InvalidParameterValue (400),
  // Unavailable → ServiceUnavailable (503), the rest InternalServiceError (500); server faults
  // say "The metric store failed: <message>".
  kCloudWatch,
};

// `status` must not be OK.
aws::AwsError AwsErrorFromStatus(const Status& status, ErrorService service);

}  // namespace kiln::api
