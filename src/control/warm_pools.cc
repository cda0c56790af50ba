#include "control/warm_pools.h"

#include <algorithm>

#include "base/strings.h"

namespace kiln::control {

using nlohmann::json;

namespace {

constexpr char kGrantPrefix[] = "warm-pool/";

json MemberOr(const json& object, const char* member, const json& fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(member);
  return it == object.end() || it->is_null() ? fallback : *it;
}

}  // namespace

int64_t KeepAliveSeconds(const json& request) {
  const json rc = MemberOr(request, "ResourceConfig", json::object());
  const json keep = MemberOr(rc, "KeepAlivePeriodInSeconds", 0);
  return keep.is_number_integer() ? std::max<int64_t>(keep.get<int64_t>(), 0) : 0;
}

std::string WarmPoolGrantId(const std::string& job) { return kGrantPrefix + job; }

std::string WarmPoolJobOfGrant(const std::string& grant_id) {
  return StartsWith(grant_id, kGrantPrefix) ? grant_id.substr(sizeof(kGrantPrefix) - 1) : "";
}

bool WarmPoolMatches(const json& kept, const json& next) {
  if (KeepAliveSeconds(next) <= 0) return false;
  const json kept_rc = MemberOr(kept, "ResourceConfig", json::object());
  const json next_rc = MemberOr(next, "ResourceConfig", json::object());
  for (const char* member : {"InstanceType", "VolumeKmsKeyId"}) {
    if (MemberOr(kept_rc, member, "") != MemberOr(next_rc, member, "")) return false;
  }
  for (const char* member : {"InstanceCount", "VolumeSizeInGB"}) {
    if (MemberOr(kept_rc, member, 1) != MemberOr(next_rc, member, 1)) return false;
  }
  if (MemberOr(kept, "RoleArn", "") != MemberOr(next, "RoleArn", "")) return false;
  if (MemberOr(kept, "VpcConfig", json::object()) != MemberOr(next, "VpcConfig", json::object())) return false;
  for (const char* flag : {"EnableInterContainerTrafficEncryption", "EnableNetworkIsolation"}) {
    if (MemberOr(kept, flag, false) != MemberOr(next, flag, false)) return false;
  }
  return true;
}

int64_t WarmPoolExpiry(int64_t from_millis, int64_t keep_alive_seconds, int64_t chain_start_millis) {
  const int64_t period = std::max<int64_t>(keep_alive_seconds, 0) * 1000;
  return std::min(from_millis + period, chain_start_millis + kMaxWarmPoolChainMillis);
}

}  // namespace kiln::control
