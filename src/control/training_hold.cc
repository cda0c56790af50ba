#include "control/training_hold.h"

#include <algorithm>

#include "base/fs.h"
#include "base/strings.h"

namespace kiln::control {

namespace {

Result<std::optional<int>> SecondsTag(const std::vector<store::Tag>& tags, const char* key, int min, int max) {
  for (const store::Tag& tag : tags) {
    if (tag.key != key) continue;
    std::optional<int64_t> seconds = ParseInt64(Trim(tag.value));
    if (!seconds || *seconds < min || *seconds > max) {
      return Status::InvalidArgument("The tag " + std::string(key) + " must be a whole number of seconds from " +
                                     std::to_string(min) + " to " + std::to_string(max) + ", not \"" + tag.value +
                                     "\".");
    }
    return std::optional<int>(static_cast<int>(*seconds));
  }
  return std::optional<int>();
}

}  // namespace

Result<std::optional<int>> HoldStartSeconds(const std::vector<store::Tag>& tags) {
  return SecondsTag(tags, kHoldStartTag, 0, kMaxHoldStartSeconds);
}

Result<std::optional<int>> HoldExitSeconds(const std::vector<store::Tag>& tags) {
  return SecondsTag(tags, kHoldExitTag, 0, kMaxHoldExitSeconds);
}

std::vector<std::string> HoldAfterExitArgv(const std::string& kiln_binary, int seconds) {
  return {kiln_binary, kHoldStartCommand, "--seconds", std::to_string(seconds), "--after-exit"};
}

Result<std::optional<int>> IdleStopSeconds(const std::vector<store::Tag>& tags) {
  return SecondsTag(tags, kIdleStopTag, 1, kMaxIdleStopSeconds);
}

std::optional<int64_t> IdleSinceMillis(const std::vector<store::RemoteConnectionRecord>& connections,
                                       int64_t training_start_millis) {
  int64_t since = training_start_millis;
  for (const store::RemoteConnectionRecord& c : connections) {
    if (!c.end_millis) return std::nullopt;
    since = std::max(since, *c.end_millis);
  }
  return since;
}

std::vector<std::string> HoldStartArgv(const std::string& kiln_binary, int seconds,
                                       const std::vector<std::string>& argv) {
  std::vector<std::string> out = {kiln_binary, kHoldStartCommand, "--seconds", std::to_string(seconds), "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

bool IsHoldingBeforeStart(int host_pid) {
  if (host_pid <= 0) return false;
  Result<std::string> cmdline = ReadFile("/proc/" + std::to_string(host_pid) + "/cmdline");
  if (!cmdline.ok()) return false;
  // argv[0] NUL argv[1] NUL ...: the hold is the second word.
  size_t first = cmdline->find('\0');
  if (first == std::string::npos) return false;
  size_t second = cmdline->find('\0', first + 1);
  return cmdline->substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1) ==
         kHoldStartCommand;
}

}  // namespace kiln::control
