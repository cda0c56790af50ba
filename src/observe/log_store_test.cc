#include "observe/log_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <tuple>

// Designated initializers name only the fields a case sets; the rest keep their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "store/test_util/temp_database.h"

namespace kiln::observe {
namespace {

class FakeClock : public Clock {
 public:
  int64_t NowMillis() const override { return now; }
  int64_t now = 1'700'000'000'000;
};

class LogStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  void Reopen(size_t max_open_streams = 64) {
    store_.reset();
    db_.reset();
    db_ = store::testing::OpenTestDatabase(dir_.path(), false);
    auto s = LogStore::Open({dir_.path() + "/logs", db_.get(), &clock_, max_open_streams});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }
  // Appends events with timestamps first..first+n-1 and messages "m<ts>", in batches of `batch`.
  void Fill(int64_t first, int n, int batch = 1000) {
    for (int i = 0; i < n; i += batch) {
      std::vector<InputEvent> events;
      for (int k = i; k < std::min(n, i + batch); ++k) events.push_back({first + k, "m" + std::to_string(first + k)});
      ASSERT_TRUE(store_->Append("g", "s", events).ok());
    }
  }
  std::vector<int64_t> Stamps(const EventsPage& page) {
    std::vector<int64_t> out;
    for (const auto& e : page.events) out.push_back(e.timestamp);
    return out;
  }
  EventsPage Get(EventsQuery q) {
    auto r = store_->GetEvents("g", "s", q);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : EventsPage{};
  }

  store::testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<LogStore> store_;
};

std::vector<int64_t> Range(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

TEST_F(LogStoreTest, GroupsAndStreamsLifecycle) {
  EXPECT_EQ(store_->CreateStream("g", "s").message(), "The specified log group does not exist.");
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  EXPECT_TRUE(store_->CreateGroup("g").IsAlreadyExists());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  EXPECT_TRUE(store_->CreateStream("g", "s").IsAlreadyExists());
  EXPECT_EQ(store_->DeleteStream("g", "nope").message(), "The specified log stream does not exist.");
  Fill(100, 3);
  auto info = store_->GetStream("g", "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(*info->first_event_timestamp, 100);
  EXPECT_EQ(*info->last_event_timestamp, 102);
  EXPECT_EQ(*info->last_ingestion_time, clock_.now);
  EXPECT_EQ(info->event_count, 3);
  ASSERT_TRUE(store_->DeleteGroup("g").ok());
  EXPECT_TRUE(store_->GetStream("g", "s").status().IsNotFound());
  EXPECT_TRUE(store_->DeleteGroup("g").IsNotFound());
  // Recreated: no events from before.
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  EXPECT_TRUE(Get({.start_from_head = true}).events.empty());
}

TEST_F(LogStoreTest, AppendValidation) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  EXPECT_TRUE(store_->Append("g", "s", {{2, "a"}, {1, "b"}}).status().IsInvalidArgument());
  EXPECT_TRUE(store_->Append("g", "s", {}).status().IsInvalidArgument());
  EXPECT_TRUE(store_->Append("g", "s", {{1, std::string(256 * 1024 + 1, 'x')}}).status().IsInvalidArgument());
  EXPECT_TRUE(store_->Append("g", "s", {{1, std::string(256 * 1024, 'x')}}).ok());
  std::vector<InputEvent> many(10001, InputEvent{1, "x"});
  EXPECT_TRUE(store_->Append("g", "s", many).status().IsInvalidArgument());
  std::vector<InputEvent> big(5, InputEvent{1, std::string(220000, 'y')});
  EXPECT_TRUE(store_->Append("g", "s", big).status().IsInvalidArgument());
  EXPECT_TRUE(store_->Append("g", "nope", {{1, "a"}}).status().IsNotFound());
  EXPECT_TRUE(store_->Append("nope", "s", {{1, "a"}}).status().IsNotFound());
  auto count = store_->Append("g", "s", {{1, "a"}, {1, "b"}});
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 3);
}

struct TokenCase {
  const char* name;
  EventsQuery query;
  std::vector<int64_t> want;
};

TEST_F(LogStoreTest, FirstPageTable) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  Fill(0, 100, 30);
  const std::vector<TokenCase> cases = {
      {"head, all", {.start_from_head = true}, Range(0, 100)},
      {"tail, all", {}, Range(0, 100)},
      {"head limit", {.limit = 10, .start_from_head = true}, Range(0, 10)},
      {"tail limit", {.limit = 10}, Range(90, 100)},
      {"head from start", {.start_time = 50, .limit = 5, .start_from_head = true}, Range(50, 55)},
      {"tail before end", {.end_time = 50, .limit = 5}, Range(45, 50)},
      {"window", {.start_time = 20, .end_time = 25}, Range(20, 25)},
      {"empty window", {.start_time = 200}, {}},
  };
  for (const auto& c : cases) EXPECT_EQ(Stamps(Get(c.query)), c.want) << c.name;
}

