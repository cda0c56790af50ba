#pragma once
// Test helper: an in-memory docker::Engine (engine.h) for unit tests of the container runtime and
// the image functions. No processes, no sockets; everything a test needs to drive is a method.
//
// Images: AddImage / RemoveImage. InspectImage matches a reference exactly against an image's
// repo_tags (or its id). PullImage follows the reference's PullScript (SetPullScript): succeed
// after the script's progress messages (the image is then present), fail NotFound /
// PermissionDenied / Internal with the script's message, or block until `cancelled` (Aborted).
// A reference without a script fails NotFound "manifest unknown" (no registry has it). Every pull
// is recorded (pulls()) with its X-Registry-Auth.
//
// Containers: CreateContainer records the body (container(name)->body), takes labels from
// body["Labels"], and needs body["Image"] to be present (NotFound "no such image" otherwise, as
// the engines answer); a name in use is AlreadyExists. What a container does is its Behavior,
// chosen by name at create (Configure(name, ...), else the default behaviour): a start error
// (StartContainer fails Internal with it and the container stays "created" with State.Error, like
// an entrypoint that is not in the image), an exit at once with a code, output written at start,
// and which signals end it with which code (SIGKILL: 137 unless told otherwise; SIGTERM does
// nothing unless the behaviour says the container handles it). A started container is "running"
// with a fake pid. While it runs a test ends it with Exit(code) or OomKill(), writes output with
// AppendLog, sets its Stats, or makes it vanish (Vanish: the engine no longer knows it). The whole
// engine can be made unreachable (SetUnreachable): every call then fails Unavailable, streams in
// progress too.
//
// Logs: lines carry the engine's timestamp, whole seconds by default (as Podman 4.3 gives them),
// or an explicit time. ContainerLogs returns the lines with timestamp >= since_seconds (inclusive,
// as the engines filter); with follow it blocks for more until the container is no longer running
// (and every line was delivered) or it vanishes (OK), `cancelled` returns true (Aborted, as the HTTP
// engine), or the engine becomes unreachable (Unavailable).
//
// Every change bumps an event counter and wakes WaitUntil, so tests wait for "container X running"
// or "SIGTERM delivered" without sleeping. Thread-safety: every method may be called from any
// thread.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "runtime/docker/engine.h"

namespace kiln::runtime::docker::testing {

class FakeEngine final : public Engine {
 public:
  // What a pull of one reference does.
  struct PullScript {
    enum class Outcome { kSucceed, kNotFound, kPermissionDenied, kInternal, kBlockUntilCancelled };
    Outcome outcome = Outcome::kSucceed;
    // Reported in order before the outcome (also before a failure or the block).
    std::vector<PullProgress> progress;
    // The engine's message for a failure.
    std::string error = "manifest unknown";
    // kSucceed: the image then present (repo_tags defaults to {reference}, id to a made-up one).
    ImageInfo image;
  };
  struct PullCall {
    std::string reference;
    std::string registry_auth;
  };

  // What a container does, chosen by name when it is created.
  struct Behavior {
    // Not empty: StartContainer fails Internal with this text (and the container stays "created"
    // with State.Error set), e.g. "crun: executable file not found in $PATH: No such file or
    // directory: OCI runtime attempted to invoke a command that was not found".
    std::string start_error;
    // Set: the container exits with this code right after starting (after writing `output`).
    std::optional<int> exit_at_start;
    // Lines written when it starts.
    std::vector<LogLine> output;
    // Signal -> exit code with which the container exits on receiving it. SIGKILL -> 137 unless
    // overridden; any signal not listed is recorded and otherwise ignored.
    std::map<int, int> exit_on_signal;
  };

  struct Container {
    std::string id;
    std::string name;
    nlohmann::json body;
    std::map<std::string, std::string> labels;
    Behavior behavior;
    ContainerState state;
    std::vector<LogLine> logs;
    std::vector<int> signals;  // every KillContainer, in order
    ContainerStats stats;
  };

  explicit FakeEngine(bool podman = true, std::string address = "unix:///fake/podman.sock")
      : podman_(podman), address_(std::move(address)) {}

