#include "api/credential_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "base/fs.h"
#include "base/ids.h"

namespace kiln::api {
namespace {

class CredentialStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("kiln-creds-" + RandomHex(6))).string();
    ASSERT_TRUE(MakeDirs(dir_).ok());
    path_ = dir_ + "/credentials.json";
  }
  void TearDown() override { (void)RemoveAll(dir_); }
  std::string dir_, path_;
};

TEST_F(CredentialStoreTest, CreatesPrivateFileWithOneKey) {
  CredentialStore::Options options;
  options.path = path_;
  auto store = CredentialStore::Open(options, true);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto primary = (*store)->Primary();
  ASSERT_TRUE(primary.has_value());
  EXPECT_EQ(primary->access_key_id.size(), 20u);
  EXPECT_EQ(primary->secret_access_key.size(), 40u);
  EXPECT_TRUE((*store)->Lookup(primary->access_key_id).has_value());
  EXPECT_FALSE((*store)->Lookup("AKIANOTAKEY").has_value());
}

TEST_F(CredentialStoreTest, PicksUpAddedKeysWithoutRestart) {
  CredentialStore::Options options;
  options.path = path_;
  options.reload_interval_millis = 0;
  auto store = CredentialStore::Open(options, true);
  ASSERT_TRUE(store.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // distinct mtime
  auto added = CredentialStore::AddKey(path_, "000000000000", "alice");
  ASSERT_TRUE(added.ok());
  auto found = (*store)->Lookup(added->access_key_id);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->principal_arn, "arn:aws:iam::000000000000:user/alice");
}

TEST_F(CredentialStoreTest, MalformedFileIsAnError) {
  ASSERT_TRUE(WriteFileAtomic(path_, "{\"keys\": 3}").ok());
  CredentialStore::Options options;
  options.path = path_;
  auto store = CredentialStore::Open(options, true);
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace kiln::api
