#include "api/console_sessions.h"

#include "base/hash.h"
#include "base/ids.h"
#include "base/time.h"

namespace kiln::api {

ConsoleSessions::ConsoleSessions(Options options, const aws::CredentialProvider* credentials)
    : options_(std::move(options)), credentials_(credentials) {}

int64_t ConsoleSessions::Now() const { return options_.now_millis ? options_.now_millis() : NowMillis(); }

ConsoleSessions::Created ConsoleSessions::Create(const aws::Credential& credential) {
  Created created;
  created.token = RandomHex(32);
  const int64_t now = Now();
  created.expires_at_millis = now + options_.ttl_millis;
  Entry entry;
  entry.access_key_id = credential.access_key_id;
  entry.secret_sha256 = Sha256(credential.secret_access_key);
  entry.expires_at_millis = created.expires_at_millis;
  MutexLock lock(mutex_);
  Prune(now, options_.max_sessions > 0 ? options_.max_sessions - 1 : 0);
  entry.sequence = next_sequence_++;
  std::string key = Sha256(created.token);
  by_age_.emplace(entry.sequence, key);
  sessions_.emplace(std::move(key), std::move(entry));
  return created;
}

std::optional<ConsoleSessions::Live> ConsoleSessions::Find(std::string_view token) {
  // Only well-formed tokens are hashed and looked up (a cookie is attacker-sized input).
  if (token.size() != 64) return std::nullopt;
  const std::string key = Sha256(token);
  const int64_t now = Now();
  Entry entry;
  {
    MutexLock lock(mutex_);
    auto it = sessions_.find(key);
    if (it == sessions_.end()) return std::nullopt;
    if (it->second.expires_at_millis <= now) {
      by_age_.erase(it->second.sequence);
      sessions_.erase(it);
      return std::nullopt;
    }
    entry = it->second;
  }
  // Outside the lock: the provider may re-read its file.
  std::optional<aws::Credential> credential = credentials_->Lookup(entry.access_key_id);
  if (!credential || !ConstantTimeEquals(Sha256(credential->secret_access_key), entry.secret_sha256)) {
    Remove(token);
    return std::nullopt;
  }
  return Live{std::move(*credential), entry.expires_at_millis};
}

bool ConsoleSessions::Remove(std::string_view token) {
  if (token.size() != 64) return false;
  const std::string key = Sha256(token);
  MutexLock lock(mutex_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return false;
  by_age_.erase(it->second.sequence);
  sessions_.erase(it);
  return true;
}

size_t ConsoleSessions::size() const {
  MutexLock lock(mutex_);
  return sessions_.size();
}

void ConsoleSessions::Prune(int64_t now, size_t keep) {
  while (!by_age_.empty()) {
    auto oldest = by_age_.begin();
    auto it = sessions_.find(oldest->second);
    if (it != sessions_.end() && it->second.expires_at_millis > now && sessions_.size() <= keep) break;
    if (it != sessions_.end()) sessions_.erase(it);
    by_age_.erase(oldest);
  }
}

}  // namespace kiln::api
