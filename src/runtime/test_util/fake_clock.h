#pragma once
// Test helper: a kiln::Clock (base/time.h) that moves only when the test says so, safe to read
// from the controller's threads while the test advances it. Pass it where a component takes a
// `const Clock*` (TrainingControllerDeps::clock, LogStore::Options::clock, FakeRuntime).
//
// Only wall-clock readings are faked: components still wait in real time (condition variables,
// runtime Wait), so a test that advances the clock past a deadline sees it acted on at the
// component's next poll.

#include <atomic>
#include <chrono>
#include <cstdint>

#include "base/time.h"

namespace kiln::runtime::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_millis = 1'700'000'000'000) : now_(start_millis) {}
  int64_t NowMillis() const override { return now_.load(); }
  void Advance(std::chrono::milliseconds d) { now_.fetch_add(d.count()); }
  void Set(int64_t millis) { now_.store(millis); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace kiln::runtime::testing