  // ---- Test controls ---------------------------------------------------------------------------

  void AddImage(const std::string& reference, ImageInfo info = {}) {
    MutexLock lock(mutex_);
    if (info.repo_tags.empty()) info.repo_tags = {reference};
    if (info.id.empty()) info.id = "sha256:" + std::to_string(1000000 + next_number_++);
    images_[reference] = std::move(info);
    ChangedLocked();
  }
  void RemoveImage(const std::string& reference) {
    MutexLock lock(mutex_);
    images_.erase(reference);
    ChangedLocked();
  }
  void SetPullScript(const std::string& reference, PullScript script) {
    MutexLock lock(mutex_);
    pull_scripts_[reference] = std::move(script);
  }
  std::vector<PullCall> pulls() const {
    MutexLock lock(mutex_);
    return pulls_;
  }
  // Pulls in progress now (a kBlockUntilCancelled pull counts until it is cancelled).
  int active_pulls() const {
    MutexLock lock(mutex_);
    return active_pulls_;
  }

  void SetDefaultBehavior(Behavior behavior) {
    MutexLock lock(mutex_);
    default_behavior_ = std::move(behavior);
  }
  // For the container that will be created with `name` (also one that exists already: its
  // behaviour is replaced).
  void Configure(const std::string& name, Behavior behavior) {
    MutexLock lock(mutex_);
    behaviors_[name] = behavior;
    if (Container* c = FindLocked(name)) c->behavior = std::move(behavior);
  }

  // Makes a container exist as if something else had created it (a foreign container, or one of
  // ours left behind), running or not.
  std::string AddContainer(const std::string& name, std::map<std::string, std::string> labels, bool running) {
    MutexLock lock(mutex_);
    auto c = std::make_unique<Container>();
    c->id = NewIdLocked();
    c->name = name;
    c->labels = std::move(labels);
    c->state.id = c->id;
    c->state.name = name;
    c->state.labels = c->labels;
    c->state.status = "created";
    auto b = behaviors_.find(name);
    c->behavior = b != behaviors_.end() ? b->second : default_behavior_;
    if (running) StartLocked(*c);
    std::string id = c->id;
    containers_[id] = std::move(c);
    ChangedLocked();
    return id;
  }

  // Ends a running container with `code` (no-op when it is not running).
  void Exit(const std::string& id_or_name, int code) {
    MutexLock lock(mutex_);
    if (Container* c = FindLocked(id_or_name); c != nullptr && c->state.running) EndLocked(*c, code, false);
  }
  // The kernel's OOM killer ends it: exit 137, OOMKilled.
  void OomKill(const std::string& id_or_name) {
    MutexLock lock(mutex_);
    if (Container* c = FindLocked(id_or_name); c != nullptr && c->state.running) EndLocked(*c, 137, true);
  }
  // The engine forgets the container (e.g. `podman rm -f` by hand): NotFound from then on.
  void Vanish(const std::string& id_or_name) {
    MutexLock lock(mutex_);
    if (Container* c = FindLocked(id_or_name)) containers_.erase(c->id);
    ChangedLocked();
  }
  // Appends a line of output. engine_millis < 0: now, truncated to whole seconds when
  // whole_second_timestamps (the default).
  void AppendLog(const std::string& id_or_name, bool stderr_stream, const std::string& text,
                 int64_t engine_millis = -1) {
    MutexLock lock(mutex_);
    Container* c = FindLocked(id_or_name);
    if (c == nullptr) return;
    c->logs.push_back(LogLine{stderr_stream, engine_millis >= 0 ? engine_millis : EngineNowLocked(), text});
    ChangedLocked();
  }
  // Following streams stay open after the container exits (until cancelled or it vanishes), as
  // Podman keeps them ~0.5 s: a reader must not wait for their end to see the exit.
  void SetLogsFollowPastExit(bool past_exit) {
    MutexLock lock(mutex_);
    follow_past_exit_ = past_exit;
  }
  // ContainerLogs calls in progress.
  int active_log_streams() const {
    MutexLock lock(mutex_);
    return active_log_streams_;
  }
  void SetWholeSecondTimestamps(bool whole) {
    MutexLock lock(mutex_);
    whole_second_timestamps_ = whole;
  }
  void SetStats(const std::string& id_or_name, ContainerStats stats) {
    MutexLock lock(mutex_);
    if (Container* c = FindLocked(id_or_name)) c->stats = stats;
  }
  // Unreachable: every call (and every stream in progress) fails Unavailable.
  void SetUnreachable(bool unreachable) {
    MutexLock lock(mutex_);
    unreachable_ = unreachable;
    ChangedLocked();
  }

