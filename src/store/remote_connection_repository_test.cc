#include "store/remote_connection_repository.h"

#include <gtest/gtest.h>

#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

class RemoteConnectionRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override { db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false); }

  RemoteConnectionRecord Open(const std::string& id, const std::string& arn, int64_t start) {
    RemoteConnectionRecord r;
    r.id = id;
    r.resource_arn = arn;
    r.target = "training-job/j/algo-1";
    r.principal = "arn:aws:iam::000000000000:user/kiln";
    r.source_address = "127.0.0.1:40000";
    r.start_millis = start;
    return r;
  }

  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
};

TEST_F(RemoteConnectionRepositoryTest, InsertCloseAndListNewestFirst) {
  RemoteConnectionRepository repo(db_.get());
  const std::string a = "arn:aws:sagemaker:us-east-1:000000000000:training-job/a";
  const std::string b = "arn:aws:sagemaker:us-east-1:000000000000:training-job/b";
  ASSERT_TRUE(repo.Insert(Open("c1", a, 1000)).ok());
  ASSERT_TRUE(repo.Insert(Open("c2", b, 2000)).ok());
  ASSERT_TRUE(repo.Insert(Open("c3", a, 3000)).ok());
  EXPECT_EQ(repo.Insert(Open("c3", a, 3000)).code(), StatusCode::kAlreadyExists);

  RemoteConnectionRecord closed = Open("c1", a, 1000);
  closed.end_millis = 1500;
  closed.bytes_in = 12;
  closed.bytes_out = 3400;
  closed.forwards = {"direct-tcpip localhost:6006", "tcpip-forward 12345"};
  closed.exit_statuses = {0, 3};
  closed.close_reason = "client disconnected";
  ASSERT_TRUE(repo.Close(closed).ok());
  RemoteConnectionRecord missing = Open("nope", a, 1);
  EXPECT_EQ(repo.Close(missing).code(), StatusCode::kNotFound);

  auto all = repo.List("", 10);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id, "c3");
  EXPECT_EQ((*all)[1].id, "c2");
  EXPECT_EQ((*all)[2].id, "c1");
  EXPECT_FALSE((*all)[0].end_millis.has_value());
  const RemoteConnectionRecord& c1 = (*all)[2];
  EXPECT_EQ(c1.end_millis, 1500);
  EXPECT_EQ(c1.bytes_in, 12u);
  EXPECT_EQ(c1.bytes_out, 3400u);
  EXPECT_EQ(c1.forwards, closed.forwards);
  EXPECT_EQ(c1.exit_statuses, closed.exit_statuses);
  EXPECT_EQ(c1.close_reason, "client disconnected");
  EXPECT_EQ(c1.principal, "arn:aws:iam::000000000000:user/kiln");

  // Per resource (ARNs match case-insensitively), and bounded.
  auto only_a = repo.List("ARN:aws:sagemaker:us-east-1:000000000000:training-job/A", 10);
  ASSERT_TRUE(only_a.ok());
  ASSERT_EQ(only_a->size(), 2u);
  EXPECT_EQ((*only_a)[0].id, "c3");
  auto got = repo.Get("c1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->close_reason, "client disconnected");
  EXPECT_EQ(repo.Get("nope").status().code(), StatusCode::kNotFound);
  auto one = repo.List("", 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
}

TEST_F(RemoteConnectionRepositoryTest, CloseOpenEndsRowsLeftOpenByAStoppedServer) {
  RemoteConnectionRepository repo(db_.get());
  const std::string a = "arn:aws:sagemaker:us-east-1:000000000000:training-job/a";
  ASSERT_TRUE(repo.Insert(Open("c1", a, 1000)).ok());
  RemoteConnectionRecord done = Open("c2", a, 2000);
  done.end_millis = 2500;
  done.close_reason = "idle timeout";
  ASSERT_TRUE(repo.Insert(done).ok());
  auto n = repo.CloseOpen(9000, "server stopping");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);
  auto all = repo.List(a, 10);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].end_millis, 9000);
  EXPECT_EQ((*all)[1].close_reason, "server stopping");
  EXPECT_EQ((*all)[0].close_reason, "idle timeout");
}

}  // namespace
}  // namespace kiln::store
