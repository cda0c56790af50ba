#pragma once
// Holding a training host before its program starts (spec remote-access.md R-15): with the
// resource tag `kiln:remote-hold-start-seconds = N` (0..3600) on a job whose remote access is
// enabled (RemoteDebugConfig.EnableRemoteDebug), each host's program is started as
//
//   <kiln> hold-start --seconds N -- <the program's argv...>
//
// (src/cli/hold_start_command.h): it waits until `kiln release <target>` (the daemon sends it
// SIGUSR1; `kill -USR1 1` inside does the same) or N seconds, then exec()s the real program, which
// therefore keeps PID 1 and receives signals exactly as training-contract.md says. The secondary
// status stays Training with the message "Waiting for remote connection" while any host holds;
// the hold counts towards MaxRuntimeInSeconds. Process runtime only: a container image's PID 1 is
// the image's entrypoint, and Kiln's binary is not inside the image (the tag is refused there).

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "store/remote_connection_repository.h"
#include "store/training_job_repository.h"

namespace kiln::control {

inline constexpr char kHoldStartTag[] = "kiln:remote-hold-start-seconds";
inline constexpr int kMaxHoldStartSeconds = 3600;
inline constexpr char kHoldStartCommand[] = "hold-start";
inline constexpr char kMsgWaitingForRemoteConnection[] = "Waiting for remote connection";

// Idle stop: with the tag `kiln:remote-idle-stop-seconds = N` (1..604800), the job is
// stopped (normal stop procedure, status Stopped) once no remote connection has been open for N
// seconds: counted from the end of the last connection, or from the start of training when nobody
// has connected. Connections are the remote-access audit rows (store/remote_connection_repository.h).
inline constexpr char kIdleStopTag[] = "kiln:remote-idle-stop-seconds";
inline constexpr int kMaxIdleStopSeconds = 7 * 24 * 3600;

// The tag's value: nullopt when absent; InvalidArgument when not a whole number in 1..604800.
Result<std::optional<int>> IdleStopSeconds(const std::vector<store::Tag>& tags);

// Since when the job has had no connection open: nullopt while one is open (a row without an
// end), else the latest end among `connections`, or `training_start_millis` when later (or there
// are none).
std::optional<int64_t> IdleSinceMillis(const std::vector<store::RemoteConnectionRecord>& connections,
                                       int64_t training_start_millis);

// Hold after exit: with the tag `kiln:remote-hold-exit-seconds = N` (0..21600) on a job
// whose remote access is enabled, once its programs have exited and the job has its terminal
// status (artifacts uploaded, so automation is unaffected), each host keeps its resources and runs
// a post-mortem instance over the job's /opt_ml with the same environment and GPUs:
//   <kiln> hold-start --seconds N --after-exit
// reachable as the same target (state Held) until N seconds pass or `kiln release` (SIGUSR1).
// Not for jobs the user stopped, and not on container images (the tag is refused there).
inline constexpr char kHoldExitTag[] = "kiln:remote-hold-exit-seconds";
inline constexpr int kMaxHoldExitSeconds = 21600;
// The post-mortem instance of `instance_id`.
inline std::string HeldInstanceId(const std::string& instance_id) { return instance_id + "-held"; }

Result<std::optional<int>> HoldExitSeconds(const std::vector<store::Tag>& tags);

// The post-mortem instance's program: {kiln_binary, "hold-start", "--seconds", N, "--after-exit"}.
std::vector<std::string> HoldAfterExitArgv(const std::string& kiln_binary, int seconds);

// The tag's value: nullopt when the tag is absent; InvalidArgument (message for a
// ValidationException) when it is not a whole number of seconds in 0..3600.
Result<std::optional<int>> HoldStartSeconds(const std::vector<store::Tag>& tags);

// `argv` wrapped in the hold: {kiln_binary, "hold-start", "--seconds", N, "--", argv...}.
std::vector<std::string> HoldStartArgv(const std::string& kiln_binary, int seconds,
                                       const std::vector<std::string>& argv);

// True while the process `host_pid` is still the hold (its command line is `<x> hold-start ...`),
// false once it has exec()ed the program or is gone.
bool IsHoldingBeforeStart(int host_pid);

}  // namespace kiln::control
