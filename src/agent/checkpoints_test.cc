#include "agent/checkpoints.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "agent/test_util/agent_fixture.h"
#include "base/strings.h"

namespace kiln::agent {
namespace {

using testing::AgentTest;

class CheckpointTest : public AgentTest {
 protected:
  std::unique_ptr<CheckpointSync> Make(const std::string& uri) {
    CheckpointSync::Options o;
    o.scan_interval = std::chrono::milliseconds(30);
    o.quiet_period = std::chrono::milliseconds(100);
    auto r = CheckpointSync::Create(*store_, uri, dir(), o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }
  std::string dir() const { return work() + "/ckpt"; }
  void Write(const std::string& rel, const std::string& data) {
    ASSERT_TRUE(MakeDirs(std::filesystem::path(dir() + "/" + rel).parent_path().string()).ok());
    ASSERT_TRUE(WriteFileAtomic(dir() + "/" + rel, data).ok());
  }
  // Waits until `pred` holds (up to 5 s).
  template <typename P>
  bool Eventually(P pred) {
    for (int i = 0; i < 500; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

TEST_F(CheckpointTest, RestoreThenSyncNewChangedDeleted) {
  Put("run/ckpt/epoch-1.pt", "one");
  Put("run/ckpt/sub/state.json", "{}");
  Put("run/ckpt/", "");                 // folder marker
  Put("run/ckpt-other/x", "not ours");  // sibling prefix: not restored
  auto sync = Make("s3://bkt/run/ckpt/");
  ASSERT_TRUE(sync->Restore().ok());
  EXPECT_EQ(Slurp(dir() + "/epoch-1.pt"), "one");
  EXPECT_EQ(Slurp(dir() + "/sub/state.json"), "{}");
  EXPECT_FALSE(PathExists(dir() + "/x"));
  EXPECT_EQ(sync->stats().restored_files, 2u);

  sync->Start();
  Write("epoch-2.pt", "two");
  EXPECT_TRUE(Eventually([&] { return Get("run/ckpt/epoch-2.pt") == "two"; }));
  Write("epoch-2.pt", "two, rewritten");
  EXPECT_TRUE(Eventually([&] { return Get("run/ckpt/epoch-2.pt") == "two, rewritten"; }));
  ASSERT_EQ(unlink((dir() + "/epoch-1.pt").c_str()), 0);
  EXPECT_TRUE(Eventually([&] { return !Exists("run/ckpt/epoch-1.pt"); }));
  // Restored files that did not change are not uploaded again.
  EXPECT_EQ(sync->stats().uploaded_files, 2u);

  Write("last.pt", "final");  // written just before exit: Final uploads it without a quiet wait
  ASSERT_TRUE(sync->Final().ok());
  EXPECT_EQ(Get("run/ckpt/last.pt"), "final");
  EXPECT_EQ(Get("run/ckpt/sub/state.json"), "{}");
  EXPECT_EQ(Get("run/ckpt-other/x"), "not ours");
  EXPECT_EQ(sync->stats().deleted_objects, 1u);
}

TEST_F(CheckpointTest, QuietPeriodDelaysUploadOfFileBeingWritten) {
  CheckpointSync::Options o;
  o.scan_interval = std::chrono::milliseconds(20);
  o.quiet_period = std::chrono::milliseconds(2000);
  auto sync = CheckpointSync::Create(*store_, "s3://bkt/q", dir(), o);
  ASSERT_TRUE(sync.ok());
  ASSERT_TRUE((*sync)->Restore().ok());
  (*sync)->Start();
  Write("busy.pt", "partial");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(Exists("q/busy.pt"));
  ASSERT_TRUE((*sync)->Final().ok());
  EXPECT_EQ(Get("q/busy.pt"), "partial");
}

TEST_F(CheckpointTest, KeysUseExactlyOneSlash) {
  auto sync = Make("s3://bkt/a///");
  ASSERT_TRUE(sync->Restore().ok());
  Write("f", "1");
  ASSERT_TRUE(sync->Final().ok());
  EXPECT_EQ(Get("a/f"), "1");
  auto whole_bucket = CheckpointSync::Create(*store_, "s3://bkt", work() + "/wb", {});
  ASSERT_TRUE(whole_bucket.ok());
  ASSERT_TRUE((*whole_bucket)->Restore().ok());
  EXPECT_EQ(Slurp(work() + "/wb/a/f"), "1");
}

TEST_F(CheckpointTest, ErrorsAreClientErrors) {
  auto bad = CheckpointSync::Create(*store_, "file:///x", dir(), {});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(StartsWith(bad.status().message(), "ClientError: "));
  auto missing = Make("s3://nobucket/x");
  Status s = missing->Restore();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(StartsWith(s.message(), "ClientError: ")) << s.message();
  EXPECT_NE(s.message().find("nobucket"), std::string::npos);
  Put("t/../../evil", "x");
  auto trav = Make("s3://bkt/t");
  s = trav->Restore();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(StartsWith(s.message(), "ClientError: ")) << s.message();
}

}  // namespace
}  // namespace kiln::agent
