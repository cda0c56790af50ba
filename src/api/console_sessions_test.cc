#include "api/console_sessions.h"

#include <gtest/gtest.h>

#include <map>

namespace kiln::api {
namespace {

// A key table the test edits, as an operator edits credentials.json.
class EditableCredentials final : public aws::CredentialProvider {
 public:
  std::optional<aws::Credential> Lookup(std::string_view id) const override {
    auto it = keys.find(std::string(id));
    if (it == keys.end()) return std::nullopt;
    return it->second;
  }
  void Add(const std::string& id, const std::string& secret) {
    aws::Credential c;
    c.access_key_id = id;
    c.secret_access_key = secret;
    c.principal_arn = "arn:aws:iam::123456789012:user/" + id;
    keys[id] = c;
  }
  std::map<std::string, aws::Credential> keys;
};

class ConsoleSessionsTest : public ::testing::Test {
 protected:
  ConsoleSessionsTest() {
    credentials_.Add("AKIAONE", "secret-one");
    credentials_.Add("AKIATWO", "secret-two");
  }
  ConsoleSessions::Options Options(size_t max_sessions = 10000) {
    return {.ttl_millis = 60000, .max_sessions = max_sessions, .now_millis = [this] { return now_; }};
  }
  int64_t now_ = 1'000'000;
  EditableCredentials credentials_;
};

TEST_F(ConsoleSessionsTest, CreateGivesAHexTokenThatFindsTheKey) {
  ConsoleSessions sessions(Options(), &credentials_);
  ConsoleSessions::Created created = sessions.Create(*credentials_.Lookup("AKIAONE"));
  ASSERT_EQ(created.token.size(), 64u);
  EXPECT_EQ(created.token.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(created.expires_at_millis, now_ + 60000);
  auto live = sessions.Find(created.token);
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->credential.access_key_id, "AKIAONE");
  EXPECT_EQ(live->credential.principal_arn, "arn:aws:iam::123456789012:user/AKIAONE");
  EXPECT_EQ(live->expires_at_millis, created.expires_at_millis);
  // Two sign-ins are two sessions.
  EXPECT_NE(sessions.Create(*credentials_.Lookup("AKIAONE")).token, created.token);
  EXPECT_EQ(sessions.size(), 2u);
}

TEST_F(ConsoleSessionsTest, UnknownAndMalformedTokensFindNothing) {
  ConsoleSessions sessions(Options(), &credentials_);
  std::string token = sessions.Create(*credentials_.Lookup("AKIAONE")).token;
  EXPECT_FALSE(sessions.Find(std::string(64, 'a')).has_value());
  EXPECT_FALSE(sessions.Find("").has_value());
  EXPECT_FALSE(sessions.Find(token.substr(1)).has_value());
  EXPECT_FALSE(sessions.Find(token + "0").has_value());
  EXPECT_TRUE(sessions.Find(token).has_value());
}

TEST_F(ConsoleSessionsTest, ExpiresAfterTheTtl) {
  ConsoleSessions sessions(Options(), &credentials_);
  std::string token = sessions.Create(*credentials_.Lookup("AKIAONE")).token;
  now_ += 59999;
  EXPECT_TRUE(sessions.Find(token).has_value());
  now_ += 1;
  EXPECT_FALSE(sessions.Find(token).has_value());
  EXPECT_EQ(sessions.size(), 0u);  // removed when found expired
}

TEST_F(ConsoleSessionsTest, ExpiredSessionsArePrunedOnCreate) {
  ConsoleSessions sessions(Options(), &credentials_);
  sessions.Create(*credentials_.Lookup("AKIAONE"));
  sessions.Create(*credentials_.Lookup("AKIATWO"));
  now_ += 60000;
  sessions.Create(*credentials_.Lookup("AKIAONE"));
  EXPECT_EQ(sessions.size(), 1u);
}

TEST_F(ConsoleSessionsTest, RemoveSignsOut) {
  ConsoleSessions sessions(Options(), &credentials_);
  std::string token = sessions.Create(*credentials_.Lookup("AKIAONE")).token;
  EXPECT_TRUE(sessions.Remove(token));
  EXPECT_FALSE(sessions.Remove(token));
  EXPECT_FALSE(sessions.Find(token).has_value());
}

TEST_F(ConsoleSessionsTest, RemovedKeyEndsItsSessions) {
  ConsoleSessions sessions(Options(), &credentials_);
  std::string one = sessions.Create(*credentials_.Lookup("AKIAONE")).token;
  std::string two = sessions.Create(*credentials_.Lookup("AKIATWO")).token;
  credentials_.keys.erase("AKIAONE");
  EXPECT_FALSE(sessions.Find(one).has_value());
  EXPECT_TRUE(sessions.Find(two).has_value());
  // Re-adding the key does not revive the session: it was removed.
  credentials_.Add("AKIAONE", "secret-one");
  EXPECT_FALSE(sessions.Find(one).has_value());
}

TEST_F(ConsoleSessionsTest, ChangedSecretEndsTheSession) {
  ConsoleSessions sessions(Options(), &credentials_);
  std::string token = sessions.Create(*credentials_.Lookup("AKIAONE")).token;
  credentials_.keys["AKIAONE"].principal_arn = "arn:aws:iam::123456789012:user/renamed";
  auto live = sessions.Find(token);
  ASSERT_TRUE(live.has_value());  // other fields may change; the session follows them
  EXPECT_EQ(live->credential.principal_arn, "arn:aws:iam::123456789012:user/renamed");
  credentials_.keys["AKIAONE"].secret_access_key = "rotated";
  EXPECT_FALSE(sessions.Find(token).has_value());
}

TEST_F(ConsoleSessionsTest, OldestIsEvictedPastTheLimit) {
  ConsoleSessions sessions(Options(3), &credentials_);
  std::vector<std::string> tokens;
  for (int i = 0; i < 5; ++i) {
    tokens.push_back(sessions.Create(*credentials_.Lookup("AKIAONE")).token);
    now_ += 1;
  }
  EXPECT_EQ(sessions.size(), 3u);
  EXPECT_FALSE(sessions.Find(tokens[0]).has_value());
  EXPECT_FALSE(sessions.Find(tokens[1]).has_value());
  for (int i = 2; i < 5; ++i) EXPECT_TRUE(sessions.Find(tokens[i]).has_value()) << i;
}

}  // namespace
}  // namespace kiln::api
