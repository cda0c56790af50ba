#include "control/log_pump.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "base/fs.h"
#include "base/log.h"

namespace kiln::control {

namespace {
constexpr size_t kReadSize = 256 * 1024;
constexpr size_t kMaxBatchEvents = 5000;  // well inside PutLogEvents' 10,000
constexpr auto kIdlePoll = std::chrono::milliseconds(20);
}  // namespace

LogPump::LogPump(Options options, observe::LogStore* store) : options_(std::move(options)), store_(store) {}

LogPump::~LogPump() { Stop(false); }

void LogPump::Start() {
  thread_ = std::thread([this] { Run(); });
}

void LogPump::Stop(bool drain) {
  drain_.store(drain);
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::string LogPump::last_stderr_line() const {
  MutexLock lock(mutex_);
  return last_stderr_line_;
}

int64_t LogPump::ReadOffset(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return 0;
  return std::strtoll(text->c_str(), nullptr, 10);
}

void LogPump::Run() {
  UniqueFd offset_fd(::open(options_.offset_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  int64_t offset = options_.start_offset;
  bool stream_ready = false;
  std::string pending;  // bytes read past `offset`, not yet a complete record
  std::vector<char> buffer(kReadSize);
  UniqueFd fd;
  bool final_pass = false;
  while (true) {
    if (!fd.valid()) fd = UniqueFd(::open(options_.output_path.c_str(), O_RDONLY | O_CLOEXEC));
    ssize_t n = 0;
    if (fd.valid()) {
      n = ::pread(fd.get(), buffer.data(), buffer.size(), offset + static_cast<int64_t>(pending.size()));
      if (n > 0) pending.append(buffer.data(), static_cast<size_t>(n));
    }
    // Complete records only: "<millis> <o|e> <text>\n".
    std::vector<observe::InputEvent> events;
    std::vector<observe::MetricPoint> points;
    size_t batch_bytes = 0;
    size_t consumed = 0;
    while (true) {
      size_t nl = pending.find('\n', consumed);
      if (nl == std::string::npos) break;
      std::string_view record(pending.data() + consumed, nl - consumed);
      size_t sp = record.find(' ');
      if (sp != std::string_view::npos && record.size() >= sp + 3) {
        int64_t ts = std::strtoll(std::string(record.substr(0, sp)).c_str(), nullptr, 10);
        char stream = record[sp + 1];
        std::string text(record.substr(sp + 3));
        if (!text.empty()) {
          if (batch_bytes + text.size() + observe::kEventOverheadBytes > observe::kMaxBatchBytes ||
              events.size() >= kMaxBatchEvents) {
            break;  // this batch is full; the rest goes in the next one
          }
          if (options_.extractor) {
            auto found = options_.extractor->Extract(text, ts);
            points.insert(points.end(), found.begin(), found.end());
          }
          if (stream == 'e') {
            MutexLock lock(mutex_);
            last_stderr_line_ = text;
          }
          batch_bytes += text.size() + observe::kEventOverheadBytes;
          events.push_back({ts, std::move(text)});
        }
      }
      consumed = nl + 1;
    }
    if (!events.empty()) {
      // The shim stamps lines as it reads two pipes; a clock step could disorder them.
      std::stable_sort(events.begin(), events.end(), [](const observe::InputEvent& a, const observe::InputEvent& b) {
        return a.timestamp < b.timestamp;
      });
      if (!stream_ready) {
        (void)store_->CreateGroup(options_.group);  // AlreadyExists is fine (adoption, several hosts)
        (void)store_->CreateStream(options_.group, options_.stream);
        stream_ready = true;
      }
      auto appended = store_->Append(options_.group, options_.stream, events);
      if (!appended.ok()) {
        KLOG(warn, "log append failed", {{"stream", options_.stream}, {"error", appended.status().ToString()}});
      }
    }
    if (!points.empty() && options_.on_metrics) options_.on_metrics(points);
    if (consumed > 0) {
      offset += static_cast<int64_t>(consumed);
      pending.erase(0, consumed);
      if (offset_fd.valid()) {
        char digits[24];
        int len = std::snprintf(digits, sizeof(digits), "%020lld\n", static_cast<long long>(offset));
        (void)!::pwrite(offset_fd.get(), digits, static_cast<size_t>(len), 0);
      }
    }
    if (n > 0 || consumed > 0) continue;  // more may be ready
    if (final_pass) break;
    if (stop_.load()) {
      if (!drain_.load()) break;
      final_pass = true;  // one more pass reads what the instance wrote last
      continue;
    }
    std::this_thread::sleep_for(kIdlePoll);
  }
}

}  // namespace kiln::control
