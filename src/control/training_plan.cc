#include "control/training_plan.h"

#include <cctype>

#include <signal.h>

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

std::optional<std::string> DecodedHyperparameter(const json& request, const std::string& key) {
  if (!request.is_object() || !request.contains("HyperParameters")) return std::nullopt;
  const json& hps = request["HyperParameters"];
  if (!hps.is_object() || !hps.contains(key) || !hps[key].is_string()) return std::nullopt;
  std::string raw = hps[key].get<std::string>();
  json decoded = json::parse(raw, nullptr, false);
  if (!decoded.is_discarded() && decoded.is_string()) return decoded.get<std::string>();
  return raw;
}

std::optional<int64_t> MpiProcessesPerHost(const json& request) {
  const std::optional<std::string> text = DecodedHyperparameter(request, kMpiProcessesPerHost);
  if (!text || text->empty() || text->size() > 7 || text->find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const int64_t value = std::stoll(*text);
  if (value < 1 || value > 1'000'000) return std::nullopt;
  return value;
}

std::string ProcessesPerHostNote(const json& request, size_t gpus) {
  const std::optional<int64_t> processes = MpiProcessesPerHost(request);
  if (!processes || gpus == 0 || static_cast<size_t>(*processes) <= gpus) return "";
  return "; warning: " + std::string(kMpiProcessesPerHost) + " is " + std::to_string(*processes) +
         " but each host has " + std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs") +
         ", so processes share GPUs (set it to at most " + std::to_string(gpus) + ")";
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

std::string TruncateUtf8(std::string s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  // Do not cut a UTF-8 sequence in half.
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  s.resize(cut);
  return s;
}

JobFailure FailureFromStatus(const Status& status, const std::string& context) {
  if (status.Is(ErrorReason::kClientError)) {
    return {FailureKind::kClientError, TruncateUtf8(status.message(), kFailureReasonMax)};
  }
  if (status.Is(ErrorReason::kInternalServerError)) {
    return {FailureKind::kInternalServerError, TruncateUtf8(status.message(), kFailureReasonMax)};
  }
  return {FailureKind::kInternalServerError,
          TruncateUtf8("InternalServerError: " + context + status.message(), kFailureReasonMax)};
}

Status ImagePreparationError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
    case StatusCode::kAborted: return status;
    case StatusCode::kNotFound:
    case StatusCode::kPermissionDenied:
    case StatusCode::kUnauthenticated:
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented:
      return Status(status.code(), "ClientError: " + status.message(), ErrorReason::kClientError);
    default:
      return Status(status.code(), "InternalServerError: " + status.message(), ErrorReason::kInternalServerError);
  }
}

JobFailure FailureReason(const std::vector<HostExit>& hosts) {
  std::vector<const HostExit*> order;
  for (const HostExit& host : hosts) {
    if (!host.stopped_by_kiln) order.push_back(&host);
  }
  for (const HostExit& host : hosts) {
    if (host.stopped_by_kiln) order.push_back(&host);
  }
  // A job of several hosts says which one failed (the lost and out-of-memory texts always do).
  const auto host_note = [&](const HostExit& host) {
    return hosts.size() > 1 ? " (host " + host.host + ")" : std::string();
  };
  for (const HostExit* host : order) {
    if (host->exit_code != 0 && !host->failure_file.empty()) {
      const std::string note = host_note(*host);
      std::string text = host->failure_file;
      if (!note.empty()) {
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
      }
      return {FailureKind::kAlgorithmError, TruncateUtf8(std::move(text), kFailureReasonMax - note.size()) + note};
    }
  }
  for (const HostExit* host : order) {
    if (host->exit_code == 0) continue;
    if (host->exit_code == -1 && host->term_signal == 0 && !host->oom_killed) {
      if (host->lost_reason.empty()) {
        return {FailureKind::kInternalServerError,
                "InternalServerError: the instance " + host->host +
                    " was lost (its supervisor exited without recording an exit status)."};
      }
      std::string why = host->lost_reason;
      while (!why.empty() && (why.back() == '.' || std::isspace(static_cast<unsigned char>(why.back())))) {
        why.pop_back();
      }
      const std::string head = "InternalServerError: the instance " + host->host + " was lost: ";
      return {FailureKind::kInternalServerError, TruncateUtf8(head + why, kFailureReasonMax - 1) + "."};
    }
    if (host->oom_killed || host->term_signal == SIGKILL || host->exit_code == 137) {
      return {
          FailureKind::kOutOfMemory,
          "OutOfMemory: Please use an instance type with more memory, or reduce the memory used by the "
          "training program. The process on " +
              host->host +
              (host->oom_killed ? " was killed by the kernel's OOM killer." : " was killed by SIGKILL (signal 9).")};
    }
    std::string summary = host->last_stderr_line;
    int code = host->term_signal != 0 ? 128 + host->term_signal : host->exit_code;
    std::string tail = ", exit code: " + std::to_string(code) + host_note(*host);
    if (summary.empty()) summary = "the training program exited with a non-zero status";
    return {FailureKind::kAlgorithmError,
            "AlgorithmError: " + TruncateUtf8(summary, kFailureReasonMax - 16 - tail.size()) + tail};
  }
  return {};
}

