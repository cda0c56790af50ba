#include "api/credential_store.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/time.h"

namespace kiln::api {

namespace {
using nlohmann::json;

int64_t MtimeNs(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

json ToJson(const aws::Credential& c) {
  json j = {{"access_key_id", c.access_key_id},
            {"secret_access_key", c.secret_access_key},
            {"principal_arn", c.principal_arn},
            {"user_id", c.user_id},
            {"account_id", c.account_id}};
  if (!c.session_token.empty()) j["session_token"] = c.session_token;
  return j;
}

Result<std::vector<aws::Credential>> ParseKeys(const std::string& text, const std::string& path,
                                               const std::string& account_id) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array()) {
    return Status::InvalidArgument(path + ": expected {\"keys\": [...]}");
  }
  std::vector<aws::Credential> keys;
  for (const auto& k : doc["keys"]) {
    if (!k.is_object() || !k.contains("access_key_id") || !k.contains("secret_access_key") ||
        !k["access_key_id"].is_string() || !k["secret_access_key"].is_string()) {
      return Status::InvalidArgument(path + ": each key needs string access_key_id and secret_access_key");
    }
    aws::Credential c;
    c.access_key_id = k["access_key_id"].get<std::string>();
    c.secret_access_key = k["secret_access_key"].get<std::string>();
    c.account_id = k.value("account_id", account_id);
    c.principal_arn = k.value("principal_arn", "arn:aws:iam::" + c.account_id + ":user/kiln");
    c.user_id = k.value("user_id", "AIDA" + c.access_key_id.substr(std::min<size_t>(4, c.access_key_id.size())));
    c.session_token = k.value("session_token", "");
    keys.push_back(std::move(c));
  }
  return keys;
}

Status WriteKeys(const std::string& path, const std::vector<aws::Credential>& keys) {
  json doc = {{"keys", json::array()}};
  for (const auto& k : keys) doc["keys"].push_back(ToJson(k));
  return WriteFileAtomic(path, doc.dump(2) + "\n", 0600);
}
}  // namespace

aws::Credential CredentialStore::NewCredential(const std::string& account_id, const std::string& user_name) {
  aws::Credential c;
  c.access_key_id = "AKIA" + RandomAlnum(16, /*upper_only=*/true);
  c.secret_access_key = RandomAlnum(40);
  c.account_id = account_id;
  c.principal_arn = "arn:aws:iam::" + account_id + ":user/" + user_name;
  c.user_id = "AIDA" + RandomAlnum(17, /*upper_only=*/true);
  return c;
}

Result<std::vector<aws::Credential>> CredentialStore::ReadFile(const std::string& path, const std::string& account_id) {
  ASSIGN_OR_RETURN(std::string text, kiln::ReadFile(path));
  return ParseKeys(text, path, account_id);
}

Result<aws::Credential> CredentialStore::AddKey(const std::string& path, const std::string& account_id,
                                                const std::string& user_name) {
  std::vector<aws::Credential> keys;
  if (PathExists(path)) {
    ASSIGN_OR_RETURN(keys, ReadFile(path, account_id));
  }
  aws::Credential c = NewCredential(account_id, user_name);
  keys.push_back(c);
  RETURN_IF_ERROR(WriteKeys(path, keys));
  return c;
}

Result<std::unique_ptr<CredentialStore>> CredentialStore::Open(Options options, bool create_if_missing) {
  if (!PathExists(options.path)) {
    if (!create_if_missing) return Status::NotFound("no credentials file at " + options.path);
    RETURN_IF_ERROR(WriteKeys(options.path, {NewCredential(options.account_id, "kiln-admin")}));
    KLOG(info, "created credentials", {{"path", options.path}});
  }
  std::unique_ptr<CredentialStore> store(new CredentialStore(std::move(options)));
  MutexLock lock(store->mutex_);  // not shared yet; taken so the analysis sees the guarded writes
  ASSIGN_OR_RETURN(store->file_keys_, ReadFile(store->options_.path, store->options_.account_id));
  store->file_mtime_ns_ = MtimeNs(store->options_.path);
  store->last_check_millis_ = NowMillis();
  return store;
}

void CredentialStore::MaybeReload() const {
  int64_t now = NowMillis();
  if (now - last_check_millis_ < options_.reload_interval_millis) return;
  last_check_millis_ = now;
  int64_t mtime = MtimeNs(options_.path);
  if (mtime == file_mtime_ns_) return;
  auto keys = ReadFile(options_.path, options_.account_id);
  if (!keys.ok()) {
    // Keep serving the keys we have; a half-edited file must not lock everyone out.
    KLOG(warn, "credentials file not reloaded", {{"error", keys.status().ToString()}});
    return;
  }
  file_keys_ = std::move(keys).value();
  file_mtime_ns_ = mtime;
  KLOG(info, "credentials reloaded", {{"path", options_.path}});
}

std::optional<aws::Credential> CredentialStore::Lookup(std::string_view access_key_id) const {
  for (const auto& c : options_.configured) {
    if (c.access_key_id == access_key_id) return c;
  }
  MutexLock lock(mutex_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (const auto& c : file_keys_) {
      if (c.access_key_id == access_key_id) return c;
    }
    if (attempt == 0) MaybeReload();
  }
  return std::nullopt;
}

std::optional<aws::Credential> CredentialStore::Primary() const {
  if (!options_.configured.empty()) return options_.configured.front();
  MutexLock lock(mutex_);
  if (file_keys_.empty()) return std::nullopt;
  return file_keys_.front();
}

}  // namespace kiln::api
