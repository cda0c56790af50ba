#include "base/log.h"

#include <spdlog/sinks/stdout_sinks.h>

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
}  // namespace

void InitLogging(std::string_view level, LogFormat format) {
  g_format = format;
  auto logger = spdlog::stderr_logger_mt("kiln");
  spdlog::set_default_logger(logger);
  if (format == LogFormat::kJson) {
    spdlog::set_pattern(R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l",%v})", spdlog::pattern_time_type::utc);
  } else {
    spdlog::set_pattern("ts=%Y-%m-%dT%H:%M:%S.%eZ level=%l %v", spdlog::pattern_time_type::utc);
  }
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
  spdlog::flush_on(spdlog::level::warn);
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