MonitorActions PlanMonitor(const MonitorInput& input, int64_t now_millis) {
  MonitorActions actions;
  bool all_exited = true;
  bool any_failed = false;
  for (const ObservedHost& host : input.hosts) {
    all_exited &= host.exited;
    any_failed |= host.exited && host.exit_code != 0;
  }
  if (all_exited) {
    actions.finish = true;
    return actions;
  }
  if (input.stop_sent) return actions;
  if (input.stop_requested) {
    actions.stop = input.requested_reason == StopReason::kNone ? StopReason::kUser : input.requested_reason;
  } else if (now_millis >= input.deadline_millis || now_millis >= input.wait_deadline_millis) {
    // Both may have passed since the last look (the monitor looks every 250 ms): the one that
    // passed first is why the job stops (a tie is MaxRuntime's).
    actions.stop =
        input.wait_deadline_millis < input.deadline_millis ? StopReason::kMaxWaitTime : StopReason::kMaxRuntime;
  } else if (any_failed) {
    // Before an interruption: a host that failed on its own fails the job (the failure is real;
    // a resumed attempt would not undo it).
    actions.stop = StopReason::kPeerFailure;
  } else if (input.interrupt_requested) {
    actions.stop = StopReason::kInterruption;
  }
  actions.record_max_runtime = actions.stop == StopReason::kMaxRuntime;
  actions.record_max_wait = actions.stop == StopReason::kMaxWaitTime;
  return actions;
}

Outcome PlanOutcome(const OutcomeInput& input) {
  using store::SecondaryStatus;
  using store::TrainingJobStatus;
  const StopReason reason = input.row_request == store::StopRequest::kUser          ? StopReason::kUser
                            : input.row_request == store::StopRequest::kMaxRuntime  ? StopReason::kMaxRuntime
                            : input.row_request == store::StopRequest::kMaxWaitTime ? StopReason::kMaxWaitTime
                                                                                    : input.run_reason;
  if (reason == StopReason::kUser || (reason == StopReason::kNone && input.stop_requested)) {
    return {TrainingJobStatus::kStopped, SecondaryStatus::kStopped, kMsgStopped, std::nullopt};
  }
  if (reason == StopReason::kMaxRuntime) {
    return {TrainingJobStatus::kStopped, SecondaryStatus::kMaxRuntimeExceeded, kMsgMaxRuntime, std::nullopt};
  }
  if (reason == StopReason::kMaxWaitTime) {
    return {TrainingJobStatus::kStopped, SecondaryStatus::kMaxWaitTimeExceeded, kMsgMaxWait, std::nullopt};
  }
  if (input.any_failed || !input.upload_error.empty()) {
    const std::string why = input.any_failed ? input.host_failure : input.upload_error;
    return {TrainingJobStatus::kFailed, SecondaryStatus::kFailed, why, why};
  }
  return {TrainingJobStatus::kCompleted, SecondaryStatus::kCompleted, kMsgCompleted, std::nullopt};
}

bool IsManagedSpot(const json& request) {
  auto it = request.find("EnableManagedSpotTraining");
  return it != request.end() && it->is_boolean() && it->get<bool>();
}

int64_t AttemptDeadline(const json& request, int64_t attempt_start, int64_t billable_before) {
  const int64_t limit = SecondsToMillisSaturating(MaxRuntimeSeconds(request));
  if (!IsManagedSpot(request)) return AddSaturating(attempt_start, limit);
  return AddSaturating(attempt_start, std::max<int64_t>(0, limit - std::max<int64_t>(0, billable_before)));
}

std::optional<int64_t> MaxWaitDeadline(const json& request, int64_t creation_millis) {
  if (!IsManagedSpot(request)) return std::nullopt;
  const int64_t seconds = StoppingSeconds(request, "MaxWaitTimeInSeconds", -1);
  if (seconds < 0) return std::nullopt;
  return AddSaturating(creation_millis, SecondsToMillisSaturating(seconds));
}

bool ScheduledInterruptionDue(const std::vector<double>& interrupt_after_seconds, int attempt, int64_t trained_millis) {
  if (attempt < 0 || static_cast<size_t>(attempt) >= interrupt_after_seconds.size()) return false;
  return static_cast<double>(trained_millis) >= interrupt_after_seconds[attempt] * 1000.0;
}

bool RetryAllowed(FailureKind kind, store::TrainingJobStatus status, int retries, int max_attempts) {
  return kind == FailureKind::kInternalServerError && status == store::TrainingJobStatus::kInProgress &&
         retries < max_attempts;
}

}  // namespace kiln::control::training
