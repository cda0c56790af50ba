#pragma once
// AWS-shaped errors and their wire forms, per protocol (spec/control-plane-api.md §2.3, §10.3,
// §13, §14). Every error a client can see is built as an AwsError and serialized here, in one place.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/io.h"
#include "base/status.h"

namespace kiln::aws {

enum class Protocol {
  kJson11,    // SageMaker, Logs, Application Auto Scaling
  kJson10,    // CloudWatch (current botocore)
  kRestJson,  // SageMaker Runtime
  kRestXml,   // S3
  kQuery,     // STS, CloudWatch (older clients)
};

struct AwsError {
  std::string code;     // "ValidationException", "NoSuchKey", ...
  std::string message;  // what to change, in AWS's words where AWS has words
  int http_status = 400;
  // Extra members: S3 <Error> children (Key, BucketName, UploadId, ...) or JSON members
  // (OriginalStatusCode, ...). Order kept.
  std::vector<std::pair<std::string, std::string>> fields;
  // JSON members whose value is a number (rest-json ModelError's OriginalStatusCode), written
  // after `fields`. JSON protocols only; XML protocols write them as text elements.
  std::vector<std::pair<std::string, int64_t>> int_fields;
  // Query protocol <Type>: Sender (client's fault) or Receiver (server's).
  bool sender_fault = true;

  AwsError() = default;
  AwsError(std::string c, std::string m, int status = 400)
      : code(std::move(c)), message(std::move(m)), http_status(status) {}
  AwsError& With(std::string name, std::string value) {
    fields.emplace_back(std::move(name), std::move(value));
    return *this;
  }
  AwsError& WithInt(std::string name, int64_t value) {
    int_fields.emplace_back(std::move(name), value);
    return *this;
  }
};

struct WireResponse {
  int status = 200;
  HeaderMap headers;
  std::string body;
};

// Serializes `error` for `protocol`. Adds the request id headers the protocol uses
// (x-amzn-RequestId; S3: x-amz-request-id + x-amz-id-2), x-amzn-ErrorType for JSON protocols,
// x-amzn-query-error for JSON 1.0, Content-Type, and Date. `head_request` (S3 HEAD) drops the body.
WireResponse SerializeError(Protocol protocol, const AwsError& error, std::string_view request_id,
                            bool head_request = false);

// Maps a Kiln Status to a generic AWS error for `protocol` when no more specific mapping exists:
// InvalidArgument → ValidationException / InvalidArgument (S3), ResourceExhausted (disk full) →
// ServiceUnavailable / InternalError with 503, everything unexpected → InternalFailure 500 /
// InternalError. The message keeps the Status message.
AwsError ErrorFromStatus(Protocol protocol, const Status& status);

}  // namespace kiln::aws
