#pragma once
// The web console's sign-in sessions (issue 22): a browser signs one request with the user's
// access key (POST /_kiln/console/session, verified like any API call) and gets a random token in
// an HttpOnly cookie; later requests carry the cookie instead of a signature and act as that key.
//
// Sessions live in memory only: a restart signs everyone out. The map is keyed by the SHA-256 of
// the token, so a memory dump does not hold usable tokens. A session remembers the SHA-256 of the
// key's secret at sign-in; every Find() looks the key up again in the CredentialProvider, and a
// key that was removed or whose secret changed ends the session (the same as revoking the key
// for SigV4 callers). At most max_sessions live at once: a new one evicts the oldest.
//
// Thread-safe.
//
//   ConsoleSessions sessions({.ttl_millis = 12 * 3600 * 1000}, &credentials);
//   ConsoleSessions::Created created = sessions.Create(verified.credential);
//   ... Set-Cookie: kiln_session=<created.token>
//   if (std::optional<ConsoleSessions::Live> live = sessions.Find(cookie)) { act as live->credential }

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "aws/credentials.h"
#include "base/mutex.h"

namespace kiln::api {

class ConsoleSessions {
 public:
  struct Options {
    // How long a session lives after sign-in (config "console.session_minutes"; 12 h like the AWS
    // console). Longer keeps a stolen cookie useful longer.
    int64_t ttl_millis = 720LL * 60 * 1000;
    // Live sessions at most; each costs ~300 bytes. Past it the oldest session is signed out.
    size_t max_sessions = 10000;
    // The clock (epoch milliseconds); tests replace it. Null = base::NowMillis.
    std::function<int64_t()> now_millis;
  };

  // `credentials` (not owned) must outlive this object.
  ConsoleSessions(Options options, const aws::CredentialProvider* credentials);
  ConsoleSessions(const ConsoleSessions&) = delete;
  ConsoleSessions& operator=(const ConsoleSessions&) = delete;

  struct Created {
    std::string token;  // 64 lower-case hex characters (32 random bytes): the cookie's value
    int64_t expires_at_millis = 0;
  };
  // Starts a session for `credential` (a key just verified by SigV4). Never fails.
  Created Create(const aws::Credential& credential);

  struct Live {
    aws::Credential credential;  // as the provider has it now
    int64_t expires_at_millis = 0;
  };
  // The session `token` stands for, or nullopt when there is none: unknown, expired (it is then
  // removed), or its key was removed or its secret changed since sign-in (removed too).
  std::optional<Live> Find(std::string_view token);

  // Ends the session `token` names; true when there was one.
  bool Remove(std::string_view token);

  size_t size() const;
  int64_t ttl_millis() const { return options_.ttl_millis; }

 private:
  struct Entry {
    std::string access_key_id;
    std::string secret_sha256;  // raw SHA-256 of the secret at sign-in
    int64_t expires_at_millis = 0;
    uint64_t sequence = 0;  // creation order, for eviction
  };
  int64_t Now() const;
  // Drops expired sessions from the oldest end, then the oldest while over `keep` sessions.
  void Prune(int64_t now, size_t keep) REQUIRES(mutex_);

  const Options options_;
  const aws::CredentialProvider* credentials_;
  mutable Mutex mutex_;
  // By raw SHA-256 of the token.
  std::map<std::string, Entry> sessions_ GUARDED_BY(mutex_);
  // Creation order → token hash: every session has the same ttl, so the oldest expires first.
  std::map<uint64_t, std::string> by_age_ GUARDED_BY(mutex_);
  uint64_t next_sequence_ GUARDED_BY(mutex_) = 0;
};

}  // namespace kiln::api
