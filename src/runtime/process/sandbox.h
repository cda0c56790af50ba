#pragma once
// The child side of the shim: turns the freshly forked process (PID 1 of a new PID namespace) into
// the instance's sandbox and execs the program. Runs in a child of the single-threaded shim, so
// ordinary library calls are safe here.

#include <string>

#include "runtime/runtime.h"

namespace kiln::runtime {

struct SandboxPlan {
  const InstanceSpec* spec = nullptr;
  std::string hosts_file;  // host file to bind at /etc/hosts; empty: leave the host's
  int stdout_fd = -1;      // write ends of the output pipes (become fds 1 and 2)
  int stderr_fd = -1;
  // CLOEXEC pipe to the shim. Exec success closes it with nothing written; any failure writes
  // "<class> <message>" (class: invalid | internal) and exits 127.
  int status_fd = -1;
  // -1, or a pipe to read one byte from before anything else (the shim first moves the child
  // into its cgroup).
  int go_fd = -1;
};

// Builds the sandbox (see process_runtime.h) and execs spec->argv. Never returns. Warnings about
// best-effort steps (GPU hiding, /proc) go to the current stderr, the shim's log.
[[noreturn]] void SetupSandboxAndExec(const SandboxPlan& plan);

}  // namespace kiln::runtime