TEST_F(LogStoreTest, ForwardPagingEndsWithSameToken) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  Fill(0, 250, 100);
  std::vector<int64_t> got;
  EventsQuery q{.limit = 100, .start_from_head = true};
  std::string token;
  for (int pages = 0; pages < 10; ++pages) {
    auto page = Get(q);
    ASSERT_EQ(page.next_forward_token.substr(0, 2), "f/");
    ASSERT_EQ(page.next_backward_token.substr(0, 2), "b/");
    if (page.events.empty()) {
      EXPECT_EQ(page.next_forward_token, q.token);
      break;
    }
    for (auto t : Stamps(page)) got.push_back(t);
    q.token = page.next_forward_token;
  }
  EXPECT_EQ(got, Range(0, 250));
  // Events appended later are visible to the old token, and then the end repeats again.
  Fill(250, 5);
  auto more = Get(q);
  EXPECT_EQ(Stamps(more), Range(250, 255));
  q.token = more.next_forward_token;
  auto end = Get(q);
  EXPECT_TRUE(end.events.empty());
  EXPECT_EQ(end.next_forward_token, q.token);
}

TEST_F(LogStoreTest, BackwardPagingFromTail) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  Fill(0, 95, 40);
  std::vector<int64_t> got;
  auto page = Get({.limit = 30});
  EXPECT_EQ(Stamps(page), Range(65, 95));
  got = Stamps(page);
  for (int i = 0; i < 10; ++i) {
    auto prev = Get({.limit = 30, .token = page.next_backward_token});
    if (prev.events.empty()) {
      EXPECT_EQ(prev.next_backward_token, page.next_backward_token);
      break;
    }
    auto s = Stamps(prev);
    got.insert(got.begin(), s.begin(), s.end());
    page = prev;
  }
  EXPECT_EQ(got, Range(0, 95));
  // Forward from the first page's forward token continues after its last event.
  auto fwd = Get({.limit = 10, .token = Get({.limit = 10, .start_from_head = true}).next_forward_token});
  EXPECT_EQ(Stamps(fwd), Range(10, 20));
}

TEST_F(LogStoreTest, BoundsApplyToTokenPages) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  Fill(0, 100);
  auto first = Get({.start_time = 10, .end_time = 20, .limit = 4, .start_from_head = true});
  EXPECT_EQ(Stamps(first), Range(10, 14));
  auto second = Get({.start_time = 10, .end_time = 20, .limit = 4, .token = first.next_forward_token});
  EXPECT_EQ(Stamps(second), Range(14, 18));
  auto third = Get({.start_time = 10, .end_time = 20, .limit = 4, .token = second.next_forward_token});
  EXPECT_EQ(Stamps(third), Range(18, 20));
  auto end = Get({.start_time = 10, .end_time = 20, .limit = 4, .token = third.next_forward_token});
  EXPECT_TRUE(end.events.empty());
  EXPECT_EQ(end.next_forward_token, third.next_forward_token);
}

TEST_F(LogStoreTest, DefaultLimitIsOneMegabyte) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  std::vector<InputEvent> batch(10, InputEvent{5, std::string(100000, 'z')});
  ASSERT_TRUE(store_->Append("g", "s", batch).ok());
  ASSERT_TRUE(store_->Append("g", "s", batch).ok());
  auto page = Get({.start_from_head = true});
  EXPECT_EQ(page.events.size(), 10u);  // 10 * (100000 + 26) fits, 11 do not
  Fill(6, 20000, 10000);
  EXPECT_EQ(Get({}).events.size(), 10000u);
}

TEST_F(LogStoreTest, BadTokens) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  ASSERT_TRUE(store_->CreateStream("g", "other").ok());
  Fill(0, 3);
  auto other = store_->GetEvents("g", "other", {.start_from_head = true});
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(store_->GetEvents("g", "s", {.token = other->next_forward_token}).status().IsInvalidArgument());
  EXPECT_TRUE(store_->GetEvents("g", "s", {.token = "f/garbage"}).status().IsInvalidArgument());
  auto page = Get({.start_from_head = true});
  std::string swapped = "b" + page.next_forward_token.substr(1);
  EXPECT_TRUE(store_->GetEvents("g", "s", {.token = swapped}).status().IsInvalidArgument());
}

