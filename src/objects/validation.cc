#include "objects/validation.h"

#include "base/strings.h"

namespace kiln::objects {
namespace {

constexpr size_t kMaxKeyBytes = 1024;

bool IsIpv4Like(const std::string& name) {
  auto fields = Split(name, '.');
  if (fields.size() != 4) return false;
  for (auto f : fields) {
    if (f.empty() || f.size() > 3 || !ParseUint64(f).has_value()) return false;
  }
  return true;
}

}  // namespace

Status ValidateBucketName(const std::string& bucket) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("InvalidBucketName: the specified bucket is not valid (" + why + "): " + bucket)
        .WithReason(ErrorReason::kInvalidBucketName);
  };
  if (bucket.size() < 3 || bucket.size() > 63) return bad("length must be 3-63");
  for (char c : bucket) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    if (!ok) return bad("only lower-case letters, digits, '.' and '-'");
  }
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(bucket.front()) || !alnum(bucket.back())) return bad("must start and end with a letter or digit");
  if (bucket.find("..") != std::string::npos) return bad("no adjacent periods");
  if (IsIpv4Like(bucket)) return bad("must not be formatted as an IP address");
  return Status::Ok();
}

Status ValidateObjectKey(const std::string& key) {
  if (key.empty()) {
    return Status::InvalidArgument("InvalidArgument: the object key must not be empty")
        .WithReason(ErrorReason::kInvalidArgument);
  }
  if (key.size() > kMaxKeyBytes) {
    return Status::InvalidArgument("KeyTooLongError: your key is too long (" + std::to_string(key.size()) +
                                   " bytes; the limit is 1024)")
        .WithReason(ErrorReason::kKeyTooLong);
  }
  return Status::Ok();
}

}  // namespace kiln::objects
