#include "control/training_hold.h"

#include "base/fs.h"
#include "base/strings.h"

namespace kiln::control {

Result<std::optional<int>> HoldStartSeconds(const std::vector<store::Tag>& tags) {
  for (const store::Tag& tag : tags) {
    if (tag.key != kHoldStartTag) continue;
    std::optional<int64_t> seconds = ParseInt64(Trim(tag.value));
    if (!seconds || *seconds < 0 || *seconds > kMaxHoldStartSeconds) {
      return Status::InvalidArgument("The tag " + std::string(kHoldStartTag) +
                                     " must be a whole number of seconds from 0 to " +
                                     std::to_string(kMaxHoldStartSeconds) + ", not \"" + tag.value + "\".");
    }
    return std::optional<int>(static_cast<int>(*seconds));
  }
  return std::optional<int>();
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
