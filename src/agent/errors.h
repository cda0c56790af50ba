#pragma once
// The agent module's error convention (transfer.h): a Status whose message is meant to become the
// job's FailureReason verbatim. ClientError — the user's fault (missing bucket or object, bad
// manifest, unsafe key, bad archive, a full disk the user can free): the message starts with
// "ClientError: " and the reason is ErrorReason::kClientError. InternalServerError — Kiln's fault:
// "InternalServerError: " and ErrorReason::kInternalServerError. Callers that wrap errors test the
// reason (IsFailureReason), never the message, to know whether one is already in this form.

#include <string>

#include "base/status.h"

namespace kiln::agent {

// "ClientError: <text>", code InvalidArgument unless the failure is better named by another code
// (a full disk is ResourceExhausted).
inline Status ClientError(const std::string& text, StatusCode code = StatusCode::kInvalidArgument) {
  return Status(code, "ClientError: " + text, ErrorReason::kClientError);
}

// "InternalServerError: <text>", code Internal unless the store's own code says more.
inline Status InternalServerError(const std::string& text, StatusCode code = StatusCode::kInternal) {
  return Status(code, "InternalServerError: " + text, ErrorReason::kInternalServerError);
}

// Whether `status` is already a FailureReason (ClientError or InternalServerError) that callers
// pass on unchanged rather than wrapping.
inline bool IsFailureReason(const Status& status) {
  return status.Is(ErrorReason::kClientError) || status.Is(ErrorReason::kInternalServerError);
}

}  // namespace kiln::agent
