#pragma once
// InstanceCredentials: the credentials each training (later: serving) instance gets in place of
// the role in `RoleArn` (training-contract.md §5.1, DESIGN.md §8). Kiln does not dereference IAM
// roles; it issues a key pair with a session token per job, bound to an assumed-role principal
// `arn:aws:sts::<account>:assumed-role/<role name>/<job name>`, and accepts it on every service
// until the job ends. The issued keys are persisted by the caller (in the job's state) and
// re-registered when a restarted server adopts the job, so instances keep working across
// restarts.
//
// Thread-safe.

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "aws/credentials.h"
#include "base/mutex.h"

namespace kiln::control {

class InstanceCredentials final : public aws::CredentialProvider {
 public:
  explicit InstanceCredentials(std::string account_id) : account_id_(std::move(account_id)) {}

  // A fresh key pair for `session_name` (the job) acting as `role_arn`.
  aws::Credential Issue(const std::string& role_arn, const std::string& session_name) const;
  // Accepts `credential` from now on (after Issue, or when adopting a job after a restart).
  void Register(const aws::Credential& credential) EXCLUDES(mutex_);
  // Stops accepting the key.
  void Revoke(const std::string& access_key_id) EXCLUDES(mutex_);

  std::optional<aws::Credential> Lookup(std::string_view access_key_id) const override EXCLUDES(mutex_);

 private:
  std::string account_id_;
  mutable Mutex mutex_;
  std::map<std::string, aws::Credential, std::less<>> keys_ GUARDED_BY(mutex_);
};

// The credentials as kept in a job's or endpoint's state, so that an adopting server accepts
// them again (Register). Missing members read as empty.
nlohmann::json CredentialToJson(const aws::Credential& c);
aws::Credential CredentialFromJson(const nlohmann::json& j);

// Serves the keys of `first`, then of `second` (operator keys, then instance keys).
class ChainedCredentialProvider final : public aws::CredentialProvider {
 public:
  ChainedCredentialProvider(const aws::CredentialProvider* first, const aws::CredentialProvider* second)
      : first_(first), second_(second) {}
  std::optional<aws::Credential> Lookup(std::string_view access_key_id) const override {
    if (auto c = first_->Lookup(access_key_id)) return c;
    return second_->Lookup(access_key_id);
  }

 private:
  const aws::CredentialProvider* first_;
  const aws::CredentialProvider* second_;
};

}  // namespace kiln::control
