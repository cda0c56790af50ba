#include "serving/async_queue.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "store/test_util/temp_database.h"

namespace kiln::serving {
namespace {

AsyncRequest Request(const std::string& endpoint, const std::string& id) {
  AsyncRequest r;
  r.endpoint = endpoint;
  r.inference_id = id;
  r.input_location = "s3://b/in/" + id;
  r.output_location = "s3://b/out/" + id + ".out";
  r.received_millis = 1000;
  return r;
}

std::unique_ptr<AsyncQueue> OpenQueue(const std::string& dir, size_t max = 100000, size_t compact = 4096) {
  auto queue = AsyncQueue::Open({.dir = dir, .max_per_endpoint = max, .compact_min_records = compact});
  EXPECT_TRUE(queue.ok()) << queue.status().ToString();
  return std::move(queue).value();
}

TEST(AsyncQueueTest, FifoPerEndpointAndRecoveryKeepsWhatIsNotDone) {
  store::testing::TempDir dir;
  {
    auto queue = OpenQueue(dir.path());
    for (const char* id : {"a", "b", "c"}) {
      AsyncRequest r = Request("ep", id);
      ASSERT_TRUE(queue->Enqueue(r).ok());
    }
    AsyncRequest other = Request("ep2", "x");
    ASSERT_TRUE(queue->Enqueue(other).ok());
    auto first = queue->Take("ep");
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->inference_id, "a");
    queue->Complete("ep", first->seq);
    auto second = queue->Take("ep");
    ASSERT_TRUE(second.has_value());
    EXPECT_EQ(second->inference_id, "b");  // taken, never completed: in flight at the "crash"
    auto backlog = queue->Backlogs();
    EXPECT_EQ(backlog["ep"].waiting, 1u);
    EXPECT_EQ(backlog["ep"].in_flight, 1u);
  }
  auto queue = OpenQueue(dir.path());
  auto b = queue->Take("ep");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->inference_id, "b");
  EXPECT_TRUE(b->recovered);
  EXPECT_EQ(b->output_location, "s3://b/out/b.out");
  auto c = queue->Take("ep");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->inference_id, "c");
  EXPECT_GT(c->seq, b->seq);
  EXPECT_FALSE(queue->Take("ep").has_value());
  EXPECT_EQ(queue->Take("ep2")->inference_id, "x");
  // New requests continue the sequence.
  AsyncRequest d = Request("ep", "d");
  ASSERT_TRUE(queue->Enqueue(d).ok());
  EXPECT_GT(d.seq, c->seq);
}

TEST(AsyncQueueTest, TornLastLineIsIgnored) {
  store::testing::TempDir dir;
  {
    auto queue = OpenQueue(dir.path());
    AsyncRequest r = Request("ep", "a");
    ASSERT_TRUE(queue->Enqueue(r).ok());
  }
  {
    std::ofstream out(dir.path() + "/ep.journal", std::ios::app);
    out << "{\"op\":\"put\",\"seq\":9,\"inference";  // a crash mid-write
  }
  auto queue = OpenQueue(dir.path());
  EXPECT_EQ(queue->Take("ep")->inference_id, "a");
  EXPECT_FALSE(queue->Take("ep").has_value());
  AsyncRequest r = Request("ep", "b");
  ASSERT_TRUE(queue->Enqueue(r).ok());
  auto reopened = OpenQueue(dir.path());
  EXPECT_EQ(reopened->Take("ep")->inference_id, "a");
  EXPECT_EQ(reopened->Take("ep")->inference_id, "b");
}

TEST(AsyncQueueTest, BoundRefusesAndUntakeKeepsOrder) {
  store::testing::TempDir dir;
  auto queue = OpenQueue(dir.path(), 2);
  AsyncRequest a = Request("ep", "a"), b = Request("ep", "b"), c = Request("ep", "c");
  ASSERT_TRUE(queue->Enqueue(a).ok());
  ASSERT_TRUE(queue->Enqueue(b).ok());
  EXPECT_EQ(queue->Enqueue(c).code(), StatusCode::kResourceExhausted);
  auto taken = queue->Take("ep");
  queue->Untake(*taken);
  EXPECT_EQ(queue->Take("ep")->inference_id, "a");
}

TEST(AsyncQueueTest, CompactionKeepsOnlyLiveRequests) {
  store::testing::TempDir dir;
  {
    auto queue = OpenQueue(dir.path(), 100000, 10);
    AsyncRequest keep = Request("ep", "keep");
    ASSERT_TRUE(queue->Enqueue(keep).ok());
    for (int i = 0; i < 50; ++i) {
      AsyncRequest r = Request("ep", "r" + std::to_string(i));
      ASSERT_TRUE(queue->Enqueue(r).ok());
    }
    EXPECT_EQ(queue->Take("ep")->inference_id, "keep");
    for (int i = 0; i < 50; ++i) {
      auto r = queue->Take("ep");
      ASSERT_TRUE(r.has_value());
      queue->Complete("ep", r->seq);
    }
    EXPECT_LE(queue->TEST_JournalLines("ep"), 12u);
  }
  auto queue = OpenQueue(dir.path());
  EXPECT_EQ(queue->Take("ep")->inference_id, "keep");
  EXPECT_FALSE(queue->Take("ep").has_value());
}

TEST(AsyncQueueTest, ConcurrentEnqueuersAllDurable) {
  store::testing::TempDir dir;
  {
    auto queue = OpenQueue(dir.path());
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 50; ++i) {
          AsyncRequest r = Request("ep", std::to_string(t) + "-" + std::to_string(i));
          ASSERT_TRUE(queue->Enqueue(r).ok());
        }
      });
    }
    for (auto& thread : threads) thread.join();
  }
  auto queue = OpenQueue(dir.path());
  std::set<std::string> ids;
  uint64_t last = 0;
  while (auto r = queue->Take("ep")) {
    EXPECT_GT(r->seq, last);
    last = r->seq;
    ids.insert(r->inference_id);
  }
  EXPECT_EQ(ids.size(), 400u);
}

TEST(AsyncQueueTest, DropRemovesTheJournal) {
  store::testing::TempDir dir;
  {
    auto queue = OpenQueue(dir.path());
    AsyncRequest r = Request("ep", "a");
    ASSERT_TRUE(queue->Enqueue(r).ok());
    queue->Drop("ep");
    EXPECT_TRUE(queue->Backlogs().empty());
  }
  auto queue = OpenQueue(dir.path());
  EXPECT_FALSE(queue->Take("ep").has_value());
}

}  // namespace
}  // namespace kiln::serving
