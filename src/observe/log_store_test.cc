#include "observe/log_store.h"

#include <gtest/gtest.h>

#include <filesystem>

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
  void Reopen() {
    store_.reset();
    db_.reset();
    db_ = store::testing::OpenTestDatabase(dir_.path(), false);
    auto s = LogStore::Open({dir_.path() + "/logs", db_.get(), &clock_});
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
