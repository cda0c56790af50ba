#include "base/status.h"

namespace kiln {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kUnauthenticated: return "Unauthenticated";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string_view ErrorReasonName(ErrorReason reason) {
  switch (reason) {
    case ErrorReason::kNone: return "None";
    case ErrorReason::kNoSuchBucket: return "NoSuchBucket";
    case ErrorReason::kNoSuchKey: return "NoSuchKey";
    case ErrorReason::kNoSuchUpload: return "NoSuchUpload";
    case ErrorReason::kBucketNotEmpty: return "BucketNotEmpty";
    case ErrorReason::kPreconditionFailed: return "PreconditionFailed";
    case ErrorReason::kDoesNotFitNow: return "DoesNotFitNow";
    case ErrorReason::kInvalidPart: return "InvalidPart";
    case ErrorReason::kInvalidPartOrder: return "InvalidPartOrder";
    case ErrorReason::kEntityTooSmall: return "EntityTooSmall";
    case ErrorReason::kInvalidRange: return "InvalidRange";
    case ErrorReason::kInvalidBucketName: return "InvalidBucketName";
    case ErrorReason::kKeyTooLong: return "KeyTooLongError";
    case ErrorReason::kInvalidArgument: return "InvalidArgument";
    case ErrorReason::kInvalidRequest: return "InvalidRequest";
    case ErrorReason::kEntityTooLarge: return "EntityTooLarge";
    case ErrorReason::kBadDigest: return "BadDigest";
    case ErrorReason::kInvalidDigest: return "InvalidDigest";
    case ErrorReason::kMalformed: return "Malformed";
    case ErrorReason::kClientError: return "ClientError";
    case ErrorReason::kInternalServerError: return "InternalServerError";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message, ErrorReason reason) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message), reason});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += state_->message;
  return out;
}

Status Status::WithPrefix(std::string_view prefix) const {
  if (ok()) return *this;
  std::string m(prefix);
  m += ": ";
  m += state_->message;
  return Status(code(), std::move(m), reason());
}

Status Status::WithReason(ErrorReason reason) const {
  if (ok()) return *this;
  return Status(code(), state_->message, reason);
}

}  // namespace kiln
