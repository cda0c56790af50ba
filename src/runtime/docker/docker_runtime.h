#pragma once
// The container runtime: runs instances whose InstanceSpec carries a ContainerImage as containers
// of a Docker-Engine-API engine (Docker, or Podman's compatible socket), behind runtime.h's
// Runtime with the process runtime's guarantees (DESIGN.md §6). Other modules use runtime.h; only
// the server's wiring includes this file.
//
// Containers: created as container_config.h says (name kiln-<server label>-<instance id>, labels
// kiln.instance and kiln.server), started, and never given a restart policy. A name clash with a
// container that lacks this server's label fails Launch with FailedPrecondition naming the
// container and saying to remove or rename it; one of ours left from an earlier attempt of the
// same id (no state directory) is removed first.
//
// On-disk state, one directory per instance id under options.state_dir:
//   container.json  {container_id, name, image, holder, launched_millis, stop_requested,
//                    stop_deadline_millis, log_cursor:{seconds, lines}}   (replaced by rename)
//   output          captured output in runtime.h's record format
//   hosts           the /etc/hosts bound into the container
//   exit.json       the final status once observed (the container may be gone later)
// A directory without container.json is a Launch that did not finish: List skips it and Open
// removes it (with its container, if any).
//
// Output: a follower thread per running instance reads the engine's logs (follow) and appends
// records (time = when read); after a server restart the follower resumes at log_cursor (the
// engine's per-second timestamps plus a count of lines already recorded in that second), so
// nothing is lost or doubled. The follower ends when the container's output ends.
//
// Stop(grace): SIGTERM now; the stop deadline is written to container.json and a timer thread
// sends SIGKILL when it passes unless the container has exited. A server that restarts finds the
// deadlines in container.json and keeps them (the engine keeps running the container meanwhile).
//
// Networks: an instance with spec.network joins a network namespace built by a *holder*: an
// instance of `network_holders` (a process runtime, its own state dir) running `sleep infinity`
// with the same NetworkAttachment, so the bridge, veth, loopback relay and their cleanup are the
// process runtime's (runtime/process/bridge_networks.h); the container gets NetworkMode
// ns:/proc/<holder program pid>/ns/net (Podman). The holder is stopped when the container's exit is
// observed and removed with the instance. Docker Engine has no ns: mode: with a Docker engine an
// instance with spec.network fails Launch with FailedPrecondition saying to use Podman or
// network.mode host.
//
// Status: Inspect asks the engine (InspectContainer). Exit code 128+n with n a signal number is
// reported as term_signal n (Docker's convention); OOMKilled as oom_killed. A container the engine
// no longer knows is kLost ("the container engine no longer knows container ..."); an engine that
// cannot be reached is kLost once it has been unreachable for `engine_lost_after` (until then
// Inspect reports the last state seen, running). Launch while the engine is unreachable:
// Unavailable "the container engine at ... is unreachable: ...; start it (...) or ...".
//
// Orphans: Open, and a sweep every minute, remove containers labelled with this server whose
// instance directory is gone, so a container whose Remove failed while the engine was down does
// not leak.
//
// Usage: the engine's stats (source "cgroup"). Access: the engine's State.Pid of the running
// container and the spec's hostname.
//
// Thread-safety: every method may be called from any thread.
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "runtime/docker/container_config.h"
#include "runtime/docker/engine.h"
#include "runtime/docker/images.h"
#include "runtime/runtime.h"

namespace kiln::runtime::docker {

struct DockerRuntimeOptions {
  std::string state_dir;  // created if missing
  std::unique_ptr<Engine> engine;
  ContainerSettings container;  // container.server_label is required
  ImageSettings images;
  // Runs the network holders (a process runtime over its own state dir); may be null when no
  // instance has a network (Launch with spec.network then fails with FailedPrecondition).
  Runtime* network_holders = nullptr;
  // The holders' state dir (for their started.json: the pid of the program whose namespace containers join).
  std::string network_holders_state_dir;
  std::chrono::seconds engine_lost_after{60};
  // Whether the engine is Podman, when the caller already asked it (Engine::Version takes ~0.45 s
  // on Podman 4.3: the server's start-up probe answers it, so the first Launch does not ask again).
  // Unset: asked at the first Launch that needs it.
  std::optional<bool> engine_is_podman;
};

// InvalidArgument when an option is missing. Does not need the engine to be up.
Result<std::unique_ptr<Runtime>> OpenDockerRuntime(DockerRuntimeOptions options);

}  // namespace kiln::runtime::docker
