#pragma once
// Status and Result<T>: Kiln's error values (STYLE.md §4).
//
// A Status is either OK (no allocation) or a code plus a message. Result<T> holds a T or a non-OK
// Status. Errors that callers handle travel as these values; exceptions never cross a module
// boundary. Codes are few on purpose: each protocol edge maps them to its wire error in one place.
//
//   Result<int> ParsePort(std::string_view s);
//   ASSIGN_OR_RETURN(int port, ParsePort(text));
//   RETURN_IF_ERROR(db.Exec("..."));

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong; retrying the same input fails again
  kNotFound,            // the named thing does not exist
  kAlreadyExists,       // creating something whose name is taken
  kFailedPrecondition,  // the system is not in a state that allows this (e.g. bucket not empty)
  kPermissionDenied,    // authenticated, but not allowed
  kUnauthenticated,     // no or bad credentials
  kResourceExhausted,   // quota, disk full, too large
  kOutOfRange,          // a range or offset outside the data
  kAborted,             // a concurrent change won; retry may succeed
  kDeadlineExceeded,    // timed out
  kUnavailable,         // transient: the peer or resource is not reachable now
  kUnimplemented,       // not supported by Kiln
  kDataLoss,            // stored data is corrupt or a checksum did not match
  kInternal,            // a bug or an unexpected environment failure
};

std::string_view StatusCodeName(StatusCode code);

// A finer, typed sub-kind of an error, set where the error is made and tested where a caller must
// tell errors of one code apart (which S3 error a NotFound is; whether a placement failed only for
// now). The message stays what users read; callers never parse it to learn the reason. kNone for
// OK and for errors nobody needs to tell apart.
enum class ErrorReason : int {
  kNone = 0,
  // objects/ and store/ (object_store.h): the S3 error a NotFound / FailedPrecondition stands for.
  kNoSuchBucket,
  kNoSuchKey,
  kNoSuchUpload,
  kBucketNotEmpty,
  kPreconditionFailed,
  kInvalidPart,        // a completed part is missing or its ETag differs
  kInvalidPartOrder,   // the part list is not in ascending order
  kEntityTooSmall,     // a non-last part is under the minimum part size
  kInvalidRange,       // a byte range outside the object
  kInvalidBucketName,  // the bucket name breaks S3's naming rules
  kKeyTooLong,         // S3's KeyTooLongError: the key is over 1,024 bytes
  kInvalidArgument,    // S3's InvalidArgument (not StatusCode::kInvalidArgument): the message's detail is shown
  kInvalidRequest,     // S3's InvalidRequest: the message's detail is shown
  kEntityTooLarge,     // the object or part is over the size limit
  kBadDigest,          // the data does not match its Content-MD5 or x-amz-checksum-*
  kInvalidDigest,      // aws/payload: the Content-MD5 header itself is not a base64 MD5
  // base/json_parse: the text is not well-formed JSON (as opposed to over a size or depth limit).
  kMalformed,
  // agent/ (agent/errors.h): the message is the job's FailureReason verbatim and says whose fault it
  // is ("ClientError: ..." the user's, "InternalServerError: ..." Kiln's).
  kClientError,
  kInternalServerError,
  // control/ scheduler: the request fits the fleet but not what is free now (retry later).
  kDoesNotFitNow,
};

std::string_view ErrorReasonName(ErrorReason reason);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, ErrorReason reason = ErrorReason::kNone);

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
  static Status Unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // kNone for OK and for errors made without one.
  ErrorReason reason() const { return state_ ? state_->reason : ErrorReason::kNone; }
  bool Is(ErrorReason r) const { return reason() == r; }
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsInvalidArgument() const { return code() == StatusCode::kInvalidArgument; }
  bool IsAlreadyExists() const { return code() == StatusCode::kAlreadyExists; }

  // Returns a copy whose message is "<prefix>: <message>" (code and reason kept); OK stays OK.
  Status WithPrefix(std::string_view prefix) const;
  // Returns a copy with the given reason (code and message kept); OK stays OK.
  //   return Status::NotFound("NoSuchKey: ...").WithReason(ErrorReason::kNoSuchKey);
  Status WithReason(ErrorReason reason) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
    ErrorReason reason = ErrorReason::kNone;
  };
  // nullptr means OK; shared so that copies are cheap. Never mutated after construction.
  std::shared_ptr<const State> state_;
};

// Holds either a value or a non-OK Status. Constructing a Result from an OK Status is a bug and
// is turned into an Internal error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(const T& value) : v_(value) {}                    // NOLINT(implicit)
  Result(T&& value) : v_(std::move(value)) {}              // NOLINT(implicit)
  Result(Status status) : v_(FixOk(std::move(status))) {}  // NOLINT(implicit)
  template <typename U,
            typename = std::enable_if_t<std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, T>>>
  Result(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT(implicit)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T value_or(T fallback) const { return ok() ? value() : std::move(fallback); }

 private:
  static Status FixOk(Status s) {
    return s.ok() ? Status::Internal("Result constructed from OK status") : std::move(s);
  }
  std::variant<T, Status> v_;
};

namespace internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
const Status& AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Returns the Status of `expr` (a Status or Result) from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                                    \
  do {                                                           \
    auto&& kiln_status_or_result_ = (expr);                      \
    if (!kiln_status_or_result_.ok()) {                          \
      return ::kiln::internal::AsStatus(kiln_status_or_result_); \
    }                                                            \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) {                            \
    return tmp.status();                      \
  }                                           \
  lhs = std::move(tmp).value()
