#include "control/instance_credentials.h"

#include "base/ids.h"

namespace kiln::control {

aws::Credential InstanceCredentials::Issue(const std::string& role_arn, const std::string& session_name) const {
  aws::Credential c;
  // "ASIA" marks temporary (session) credentials in AWS; SDKs treat both prefixes alike.
  c.access_key_id = "ASIA" + RandomAlnum(16, /*upper_only=*/true);
  c.secret_access_key = RandomAlnum(40);
  c.session_token = RandomAlnum(96);
  std::string role_name = role_arn.substr(role_arn.rfind('/') == std::string::npos ? 0 : role_arn.rfind('/') + 1);
  if (role_name.empty()) role_name = "kiln-instance";
  c.account_id = account_id_;
  c.principal_arn = "arn:aws:sts::" + account_id_ + ":assumed-role/" + role_name + "/" + session_name;
  c.user_id = "AROA" + RandomAlnum(17, true) + ":" + session_name;
  return c;
}

void InstanceCredentials::Register(const aws::Credential& credential) {
  MutexLock lock(mutex_);
  keys_[credential.access_key_id] = credential;
}

void InstanceCredentials::Revoke(const std::string& access_key_id) {
  MutexLock lock(mutex_);
  keys_.erase(access_key_id);
}

std::optional<aws::Credential> InstanceCredentials::Lookup(std::string_view access_key_id) const {
  MutexLock lock(mutex_);
  auto it = keys_.find(access_key_id);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

nlohmann::json CredentialToJson(const aws::Credential& c) {
  return {{"access_key_id", c.access_key_id},
          {"secret_access_key", c.secret_access_key},
          {"session_token", c.session_token},
          {"principal_arn", c.principal_arn},
          {"user_id", c.user_id},
          {"account_id", c.account_id}};
}

aws::Credential CredentialFromJson(const nlohmann::json& j) {
  aws::Credential c;
  c.access_key_id = j.value("access_key_id", "");
  c.secret_access_key = j.value("secret_access_key", "");
  c.session_token = j.value("session_token", "");
  c.principal_arn = j.value("principal_arn", "");
  c.user_id = j.value("user_id", "");
  c.account_id = j.value("account_id", "");
  return c;
}

}  // namespace kiln::control
