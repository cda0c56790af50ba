#include "base/log.h"
#include "base/log_flush.h"
#include "base/mutex.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <spdlog/sinks/base_sink.h>

namespace kiln {

namespace {
LogFormat g_format = LogFormat::kLogfmt;

bool NeedsQuotes(std::string_view v) {
  if (v.empty()) return true;
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return true;
  }
  return false;
}

void AppendQuoted(std::string& out, std::string_view v) {
  out += '"';
  for (char c : v) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}
// Appends formatted lines to a buffer; flush() (periodic, on warn+, at exit) writes it to fd 2.
class BufferedStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // Writes what is buffered if no other thread holds the sink (see TryFlushLogs).
  void TryFlush() {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) flush_();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    buffer_.append(formatted.data(), formatted.size());
    if (buffer_.size() >= kFlushBytes) flush_();
  }
  void flush_() override {
    size_t done = 0;
    while (done < buffer_.size()) {
      ssize_t n = ::write(STDERR_FILENO, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // stderr gone: drop rather than block the server
      done += static_cast<size_t>(n);
    }
    buffer_.clear();
  }

 private:
  static constexpr size_t kFlushBytes = 32 * 1024;
  std::string buffer_;
};

// spdlog 1.10's flush_every() takes whole seconds; lines should appear within 100 ms.
Mutex g_flusher_mutex;
CondVar g_flusher_wake;
bool g_flusher_stop GUARDED_BY(g_flusher_mutex) = false;
std::thread g_flusher;
// Leaked on purpose: flushed by the flusher thread and at exit, after spdlog's registry (which
// owns the logger) may already be gone.
std::shared_ptr<spdlog::sinks::sink>* g_sink = nullptr;

void StartFlusher() {
  if (g_flusher.joinable()) return;
  g_flusher = std::thread([] {
    MutexLock lock(g_flusher_mutex);
    while (true) {
      // Sleep 100 ms (through spurious wake-ups) unless told to stop.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      while (!g_flusher_stop && g_flusher_wake.WaitUntil(g_flusher_mutex, deadline) == std::cv_status::no_timeout) {
      }
      if (g_flusher_stop) break;
      lock.Unlock();
      if (g_sink != nullptr) (*g_sink)->flush();
      lock.Lock();
    }
  });
}

void StopFlusher() {
  {
    MutexLock lock(g_flusher_mutex);
    g_flusher_stop = true;
  }
  g_flusher_wake.NotifyAll();
  if (g_flusher.joinable()) g_flusher.join();
}

}  // namespace

void InitLogging(std::string_view level, LogFormat format) {
  g_format = format;
  // Lines are buffered and written to stderr at most every 100 ms (or per 32 KiB, or at once for
  // warnings and errors): spdlog's stderr sink wrote and flushed every line while holding its
  // process-wide mutex, a write(2) under a global lock on every request of the invoke path (and
  // an async logger would wake its thread per line instead). The periodic flusher thread is
  // started here, so call this after blocking the signals other threads must not take.
  if (g_sink == nullptr) g_sink = new std::shared_ptr<spdlog::sinks::sink>(std::make_shared<BufferedStderrSink>());
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("kiln", *g_sink));
  if (!g_flusher.joinable()) {
    StartFlusher();
    // Touches only the sink: static destructors (spdlog's registry among them) may run first.
    std::atexit([] {
      StopFlusher();
      (*g_sink)->flush();
    });
  }
  if (format == LogFormat::kJson) {
    spdlog::set_pattern(R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l",%v})", spdlog::pattern_time_type::utc);
  } else {
    spdlog::set_pattern("ts=%Y-%m-%dT%H:%M:%S.%eZ level=%l %v", spdlog::pattern_time_type::utc);
  }
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
  spdlog::flush_on(spdlog::level::warn);
}

void TryFlushLogs() {
  if (g_sink == nullptr) return;
  if (auto* sink = dynamic_cast<BufferedStderrSink*>(g_sink->get())) sink->TryFlush();
}

std::string FormatLogLine(std::string_view msg, std::initializer_list<LogField> fields) {
  std::string out;
  if (g_format == LogFormat::kJson) {
    out += "\"msg\":";
    AppendQuoted(out, msg);
    for (const auto& [k, v] : fields) {
      out += ",\"";
      out += k;
      out += "\":";
      AppendQuoted(out, v);
    }
    return out;
  }
  out += "msg=";
  AppendQuoted(out, msg);
  for (const auto& [k, v] : fields) {
    out += ' ';
    out += k;
    out += '=';
    if (NeedsQuotes(v)) {
      AppendQuoted(out, v);
    } else {
      out += v;
    }
  }
  return out;
}

}  // namespace kiln
