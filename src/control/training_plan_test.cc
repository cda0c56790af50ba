#include "agent/errors.h"
#include "control/training_plan.h"

#include <gtest/gtest.h>

#include <limits>

// The case tables name only the members that matter to each case; the others keep their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace kiln::control::training {
namespace {

using nlohmann::json;
using store::SecondaryStatus;
using store::StopRequest;
using store::TrainingJobStatus;

constexpr ObservedHost kRunning{.exited = false, .exit_code = -1};
constexpr ObservedHost kExitedOk{.exited = true, .exit_code = 0};
constexpr ObservedHost kExitedFailed{.exited = true, .exit_code = 2};
constexpr ObservedHost kLost{.exited = true, .exit_code = -1};

TEST(PlanMonitorTest, Table) {
  struct Case {
    const char* name;
    MonitorInput input;
    int64_t now;
    MonitorActions expected;
  };
  const Case cases[] = {
      {"running, nothing to do", {.hosts = {kRunning}, .deadline_millis = 100}, 50, {}},
      {"all hosts exited: finish", {.hosts = {kExitedOk, kExitedFailed}, .deadline_millis = 100}, 50, {.finish = true}},
      {"no hosts is all exited", {.deadline_millis = 100}, 50, {.finish = true}},
      {"exits win over a stop request",
       {.stop_requested = true, .hosts = {kExitedOk}, .deadline_millis = 100},
       50,
       {.finish = true}},
      {"user stop: stop the hosts",
       {.stop_requested = true, .hosts = {kRunning}, .deadline_millis = 100},
       50,
       {.stop = StopReason::kUser}},
      {"stop requested with the row's max runtime reason (adopted)",
       {.stop_requested = true,
        .requested_reason = StopReason::kMaxRuntime,
        .hosts = {kRunning},
        .deadline_millis = 100},
       50,
       {.stop = StopReason::kMaxRuntime, .record_max_runtime = true}},
      {"a stop already sent is not sent again",
       {.stop_requested = true, .stop_sent = true, .hosts = {kRunning}, .deadline_millis = 100},
       500,
       {}},
      {"deadline reached: max runtime",
       {.hosts = {kRunning}, .deadline_millis = 100},
       100,
       {.stop = StopReason::kMaxRuntime, .record_max_runtime = true}},
      {"one millisecond before the deadline", {.hosts = {kRunning}, .deadline_millis = 100}, 99, {}},
      {"a user stop wins over the deadline",
       {.stop_requested = true, .hosts = {kRunning}, .deadline_millis = 100},
       200,
       {.stop = StopReason::kUser}},
      {"a host failed: stop its peers",
       {.hosts = {kRunning, kExitedFailed}, .deadline_millis = 100},
       50,
       {.stop = StopReason::kPeerFailure}},
      {"a lost host counts as failed",
       {.hosts = {kLost, kRunning}, .deadline_millis = 100},
       50,
       {.stop = StopReason::kPeerFailure}},
      {"a host that succeeded does not stop its peers",
       {.hosts = {kExitedOk, kRunning}, .deadline_millis = 100},
       50,
       {}},
      {"the deadline wins over a peer failure",
       {.hosts = {kExitedFailed, kRunning}, .deadline_millis = 100},
       100,
       {.stop = StopReason::kMaxRuntime, .record_max_runtime = true}},
      {"a saturated deadline never passes",
       {.hosts = {kRunning}, .deadline_millis = std::numeric_limits<int64_t>::max()},
       std::numeric_limits<int64_t>::max() - 1,
       {}},
      {"spot: an interruption stops the hosts",
       {.interrupt_requested = true, .hosts = {kRunning}, .deadline_millis = 100},
       50,
       {.stop = StopReason::kInterruption}},
      {"spot: a user stop wins over an interruption",
       {.stop_requested = true, .interrupt_requested = true, .hosts = {kRunning}, .deadline_millis = 100},
       50,
       {.stop = StopReason::kUser}},
      {"spot: a failed host fails the job rather than resuming it",
       {.interrupt_requested = true, .hosts = {kExitedFailed, kRunning}, .deadline_millis = 100},
       50,
       {.stop = StopReason::kPeerFailure}},
      {"spot: max wait reached",
       {.hosts = {kRunning}, .deadline_millis = 1000, .wait_deadline_millis = 100},
       100,
       {.stop = StopReason::kMaxWaitTime, .record_max_wait = true}},
      {"spot: max wait wins over an interruption",
       {.interrupt_requested = true, .hosts = {kRunning}, .deadline_millis = 1000, .wait_deadline_millis = 100},
       150,
       {.stop = StopReason::kMaxWaitTime, .record_max_wait = true}},
      {"spot: max runtime and max wait at once: max runtime",
       {.hosts = {kRunning}, .deadline_millis = 100, .wait_deadline_millis = 100},
       100,
       {.stop = StopReason::kMaxRuntime, .record_max_runtime = true}},
      {"spot: both passed since the last look, max wait first",
       {.hosts = {kRunning}, .deadline_millis = 120, .wait_deadline_millis = 100},
       300,
       {.stop = StopReason::kMaxWaitTime, .record_max_wait = true}},
      {"spot: both passed since the last look, max runtime first",
       {.hosts = {kRunning}, .deadline_millis = 100, .wait_deadline_millis = 120},
       300,
       {.stop = StopReason::kMaxRuntime, .record_max_runtime = true}},
      {"spot: an interruption already sent is not sent again",
       {.stop_sent = true, .interrupt_requested = true, .hosts = {kRunning}, .deadline_millis = 100},
       50,
       {}},
  };
  for (const Case& c : cases) {
    MonitorActions got = PlanMonitor(c.input, c.now);
    EXPECT_EQ(got.finish, c.expected.finish) << c.name;
    EXPECT_EQ(got.stop, c.expected.stop) << c.name;
    EXPECT_EQ(got.record_max_runtime, c.expected.record_max_runtime) << c.name;
    EXPECT_EQ(got.record_max_wait, c.expected.record_max_wait) << c.name;
  }
}

TEST(PlanOutcomeTest, Table) {
  struct Case {
    const char* name;
    OutcomeInput input;
    Outcome expected;
  };
  const Case cases[] = {
      {"clean exit", {}, {TrainingJobStatus::kCompleted, SecondaryStatus::kCompleted, kMsgCompleted, std::nullopt}},
      {"a host failed",
       {.run_reason = StopReason::kPeerFailure, .any_failed = true, .host_failure = "AlgorithmError: x, exit code: 1"},
       {TrainingJobStatus::kFailed, SecondaryStatus::kFailed, "AlgorithmError: x, exit code: 1",
        "AlgorithmError: x, exit code: 1"}},
      {"upload failed",
       {.upload_error = "InternalServerError: checkpoint upload failed: x"},
       {TrainingJobStatus::kFailed, SecondaryStatus::kFailed, "InternalServerError: checkpoint upload failed: x",
        "InternalServerError: checkpoint upload failed: x"}},
      {"a host failure is the reason over an upload error",
       {.any_failed = true, .host_failure = "OutOfMemory: y", .upload_error = "InternalServerError: z"},
       {TrainingJobStatus::kFailed, SecondaryStatus::kFailed, "OutOfMemory: y", "OutOfMemory: y"}},
      {"user stop",
       {.row_request = StopRequest::kUser, .run_reason = StopReason::kUser, .stop_requested = true},
       {TrainingJobStatus::kStopped, SecondaryStatus::kStopped, kMsgStopped, std::nullopt}},
      {"user stop wins over a failed host (stopped by SIGTERM)",
       {.row_request = StopRequest::kUser,
        .stop_requested = true,
        .any_failed = true,
        .host_failure = "AlgorithmError: 143"},
       {TrainingJobStatus::kStopped, SecondaryStatus::kStopped, kMsgStopped, std::nullopt}},
      {"stopped while staging (the run's request only)",
       {.stop_requested = true},
       {TrainingJobStatus::kStopped, SecondaryStatus::kStopped, kMsgStopped, std::nullopt}},
      {"max runtime (the row's)",
       {.row_request = StopRequest::kMaxRuntime, .run_reason = StopReason::kMaxRuntime},
       {TrainingJobStatus::kStopped, SecondaryStatus::kMaxRuntimeExceeded, kMsgMaxRuntime, std::nullopt}},
      {"the row's user stop wins over the run's max runtime",
       {.row_request = StopRequest::kUser, .run_reason = StopReason::kMaxRuntime},
       {TrainingJobStatus::kStopped, SecondaryStatus::kStopped, kMsgStopped, std::nullopt}},
      {"max wait time (the row's)",
       {.row_request = StopRequest::kMaxWaitTime, .run_reason = StopReason::kMaxWaitTime},
       {TrainingJobStatus::kStopped, SecondaryStatus::kMaxWaitTimeExceeded, kMsgMaxWait, std::nullopt}},
      {"max wait time wins over a host stopped by SIGTERM",
       {.row_request = StopRequest::kMaxWaitTime, .any_failed = true, .host_failure = "AlgorithmError: 143"},
       {TrainingJobStatus::kStopped, SecondaryStatus::kMaxWaitTimeExceeded, kMsgMaxWait, std::nullopt}},
  };
  for (const Case& c : cases) {
    Outcome got = PlanOutcome(c.input);
    EXPECT_EQ(got.status, c.expected.status) << c.name;
    EXPECT_EQ(got.secondary, c.expected.secondary) << c.name;
    EXPECT_EQ(got.message, c.expected.message) << c.name;
    EXPECT_EQ(got.failure_reason, c.expected.failure_reason) << c.name;
  }
}

TEST(RetryAllowedTest, Table) {
  struct Case {
    const char* name;
    FailureKind kind;
    TrainingJobStatus status;
    int retries;
    int max_attempts;
    bool expected;
  };
  const Case cases[] = {
      {"Kiln's own failure", FailureKind::kInternalServerError, TrainingJobStatus::kInProgress, 0, 1, true},
      {"attempts used", FailureKind::kInternalServerError, TrainingJobStatus::kInProgress, 1, 1, false},
      {"no RetryStrategy", FailureKind::kInternalServerError, TrainingJobStatus::kInProgress, 0, 0, false},
      {"being stopped", FailureKind::kInternalServerError, TrainingJobStatus::kStopping, 0, 3, false},
      {"the program failed", FailureKind::kAlgorithmError, TrainingJobStatus::kInProgress, 0, 3, false},
      {"out of memory", FailureKind::kOutOfMemory, TrainingJobStatus::kInProgress, 0, 3, false},
      {"the user's error", FailureKind::kClientError, TrainingJobStatus::kInProgress, 0, 3, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(RetryAllowed(c.kind, c.status, c.retries, c.max_attempts), c.expected) << c.name;
  }
}

TEST(FailureFromStatusTest, TheReasonNotTheMessageDecidesTheKind) {
  const JobFailure client = FailureFromStatus(agent::ClientError("No S3 objects found under S3 URL s3://b/p"));
  EXPECT_EQ(client.kind, FailureKind::kClientError);
  EXPECT_EQ(client.reason, "ClientError: No S3 objects found under S3 URL s3://b/p");
  const JobFailure internal = FailureFromStatus(agent::InternalServerError("disk gone"), "ignored: ");
  EXPECT_EQ(internal.kind, FailureKind::kInternalServerError);
  EXPECT_EQ(internal.reason, "InternalServerError: disk gone");
  // An error of no failure kind is Kiln's own, even when its text looks like another kind.
  const JobFailure plain = FailureFromStatus(Status::Internal("ClientError: not really"), "uploading failed: ");
  EXPECT_EQ(plain.kind, FailureKind::kInternalServerError);
  EXPECT_EQ(plain.reason, "InternalServerError: uploading failed: ClientError: not really");
  EXPECT_LE(FailureFromStatus(Status::Internal(std::string(5000, 'z'))).reason.size(), kFailureReasonMax);
}

TEST(StoppingSecondsTest, TakesIntegersTruncatesFractionsAndSaturates) {
  using nlohmann::json;
  auto request = [](json v) { return json{{"StoppingCondition", {{"MaxRuntimeInSeconds", v}}}}; };
  EXPECT_EQ(MaxRuntimeSeconds(json::object()), 86400);
  EXPECT_EQ(MaxRuntimeSeconds(request(60)), 60);
  EXPECT_EQ(MaxRuntimeSeconds(request(60.9)), 60);
  EXPECT_EQ(MaxRuntimeSeconds(request("60")), 86400);
  EXPECT_EQ(MaxRuntimeSeconds(request(json::parse("18446744073709551615"))), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(MaxRuntimeSeconds(request(1e300)), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(SecondsToMillisSaturating(std::numeric_limits<int64_t>::max()), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(AddSaturating(std::numeric_limits<int64_t>::max() - 1, 5), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(AddSaturating(1000, 60000), 61000);
}

TEST(DistributionHyperparametersTest, ProcessesPerHostIsAPositiveIntegerAsTheSdkEncodesIt) {
  auto request = [](const json& value) {
    return json{{"HyperParameters", {{"sagemaker_mpi_num_of_processes_per_host", value}}}};
  };
  EXPECT_EQ(MpiProcessesPerHost(request("2")), 2);      // json.dumps(2)
  EXPECT_EQ(MpiProcessesPerHost(request("\"4\"")), 4);  // json.dumps("4")
  EXPECT_EQ(MpiProcessesPerHost(json::object()), std::nullopt);
  for (const json& bad : {json("0"), json("-1"), json("1.5"), json("\"two\""), json(""), json("99999999"), json(2)}) {
    EXPECT_EQ(MpiProcessesPerHost(request(bad)), std::nullopt) << bad.dump();
  }
  EXPECT_EQ(DecodedHyperparameter(json{{"HyperParameters", {{"p", "\"train.py\""}}}}, "p"), "train.py");
  EXPECT_EQ(DecodedHyperparameter(json{{"HyperParameters", {{"p", "not json"}}}}, "p"), "not json");

  EXPECT_EQ(ProcessesPerHostNote(request("8"), 4),
            "; warning: sagemaker_mpi_num_of_processes_per_host is 8 but each host has 4 GPUs, so processes share "
            "GPUs (set it to at most 4)");
  EXPECT_EQ(ProcessesPerHostNote(request("4"), 4), "");
  EXPECT_EQ(ProcessesPerHostNote(request("8"), 0), "");  // CPU hosts: CreateTrainingJob checked the vCPUs
  EXPECT_EQ(ProcessesPerHostNote(json::object(), 1), "");
}

TEST(FailureReasonTest, Table) {
  const HostExit ok{.host = "algo-1", .exit_code = 0};
  const HostExit crashed{.host = "algo-2", .exit_code = 1, .last_stderr_line = "RuntimeError: rank 1 crashed"};
  const HostExit stopped{
      .host = "algo-1", .exit_code = 143, .term_signal = 15, .stopped_by_kiln = true, .last_stderr_line = "Terminated"};
  const HostExit lost{.host = "algo-1", .exit_code = -1};
  const HostExit killed{.host = "algo-1", .exit_code = 137, .term_signal = 9};
  const HostExit with_file{
      .host = "algo-2", .exit_code = 1, .failure_file = "my own reason", .last_stderr_line = "ignored"};
  const HostExit silent{.host = "algo-1", .exit_code = 2};
  const HostExit oom{.host = "algo-1", .exit_code = 137, .term_signal = 9, .oom_killed = true};
  const HostExit oom_lost_code{.host = "algo-2", .exit_code = -1, .oom_killed = true};
  const HostExit lost_why{
      .host = "algo-1", .exit_code = -1, .lost_reason = "the container engine no longer knows container kiln-1-x."};
  struct Case {
    const char* name;
    std::vector<HostExit> hosts;
    std::string expected;
  };
  const Case cases[] = {
      {"nobody failed", {ok, ok}, ""},
      {"no hosts", {}, ""},
      {"last stderr line and exit code", {crashed}, "AlgorithmError: RuntimeError: rank 1 crashed, exit code: 1"},
      {"the host that failed on its own, not the peer Kiln stopped, named when there are several",
       {stopped, crashed},
       "AlgorithmError: RuntimeError: rank 1 crashed, exit code: 1 (host algo-2)"},
      {"a failure file wins over any summary", {with_file}, "my own reason"},
      {"a failure file of one of several hosts names it", {crashed, with_file}, "my own reason (host algo-2)"},
      {"a signal on one of several hosts", {ok, stopped}, "AlgorithmError: Terminated, exit code: 143 (host algo-1)"},
      {"lost",
       {lost},
       "InternalServerError: the instance algo-1 was lost (its supervisor exited without recording an exit status)."},
      {"SIGKILL is out of memory",
       {killed},
       "OutOfMemory: Please use an instance type with more memory, or reduce the memory used by the training program. "
       "The process on algo-1 was killed by SIGKILL (signal 9)."},
      {"the OOM killer, as the runtime reports it",
       {oom},
       "OutOfMemory: Please use an instance type with more memory, or reduce the memory used by the training program. "
       "The process on algo-1 was killed by the kernel's OOM killer."},
      {"OOM killed whatever the exit code says",
       {ok, oom_lost_code},
       "OutOfMemory: Please use an instance type with more memory, or reduce the memory used by the training program. "
       "The process on algo-2 was killed by the kernel's OOM killer."},
      {"lost with the runtime's reason",
       {lost_why},
       "InternalServerError: the instance algo-1 was lost: the container engine no longer knows container kiln-1-x."},
      {"no stderr line", {silent}, "AlgorithmError: the training program exited with a non-zero status, exit code: 2"},
      {"a signal is 128 + signal", {stopped}, "AlgorithmError: Terminated, exit code: 143"},
  };
  for (const Case& c : cases) EXPECT_EQ(FailureReason(c.hosts).reason, c.expected) << c.name;
}

TEST(FailureReasonTest, KindsComeFromHowTheHostEndedNotFromTheText) {
  const HostExit lost{.host = "algo-1", .exit_code = -1};
  const HostExit killed{.host = "algo-1", .exit_code = 137, .term_signal = 9};
  const HostExit crashed{.host = "algo-1", .exit_code = 1, .last_stderr_line = "boom"};
  // A failure file saying "InternalServerError" is still the program's failure: not retried.
  const HostExit sly{.host = "algo-1", .exit_code = 1, .failure_file = "InternalServerError: please retry me"};
  EXPECT_EQ(FailureReason({lost}).kind, FailureKind::kInternalServerError);
  EXPECT_EQ(FailureReason({killed}).kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(FailureReason({{.host = "algo-1", .exit_code = 137, .oom_killed = true}}).kind, FailureKind::kOutOfMemory);
  EXPECT_EQ(FailureReason({{.host = "algo-1", .exit_code = -1, .lost_reason = "engine gone"}}).kind,
            FailureKind::kInternalServerError);
  EXPECT_EQ(FailureReason({crashed}).kind, FailureKind::kAlgorithmError);
  EXPECT_EQ(FailureReason({sly}).kind, FailureKind::kAlgorithmError);
  EXPECT_EQ(FailureReason({sly}).reason, "InternalServerError: please retry me");
  EXPECT_FALSE(FailureReason({}).failed());
}

TEST(ImagePreparationErrorTest, TheUsersImageIsAClientErrorTheEngineIsKilns) {
  struct Case {
    Status in;
    std::string message;
    ErrorReason reason;
  };
  const Case cases[] = {
      {Status::NotFound("image registry.local/x:1 not found locally and no registry had it"),
       "ClientError: image registry.local/x:1 not found locally and no registry had it", ErrorReason::kClientError},
      {Status::PermissionDenied("registry.local rejected the credentials"),
       "ClientError: registry.local rejected the credentials", ErrorReason::kClientError},
      {Status::InvalidArgument("bad reference"), "ClientError: bad reference", ErrorReason::kClientError},
      {Status::FailedPrecondition("no engine"), "ClientError: no engine", ErrorReason::kClientError},
      {Status::Unavailable("the container engine at unix:///x is unreachable"),
       "InternalServerError: the container engine at unix:///x is unreachable", ErrorReason::kInternalServerError},
      {Status::Internal("engine answered 500"), "InternalServerError: engine answered 500",
       ErrorReason::kInternalServerError},
  };
  for (const Case& c : cases) {
    const Status out = ImagePreparationError(c.in);
    EXPECT_EQ(out.message(), c.message);
    EXPECT_EQ(out.code(), c.in.code());
    EXPECT_TRUE(out.Is(c.reason)) << c.message;
  }
  // The failure kinds follow: only Kiln's side is retried.
  EXPECT_EQ(FailureFromStatus(ImagePreparationError(Status::NotFound("x"))).kind, FailureKind::kClientError);
  EXPECT_EQ(FailureFromStatus(ImagePreparationError(Status::Unavailable("x"))).kind, FailureKind::kInternalServerError);
  // A stop meanwhile stays Aborted (the run ends Stopped, not Failed).
  EXPECT_EQ(ImagePreparationError(Status::Aborted("cancelled")).code(), StatusCode::kAborted);
  EXPECT_FALSE(ImagePreparationError(Status::Aborted("cancelled")).Is(ErrorReason::kClientError));
  EXPECT_TRUE(ImagePreparationError(Status::Ok()).ok());
}

TEST(FailureReasonTest, LongReasonsAreCutToTheLimitOnACharacterBoundary) {
  HostExit file{.host = "algo-1", .exit_code = 1, .failure_file = std::string(1023, 'x') + "\xC3\xA9"};
  EXPECT_EQ(FailureReason({file}).reason, std::string(1023, 'x'));
  HostExit chatty{.host = "algo-1", .exit_code = 1, .last_stderr_line = std::string(5000, 'y')};
  const std::string reason = FailureReason({chatty}).reason;
  EXPECT_LE(reason.size(), kFailureReasonMax);
  EXPECT_TRUE(reason.ends_with("y, exit code: 1"));
  // The host's name survives the cut.
  HostExit second = chatty;
  second.host = "algo-2";
  const std::string named = FailureReason({{.host = "algo-1", .exit_code = 0}, second}).reason;
  EXPECT_LE(named.size(), kFailureReasonMax);
  EXPECT_TRUE(named.ends_with("y, exit code: 1 (host algo-2)")) << named;
  HostExit file_on_second = file;
  file_on_second.host = "algo-2";
  file_on_second.failure_file = std::string(2000, 'z') + "\n";
  const std::string from_file = FailureReason({{.host = "algo-1", .exit_code = 0}, file_on_second}).reason;
  EXPECT_LE(from_file.size(), kFailureReasonMax);
  EXPECT_TRUE(from_file.ends_with("z (host algo-2)")) << from_file;
}

TEST(ManagedSpotTest, DeadlinesAndTheOperatorsSchedule) {
  const nlohmann::json spot = {{"EnableManagedSpotTraining", true},
                               {"StoppingCondition", {{"MaxRuntimeInSeconds", 60}, {"MaxWaitTimeInSeconds", 120}}}};
  const nlohmann::json on_demand = {{"StoppingCondition", {{"MaxRuntimeInSeconds", 60}}}};
  EXPECT_TRUE(IsManagedSpot(spot));
  EXPECT_FALSE(IsManagedSpot(on_demand));
  EXPECT_FALSE(IsManagedSpot({{"EnableManagedSpotTraining", "true"}}));  // not a boolean
  // Spot: MaxRuntime counts the running time of every attempt; on demand each attempt has it all.
  EXPECT_EQ(AttemptDeadline(spot, 1000, 40000), 1000 + 20000);
  EXPECT_EQ(AttemptDeadline(spot, 1000, 90000), 1000);  // already over: stops at once
  EXPECT_EQ(AttemptDeadline(on_demand, 1000, 40000), 61000);
  EXPECT_EQ(MaxWaitDeadline(spot, 5000), 125000);
  EXPECT_EQ(MaxWaitDeadline(on_demand, 5000), std::nullopt);
  EXPECT_EQ(MaxWaitDeadline({{"EnableManagedSpotTraining", true}}, 5000), std::nullopt);
  const std::vector<double> schedule = {3, 1.5};
  EXPECT_FALSE(ScheduledInterruptionDue(schedule, 0, 2999));
  EXPECT_TRUE(ScheduledInterruptionDue(schedule, 0, 3000));
  EXPECT_TRUE(ScheduledInterruptionDue(schedule, 1, 1500));
  EXPECT_FALSE(ScheduledInterruptionDue(schedule, 1, 1499));
  EXPECT_FALSE(ScheduledInterruptionDue(schedule, 2, 1000000));  // beyond the list: runs on
  EXPECT_FALSE(ScheduledInterruptionDue({}, 0, 1000000));
}

}  // namespace
}  // namespace kiln::control::training
