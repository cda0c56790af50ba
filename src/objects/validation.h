#pragma once
// Name rules shared by every ObjectStore backend, so that all of them reject the same input with
// the same error before touching storage or the network.

#include <string>

#include "base/status.h"

namespace kiln::objects {

// S3 bucket-name rules: 3–63 characters of a-z 0-9 . -, starting and ending with a letter or
// digit, no "..", not shaped like an IPv4 address. InvalidArgument("InvalidBucketName: ...") with
// reason kInvalidBucketName.
Status ValidateBucketName(const std::string& bucket);
// 1..1024 bytes; empty: InvalidArgument("InvalidArgument: ...") with reason kInvalidArgument;
// longer: InvalidArgument("KeyTooLongError: ...") with reason kKeyTooLong.
Status ValidateObjectKey(const std::string& key);

}  // namespace kiln::objects
