#include "control/training_plan.h"

#include <cmath>
#include <limits>

namespace kiln::control::training {

using nlohmann::json;

// "; <what the scheduler gave instead of the full shape>" (the first note), or "".
std::string AllocationNote(const std::vector<Allocation>& allocations) {
  for (const auto& a : allocations) {
    if (!a.note.empty()) return "; " + a.note;
  }
  return "";
}

// `seconds` (a request member: validated as a Java int, but rows written before that check, or
// by other paths, may hold anything) as milliseconds, saturating instead of overflowing.
int64_t SecondsToMillisSaturating(int64_t seconds) {
  int64_t millis = 0;
  if (__builtin_mul_overflow(seconds, int64_t{1000}, &millis)) {
    return seconds < 0 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
  }
  return millis;
}

// `at + millis` without overflow (a deadline far in the future stays in the far future).
int64_t AddSaturating(int64_t at, int64_t millis) {
  int64_t sum = 0;
  if (__builtin_add_overflow(at, millis, &sum)) {
    return millis < 0 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
  }
  return sum;
}

// A seconds member of StoppingCondition: integers as sent, fractional numbers truncated (as the
// validator and AWS do), `fallback` when absent.
int64_t StoppingSeconds(const json& request, const char* member, int64_t fallback) {
  const json& sc = request.value("StoppingCondition", json::object());
  if (!sc.contains(member)) return fallback;
  const json& value = sc[member];
  // (nlohmann: is_number_integer() is true for unsigned numbers too, which may not fit int64.)
  if (value.is_number_unsigned()) {
    return value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(value.get<uint64_t>());
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    double seconds = std::trunc(value.get<double>());
    if (!(seconds < 9.2e18)) return std::numeric_limits<int64_t>::max();
    if (!(seconds > -9.2e18)) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(seconds);
  }
  return fallback;
}

int64_t MaxRuntimeSeconds(const json& request) { return StoppingSeconds(request, "MaxRuntimeInSeconds", 86400); }

}  // namespace kiln::control::training