TEST_F(LogStoreTest, EventsSurviveReopenAndTornTail) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  Fill(0, 50);
  auto before = Get({.limit = 10, .start_from_head = true});
  Reopen();
  // A torn record at the end (a crash mid-append) is cut off at load.
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path() + "/logs")) {
    FILE* f = fopen(entry.path().c_str(), "ab");
    fwrite("\x10\x00\x00", 1, 3, f);
    fclose(f);
  }
  auto after = Get({.limit = 10, .token = before.next_forward_token});
  EXPECT_EQ(Stamps(after), Range(10, 20));
  EXPECT_EQ(Get({.start_from_head = true}).events.size(), 50u);
  EXPECT_EQ(Get({.start_from_head = true}).events[7].message, "m7");
  Fill(50, 1);
  EXPECT_EQ(Stamps(Get({.limit = 2})), Range(49, 51));
}

TEST_F(LogStoreTest, ListStreamsOrdering) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  for (const char* name : {"c", "a", "b"}) ASSERT_TRUE(store_->CreateStream("g", name).ok());
  ASSERT_TRUE(store_->Append("g", "a", {{300, "x"}}).ok());
  ASSERT_TRUE(store_->Append("g", "b", {{100, "x"}}).ok());
  ASSERT_TRUE(store_->Append("g", "c", {{200, "x"}}).ok());
  auto names = [](const StreamPage& p) {
    std::vector<std::string> out;
    for (const auto& s : p.streams) out.push_back(s.name);
    return out;
  };
  EXPECT_EQ(names(*store_->ListStreams("g", "", StreamOrder::kLogStreamName, false, 50, "")),
            (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(names(*store_->ListStreams("g", "", StreamOrder::kLastEventTime, false, 50, "")),
            (std::vector<std::string>{"b", "c", "a"}));
  EXPECT_EQ(names(*store_->ListStreams("g", "", StreamOrder::kLastEventTime, true, 50, "")),
            (std::vector<std::string>{"a", "c", "b"}));
  auto p1 = store_->ListStreams("g", "", StreamOrder::kLogStreamName, true, 2, "");
  EXPECT_EQ(names(*p1), (std::vector<std::string>{"c", "b"}));
  auto p2 = store_->ListStreams("g", "", StreamOrder::kLogStreamName, true, 2, p1->next_token);
  EXPECT_EQ(names(*p2), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(p2->next_token.empty());
  EXPECT_TRUE(store_->ListStreams("g", "a", StreamOrder::kLastEventTime, false, 50, "").status().IsInvalidArgument());
  EXPECT_TRUE(store_->ListStreams("nope", "", StreamOrder::kLogStreamName, false, 50, "").status().IsNotFound());
}

// Keyset pages (two index ranges per LastEventTime page, prefix bounds by name) return what a
// sort of every stream by (k, name) and a scan past the token's key returns: every order,
// direction, prefix and limit, ties in last event time, streams without events (k = 0), and a
// token carried from one order to the other.
TEST_F(LogStoreTest, ListStreamsPagesMatchAFullSort) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateGroup("other").ok());
  ASSERT_TRUE(store_->CreateStream("other", "a").ok());
  const std::vector<std::pair<std::string, std::optional<int64_t>>> streams = {
      {"a", 5},  {"ab", 5}, {"abc", std::nullopt}, {"abd", 7}, {"b", 5}, {"b/1", -3}, {"b/2", std::nullopt},
      {"ba", 7}, {"c", 1},  {"a\x7f", 2}};
  for (const auto& [name, ts] : streams) {
    ASSERT_TRUE(store_->CreateStream("g", name).ok());
    if (ts) {
      ASSERT_TRUE(store_->Append("g", name, {{*ts, "x"}}).ok());
    }
  }
  using Key = std::pair<int64_t, std::string>;
  auto expected = [&](StreamOrder order, bool desc, const std::string& prefix, const std::optional<Key>& after) {
    std::vector<Key> keys;
    for (const auto& [name, ts] : streams) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      keys.emplace_back(order == StreamOrder::kLastEventTime ? ts.value_or(0) : 0, name);
    }
    std::sort(keys.begin(), keys.end());
    if (desc) std::reverse(keys.begin(), keys.end());
    std::vector<std::string> out;
    for (const Key& k : keys) {
      if (!after || (desc ? k < *after : *after < k)) out.push_back(k.second);
    }
    return out;
  };
  for (StreamOrder order : {StreamOrder::kLogStreamName, StreamOrder::kLastEventTime}) {
    for (bool desc : {false, true}) {
      for (std::string prefix : {"", "a", "ab", "b/", "z", "a\x7f"}) {
        if (order == StreamOrder::kLastEventTime && !prefix.empty()) continue;
        for (int limit = 1; limit <= 4; ++limit) {
          std::vector<std::string> got;
          std::string token;
          for (int pages = 0; pages < 20; ++pages) {
            auto page = store_->ListStreams("g", prefix, order, desc, limit, token);
            ASSERT_TRUE(page.ok()) << page.status().ToString();
            ASSERT_LE(page->streams.size(), static_cast<size_t>(limit));
            for (const auto& s : page->streams) got.push_back(s.name);
            token = page->next_token;
            if (token.empty()) break;
          }
          EXPECT_EQ(got, expected(order, desc, prefix, std::nullopt))
              << "order " << int(order) << " desc " << desc << " prefix " << prefix << " limit " << limit;
        }
      }
    }
  }
  // A LastEventTime token (k = 7) used ordering by name: every (0, name) key is before it.
  auto by_time = store_->ListStreams("g", "", StreamOrder::kLastEventTime, true, 1, "");
  ASSERT_TRUE(by_time.ok());
  ASSERT_EQ(by_time->streams[0].name, "ba");
  for (bool desc : {false, true}) {
    auto page = store_->ListStreams("g", "", StreamOrder::kLogStreamName, desc, 50, by_time->next_token);
    ASSERT_TRUE(page.ok());
    std::vector<std::string> got;
    for (const auto& s : page->streams) got.push_back(s.name);
    EXPECT_EQ(got, expected(StreamOrder::kLogStreamName, desc, "", Key{7, "ba"}));
  }
  EXPECT_TRUE(
      store_->ListStreams("g", "", StreamOrder::kLogStreamName, false, 5, "bm90IGpzb24=").status().IsInvalidArgument());
}

