#pragma once
// Engine: the calls Kiln makes to a container engine, typed (runtime/docker/, DESIGN.md §6). One
// implementation talks the Docker Engine API over a Unix socket (OpenHttpEngine below; Docker's
// own socket or Podman's Docker-compatible one, API v1.41); test_util/fake_engine.h is the unit
// tests' engine. DockerRuntime and the image functions (images.h) use only this interface.
//
// Errors (every call): Unavailable "the container engine at <socket> is unreachable: <why>" when
// it cannot be connected to or the connection breaks; NotFound for a 404 (no such container or
// image); AlreadyExists for a 409 on create (a container of that name exists); Internal for other
// non-2xx answers, carrying the engine's own "message"; DeadlineExceeded when a non-streaming call
// takes longer than the engine timeout.
//
// Thread-safety: every method may be called from any thread; streaming calls block their thread
// until the stream ends, fails or is cancelled.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::runtime::docker {

struct EngineVersion {
  std::string name;         // "Docker Engine - Community", "Podman Engine", ... (Components[0].Name)
  std::string version;      // "4.3.1"
  std::string api_version;  // "1.41"
  bool podman = false;      // the engine is Podman (ns:<path> network mode, CDI devices, k8s-file logs)
};

struct ImageInfo {
  std::string id;                      // "sha256:..."
  std::vector<std::string> repo_tags;  // "localhost/byo:1"
  int64_t size_bytes = 0;
  int64_t created_seconds = 0;  // unix time
  // From the image config (InspectImage only; empty from ListImages).
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  std::vector<std::string> env;  // "K=V"
  std::string working_dir;
};

// One progress message of a pull (the engine's JSON lines: status, id, progressDetail).
struct PullProgress {
  std::string status;  // "Downloading", "Pull complete", "Copying blob ...", ...
  std::string layer;   // id
  int64_t current = 0;
  int64_t total = 0;
};

struct ContainerState {
  std::string id;
  std::string name;  // without the leading '/'
  std::map<std::string, std::string> labels;
  std::string status;  // "created", "running", "exited", "paused", "dead", ...
  bool running = false;
  int pid = 0;  // of PID 1 as the node sees it; 0 when not running
  int exit_code = 0;
  bool oom_killed = false;
  std::string error;            // the engine's State.Error (e.g. "executable file not found")
  int64_t started_millis = 0;   // 0 when never started
  int64_t finished_millis = 0;  // 0 while running / never started
};

struct ContainerSummary {
  std::string id;
  std::string name;  // without the leading '/'
  std::map<std::string, std::string> labels;
  std::string state;  // "running", "exited", "created", ...
};

// One line of a container's output as the logs call returns it.
struct LogLine {
  bool stderr_stream = false;
  int64_t engine_millis = 0;  // the engine's timestamp (Podman 4.3 gives whole seconds)
  std::string text;           // without the newline
};

struct ContainerStats {
  uint64_t cpu_total_usec = 0;  // cpu_stats.cpu_usage.total_usage (ns) / 1000
  uint64_t memory_bytes = 0;    // memory_stats.usage
  uint64_t memory_limit_bytes = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Where the engine is, for messages: "unix:///run/podman/podman.sock".
  virtual std::string address() const = 0;

  virtual Result<EngineVersion> Version() = 0;

  // GET /images/{name}/json. NotFound when absent.
  virtual Result<ImageInfo> InspectImage(const std::string& reference) = 0;
  virtual Result<std::vector<ImageInfo>> ListImages() = 0;
  // POST /images/create?fromImage=<repository>&tag=<tag> with X-Registry-Auth when `registry_auth`
  // (base64url JSON, images.h) is not empty. Calls `on_progress` per message; stops with Aborted
  // when `cancelled` returns true (checked per message and at least every second). A pull the
  // engine reports as failed (an "error" message in the stream) is NotFound when the registry said
  // the image or repository does not exist, PermissionDenied when it refused the credentials, else
  // Internal; the message is the engine's.
  virtual Status PullImage(const std::string& reference, const std::string& registry_auth,
                           const std::function<void(const PullProgress&)>& on_progress,
                           const std::function<bool()>& cancelled) = 0;

  // POST /containers/create?name=<name> with `body` (container_config.h builds it); the new id.
  virtual Result<std::string> CreateContainer(const std::string& name, const nlohmann::json& body) = 0;
  virtual Status StartContainer(const std::string& id) = 0;
  // POST /containers/{id}/kill?signal=<n>. A container that is not running: FailedPrecondition.
  virtual Status KillContainer(const std::string& id, int signal) = 0;
  virtual Result<ContainerState> InspectContainer(const std::string& id_or_name) = 0;
  // DELETE /containers/{id}?force=1&v=1 (anonymous volumes too), a running container SIGKILLed
  // first (not stopped with its StopTimeout). NotFound when absent.
  virtual Status RemoveContainer(const std::string& id) = 0;
  // GET /containers/json?all=1&filters={"label":[<label_filter>]}, e.g. "kiln.server=ab12cd34".
  virtual Result<std::vector<ContainerSummary>> ListContainers(const std::string& label_filter) = 0;
  // GET /containers/{id}/logs?stdout=1&stderr=1&timestamps=1[&follow=1][&since=<seconds>]: calls
  // `on_line` per complete line (a final line without newline too) in order, until the output
  // ends (not following, or the container exited), `cancelled` returns true (checked at least every
  // 200 ms) or an error. Lines longer than 256 KiB come in pieces.
  virtual Status ContainerLogs(const std::string& id, bool follow, int64_t since_seconds,
                               const std::function<void(const LogLine&)>& on_line,
                               const std::function<bool()>& cancelled) = 0;
  // GET /containers/{id}/stats?stream=false&one-shot=true.
  virtual Result<ContainerStats> Stats(const std::string& id) = 0;
};

struct HttpEngineOptions {
  // "unix:///run/podman/podman.sock" or a plain path.
  std::string socket;
  // API version prefix of every call.
  std::string api_version = "v1.41";
  // Non-streaming calls (create, start, inspect, kill, remove, ...).
  int timeout_ms = 30000;
};

// The engine behind a Docker-Engine-API Unix socket. Connects per call (a Unix connect costs a few
// µs; no pool to go stale when the engine restarts). Never fails to open: a missing socket is
// Unavailable on each call, so a server configured for an engine that is down still starts.
std::unique_ptr<Engine> OpenHttpEngine(HttpEngineOptions options);

}  // namespace kiln::runtime::docker
