#pragma once
// WorkerProcess: one child process of the model server (a Python worker, or the `prepare` step),
// in a process group of its own so that whatever it starts dies with it.
//
//   WorkerSpawnOptions spawn{.argv = {"/usr/bin/python3", "-u", "serve_worker.py", "work", ...},
//                            .env = {{"SAGEMAKER_PROGRAM", "inference.py"}}};
//   ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> worker, WorkerProcess::Spawn(spawn));
//   write(worker->socket_fd(), ...);   // frames (frame.h); the child reads them on its fd 3
//   worker->Kill(SIGKILL);
//   int wait_status = worker->Wait();  // reaped: no zombie
//
// The child gets: fd 0 /dev/null, fds 1 and 2 the server's (the instance log) unless stderr is
// captured, fd 3 its end of a SOCK_STREAM socketpair when `socket` is set, and no other descriptor
// of ours (every fd Kiln opens is close-on-exec); the server's environment plus `env`; default
// signal dispositions and an empty signal mask.
//
// Thread-safety: one owner thread (WorkerPool: the worker's dispatch thread), except pid() and
// RssBytes(), which any thread may call while the object lives. Only the owner signals and reaps,
// so a signal never reaches a recycled pid. The destructor SIGKILLs the group (if not yet reaped)
// and reaps it: no zombie outlives the object.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/fs.h"
#include "base/status.h"

namespace kiln::modelserver {

struct WorkerSpawnOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  // Set or override these variables over the server's own environment.
  std::map<std::string, std::string> env;
  // Give the child fd 3: one end of a socketpair; the other is socket_fd() (non-blocking).
  bool socket = true;
  // The child's stderr goes to a pipe whose read end is stderr_fd() (blocking) instead of ours.
  bool capture_stderr = false;
};

class WorkerProcess {
 public:
  // Starts the child. Errors: the interpreter missing or not executable (NotFound /
  // PermissionDenied / Internal, naming argv[0]); socketpair/pipe failures (Internal).
  static Result<std::unique_ptr<WorkerProcess>> Spawn(const WorkerSpawnOptions& options);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The server's end of the socketpair (O_NONBLOCK, close-on-exec); -1 without `socket`.
  int socket_fd() const { return socket_.get(); }
  // The read end of the captured stderr; -1 without `capture_stderr`.
  int stderr_fd() const { return stderr_.get(); }
  // Closes our end of the socket (the child then reads EOF).
  void CloseSocket() { socket_.Reset(); }

  // Sends `signal` to the child's process group; nothing once it has been reaped.
  void Kill(int signal);
  // Blocks until the child exits and reaps it; returns the wait status (as waitpid's). Idempotent.
  int Wait();
  // Reaps the child if it has exited: its wait status, else nullopt.
  std::optional<int> TryWait();
  // Waits up to `timeout_ms` for the child to exit (polling), then SIGKILLs the group and reaps.
  int WaitOrKill(int timeout_ms);

  // Resident memory of the child and its direct children (/proc/<pid>/statm), bytes; 0 once gone.
  uint64_t RssBytes() const;

 private:
  WorkerProcess() = default;

  pid_t pid_ = -1;
  UniqueFd socket_;
  UniqueFd stderr_;
  // Set once waitpid returned the child; after that its pid may belong to someone else.
  std::atomic<bool> reaped_{false};
  int wait_status_ = 0;
};

// Resident memory of process `pid` and its direct children (/proc/<pid>/statm), bytes; 0 when gone.
uint64_t ProcessRssBytes(pid_t pid);

// "exit status 1", "killed by signal 9 (SIGKILL)".
std::string DescribeWaitStatus(int wait_status);

}  // namespace kiln::modelserver
