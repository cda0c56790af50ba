#pragma once
// LogPump: tails one instance's captured output (runtime.h's record format) into a log stream
// with CloudWatch Logs semantics, and hands every line to the metric extractor.
//
// Each complete record becomes one event (timestamp = when the shim read the line; empty lines
// are skipped: CloudWatch events are 1..256 KiB). Events go to the store in batches within
// PutLogEvents' limits; the group and stream are created when the first line arrives (the SDK
// tolerates their absence before that). After each batch the byte offset reached is written to
// `offset_path` (20 digits, rewritten in place; no fsync: it has to outlive the server process,
// not the machine), so that a server adopting the instance resumes exactly there: no line is lost
// or repeated across a restart.
//
// Thread-safety: Start/Stop from the owning thread; the sink is called on the pump's thread;
// last_stderr_line() from any thread.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "observe/log_store.h"
#include "observe/metric_extractor.h"

namespace kiln::control {

class LogPump {
 public:
  struct Options {
    std::string output_path;   // the runtime's OutputPath of the instance
    std::string offset_path;   // where the offset reached is kept
    int64_t start_offset = 0;  // resume point (0, or what offset_path held)
    std::string group;
    std::string stream;
    std::shared_ptr<const observe::MetricExtractor> extractor;  // may be null
    // Points extracted from one batch of lines, in line order. May be empty (then unused).
    std::function<void(const std::vector<observe::MetricPoint>&)> on_metrics;
  };

  LogPump(Options options, observe::LogStore* store);
  ~LogPump();  // Stop(false)
  LogPump(const LogPump&) = delete;
  LogPump& operator=(const LogPump&) = delete;

  void Start();
  // Ends the pump. `drain`: first read everything the instance wrote (call it once the instance
  // has exited, so the output is complete); otherwise stop at once (server shutdown: the next
  // server resumes from the recorded offset).
  void Stop(bool drain);

  // The last line the program wrote to stderr (for a FailureReason without a failure file).
  std::string last_stderr_line() const EXCLUDES(mutex_);

  // The offset recorded at `path` by an earlier pump (0 when there is none).
  static int64_t ReadOffset(const std::string& path);

 private:
  void Run() EXCLUDES(mutex_);

  Options options_;
  observe::LogStore* store_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drain_{false};
  mutable Mutex mutex_;
  std::string last_stderr_line_ GUARDED_BY(mutex_);
};

}  // namespace kiln::control
