#include "base/time.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include "base/strings.h"

namespace kiln {

int64_t NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {
class SystemClock final : public Clock {
 public:
  int64_t NowMillis() const override { return kiln::NowMillis(); }
};

std::tm ToTm(int64_t epoch_millis) {
  time_t secs = static_cast<time_t>(epoch_millis >= 0 ? epoch_millis / 1000 : (epoch_millis - 999) / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return tm;
}

// Days from civil date, valid for the proleptic Gregorian calendar (Howard Hinnant's algorithm).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

std::optional<int> Digits(std::string_view s, size_t pos, size_t n) {
  if (pos + n > s.size()) return std::nullopt;
  int v = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

std::optional<int64_t> Compose(int y, int mo, int d, int h, int mi, int sec, int millis) {
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  int64_t days = DaysFromCivil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  return ((days * 24 + h) * 60 + mi) * 60000 + int64_t(sec) * 1000 + millis;
}
}  // namespace

const Clock& Clock::System() {
  static const SystemClock clock;
  return clock;
}

// Formats with snprintf rather than strftime: strftime's %Y writes years before 1000 with fewer
// than four digits, which the parsers (rightly) reject.
std::string FormatIso8601Millis(int64_t epoch_millis) {
  std::tm tm = ToTm(epoch_millis);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(((epoch_millis % 1000) + 1000) % 1000));
  return buf;
}

std::string FormatRfc1123(int64_t epoch_millis) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::tm tm = ToTm(epoch_millis);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday], tm.tm_mday,
                kMonths[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return buf;
}

std::string FormatAmzDate(int64_t epoch_millis) {
  std::tm tm = ToTm(epoch_millis);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d%02d%02dT%02d%02d%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec);
  return buf;
}

std::string FormatAmzDateShort(int64_t epoch_millis) { return FormatAmzDate(epoch_millis).substr(0, 8); }

std::optional<int64_t> ParseAmzDate(std::string_view s) {
  if (s.size() != 16 || s[8] != 'T' || s[15] != 'Z') return std::nullopt;
  auto y = Digits(s, 0, 4), mo = Digits(s, 4, 2), d = Digits(s, 6, 2);
  auto h = Digits(s, 9, 2), mi = Digits(s, 11, 2), sec = Digits(s, 13, 2);
  if (!y || !mo || !d || !h || !mi || !sec) return std::nullopt;
  return Compose(*y, *mo, *d, *h, *mi, *sec, 0);
}

std::optional<int64_t> ParseRfc1123(std::string_view s) {
  // "Wed, 01 May 2024 10:00:00 GMT"
  static constexpr std::string_view kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  s = Trim(s);
  if (s.size() != 29 || s[3] != ',' || s[4] != ' ' || s[25] != ' ' || s.substr(26) != "GMT") return std::nullopt;
  auto d = Digits(s, 5, 2), y = Digits(s, 12, 4), h = Digits(s, 17, 2), mi = Digits(s, 20, 2), sec = Digits(s, 23, 2);
  if (!d || !y || !h || !mi || !sec || s[19] != ':' || s[22] != ':') return std::nullopt;
  std::string_view mon = s.substr(8, 3);
  int mo = 0;
  for (int i = 0; i < 12; ++i) {
    if (mon == kMonths[i]) mo = i + 1;
  }
  if (mo == 0) return std::nullopt;
  return Compose(*y, mo, *d, *h, *mi, *sec, 0);
}

std::optional<int64_t> ParseIso8601(std::string_view s) {
  // yyyy-mm-ddThh:mm:ss[.fff][Z|+hh:mm|-hh:mm]
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != ' ') || s[13] != ':' || s[16] != ':') {
    return std::nullopt;
  }
  auto y = Digits(s, 0, 4), mo = Digits(s, 5, 2), d = Digits(s, 8, 2);
  auto h = Digits(s, 11, 2), mi = Digits(s, 14, 2), sec = Digits(s, 17, 2);
  if (!y || !mo || !d || !h || !mi || !sec) return std::nullopt;
  size_t pos = 19;
  int millis = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    int scale = 100;
    size_t start = pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      millis += (s[pos] - '0') * scale;
      scale /= 10;
      ++pos;
    }
    if (pos == start) return std::nullopt;
  }
  int64_t offset_minutes = 0;
  if (pos < s.size()) {
    if (s[pos] == 'Z' && pos + 1 == s.size()) {
      ++pos;
    } else if ((s[pos] == '+' || s[pos] == '-') && pos + 6 == s.size() && s[pos + 3] == ':') {
      auto oh = Digits(s, pos + 1, 2), om = Digits(s, pos + 4, 2);
      if (!oh || !om) return std::nullopt;
      offset_minutes = (*oh * 60 + *om) * (s[pos] == '+' ? 1 : -1);
      pos += 6;
    } else {
      return std::nullopt;
    }
  }
  auto t = Compose(*y, *mo, *d, *h, *mi, *sec, millis);
  if (!t) return std::nullopt;
  return *t - offset_minutes * 60000;
}

}  // namespace kiln