  // A copy of the container (by id or name), or nullopt when the engine does not know it.
  std::optional<Container> container(const std::string& id_or_name) const {
    MutexLock lock(mutex_);
    const Container* c = FindLocked(id_or_name);
    if (c == nullptr) return std::nullopt;
    return *c;
  }
  std::vector<std::string> container_names() const {
    MutexLock lock(mutex_);
    std::vector<std::string> names;
    for (const auto& [id, c] : containers_) names.push_back(c->name);
    return names;
  }
  std::vector<int> signals(const std::string& id_or_name) const {
    MutexLock lock(mutex_);
    const Container* c = FindLocked(id_or_name);
    return c == nullptr ? std::vector<int>{} : c->signals;
  }
  // Containers removed through RemoveContainer, by name, in order.
  std::vector<std::string> removed() const {
    MutexLock lock(mutex_);
    return removed_;
  }
  // How many times each Engine method was called (by its name, e.g. "InspectContainer").
  int calls(const std::string& method) const {
    MutexLock lock(mutex_);
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }

  // Waits until `done()` holds, re-checking after every change of the engine and at least every
  // 10 ms (for conditions on other objects). False if `timeout` passed first. `done` runs without
  // the engine's lock, so it may call any method.
  bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mutex_);
    while (true) {
      lock.Unlock();
      if (done()) return true;
      lock.Lock();
      if (std::chrono::steady_clock::now() >= deadline) return false;
      uint64_t seen = events_;
      const auto recheck = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
      while (events_ == seen && cv_.WaitUntil(mutex_, recheck) == std::cv_status::no_timeout) {
      }
    }
  }
  // Waits until the container (by id or name) exists and runs.
  bool WaitRunning(const std::string& id_or_name, std::chrono::milliseconds timeout) const {
    return WaitUntil(
        [&] {
          auto c = container(id_or_name);
          return c && c->state.running;
        },
        timeout);
  }

  // ---- Engine ----------------------------------------------------------------------------------

  std::string address() const override { return address_; }

  Result<EngineVersion> Version() override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("Version"));
    EngineVersion v;
    v.name = podman_ ? "Podman Engine" : "Docker Engine - Community";
    v.version = podman_ ? "4.3.1" : "24.0.7";
    v.api_version = "1.41";
    v.podman = podman_;
    return v;
  }

  Result<ImageInfo> InspectImage(const std::string& reference) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("InspectImage"));
    for (const auto& [key, info] : images_) {
      if (info.id == reference ||
          std::find(info.repo_tags.begin(), info.repo_tags.end(), reference) != info.repo_tags.end()) {
        return info;
      }
    }
    return Status::NotFound("no such image: " + reference);
  }

  Result<std::vector<ImageInfo>> ListImages() override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("ListImages"));
    std::vector<ImageInfo> out;
    for (const auto& [key, info] : images_) {
      ImageInfo listed = info;  // the list call carries no image config
      listed.entrypoint.clear();
      listed.cmd.clear();
      listed.env.clear();
      listed.working_dir.clear();
      out.push_back(std::move(listed));
    }
    return out;
  }

  Status PullImage(const std::string& reference, const std::string& registry_auth,
                   const std::function<void(const PullProgress&)>& on_progress,
                   const std::function<bool()>& cancelled) override {
    PullScript script;
    {
      MutexLock lock(mutex_);
      RETURN_IF_ERROR(CallLocked("PullImage"));
      pulls_.push_back(PullCall{reference, registry_auth});
      auto it = pull_scripts_.find(reference);
      if (it == pull_scripts_.end()) {
        ChangedLocked();
        return Status::NotFound("initializing source docker://" + reference + ": reading manifest: manifest unknown");
      }
      script = it->second;
      ++active_pulls_;
      ChangedLocked();
    }
    Status result = RunPull(reference, script, on_progress, cancelled);
    MutexLock lock(mutex_);
    --active_pulls_;
    ChangedLocked();
    return result;
  }

  Result<std::string> CreateContainer(const std::string& name, const nlohmann::json& body) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("CreateContainer"));
    if (FindLocked(name) != nullptr) {
      return Status::AlreadyExists("creating container storage: the container name \"" + name +
                                   "\" is already in use by another container");
    }
    std::string image = body.is_object() && body.contains("Image") && body["Image"].is_string()
                            ? body["Image"].get<std::string>()
                            : std::string();
    bool image_present = false;
    for (const auto& [key, info] : images_) {
      if (info.id == image || std::find(info.repo_tags.begin(), info.repo_tags.end(), image) != info.repo_tags.end()) {
        image_present = true;
      }
    }
    if (!image_present) return Status::NotFound(image + ": image not known");
    auto c = std::make_unique<Container>();
    c->id = NewIdLocked();
    c->name = name;
    c->body = body;
    if (body.contains("Labels") && body["Labels"].is_object()) {
      for (const auto& [k, v] : body["Labels"].items()) {
        if (v.is_string()) c->labels[k] = v.get<std::string>();
      }
    }
    auto b = behaviors_.find(name);
    c->behavior = b != behaviors_.end() ? b->second : default_behavior_;
    c->state.id = c->id;
    c->state.name = name;
    c->state.labels = c->labels;
    c->state.status = "created";
    std::string id = c->id;
    containers_[id] = std::move(c);
    ChangedLocked();
    return id;
  }

  Status StartContainer(const std::string& id) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("StartContainer"));
    Container* c = FindLocked(id);
    if (c == nullptr) return Status::NotFound("no container with name or ID \"" + id + "\" found: no such container");
    if (c->state.running) return Status::Ok();  // 304 Not Modified: already started
    if (!c->behavior.start_error.empty()) {
      c->state.error = c->behavior.start_error;
      ChangedLocked();
      return Status::Internal(c->behavior.start_error);
    }
    StartLocked(*c);
    ChangedLocked();
    return Status::Ok();
  }

  Status KillContainer(const std::string& id, int signal) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("KillContainer"));
    Container* c = FindLocked(id);
    if (c == nullptr) return Status::NotFound("no container with name or ID \"" + id + "\" found: no such container");
    if (!c->state.running) {
      return Status::FailedPrecondition("can only kill running containers. " + c->id + " is in state " +
                                        c->state.status + ": container state improper");
    }
    c->signals.push_back(signal);
    auto it = c->behavior.exit_on_signal.find(signal);
    if (it != c->behavior.exit_on_signal.end()) {
      EndLocked(*c, it->second, false);
    } else if (signal == SIGKILL) {
      EndLocked(*c, 137, false);
    }
    ChangedLocked();
    return Status::Ok();
  }

  Result<ContainerState> InspectContainer(const std::string& id_or_name) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("InspectContainer"));
    const Container* c = FindLocked(id_or_name);
    if (c == nullptr) {
      return Status::NotFound("no container with name or ID \"" + id_or_name + "\" found: no such container");
    }
    return c->state;
  }

  Status RemoveContainer(const std::string& id) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("RemoveContainer"));
    Container* c = FindLocked(id);
    if (c == nullptr) return Status::NotFound("no container with name or ID \"" + id + "\" found: no such container");
    removed_.push_back(c->name);
    containers_.erase(c->id);
    ChangedLocked();
    return Status::Ok();
  }

  Result<std::vector<ContainerSummary>> ListContainers(const std::string& label_filter) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("ListContainers"));
    std::string key = label_filter;
    std::optional<std::string> value;
    if (size_t eq = label_filter.find('='); eq != std::string::npos) {
      key = label_filter.substr(0, eq);
      value = label_filter.substr(eq + 1);
    }
    std::vector<ContainerSummary> out;
    for (const auto& [id, c] : containers_) {
      auto it = c->labels.find(key);
      if (!label_filter.empty() && (it == c->labels.end() || (value && it->second != *value))) continue;
      out.push_back(ContainerSummary{c->id, c->name, c->labels, c->state.status});
    }
    return out;
  }

  Status ContainerLogs(const std::string& id, bool follow, int64_t since_seconds,
                       const std::function<void(const LogLine&)>& on_line,
                       const std::function<bool()>& cancelled) override {
    std::string container_id;
    {
      MutexLock lock(mutex_);
      RETURN_IF_ERROR(CallLocked("ContainerLogs"));
      const Container* c = FindLocked(id);
      if (c == nullptr) return Status::NotFound("no container with name or ID \"" + id + "\" found: no such container");
      container_id = c->id;
      ++active_log_streams_;
    }
    Status result = StreamLogs(container_id, follow, since_seconds, on_line, cancelled);
    MutexLock lock(mutex_);
    --active_log_streams_;
    ChangedLocked();
    return result;
  }

  Result<ContainerStats> Stats(const std::string& id) override {
    MutexLock lock(mutex_);
    RETURN_IF_ERROR(CallLocked("Stats"));
    const Container* c = FindLocked(id);
    if (c == nullptr) return Status::NotFound("no container with name or ID \"" + id + "\" found: no such container");
    return c->stats;
  }

 private:
  Status StreamLogs(const std::string& container_id, bool follow, int64_t since_seconds,
                    const std::function<void(const LogLine&)>& on_line, const std::function<bool()>& cancelled)
      EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    const Container* c = nullptr;
    size_t next = 0;
    while (true) {
      if (unreachable_) return UnreachableLocked();
      c = FindLocked(container_id);
      if (c == nullptr) return Status::Ok();  // removed: the stream ends
      std::vector<LogLine> batch;
      for (; next < c->logs.size(); ++next) {
        if (since_seconds > 0 && c->logs[next].engine_millis < since_seconds * 1000) continue;
        batch.push_back(c->logs[next]);
      }
      const bool running = c->state.running;
      if (!batch.empty()) {
        lock.Unlock();
        for (const LogLine& line : batch) on_line(line);
        lock.Lock();
        continue;  // more may have come meanwhile
      }
      if (!follow || (!running && !follow_past_exit_)) return Status::Ok();
      lock.Unlock();
      const bool stop = cancelled();
      lock.Lock();
      if (stop) return Status::Aborted("reading the logs of " + container_id + " was cancelled");
      uint64_t seen = events_;
      const auto recheck = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      while (events_ == seen && cv_.WaitUntil(mutex_, recheck) == std::cv_status::no_timeout) {
      }
    }
  }

  Status RunPull(const std::string& reference, const PullScript& script,
                 const std::function<void(const PullProgress&)>& on_progress, const std::function<bool()>& cancelled) {
    for (const PullProgress& p : script.progress) {
      if (cancelled()) return Status::Aborted("pulling " + reference + " was cancelled");
      on_progress(p);
    }
    using Outcome = PullScript::Outcome;
    switch (script.outcome) {
      case Outcome::kSucceed: {
        ImageInfo info = script.image;
        if (info.repo_tags.empty()) info.repo_tags = {reference};
        MutexLock lock(mutex_);
        if (info.id.empty()) info.id = "sha256:" + std::to_string(1000000 + next_number_++);
        images_[reference] = std::move(info);
        ChangedLocked();
        return Status::Ok();
      }
      case Outcome::kNotFound: return Status::NotFound(script.error);
      case Outcome::kPermissionDenied: return Status::PermissionDenied(script.error);
      case Outcome::kInternal: return Status::Internal(script.error);
      case Outcome::kBlockUntilCancelled: {
        MutexLock lock(mutex_);
        while (true) {
          if (unreachable_) return UnreachableLocked();
          lock.Unlock();
          const bool stop = cancelled();
          lock.Lock();
          if (stop) return Status::Aborted("pulling " + reference + " was cancelled");
          uint64_t seen = events_;
          const auto recheck = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
          while (events_ == seen && cv_.WaitUntil(mutex_, recheck) == std::cv_status::no_timeout) {
          }
        }
      }
    }
    return Status::Internal("unknown pull outcome");
  }

  Status UnreachableLocked() const REQUIRES(mutex_) {
    return Status::Unavailable("the container engine at " + address_ +
                               " is unreachable: connect: No such file or directory");
  }
  Status CallLocked(const std::string& method) REQUIRES(mutex_) {
    ++calls_[method];
    if (unreachable_) return UnreachableLocked();
    return Status::Ok();
  }
  void ChangedLocked() REQUIRES(mutex_) {
    ++events_;
    cv_.NotifyAll();
  }
  std::string NewIdLocked() REQUIRES(mutex_) {
    char buf[17];
    snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(0xc0ffee0000ull + next_number_++));
    return std::string(buf) + std::string(buf) + std::string(buf) + std::string(buf);  // 64 hex digits
  }
  int64_t EngineNowLocked() const REQUIRES(mutex_) {
    int64_t now = NowMillis();
    return whole_second_timestamps_ ? now / 1000 * 1000 : now;
  }
  Container* FindLocked(const std::string& id_or_name) REQUIRES(mutex_) {
    auto it = containers_.find(id_or_name);
    if (it != containers_.end()) return it->second.get();
    for (auto& [id, c] : containers_) {
      if (c->name == id_or_name) return c.get();
    }
    return nullptr;
  }
  const Container* FindLocked(const std::string& id_or_name) const REQUIRES(mutex_) {
    auto it = containers_.find(id_or_name);
    if (it != containers_.end()) return it->second.get();
    for (const auto& [id, c] : containers_) {
      if (c->name == id_or_name) return c.get();
    }
    return nullptr;
  }
  void StartLocked(Container& c) REQUIRES(mutex_) {
    c.state.status = "running";
    c.state.running = true;
    c.state.pid = next_pid_++;
    c.state.error.clear();
    c.state.exit_code = 0;
    c.state.started_millis = NowMillis();
    c.state.finished_millis = 0;
    for (LogLine line : c.behavior.output) {
      if (line.engine_millis <= 0) line.engine_millis = EngineNowLocked();
      c.logs.push_back(std::move(line));
    }
    if (c.behavior.exit_at_start) EndLocked(c, *c.behavior.exit_at_start, false);
  }
  void EndLocked(Container& c, int code, bool oom) REQUIRES(mutex_) {
    c.state.status = "exited";
    c.state.running = false;
    c.state.pid = 0;
    c.state.exit_code = code;
    c.state.oom_killed = oom;
    c.state.finished_millis = NowMillis();
    ChangedLocked();
  }

  const bool podman_;
  const std::string address_;
  mutable Mutex mutex_;
  mutable CondVar cv_;
  uint64_t events_ GUARDED_BY(mutex_) = 0;
  bool unreachable_ GUARDED_BY(mutex_) = false;
  bool whole_second_timestamps_ GUARDED_BY(mutex_) = true;
  bool follow_past_exit_ GUARDED_BY(mutex_) = false;
  int active_log_streams_ GUARDED_BY(mutex_) = 0;
  uint64_t next_number_ GUARDED_BY(mutex_) = 1;
  int next_pid_ GUARDED_BY(mutex_) = 40000;
  std::map<std::string, ImageInfo> images_ GUARDED_BY(mutex_);  // by the reference it was added as
  std::map<std::string, PullScript> pull_scripts_ GUARDED_BY(mutex_);
  std::vector<PullCall> pulls_ GUARDED_BY(mutex_);
  int active_pulls_ GUARDED_BY(mutex_) = 0;
  Behavior default_behavior_ GUARDED_BY(mutex_);
  std::map<std::string, Behavior> behaviors_ GUARDED_BY(mutex_);                     // by name
  std::map<std::string, std::unique_ptr<Container>> containers_ GUARDED_BY(mutex_);  // by id
  std::vector<std::string> removed_ GUARDED_BY(mutex_);
  std::map<std::string, int> calls_ GUARDED_BY(mutex_);
};

}  // namespace kiln::runtime::docker::testing
