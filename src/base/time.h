#pragma once
// Wall-clock helpers and the time formats AWS protocols use. All times are UTC. Parsers return
// nullopt on anything that is not exactly the expected form.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

// Milliseconds since the Unix epoch.
int64_t NowMillis();

// A clock that tests can replace; production code calls Clock::Now().
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMillis() const = 0;
  static const Clock& System();
};

std::string FormatIso8601Millis(int64_t epoch_millis);  // 2024-05-01T10:00:00.000Z
std::string FormatRfc1123(int64_t epoch_millis);        // Wed, 01 May 2024 10:00:00 GMT
std::string FormatAmzDate(int64_t epoch_millis);        // 20240501T100000Z
std::string FormatAmzDateShort(int64_t epoch_millis);   // 20240501

std::optional<int64_t> ParseAmzDate(std::string_view s);  // yyyymmddThhmmssZ -> millis
std::optional<int64_t> ParseRfc1123(std::string_view s);
// ISO-8601 "2024-05-01T10:00:00Z", with optional fraction and "+00:00"-style offset.
std::optional<int64_t> ParseIso8601(std::string_view s);

}  // namespace kiln
