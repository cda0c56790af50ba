#pragma once
// Kiln's access keys, kept in `<data-dir>/credentials.json` (mode 0600):
//
//   {"keys": [{"access_key_id": "AKIA...", "secret_access_key": "...",
//              "principal_arn": "arn:aws:iam::<account>:user/kiln-admin",
//              "user_id": "AIDA...", "account_id": "<12 digits>"}]}
//
// The first start creates the file with one random key pair. Operators add pairs with
// `kiln keys add` (or by editing the file); the server picks up changes without a restart.
// Keys given in the config file are served as well and take precedence.
//
// Thread-safe.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aws/credentials.h"
#include "base/mutex.h"
#include "base/status.h"

namespace kiln::api {

class CredentialStore final : public aws::CredentialProvider {
 public:
  struct Options {
    std::string path;                         // <data-dir>/credentials.json
    std::string account_id = "000000000000";  // for keys that do not name one
    std::vector<aws::Credential> configured;  // from the config file
    // A missed lookup re-reads the file when it changed, at most this often.
    int reload_interval_millis = 1000;
  };

  // Loads the file, creating it with one fresh key pair when it does not exist (and
  // `create_if_missing`). Errors: the file is unreadable or malformed (the message names it).
  static Result<std::unique_ptr<CredentialStore>> Open(Options options, bool create_if_missing);

  // Appends a fresh key pair to the file (atomically) and returns it.
  static Result<aws::Credential> AddKey(const std::string& path, const std::string& account_id,
                                        const std::string& user_name);
  // Reads the keys in the file.
  static Result<std::vector<aws::Credential>> ReadFile(const std::string& path, const std::string& account_id);
  static aws::Credential NewCredential(const std::string& account_id, const std::string& user_name);

  // CredentialProvider
  std::optional<aws::Credential> Lookup(std::string_view access_key_id) const override;

  // The first key: what `kiln env` prints.
  std::optional<aws::Credential> Primary() const;

 private:
  explicit CredentialStore(Options options) : options_(std::move(options)) {}
  // Re-reads the key file if it changed (checked at most once per reload interval).
  void MaybeReload() const REQUIRES(mutex_);

  Options options_;
  mutable Mutex mutex_;
  mutable std::vector<aws::Credential> file_keys_ GUARDED_BY(mutex_);
  mutable int64_t file_mtime_ns_ GUARDED_BY(mutex_) = 0;
  mutable int64_t last_check_millis_ GUARDED_BY(mutex_) = 0;
};

}  // namespace kiln::api
