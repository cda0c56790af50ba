// Fuzzes the CloudWatch Logs side: the request decoders of src/api/logs.cc (PutLogEvents,
// GetLogEvents, FilterLogEvents, DescribeLogStreams, DescribeLogGroups, Create/Delete*, the
// opaque nextToken values) run against a real observe::LogStore, and the log store's own
// decoding of its files (src/observe/log_store.cc) when they are corrupted on disk.
//
// Every input starts from the same database and store files (restored per input) holding group
// "/g" with stream "s1" (6 events, timestamps 1000..1005, "line 0".."line 5") and an empty
// stream "s2".
//
// Input layout: byte 0 = mode.
//   even: API. Then first line = operation ("GetLogEvents"), the rest = the JSON body, handed
//         to the Logs JsonService (the same object the front door calls).
//   odd:  corrupted files. Byte 1 picks a file under the store's directory (sorted by path),
//         byte 2 how to damage it (% 4: replace it with the rest of the input, overwrite at
//         offset byte 3 * 4, truncate to the rest's length, append the rest). The store is then
//         reopened over the same database and read (GetEvents from the head and the tail, the
//         forward token, Filter, DescribeLogStreams' GetStream/ListStreams) and appended to.
//
// Checks besides "no crash, no sanitizer report":
//   API: the answer is a JSON object, never 500; an error carries __type and a 4xx status; a
//   GetLogEvents page holds at most `limit` events and both its tokens are accepted by the next
//   GetLogEvents (same stream); a FilterLogEvents nextToken is accepted by the next call; an
//   accepted PutLogEvents adds exactly its events to the stream's count.
//   Files: every event read back is at most kMaxEventMessageBytes; a page holds at most 10,000.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "api/logs.h"
#include "base/time.h"
#include "fuzz_support.h"
#include "observe/log_store.h"
#include "store/database.h"

namespace {

namespace fs = std::filesystem;
using kiln::fuzz::Check;
using nlohmann::json;

class FixedClock : public kiln::Clock {
 public:
  int64_t NowMillis() const override { return 1714557600000; }
};

struct World {
  kiln::fuzz::ScratchDir dir;
  FixedClock clock;
  kiln::store::Database* db = &kiln::fuzz::SharedDatabase();
  std::unique_ptr<kiln::observe::LogStore> store;

