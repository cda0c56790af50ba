#pragma once
// The process runtime: runs each instance in a sandbox of Linux namespaces owned by a `kiln shim`
// process that outlives the server (DESIGN.md §2, §6). Other modules use runtime/runtime.h; only
// the code that builds the server's runtime (and the `kiln shim` entry point) includes this file.
//
// Sandbox (built by the shim, see sandbox.h): new mount, PID and UTS namespaces; the mounts are
// private; spec.opt_ml_dir is bound at /opt/ml, /tmp is a private tmpfs, /proc is the sandbox's
// own; extra mounts, /etc/hosts and GPU hiding as InstanceSpec says. The program is PID 1 of its
// PID namespace, exactly as a container's entrypoint is under Docker (training-contract.md §2): a
// program without a SIGTERM handler ignores SIGTERM (the kernel's rule for a namespace's init) and
// is SIGKILLed when Stop's grace runs out. When PID 1 exits, the kernel kills every other process
// of the sandbox. Running as non-root, the shim first enters a new user namespace in which the
// caller is root (Launch fails with a clear message when the host forbids that).
//
// Network: without spec.network the sandbox shares the node's network. With it, the program runs in
// a network namespace of its own, joined to spec.network->bridge by a veth and configured before
// the program starts (README.md, "Networks"); 127.0.0.1:<port> of each loopback_forwards entry is
// relayed to the node's 127.0.0.1:<port> by the shim. Needs the shim to run as root
// (FailedPrecondition otherwise); a network step's failure fails Launch (Internal) and leaves no
// veth. The host veth is gone once the instance's exit is visible.
//
// On-disk state, one directory per instance under options.state_dir (see state.h):
//   spec.json  shim.lock  shim.log  output  started.json  stop_requested  exit.json  control.sock
// The shim holds an exclusive flock on shim.lock for its whole life, so "no exit.json and the lock
// is free" means the shim died without recording an exit: kLost.

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/runtime.h"

namespace kiln::runtime {

struct ProcessRuntimeOptions {
  // Directory holding one subdirectory per instance id; created if missing.
  std::string state_dir;
  // How to start a shim, e.g. {"/proc/self/exe resolved", "shim"}; the runtime appends its own
  // arguments (--state <dir> --lock-fd 3 --report-fd 4). The binary must call RunShim.
  std::vector<std::string> shim_command;
};

// Opens the runtime over `options.state_dir`; instances already there (from an earlier server)
// are visible at once. InvalidArgument if an option is missing. The returned object is
// thread-safe and holds no per-instance state in memory.
Result<std::unique_ptr<Runtime>> OpenProcessRuntime(ProcessRuntimeOptions options);

// The `kiln shim` entry point: `argv` are the arguments after "shim" (argv[0] is ignored, as for
// main). Returns the process exit code. Not for direct use: the runtime starts shims itself.
int RunShim(int argc, char** argv);

}  // namespace kiln::runtime
