#pragma once
// Access keys Kiln accepts and the identity each one stands for.

#include <optional>
#include <string>
#include <string_view>

namespace kiln::aws {

struct Credential {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless the key was issued with one
  std::string principal_arn;  // "arn:aws:iam::<account>:user/<name>"
  std::string user_id;        // "AIDA..." as STS GetCallerIdentity returns
  std::string account_id;     // 12 digits
};

// Looks up credentials by access key id. Implementations must be thread-safe.
class CredentialProvider {
 public:
  virtual ~CredentialProvider() = default;
  virtual std::optional<Credential> Lookup(std::string_view access_key_id) const = 0;
};

}  // namespace kiln::aws