TEST_F(LogStoreTest, ListGroupsPrefixBounds) {
  for (const char* name : {"/a", "/a/1", "/a0", "/b", "/a\x7f"}) ASSERT_TRUE(store_->CreateGroup(name).ok());
  auto names = [](const GroupPage& p) {
    std::vector<std::string> out;
    for (const auto& g : p.groups) out.push_back(g.name);
    return out;
  };
  EXPECT_EQ(names(*store_->ListGroups("/a", "", 50, "")), (std::vector<std::string>{"/a", "/a/1", "/a0", "/a\x7f"}));
  EXPECT_EQ(names(*store_->ListGroups("/a\x7f", "", 50, "")), (std::vector<std::string>{"/a\x7f"}));
  EXPECT_EQ(names(*store_->ListGroups("/c", "", 50, "")), (std::vector<std::string>{}));
}

TEST_F(LogStoreTest, ListGroupsPaging) {
  for (const char* name : {"/b/1", "/a/2", "/a/1", "x"}) ASSERT_TRUE(store_->CreateGroup(name).ok());
  auto p1 = store_->ListGroups("/a", "", 1, "");
  ASSERT_TRUE(p1.ok());
  ASSERT_EQ(p1->groups.size(), 1u);
  EXPECT_EQ(p1->groups[0].name, "/a/1");
  auto p2 = store_->ListGroups("/a", "", 1, p1->next_token);
  ASSERT_EQ(p2->groups.size(), 1u);
  EXPECT_EQ(p2->groups[0].name, "/a/2");
  EXPECT_TRUE(p2->next_token.empty());
  EXPECT_EQ(store_->ListGroups("", "B/", 50, "")->groups.size(), 1u);
  EXPECT_EQ(store_->ListGroups("", "", 50, "")->groups.size(), 4u);
}

TEST_F(LogStoreTest, FilterMergesStreams) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s1").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s2").ok());
  ASSERT_TRUE(store_->CreateStream("g", "t").ok());
  ASSERT_TRUE(store_->Append("g", "s1", {{1, "ERROR one"}, {3, "INFO two"}, {5, "ERROR three"}}).ok());
  ASSERT_TRUE(store_->Append("g", "s2", {{1, "ERROR four"}, {4, "WARN five"}}).ok());
  ASSERT_TRUE(store_->Append("g", "t", {{2, "ERROR six"}}).ok());
  auto r = store_->Filter("g", {.stream_name_prefix = "s", .pattern = "ERROR"});
  ASSERT_TRUE(r.ok());
  std::vector<std::string> msgs;
  for (const auto& e : r->events) msgs.push_back(e.stream_name + ":" + e.message);
  EXPECT_EQ(msgs, (std::vector<std::string>{"s1:ERROR one", "s2:ERROR four", "s1:ERROR three"}));
  EXPECT_TRUE(r->next_token.empty());
  // Paging with limit 1 visits every event once, then no token.
  FilterQuery q{.limit = 2};
  std::vector<std::string> all;
  for (int i = 0; i < 10; ++i) {
    auto page = store_->Filter("g", q);
    ASSERT_TRUE(page.ok());
    for (const auto& e : page->events) all.push_back(e.message);
    if (page->next_token.empty()) break;
    q.token = page->next_token;
  }
  EXPECT_EQ(all.size(), 6u);
  EXPECT_EQ(all.back(), "ERROR three");
  EXPECT_TRUE(store_->Filter("g", {.stream_names = {"a"}, .stream_name_prefix = "s"}).status().IsInvalidArgument());
  auto named = store_->Filter("g", {.stream_names = {"t"}, .start_time = 2, .end_time = 3});
  ASSERT_EQ(named->events.size(), 1u);
  EXPECT_EQ(named->events[0].message, "ERROR six");
}

