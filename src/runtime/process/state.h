#pragma once
// The on-disk state of one process-runtime instance, shared by the runtime (server side) and the
// shim: file names, the JSON forms of the spec, started and exit records, the control socket's
// path and the shim-liveness check. Nothing here keeps state in memory: it reads (or writes) the
// files, so it works the same in a server that started long after the shim.
//
// Thread-safety: all functions are thread-safe (no shared state).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "runtime/runtime.h"

namespace kiln::runtime::process_state {

// File names inside an instance's state directory.
inline constexpr char kSpecFile[] = "spec.json";        // InstanceSpec, written by Launch
inline constexpr char kLockFile[] = "shim.lock";        // flock(LOCK_EX) held by the live shim
inline constexpr char kShimLogFile[] = "shim.log";      // the shim's own stdout/stderr
inline constexpr char kOutputFile[] = "output";         // captured output (runtime.h format)
inline constexpr char kStartedFile[] = "started.json";  // {started_millis, shim_pid, pid, socket}
inline constexpr char kStopFile[] = "stop_requested";   // exists once Stop reached the shim
inline constexpr char kExitFile[] = "exit.json";        // the exit record, written atomically
inline constexpr char kHostsFile[] = "hosts";           // the sandbox's /etc/hosts when given
inline constexpr char kSocketFile[] = "control.sock";   // the control socket (see SocketPath)

// True for ids matching [A-Za-z0-9._-]{1,128}, excluding "." and "..".
bool ValidInstanceId(std::string_view id);

std::string Join(const std::string& dir, std::string_view name);

// The control socket of the instance whose state directory is `instance_dir`: <dir>/control.sock
// when that fits in sockaddr_un (108 bytes), else /tmp/kiln-<hash of dir>.sock. Deterministic, so
// both sides compute the same path; started.json records it too.
std::string SocketPath(const std::string& instance_dir);

// The Decode* functions fail with DataLoss("bad <record>: ...") when the text is not JSON or lacks
// a field (a torn or foreign file). The spec's "network" member is optional (absent: no network;
// specs written before per-instance networks have none); when present all its fields are required.
std::string EncodeSpec(const InstanceSpec& spec);
Result<InstanceSpec> DecodeSpec(std::string_view json);

struct ExitRecord {
  int exit_code = -1;
  int term_signal = 0;
  int64_t started_millis = 0;
  int64_t finished_millis = 0;
  bool stop_requested = false;
};
std::string EncodeExit(const ExitRecord& record);
Result<ExitRecord> DecodeExit(std::string_view json);

// started.json: written by the shim right after the program was exec'd.
struct StartedRecord {
  int64_t started_millis = 0;
  int shim_pid = 0;
  int pid = 0;  // the program (PID 1 of the sandbox) as the host sees it
  std::string socket;
};
std::string EncodeStarted(const StartedRecord& record);
Result<StartedRecord> DecodeStarted(std::string_view json);

// Writes `content` to `path` through a temp file and rename: readers see the old or the new file,
// never a torn one. No fsync (for state that is worthless after a node crash anyway, where the
// fsync's milliseconds would sit on the job-start path).
Status WriteFileRenamed(const std::string& path, std::string_view content);

// Whether a shim holds the lock of `instance_dir`. False when the lock file is missing.
bool ShimAlive(const std::string& instance_dir);

// The instance's status from its directory (see process_runtime.h for the protocol). NotFound if
// the directory does not exist.
Result<InstanceStatus> ReadStatus(const std::string& instance_dir, const std::string& instance_id);

}  // namespace kiln::runtime::process_state
