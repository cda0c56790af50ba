#pragma once
// Structured logging. Every line is logfmt: `ts=... level=info msg="..." key=value ...`, so log
// lines can be grepped and parsed. Use the spdlog macros through these helpers:
//
//   KLOG(info, "request", {{"method", "PUT"}, {"status", "200"}});
//
// Thread-safe.

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

namespace kiln {

enum class LogFormat { kLogfmt, kJson };

// Configures the process-wide logger: stderr, buffered and written every 100 ms (warnings and
// errors at once). Starts spdlog's flusher thread: call it after blocking the signals that a
// dedicated thread waits for, so that thread inherits the mask.
// `level` is trace|debug|info|warn|error.
void InitLogging(std::string_view level, LogFormat format = LogFormat::kLogfmt);

using LogField = std::pair<std::string_view, std::string_view>;
// Renders `msg` and fields as one structured line body (without ts/level, which spdlog adds).
std::string FormatLogLine(std::string_view msg, std::initializer_list<LogField> fields);

}  // namespace kiln

#define KLOG(level, msg, ...) \
  ::spdlog::level("{}", ::kiln::FormatLogLine((msg), std::initializer_list<::kiln::LogField> __VA_ARGS__))