// ---- Bounded memory: the index lives on disk; reads anywhere in a long stream stay exact ----

// The index files of the store's streams (one per stream that was read or written).
std::vector<std::string> IndexFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".index") out.push_back(entry.path());
  }
  return out;
}

TEST_F(LogStoreTest, MillionEventStreamKeepsIndexMemoryBounded) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  Fill(0, 1000, 1000);
  const auto small = store_->TEST_MemoryStats();
  EXPECT_EQ(small.open_streams, 1u);
  Fill(1000, 999'000, 10000);
  const auto large = store_->TEST_MemoryStats();
  // A constant-size handle: the same bytes for 1,000 and 1,000,000 events, and small.
  EXPECT_EQ(large.index_bytes, small.index_bytes);
  EXPECT_LT(large.index_bytes, 1024u);
  EXPECT_EQ(store_->GetStream("g", "s")->event_count, 1'000'000);

  auto check_reads = [&](const char* when) {
    SCOPED_TRACE(when);
    for (int64_t at : {0, 1, 63, 64, 65, 4095, 123'457, 500'000, 999'936, 999'990}) {
      auto fwd = Get({.start_time = at, .limit = 5, .start_from_head = true});
      EXPECT_EQ(Stamps(fwd), Range(at, std::min<int64_t>(at + 5, 1'000'000))) << at;
      if (!fwd.events.empty()) {
        EXPECT_EQ(fwd.events[0].message, "m" + std::to_string(at));
      }
      // The page's tokens continue from where it ended, in both directions.
      auto next = Get({.limit = 3, .token = fwd.next_forward_token});
      EXPECT_EQ(Stamps(next), Range(std::min<int64_t>(at + 5, 1'000'000), std::min<int64_t>(at + 8, 1'000'000)));
      auto back = Get({.limit = 3, .token = fwd.next_backward_token});
      EXPECT_EQ(Stamps(back), Range(std::max<int64_t>(at - 3, 0), at)) << at;
      auto before = Get({.end_time = at + 1, .limit = 4});
      EXPECT_EQ(Stamps(before), Range(std::max<int64_t>(at - 3, 0), at + 1)) << at;
    }
    EXPECT_EQ(Stamps(Get({.start_time = 700'000, .end_time = 700'010})), Range(700'000, 700'010));
    EXPECT_EQ(Stamps(Get({.limit = 2})), Range(999'998, 1'000'000));
    auto tail = Get({});  // 10,000 events fit in 1 MB
    EXPECT_EQ(Stamps(tail), Range(990'000, 1'000'000));
    auto filtered = store_->Filter("g", {.start_time = 333'330, .pattern = "m33333", .limit = 3});
    ASSERT_TRUE(filtered.ok()) << filtered.status().ToString();
    ASSERT_EQ(filtered->events.size(), 3u);
    EXPECT_EQ(filtered->events[0].message, "m333330");
    EXPECT_EQ(filtered->events[2].message, "m333332");
  };
  check_reads("written in this process");
  Reopen();
  check_reads("after reopen (index read back from disk)");
  EXPECT_EQ(store_->TEST_MemoryStats().index_bytes, small.index_bytes);
  // A lost index is rebuilt from the events.
  Reopen();
  for (const auto& path : IndexFiles(dir_.path() + "/logs")) std::filesystem::remove(path);
  check_reads("after the index file was removed");
  auto count = store_->Append("g", "s", {{1'000'000, "m1000000"}});
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 1'000'001);
}

// The contract, written the simple way (every event in memory), to check the store against.
struct ModelEvent {
  int64_t ts;
  std::string message;
};

struct ModelPage {
  std::vector<size_t> picked;  // event indexes, oldest first
  size_t forward = 0;
  size_t backward = 0;
};

ModelPage ModelGet(const std::vector<ModelEvent>& events, std::optional<size_t> position, char direction,
                   const EventsQuery& q) {
  const size_t n = events.size();
  const size_t max_events = q.limit ? *q.limit : 10000;
  ModelPage page;
  size_t bytes = 0;
  auto take = [&](size_t i) {
    int64_t ts = events[i].ts;
    if ((q.start_time && ts < *q.start_time) || (q.end_time && ts >= *q.end_time)) return true;
    if (page.picked.size() >= max_events) return false;
    size_t b = events[i].message.size() + 26;
    if (!q.limit && !page.picked.empty() && bytes + b > 1048576) return false;
    bytes += b;
    page.picked.push_back(i);
    return true;
  };
  if (direction == 'f') {
    for (size_t i = position.value_or(0); i < n && take(i); ++i) {
    }
  } else {
    for (size_t i = position.value_or(n); i > 0 && take(i - 1); --i) {
    }
    std::reverse(page.picked.begin(), page.picked.end());
  }
  if (page.picked.empty()) {
    size_t p = position.value_or(direction == 'f' ? 0 : n);
    if (!position && !q.start_from_head) p = 0;
    page.forward = page.backward = p;
  } else {
    page.forward = page.picked.back() + 1;
    page.backward = page.picked.front();
  }
  return page;
}

// Pages through the stream in one direction with the store's tokens and the model's positions
// side by side, comparing every page.
void ExpectSameAsModel(LogStore& store, const std::vector<ModelEvent>& events, EventsQuery q, const std::string& what) {
  SCOPED_TRACE(what);
  char direction = q.start_from_head ? 'f' : 'b';
  std::optional<size_t> position;
  for (int pages = 0; pages < 400; ++pages) {
    auto got = store.GetEvents("g", "s", q);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ModelPage want = ModelGet(events, position, direction, q);
    ASSERT_EQ(got->events.size(), want.picked.size()) << "page " << pages;
    for (size_t k = 0; k < want.picked.size(); ++k) {
      ASSERT_EQ(got->events[k].timestamp, events[want.picked[k]].ts) << "page " << pages << " event " << k;
      ASSERT_EQ(got->events[k].message, events[want.picked[k]].message) << "page " << pages << " event " << k;
    }
    std::string next = direction == 'f' ? got->next_forward_token : got->next_backward_token;
    size_t next_position = direction == 'f' ? want.forward : want.backward;
    if (want.picked.empty()) {
      if (!q.token.empty()) {  // the end-of-stream rule
        EXPECT_EQ(next, q.token);
      }
      return;
    }
    q.token = next;
    position = next_position;
  }
  FAIL() << "paging did not end";
}

// Batches that interleave in time (a stream whose timestamps go back), messages of mixed sizes
// (pages end at 1 MB), across many 64-event blocks: GetEvents in both directions, with and
// without bounds and limits, equals the model; so after a reopen.
TEST_F(LogStoreTest, ReadsMatchTheModelOnInterleavedBatches) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  std::mt19937 rng(7);
  std::vector<ModelEvent> events;
  for (int batch = 0; batch < 60; ++batch) {
    std::vector<InputEvent> in;
    int64_t ts = 1000 + std::uniform_int_distribution<int>(0, 4000)(rng);  // jumps back and forth
    int count = std::uniform_int_distribution<int>(1, 150)(rng);
    for (int k = 0; k < count; ++k) {
      ts += std::uniform_int_distribution<int>(0, 3)(rng);
      size_t size = rng() % 50 == 0 ? 60000 : 1 + rng() % 200;
      std::string message = std::to_string(events.size()) + ":" + std::string(size, 'a' + batch % 26);
      in.push_back({ts, message});
      events.push_back({ts, message});
    }
    ASSERT_TRUE(store_->Append("g", "s", in).ok());
  }
  auto run = [&](const char* when) {
    SCOPED_TRACE(when);
    ExpectSameAsModel(*store_, events, {.limit = 97, .start_from_head = true}, "forward, limit 97");
    ExpectSameAsModel(*store_, events, {.limit = 130}, "backward, limit 130");
    ExpectSameAsModel(*store_, events, {.start_from_head = true}, "forward, 1 MB pages");
    ExpectSameAsModel(*store_, events, {}, "backward, 1 MB pages");
    ExpectSameAsModel(*store_, events, {.start_time = 2500, .end_time = 3100, .limit = 40, .start_from_head = true},
                      "forward, window");
    ExpectSameAsModel(*store_, events, {.start_time = 2500, .end_time = 3100, .limit = 33}, "backward, window");
    ExpectSameAsModel(*store_, events, {.start_time = 4900, .limit = 10, .start_from_head = true}, "forward, late");
    ExpectSameAsModel(*store_, events, {.end_time = 1100, .limit = 10}, "backward, early");
    ExpectSameAsModel(*store_, events, {.start_time = 9000, .start_from_head = true}, "after everything");
  };
  run("live");
  Reopen();
  run("reopened");
}

// The same check for a stream whose timestamps never decrease (the binary-search path).
TEST_F(LogStoreTest, ReadsMatchTheModelOnAnOrderedStream) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  std::mt19937 rng(11);
  std::vector<ModelEvent> events;
  int64_t ts = 0;
  for (int batch = 0; batch < 50; ++batch) {
    std::vector<InputEvent> in;
    int count = std::uniform_int_distribution<int>(1, 200)(rng);
    for (int k = 0; k < count; ++k) {
      ts += std::uniform_int_distribution<int>(0, 2)(rng);
      std::string message = "e" + std::to_string(events.size());
      in.push_back({ts, message});
      events.push_back({ts, message});
    }
    ASSERT_TRUE(store_->Append("g", "s", in).ok());
  }
  for (int64_t start : {int64_t{0}, ts / 3, ts / 2, ts - 1, ts + 1}) {
    ExpectSameAsModel(*store_, events,
                      {.start_time = start, .end_time = start + 57, .limit = 25, .start_from_head = true},
                      "forward from " + std::to_string(start));
    ExpectSameAsModel(*store_, events, {.start_time = start - 40, .end_time = start, .limit = 25},
                      "backward to " + std::to_string(start));
  }
}

// FilterLogEvents over several long, partly interleaved streams equals sorting every candidate by
// (timestamp, stream name, sequence) and paging through them (more candidates than one internal
// selection pass holds).
TEST_F(LogStoreTest, FilterPagingMatchesTheModelAcrossLongStreams) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  const std::vector<std::string> names = {"a", "b", "c"};
  std::map<std::string, std::vector<ModelEvent>> by_stream;
  std::mt19937 rng(3);
  for (const auto& name : names) {
    ASSERT_TRUE(store_->CreateStream("g", name).ok());
    int64_t ts = 0;
    for (int batch = 0; batch < 8; ++batch) {
      std::vector<InputEvent> in;
      // Stream "c" goes back in time between batches; "a" and "b" only forward.
      if (name == "c") ts = std::uniform_int_distribution<int>(0, 3000)(rng);
      for (int k = 0; k < 1000; ++k) {
        ts += std::uniform_int_distribution<int>(0, 1)(rng);
        std::string message = name + std::to_string(by_stream[name].size()) + (rng() % 3 == 0 ? " ERROR" : " ok");
        in.push_back({ts, message});
        by_stream[name].push_back({ts, message});
      }
      ASSERT_TRUE(store_->Append("g", name, in).ok());
    }
  }
  struct Key {
    int64_t ts;
    size_t stream;
    size_t seq;
  };
  auto model = [&](const FilterQuery& q) {
    std::vector<Key> keys;
    for (size_t s = 0; s < names.size(); ++s) {
      const auto& ev = by_stream[names[s]];
      for (size_t i = 0; i < ev.size(); ++i) {
        if ((q.start_time && ev[i].ts < *q.start_time) || (q.end_time && ev[i].ts >= *q.end_time)) continue;
        if (MatchesFilterPattern(q.pattern, ev[i].message)) keys.push_back({ev[i].ts, s, i});
      }
    }
    std::sort(keys.begin(), keys.end(), [](const Key& x, const Key& y) {
      return std::tie(x.ts, x.stream, x.seq) < std::tie(y.ts, y.stream, y.seq);
    });
    std::vector<std::string> out;
    for (const Key& k : keys) out.push_back(names[k.stream] + "/" + by_stream[names[k.stream]][k.seq].message);
    return out;
  };
  for (FilterQuery q : {FilterQuery{.limit = 10000}, FilterQuery{.pattern = "ERROR", .limit = 777},
                        FilterQuery{.start_time = 1500, .end_time = 2500, .limit = 100}, FilterQuery{}}) {
    std::vector<std::string> got;
    int pages = 0;
    for (; pages < 200; ++pages) {
      auto page = store_->Filter("g", q);
      ASSERT_TRUE(page.ok()) << page.status().ToString();
      EXPECT_EQ(page->searched_streams, names);
      if (q.limit) {
        EXPECT_LE(page->events.size(), static_cast<size_t>(*q.limit));
      }
      for (const auto& e : page->events) got.push_back(e.stream_name + "/" + e.message);
      if (page->next_token.empty()) break;
      q.token = page->next_token;
    }
    EXPECT_GT(pages, 0);
    EXPECT_EQ(got, model(q)) << "pattern '" << q.pattern << "'";
  }
}

// More streams than the handle cache holds: handles are evicted and reopened, nothing is lost.
TEST_F(LogStoreTest, StreamHandlesAreEvictedLeastRecentlyUsed) {
  Reopen(2);
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  for (int round = 0; round < 3; ++round) {
    for (int s = 0; s < 5; ++s) {
      std::string name = "s" + std::to_string(s);
      if (round == 0) {
        ASSERT_TRUE(store_->CreateStream("g", name).ok());
      }
      std::vector<InputEvent> in;
      for (int k = 0; k < 100; ++k) in.push_back({round * 1000 + k, name + "/" + std::to_string(round * 100 + k)});
      ASSERT_TRUE(store_->Append("g", name, in).ok());
      EXPECT_LE(store_->TEST_MemoryStats().open_streams, 2u);
    }
  }
  for (int s = 0; s < 5; ++s) {
    std::string name = "s" + std::to_string(s);
    auto page = store_->GetEvents("g", name, {.start_from_head = true});
    ASSERT_TRUE(page.ok());
    ASSERT_EQ(page->events.size(), 300u);
    EXPECT_EQ(page->events[150].message, name + "/150");
  }
  auto all = store_->Filter("g", {.pattern = "/299"});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->events.size(), 5u);
  EXPECT_LE(store_->TEST_MemoryStats().open_streams, 2u);
}

// A damaged index is never trusted: a bad last entry is caught on open, a bad entry in the middle
// when read (that request fails with DataLoss, the next one finds the index rebuilt).
TEST_F(LogStoreTest, DamagedIndexIsRebuilt) {
  ASSERT_TRUE(store_->CreateGroup("g").ok());
  ASSERT_TRUE(store_->CreateStream("g", "s").ok());
  Fill(0, 1000, 100);
  auto files = IndexFiles(dir_.path() + "/logs");
  ASSERT_EQ(files.size(), 1u);
  const std::string index = files[0];
  ASSERT_EQ(std::filesystem::file_size(index), 1000u / 64 * 32);
  auto scribble = [&](uint64_t at) {
    std::fstream f(index, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.write("garbage!", 8);
  };
  Reopen();
  scribble(14 * 32 + 8);  // the last entry's min timestamp
  EXPECT_EQ(Stamps(Get({.start_time = 900, .end_time = 905})), Range(900, 905));
  EXPECT_EQ(std::filesystem::file_size(index), 1000u / 64 * 32);
  Reopen();
  scribble(3 * 32);  // an entry in the middle
  auto first = store_->GetEvents("g", "s", {.start_time = 200, .limit = 5, .start_from_head = true});
  EXPECT_EQ(first.status().code(), StatusCode::kDataLoss) << first.status().ToString();
  EXPECT_EQ(Stamps(Get({.start_time = 200, .limit = 5, .start_from_head = true})), Range(200, 205));
  EXPECT_EQ(Stamps(Get({.start_from_head = true})), Range(0, 1000));
  // An index cut short (entries are not synced) is completed from the events.
  Reopen();
  std::filesystem::resize_file(index, 5 * 32 + 7);
  EXPECT_EQ(Stamps(Get({.start_time = 990, .start_from_head = true})), Range(990, 1000));
  EXPECT_EQ(std::filesystem::file_size(index), 1000u / 64 * 32);
}

TEST(FilterPatternTest, Table) {
  struct Case {
    const char* pattern;
    const char* message;
    bool match;
  } cases[] = {
      {"", "anything", true},
      {"ERROR", "an ERROR here", true},
      {"ERROR", "an error here", false},
      {"ERROR disk", "ERROR: disk full", true},
      {"ERROR disk", "ERROR: net down", false},
      {"\"disk full\"", "ERROR: disk full", true},
      {"\"disk full\"", "full disk", false},
      {"?ERROR ?WARN", "WARN x", true},
      {"?ERROR ?WARN", "INFO x", false},
      {"ERROR -disk", "ERROR net", true},
      {"ERROR -disk", "ERROR disk", false},
      {"-\"disk full\"", "disk is full", true},
  };
  for (const auto& c : cases)
    EXPECT_EQ(MatchesFilterPattern(c.pattern, c.message), c.match) << c.pattern << " / " << c.message;
}

}  // namespace
}  // namespace kiln::observe