  // The database and the store's files start every input as the first input's setup left them.
  World() {
    static kiln::fuzz::ScratchDir* files = new kiln::fuzz::ScratchDir();
    kiln::fuzz::RestoreDatabase([&](kiln::store::Database&) {
      auto setup = kiln::observe::LogStore::Open({files->path() + "/logs", db, &clock});
      Check(setup.ok());
      Check((*setup)->CreateGroup("/g").ok());
      Check((*setup)->CreateStream("/g", "s1").ok());
      Check((*setup)->CreateStream("/g", "s2").ok());
      std::vector<kiln::observe::InputEvent> events;
      for (int i = 0; i < 6; ++i) events.push_back({1000 + i, "line " + std::to_string(i)});
      Check((*setup)->Append("/g", "s1", events).ok());
    });
    fs::copy(files->path() + "/logs", dir.path() + "/logs", fs::copy_options::recursive);
    Open();
  }
  void Open() {
    store.reset();
    auto opened = kiln::observe::LogStore::Open({dir.path() + "/logs", db, &clock});
    Check(opened.ok());
    store = std::move(opened).value();
  }
};

struct Answer {
  int status = 0;
  json body;
};

Answer Call(const kiln::api::JsonService& service, std::string_view operation, std::string_view body) {
  kiln::aws::RequestContext context;
  context.request_id = "fuzz";
  context.account_id = "000000000000";
  context.region = "us-east-1";
  kiln::aws::WireResponse wire = service.Handle(context, operation, body);
  if (kiln::fuzz::Debug())
    std::fprintf(stderr, "%.*s: %d %s\n", static_cast<int>(operation.size()), operation.data(), wire.status,
                 wire.body.substr(0, 2000).c_str());
  Answer a{wire.status, json::parse(wire.body, nullptr, /*allow_exceptions=*/false)};
  Check(a.status != 500);
  Check(a.body.is_object());
  if (a.status != 200) {
    Check(a.status >= 400 && a.status < 500);
    Check(a.body.contains("__type") && a.body["__type"].is_string());
  }
  return a;
}

int64_t EventCount(kiln::observe::LogStore& store, const json& in) {
  if (!in.is_object() || !in.contains("logGroupName") || !in.contains("logStreamName")) return -1;
  if (!in["logGroupName"].is_string() || !in["logStreamName"].is_string()) return -1;
  auto info = store.GetStream(in["logGroupName"].get<std::string>(), in["logStreamName"].get<std::string>());
  return info.ok() ? info->event_count : -1;
}

void FuzzApi(std::string_view input) {
  World world;
  kiln::api::JsonService service("Logs_20140328", "logs", kiln::aws::Protocol::kJson11);
  kiln::api::RegisterLogsOperations(&service, world.store.get(), "000000000000", "us-east-1");
  auto [operation, body] = kiln::fuzz::FirstLine(input);
  json in = json::parse(body, nullptr, /*allow_exceptions=*/false);
  const bool put = operation == "PutLogEvents";
  const int64_t before = put ? EventCount(*world.store, in) : -1;

  Answer a = Call(service, operation, body);
  if (a.status != 200 || !in.is_object()) return;

  if (put) {
    Check(in["logEvents"].is_array());
    Check(EventCount(*world.store, in) == before + static_cast<int64_t>(in["logEvents"].size()));
  } else if (operation == "GetLogEvents") {
    Check(a.body["events"].is_array());
    if (in.contains("limit") && in["limit"].is_number()) {
      Check(a.body["events"].size() <= static_cast<size_t>(std::max<double>(in["limit"].get<double>(), 1)));
    }
    for (const char* name : {"nextForwardToken", "nextBackwardToken"}) {
      const std::string token = a.body[name].get<std::string>();
      Check(token.size() > 2 && token[0] == name[4] + ('a' - 'A') && token[1] == '/');  // "f/" or "b/"
      json next = in;
      next["nextToken"] = token;
      Check(Call(service, operation, next.dump()).status == 200);
    }
  } else if (operation == "FilterLogEvents" && a.body.contains("nextToken")) {
    json next = in;
    next["nextToken"] = a.body["nextToken"];
    Check(Call(service, operation, next.dump()).status == 200);
  }
}

void CheckEvents(const std::vector<kiln::observe::OutputEvent>& events) {
  Check(events.size() <= static_cast<size_t>(kiln::observe::kMaxEventsLimit));
  for (const auto& e : events) Check(e.message.size() <= kiln::observe::kMaxEventMessageBytes);
}

void FuzzFiles(const uint8_t* data, size_t size) {
  if (size < 4) return;
  World world;
  world.store.reset();  // close the files before damaging them
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(world.dir.path() + "/logs")) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  if (files.empty()) return;
  std::sort(files.begin(), files.end());
  const fs::path& victim = files[data[1] % files.size()];
  std::string_view rest(reinterpret_cast<const char*>(data) + 4, size - 4);
  switch (data[2] % 4) {
    case 0: std::ofstream(victim, std::ios::binary | std::ios::trunc) << rest; break;
    case 1: {
      std::fstream f(victim, std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(static_cast<std::streamoff>(data[3]) * 4);
      f << rest;
      break;
    }
    case 2: fs::resize_file(victim, std::min<uintmax_t>(rest.size(), fs::file_size(victim))); break;
    case 3: std::ofstream(victim, std::ios::binary | std::ios::app) << rest; break;
  }

  auto opened = kiln::observe::LogStore::Open({world.dir.path() + "/logs", world.db, &world.clock});
  if (!opened.ok()) return;
  auto& store = **opened;
  kiln::observe::EventsQuery head;
  head.start_from_head = true;
  auto page = store.GetEvents("/g", "s1", head);
  if (page.ok()) {
    CheckEvents(page->events);
    kiln::observe::EventsQuery next;
    next.token = page->next_forward_token;
    if (auto more = store.GetEvents("/g", "s1", next); more.ok()) CheckEvents(more->events);
    next.token = page->next_backward_token;
    if (auto more = store.GetEvents("/g", "s1", next); more.ok()) CheckEvents(more->events);
  }
  kiln::observe::EventsQuery tail;
  tail.limit = 3;
  if (auto t = store.GetEvents("/g", "s1", tail); t.ok()) {
    Check(t->events.size() <= 3);
    CheckEvents(t->events);
  }
  kiln::observe::FilterQuery filter;
  filter.pattern = "line";
  if (auto f = store.Filter("/g", filter); f.ok()) {
    Check(f->events.size() <= static_cast<size_t>(kiln::observe::kMaxEventsLimit));
  }
  (void)store.GetStream("/g", "s1");
  (void)store.ListStreams("/g", "", kiln::observe::StreamOrder::kLastEventTime, true, 50, "");
  (void)store.Append("/g", "s1", {{2000, "after the damage"}});
  if (auto again = store.GetEvents("/g", "s1", head); again.ok()) CheckEvents(again->events);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    FuzzApi(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  } else {
    FuzzFiles(data, size);
  }
  return 0;
}
