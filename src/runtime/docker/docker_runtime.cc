#include "runtime/docker/docker_runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "base/fs.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "base/time.h"
#include "runtime/process/state.h"

namespace kiln::runtime::docker {
namespace {

namespace ps = process_state;

constexpr char kRecordFile[] = "container.json";
constexpr char kOutputFile[] = "output";
constexpr char kHostsFile[] = "hosts";
constexpr char kExitFile[] = "exit.json";
constexpr char kHolderDir[] = "holder";

// The orphan sweep's period: a container left by a Remove that could not reach the engine lives
// at most this long after the engine is back.
constexpr int64_t kSweepIntervalMillis = 60'000;
// How often an unreachable engine is retried (log followers, pending stop signals).
constexpr int64_t kRetryMillis = 1'000;
// How often a follower saves its log cursor while output flows: a server killed in between
// re-reads at most this much from the engine, and skips it (see Follow), so this bounds work, not
// correctness.
constexpr int64_t kCursorSaveMillis = 1'000;
// Wait() re-checks the engine this often (a follower's end wakes it sooner).
constexpr int64_t kWaitPollMillis = 100;
// Inspect that sees an exited container waits this long for the follower to record the last
// output, so that output is complete once the exit is visible (as with the process runtime).
constexpr int64_t kDrainWaitMillis = 2'000;
// A holder (process runtime) asked to stop with grace 0 is gone within milliseconds.
constexpr std::chrono::milliseconds kHolderWait{10'000};

// Where the follower has got to in the engine's output: `lines` lines with engine second
// `seconds` (the latest second seen) have been recorded, and the records of every line up to there
// end at byte `output_bytes` of the output file.
struct LogCursor {
  int64_t seconds = 0;
  int64_t lines = 0;
  uint64_t output_bytes = 0;
};

// container.json.
struct ContainerRecord {
  std::string container_id;
  std::string name;
  std::string image;
  std::string holder;  // the holder's instance id in network_holders; "" = none
  int64_t launched_millis = 0;
  bool stop_requested = false;
  bool term_sent = false;            // Stop's SIGTERM reached the engine
  int64_t stop_deadline_millis = 0;  // SIGKILL then; 0 = no stop
  LogCursor log_cursor;
  std::vector<int> gpus;  // for Usage
  uint64_t memory_limit_bytes = 0;
  std::string hostname;  // for Access; "" in records written before it was kept
};

std::string EncodeRecord(const ContainerRecord& r) {
  nlohmann::json j = {
      {"container_id", r.container_id},
      {"name", r.name},
      {"image", r.image},
      {"holder", r.holder},
      {"launched_millis", r.launched_millis},
      {"stop_requested", r.stop_requested},
      {"term_sent", r.term_sent},
      {"stop_deadline_millis", r.stop_deadline_millis},
      {"log_cursor",
       {{"seconds", r.log_cursor.seconds}, {"lines", r.log_cursor.lines}, {"output_bytes", r.log_cursor.output_bytes}}},
      {"gpus", r.gpus},
      {"memory_limit_bytes", r.memory_limit_bytes},
      {"hostname", r.hostname},
  };
  return j.dump();
}

Result<ContainerRecord> DecodeRecord(std::string_view text) {
  ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonBounded(text));
  try {
    ContainerRecord r;
    r.container_id = j.at("container_id").get<std::string>();
    r.name = j.at("name").get<std::string>();
    r.image = j.value("image", "");
    r.holder = j.value("holder", "");
    r.launched_millis = j.value("launched_millis", int64_t{0});
    r.stop_requested = j.value("stop_requested", false);
    r.term_sent = j.value("term_sent", false);
    r.stop_deadline_millis = j.value("stop_deadline_millis", int64_t{0});
    if (j.contains("log_cursor")) {
      const nlohmann::json& c = j["log_cursor"];
      r.log_cursor.seconds = c.value("seconds", int64_t{0});
      r.log_cursor.lines = c.value("lines", int64_t{0});
      r.log_cursor.output_bytes = c.value("output_bytes", uint64_t{0});
    }
    r.gpus = j.value("gpus", std::vector<int>{});
    r.memory_limit_bytes = j.value("memory_limit_bytes", uint64_t{0});
    r.hostname = j.value("hostname", "");
    if (r.container_id.empty()) return Status::DataLoss("bad container record: no container_id");
    return r;
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss(std::string("bad container record: ") + e.what());
  }
}

std::string EncodeExitStatus(const InstanceStatus& s) {
  nlohmann::json j = {{"exit_code", s.exit_code},           {"term_signal", s.term_signal},
                      {"started_millis", s.started_millis}, {"finished_millis", s.finished_millis},
                      {"stop_requested", s.stop_requested}, {"oom_killed", s.oom_killed}};
  return j.dump();
}

Result<InstanceStatus> DecodeExitStatus(std::string_view text, const std::string& id) {
  ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonBounded(text));
  try {
    InstanceStatus s;
    s.instance_id = id;
    s.state = InstanceState::kExited;
    s.exit_code = j.at("exit_code").get<int>();
    s.term_signal = j.at("term_signal").get<int>();
    s.started_millis = j.value("started_millis", int64_t{0});
    s.finished_millis = j.value("finished_millis", int64_t{0});
    s.stop_requested = j.value("stop_requested", false);
    s.oom_killed = j.value("oom_killed", false);
    return s;
  } catch (const nlohmann::json::exception& e) {
    return Status::DataLoss(std::string("bad exit record: ") + e.what());
  }
}

bool EngineUnreachable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

// Whether the engine's state means the container's program still runs.
bool StillRunning(const ContainerState& st) {
  return st.running || st.status == "running" || st.status == "paused" || st.status == "restarting";
}

std::string ShortId(const std::string& id) { return id.substr(0, 12); }

// The output records of one line (several when it is longer than kMaxOutputLineBytes), skipping
// the first `skip_pieces` pieces.
std::string Records(const LogLine& line, int64_t now, size_t skip_pieces) {
  const std::string prefix = std::to_string(now) + (line.stderr_stream ? " e " : " o ");
  std::string out;
  size_t piece = 0;
  size_t at = 0;
  do {
    size_t len = std::min(kMaxOutputLineBytes, line.text.size() - at);
    if (piece++ >= skip_pieces) {
      out += prefix;
      out.append(line.text, at, len);
      out += '\n';
    }
    at += len;
  } while (at < line.text.size());
  return out;
}

size_t PieceCount(const LogLine& line) {
  return line.text.empty() ? 1 : (line.text.size() + kMaxOutputLineBytes - 1) / kMaxOutputLineBytes;
}

class DockerRuntime final : public Runtime {
 public:
  explicit DockerRuntime(DockerRuntimeOptions options)
      : options_(std::move(options)), podman_(options_.engine_is_podman) {}
  ~DockerRuntime() override;
  DockerRuntime(const DockerRuntime&) = delete;
  DockerRuntime& operator=(const DockerRuntime&) = delete;

  // Recovers the instances under the state dir and starts the background threads (Open).
  Status Start();

  // Runtime
  Status PrepareImage(const ContainerImage& image, const std::function<void(const std::string&)>& progress,
                      const std::function<bool()>& cancelled) override;
  Status Launch(const InstanceSpec& spec) override;
  Result<InstanceStatus> Inspect(const std::string& instance_id) override;
  Status Signal(const std::string& instance_id, int signal) override;
  Status Stop(const std::string& instance_id, std::chrono::seconds grace) override;
  Result<InstanceStatus> Wait(const std::string& instance_id, std::chrono::milliseconds timeout) override;
  std::string OutputPath(const std::string& instance_id) const override;
  Result<std::vector<std::string>> List() override;
  Status Remove(const std::string& instance_id) override;
  Result<InstanceUsage> Usage(const std::string& instance_id) override;
  Result<AccessPoint> Access(const std::string& instance_id) override;

 private:
  // One instance with a container.json. `record`, `exit` and the flags are guarded by mu_ (the
  // analysis cannot name the runtime's mutex from here); `follower` is touched only by Launch /
  // Start (before anyone else sees the instance) and by whoever takes it out under mu_ to join it.
  struct Instance {
    explicit Instance(std::string instance_id) : id(std::move(instance_id)) {}
    const std::string id;
    ContainerRecord record;
    std::optional<InstanceStatus> exit;  // exit.json, once written
    bool follower_active = false;
    std::atomic<bool> cancel{false};  // the follower stops (Remove, destruction)
    // Inspect saw the exit: the follower leaves its follow stream (Podman closes it only ~0.5 s
    // after the exit) for a last plain read, which takes milliseconds.
    std::atomic<bool> exit_seen{false};
    std::thread follower;
    bool kill_sent = false;       // the stop deadline's SIGKILL reached the engine
    bool holder_stopped = false;  // the holder was asked to stop (this process)
    int64_t retry_at = 0;         // a stop signal failed: not before then
    bool removing = false;
  };

  std::string InstanceDir(const std::string& id) const { return ps::Join(options_.state_dir, id); }
  std::shared_ptr<Instance> Find(const std::string& id) EXCLUDES(mu_);
  // Writes container.json from inst->record (callers hold mu_, so writers never interleave).
  Status SaveRecordLocked(const Instance& inst) REQUIRES(mu_);

  // Engine reachability: every engine answer goes through Note.
  void Note(const Status& s) EXCLUDES(mu_);
  Status Unreachable(const Status& s) const;
  Result<bool> EnginePodman() EXCLUDES(mu_);

  Result<std::string> LaunchHolder(const InstanceSpec& spec, const std::string& dir);
  void RemoveHolder(const std::string& holder_id);
  void StopHolderOnce(const std::shared_ptr<Instance>& inst) EXCLUDES(mu_);
  Result<std::string> CreateContainer(const std::string& name, const nlohmann::json& body, const std::string& image);

  // The exit as the engine reports it: waits for the follower to finish recording output, then
  // writes exit.json (once) and stops the holder.
  InstanceStatus ObserveExit(const std::shared_ptr<Instance>& inst, const ContainerState& st) EXCLUDES(mu_);
  InstanceStatus Finish(const std::shared_ptr<Instance>& inst, const ContainerState& st) EXCLUDES(mu_);

  void StartFollowerLocked(const std::shared_ptr<Instance>& inst) REQUIRES(mu_);
  void Follow(std::shared_ptr<Instance> inst) EXCLUDES(mu_);
  void SaveCursor(const std::shared_ptr<Instance>& inst, const LogCursor& cursor) EXCLUDES(mu_);
  // Sleeps `millis` unless the instance is cancelled (or the runtime closes) first.
  void SleepUnlessCancelled(const Instance& inst, int64_t millis) EXCLUDES(mu_);

  // Stop deadlines, pending stop signals and the orphan sweep.
  void Supervise() EXCLUDES(mu_);
  void SweepOrphans() EXCLUDES(mu_);
  // A half-made Launch (a directory without container.json): its container, holder and directory.
  void RemoveHalfMade(const std::string& id);

  const DockerRuntimeOptions options_;
  Engine& engine() const { return *options_.engine; }

  Mutex mu_;
  CondVar changed_;  // an instance's exit, a follower's end, a stop, shutdown
  std::map<std::string, std::shared_ptr<Instance>> instances_ GUARDED_BY(mu_);
  bool shutting_down_ GUARDED_BY(mu_) = false;
  std::optional<bool> podman_ GUARDED_BY(mu_);  // Version(), once it answered
  int64_t unreachable_since_ GUARDED_BY(mu_) = 0;
  std::string unreachable_error_ GUARDED_BY(mu_);
  std::thread supervisor_;
};

DockerRuntime::~DockerRuntime() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    shutting_down_ = true;
    for (auto& [id, inst] : instances_) {
      inst->cancel = true;
      if (inst->follower.joinable()) threads.push_back(std::move(inst->follower));
    }
    changed_.NotifyAll();
  }
  if (supervisor_.joinable()) supervisor_.join();
  for (std::thread& t : threads) t.join();
}

std::shared_ptr<DockerRuntime::Instance> DockerRuntime::Find(const std::string& id) {
  MutexLock lock(mu_);
  auto it = instances_.find(id);
  return it == instances_.end() ? nullptr : it->second;
}

Status DockerRuntime::SaveRecordLocked(const Instance& inst) {
  return ps::WriteFileRenamed(ps::Join(InstanceDir(inst.id), kRecordFile), EncodeRecord(inst.record));
}

void DockerRuntime::Note(const Status& s) {
  MutexLock lock(mu_);
  if (EngineUnreachable(s)) {
    if (unreachable_since_ == 0) unreachable_since_ = NowMillis();
    unreachable_error_ = s.message();
  } else {
    unreachable_since_ = 0;  // it answered (OK or an error of its own)
  }
}

Status DockerRuntime::Unreachable(const Status& s) const {
  std::string message = s.message();
  if (message.find("unreachable") == std::string::npos) {
    message = "the container engine at " + engine().address() + " is unreachable: " + message;
  }
  return Status::Unavailable(message + "; start it (podman system service --time=0 " + engine().address() +
                             ", or systemctl start docker) or remove container_engine from the Kiln config file");
}

Result<bool> DockerRuntime::EnginePodman() {
  {
    MutexLock lock(mu_);
    if (podman_) return *podman_;
  }
  Result<EngineVersion> version = engine().Version();
  Note(version.status());
  if (!version.ok()) {
    if (EngineUnreachable(version.status())) return Unreachable(version.status());
    return version.status();
  }
  MutexLock lock(mu_);
  podman_ = version->podman;
  return version->podman;
}

Status DockerRuntime::Start() {
  RETURN_IF_ERROR(MakeDirs(options_.state_dir));
  std::vector<std::string> ids;
  DIR* d = opendir(options_.state_dir.c_str());
  if (d == nullptr) return ErrnoStatus("opendir " + options_.state_dir, errno);
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    struct stat st;
    if (ps::ValidInstanceId(name) && stat(InstanceDir(name).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      ids.push_back(name);
    }
  }
  closedir(d);

  std::vector<std::shared_ptr<Instance>> exited_with_holder;
  for (const std::string& id : ids) {
    const std::string dir = InstanceDir(id);
    Result<std::string> text = ReadFile(ps::Join(dir, kRecordFile));
    if (!text.ok() && text.status().IsNotFound()) {
      RemoveHalfMade(id);
      continue;
    }
    Result<ContainerRecord> record = text.ok() ? DecodeRecord(*text) : Result<ContainerRecord>(text.status());
    if (!record.ok()) {
      KLOG(warn, "container runtime: skipping an instance whose state cannot be read",
           {{"instance", id}, {"error", record.status().ToString()}});
      continue;
    }
    auto inst = std::make_shared<Instance>(id);
    inst->record = std::move(*record);
    if (Result<std::string> exit_text = ReadFile(ps::Join(dir, kExitFile)); exit_text.ok()) {
      if (Result<InstanceStatus> exit = DecodeExitStatus(*exit_text, id); exit.ok()) inst->exit = *exit;
    }
    if (inst->exit && !inst->record.holder.empty()) exited_with_holder.push_back(inst);
    MutexLock lock(mu_);
    instances_[id] = inst;
    // Output may still grow (or its end was not recorded yet): follow it from the cursor.
    if (!inst->exit) StartFollowerLocked(inst);
  }
  // A server that died between exit.json and stopping the holder left it running.
  for (const auto& inst : exited_with_holder) StopHolderOnce(inst);
  supervisor_ = std::thread([this] { Supervise(); });
  return Status::Ok();
}

void DockerRuntime::RemoveHalfMade(const std::string& id) {
  const std::string name = ContainerName(options_.container.server_label, id);
  Status removed = engine().RemoveContainer(name);
  Note(removed);
  if (!removed.ok() && !removed.IsNotFound()) {
    // The directory goes anyway: the orphan sweep removes the container once the engine answers.
    KLOG(warn, "container runtime: cannot remove the container of an unfinished launch",
         {{"instance", id}, {"container", name}, {"error", removed.ToString()}});
  }
  RemoveHolder(id);
  if (Status s = RemoveAll(InstanceDir(id)); !s.ok()) {
    KLOG(warn, "container runtime: cannot remove an unfinished launch", {{"instance", id}, {"error", s.ToString()}});
  }
}

void DockerRuntime::RemoveHolder(const std::string& holder_id) {
  Runtime* holders = options_.network_holders;
  if (holders == nullptr || holder_id.empty()) return;
  Status stopped = holders->Stop(holder_id, std::chrono::seconds(0));
  if (stopped.IsNotFound()) return;
  Result<InstanceStatus> waited = holders->Wait(holder_id, kHolderWait);
  Status removed = holders->Remove(holder_id);
  if (!removed.ok() && !removed.IsNotFound()) {
    KLOG(warn, "container runtime: cannot remove a network holder",
         {{"holder", holder_id}, {"error", removed.ToString()}});
  }
}

void DockerRuntime::StopHolderOnce(const std::shared_ptr<Instance>& inst) {
  std::string holder;
  {
    MutexLock lock(mu_);
    if (inst->record.holder.empty() || inst->holder_stopped) return;
    inst->holder_stopped = true;
    holder = inst->record.holder;
  }
  if (options_.network_holders == nullptr) return;
  if (Status s = options_.network_holders->Stop(holder, std::chrono::seconds(0)); !s.ok() && !s.IsNotFound()) {
    KLOG(warn, "container runtime: cannot stop a network holder", {{"holder", holder}, {"error", s.ToString()}});
  }
}

Status DockerRuntime::PrepareImage(const ContainerImage& image, const std::function<void(const std::string&)>& progress,
                                   const std::function<bool()>& cancelled) {
  return EnsureImage(engine(), image, options_.images, progress, cancelled);
}

Result<std::string> DockerRuntime::LaunchHolder(const InstanceSpec& spec, const std::string& dir) {
  Runtime& holders = *options_.network_holders;
  const std::string holder_dir = ps::Join(dir, kHolderDir);
  RETURN_IF_ERROR(MakeDirs(holder_dir));
  InstanceSpec holder;
  holder.instance_id = spec.instance_id;
  holder.opt_ml_dir = holder_dir;
  holder.argv = {"/bin/sleep", "infinity"};
  holder.env = {{"PATH", "/usr/bin:/bin"}};
  holder.hostname = spec.hostname;
  holder.network = spec.network;
  Status launched = holders.Launch(holder);
  if (launched.IsAlreadyExists()) {
    // Left by an attempt of this id that did not finish (its instance directory is gone): ours.
    RemoveHolder(spec.instance_id);
    launched = holders.Launch(holder);
  }
  if (!launched.ok()) return launched.WithPrefix("building the network of instance " + spec.instance_id);
  const std::string started_path =
      ps::Join(ps::Join(options_.network_holders_state_dir, spec.instance_id), ps::kStartedFile);
  Result<std::string> text = ReadFile(started_path);
  if (!text.ok()) {
    RemoveHolder(spec.instance_id);
    return text.status().WithPrefix("reading the network holder's " + started_path);
  }
  Result<ps::StartedRecord> started = ps::DecodeStarted(*text);
  // The holder's program (PID 1 of its sandbox), not its shim: the shim stays in the node's
  // network namespace (it only opens the loopback relay's sockets inside), the program runs in the
  // instance's own.
  if (!started.ok() || started->pid <= 0) {
    RemoveHolder(spec.instance_id);
    return Status::Internal("the network holder of instance " + spec.instance_id + " recorded no pid in " +
                            started_path);
  }
  return "/proc/" + std::to_string(started->pid) + "/ns/net";
}

Result<std::string> DockerRuntime::CreateContainer(const std::string& name, const nlohmann::json& body,
                                                   const std::string& image) {
  for (int attempt = 0;; ++attempt) {
    Result<std::string> created = engine().CreateContainer(name, body);
    Note(created.status());
    if (created.ok()) return created;
    const Status& s = created.status();
    if (EngineUnreachable(s)) return Unreachable(s);
    if (s.IsNotFound()) {
      return Status::FailedPrecondition("image " + image + " is not in the container engine at " + engine().address() +
                                        " (" + s.message() + "): prepare it first (pull or build it on this node)");
    }
    if (!s.IsAlreadyExists() || attempt > 0) return s.WithPrefix("creating container " + name);
    Result<ContainerState> other = engine().InspectContainer(name);
    Note(other.status());
    if (!other.ok()) {
      if (other.status().IsNotFound()) continue;  // gone meanwhile
      if (EngineUnreachable(other.status())) return Unreachable(other.status());
      return other.status().WithPrefix("inspecting container " + name);
    }
    auto label = other->labels.find("kiln.server");
    if (label == other->labels.end() || label->second != options_.container.server_label) {
      return Status::FailedPrecondition(
          "a container named " + name + " (" + ShortId(other->id) + ") exists in the container engine at " +
          engine().address() + " and was not created by this Kiln server (its kiln.server label is " +
          (label == other->labels.end() ? std::string("missing") : "\"" + label->second + "\"") +
          "): remove it (podman rm -f " + name + ") or rename it (podman rename " + name + " <new name>)");
    }
    // Ours, from an earlier attempt of this id whose state is gone: replace it.
    Status removed = engine().RemoveContainer(other->id);
    Note(removed);
    if (!removed.ok() && !removed.IsNotFound()) {
      if (EngineUnreachable(removed)) return Unreachable(removed);
      return removed.WithPrefix("removing the stale container " + name);
    }
  }
}

Status DockerRuntime::Launch(const InstanceSpec& spec_in) {
  const std::string& id = spec_in.instance_id;
  if (!spec_in.container) {
    return Status::InvalidArgument("instance " + id +
                                   " has no container image: the container runtime runs only images");
  }
  if (!ps::ValidInstanceId(id)) return Status::InvalidArgument("instance id must match [A-Za-z0-9._-]{1,128}: " + id);
  struct stat st;
  if (spec_in.opt_ml_dir.empty() || spec_in.opt_ml_dir[0] != '/' || stat(spec_in.opt_ml_dir.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("opt_ml_dir must be an existing absolute directory: " + spec_in.opt_ml_dir);
  }
  for (const BindMount& m : spec_in.extra_mounts) {
    if (m.host_path.empty() || m.host_path[0] != '/' || m.sandbox_path.empty() || m.sandbox_path[0] != '/') {
      return Status::InvalidArgument("mount paths must be absolute: " + m.host_path + " -> " + m.sandbox_path);
    }
  }
  if (!spec_in.working_dir.empty() && spec_in.working_dir[0] != '/') {
    return Status::InvalidArgument("working_dir must be absolute: " + spec_in.working_dir);
  }
  if (spec_in.network && options_.network_holders == nullptr) {
    return Status::FailedPrecondition("instance " + id + " needs a network of its own (" + spec_in.network->network +
                                      "), but the container runtime has no network holders configured");
  }
  InstanceSpec spec = spec_in;
  if (spec.container->reference.empty()) {
    ASSIGN_OR_RETURN(spec.container->reference, EngineReference(spec.container->requested, options_.images));
  }
  const std::string& image = spec.container->reference;
  if (spec.network && !spec.network_namespace.empty()) {
    return Status::InvalidArgument("instance " + id + " either gets a network of its own (" + spec.network->network +
                                   ") or joins an existing namespace (" + spec.network_namespace + "), not both");
  }
  if (!spec.network_namespace.empty()) {
    // Another instance's namespace (runtime.h): the engine joins it as it joins a holder's.
    ASSIGN_OR_RETURN(bool podman, EnginePodman());
    if (!podman) {
      return Status::FailedPrecondition(
          "instance " + id + " joins the network namespace of another instance (" + spec.network_namespace +
          "), and the container engine at " + engine().address() +
          " is Docker, which cannot join a container to an existing network namespace: use Podman's socket for "
          "container_engine.socket, or set network.mode to host in the Kiln config file");
    }
  }
  if (spec.network) {
    ASSIGN_OR_RETURN(bool podman, EnginePodman());
    if (!podman) {
      return Status::FailedPrecondition(
          "instance " + id + " needs a network of its own (" + spec.network->network +
          "), and the container engine at " + engine().address() +
          " is Docker, which cannot join a container to an existing network namespace: use Podman's socket for "
          "container_engine.socket, or set network.mode to auto (every instance then shares the node's network) or "
          "host in the Kiln config file");
    }
  }

  RETURN_IF_ERROR(MakeDirs(options_.state_dir));
  const std::string dir = InstanceDir(id);
  if (mkdir(dir.c_str(), 0755) != 0) {
    if (errno == EEXIST) return Status::AlreadyExists("instance " + id + " already exists");
    return ErrnoStatus("mkdir " + dir, errno);
  }
  // Whatever Launch made is undone on failure: nothing is left running or on disk.
  std::string container_id;
  bool holder_launched = false;
  auto fail = [&](Status s) {
    if (!container_id.empty()) {
      Status removed = engine().RemoveContainer(container_id);
      Note(removed);
      if (!removed.ok() && !removed.IsNotFound()) {
        KLOG(warn, "container runtime: cannot remove the container of a failed launch",
             {{"instance", id}, {"error", removed.ToString()}});
      }
    }
    if (holder_launched) RemoveHolder(id);
    RemoveAll(dir).ok();
    return s;
  };

  // The output file exists from Launch on (runtime.h), before anything can be written to it.
  if (Status s = ps::WriteFileRenamed(ps::Join(dir, kOutputFile), ""); !s.ok()) return fail(s);
  std::string hosts_path;
  if (!spec.hosts_file_lines.empty()) {
    hosts_path = ps::Join(dir, kHostsFile);
    std::string hosts;
    for (const std::string& line : spec.hosts_file_lines) hosts += line + "\n";
    if (Status s = ps::WriteFileRenamed(hosts_path, hosts); !s.ok()) return fail(s);
  }
  std::string netns = spec.network_namespace;
  if (spec.network) {
    Result<std::string> path = LaunchHolder(spec, dir);
    if (!path.ok()) return fail(path.status());
    holder_launched = true;
    netns = *path;
  }

  const std::string name = ContainerName(options_.container.server_label, id);
  const nlohmann::json body = BuildCreateBody(spec, options_.container, netns, hosts_path);
  Result<std::string> created = CreateContainer(name, body, image);
  if (!created.ok()) return fail(created.status());
  container_id = *created;

  Status started = engine().StartContainer(container_id);
  Note(started);
  if (!started.ok()) {
    if (EngineUnreachable(started)) return fail(Unreachable(started));
    std::string what = spec.container->entrypoint ? "entrypoint " + Join(*spec.container->entrypoint, " ")
                                                  : std::string("the image's entrypoint");
    what += spec.argv.empty() ? ", the image's command" : ", command " + Join(spec.argv, " ");
    return fail(Status::FailedPrecondition("cannot start the container of image " + image + " (" + what +
                                           "): " + started.message()));
  }

  auto inst = std::make_shared<Instance>(id);
  inst->record.container_id = container_id;
  inst->record.name = name;
  inst->record.image = image;
  inst->record.holder = spec.network ? id : "";
  inst->record.launched_millis = NowMillis();
  inst->record.gpus = spec.gpus;
  inst->record.memory_limit_bytes = spec.memory_limit_bytes;
  inst->record.hostname = spec.hostname;
  MutexLock lock(mu_);
  if (Status s = SaveRecordLocked(*inst); !s.ok()) {
    lock.Unlock();
    return fail(s);
  }
  instances_[id] = inst;
  StartFollowerLocked(inst);
  return Status::Ok();
}

Result<InstanceStatus> DockerRuntime::Inspect(const std::string& instance_id) {
  std::shared_ptr<Instance> inst = Find(instance_id);
  if (inst == nullptr) return Status::NotFound("instance " + instance_id + " not found");
  ContainerRecord record;
  {
    MutexLock lock(mu_);
    if (inst->exit) return *inst->exit;
    record = inst->record;
  }
  InstanceStatus status;
  status.instance_id = instance_id;
  status.stop_requested = record.stop_requested;
  status.started_millis = record.launched_millis;
  Result<ContainerState> st = engine().InspectContainer(record.container_id);
  Note(st.status());
  if (st.ok()) {
    if (!StillRunning(*st)) return ObserveExit(inst, *st);
    status.state = InstanceState::kRunning;
    if (st->started_millis > 0) status.started_millis = st->started_millis;
    return status;
  }
  if (st.status().IsNotFound()) {
    StopHolderOnce(inst);
    status.state = InstanceState::kLost;
    status.lost_reason = "the container engine at " + engine().address() + " no longer knows container " + record.name +
                         " (" + ShortId(record.container_id) + "): it was removed outside Kiln";
    return status;
  }
  if (!EngineUnreachable(st.status())) return st.status().WithPrefix("inspecting container " + record.name);
  int64_t since = 0;
  std::string error;
  {
    MutexLock lock(mu_);
    since = unreachable_since_;
    error = unreachable_error_;
  }
  const int64_t unreachable_millis = since == 0 ? 0 : NowMillis() - since;
  if (unreachable_millis >= std::chrono::duration_cast<std::chrono::milliseconds>(options_.engine_lost_after).count()) {
    status.state = InstanceState::kLost;
    status.lost_reason = "the container engine at " + engine().address() + " has been unreachable for " +
                         std::to_string(unreachable_millis / 1000) + " s: " + error;
    return status;
  }
  // Not long enough to give up: the last state seen (running: an exit would be recorded).
  status.state = InstanceState::kRunning;
  return status;
}

InstanceStatus DockerRuntime::ObserveExit(const std::shared_ptr<Instance>& inst, const ContainerState& st) {
  inst->exit_seen = true;
  {
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kDrainWaitMillis);
    while (inst->follower_active && !inst->exit && !shutting_down_ &&
           changed_.WaitUntil(mu_, deadline) == std::cv_status::no_timeout) {
    }
    if (inst->exit) return *inst->exit;
  }
  return Finish(inst, st);
}

InstanceStatus DockerRuntime::Finish(const std::shared_ptr<Instance>& inst, const ContainerState& st) {
  {
    MutexLock lock(mu_);
    if (inst->exit) return *inst->exit;
  }
  // Before the exit is visible: whoever sees it may remove the instance at once.
  StopHolderOnce(inst);
  InstanceStatus status;
  {
    MutexLock lock(mu_);
    if (inst->exit) return *inst->exit;  // a concurrent Finish was first
    status.instance_id = inst->id;
    status.state = InstanceState::kExited;
    status.started_millis = st.started_millis > 0 ? st.started_millis : inst->record.launched_millis;
    status.finished_millis = st.finished_millis > 0 ? st.finished_millis : NowMillis();
    status.stop_requested = inst->record.stop_requested;
    status.oom_killed = st.oom_killed;
    // Docker's convention: 128 + n is "killed by signal n".
    if (st.exit_code > 128 && st.exit_code < 128 + NSIG) {
      status.term_signal = st.exit_code - 128;
      status.exit_code = -1;
    } else {
      status.exit_code = st.exit_code;
    }
    if (!inst->removing) {
      if (Status s = ps::WriteFileRenamed(ps::Join(InstanceDir(inst->id), kExitFile), EncodeExitStatus(status));
          !s.ok()) {
        KLOG(warn, "container runtime: cannot record an exit", {{"instance", inst->id}, {"error", s.ToString()}});
      }
    }
    inst->exit = status;
    changed_.NotifyAll();
  }
  return status;
}

Status DockerRuntime::Signal(const std::string& instance_id, int signal) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state != InstanceState::kRunning) {
    return Status::FailedPrecondition("instance " + instance_id + " is not running");
  }
  std::shared_ptr<Instance> inst = Find(instance_id);
  if (inst == nullptr) return Status::NotFound("instance " + instance_id + " not found");
  std::string container_id;
  {
    MutexLock lock(mu_);
    container_id = inst->record.container_id;
  }
  Status s = engine().KillContainer(container_id, signal);
  Note(s);
  if (s.code() == StatusCode::kFailedPrecondition || s.IsNotFound()) {
    return Status::FailedPrecondition("instance " + instance_id + " is not running");
  }
  if (EngineUnreachable(s)) return Unreachable(s);
  return s;
}

Status DockerRuntime::Stop(const std::string& instance_id, std::chrono::seconds grace) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state != InstanceState::kRunning) return Status::Ok();
  std::shared_ptr<Instance> inst = Find(instance_id);
  if (inst == nullptr) return Status::NotFound("instance " + instance_id + " not found");
  const int64_t now = NowMillis();
  int64_t deadline = now + std::max<int64_t>(0, grace.count()) * 1000;
  bool send_term = false;
  std::string container_id;
  {
    MutexLock lock(mu_);
    if (inst->exit) return Status::Ok();
    ContainerRecord& r = inst->record;
    r.stop_requested = true;
    if (r.stop_deadline_millis == 0 || deadline < r.stop_deadline_millis) r.stop_deadline_millis = deadline;
    deadline = r.stop_deadline_millis;
    send_term = !r.term_sent;
    container_id = r.container_id;
    // This call sends the signals itself; the supervisor only retries them (after a failure).
    inst->retry_at = now + kRetryMillis;
    // The deadline is on disk before any signal: a server that dies now still keeps it.
    RETURN_IF_ERROR(SaveRecordLocked(*inst));
    changed_.NotifyAll();  // the supervisor's next deadline may be this one
  }
  auto delivered = [](const Status& s) {
    // Not running any more counts: the signal has nothing left to do.
    return s.ok() || s.code() == StatusCode::kFailedPrecondition || s.IsNotFound();
  };
  if (send_term) {
    Status s = engine().KillContainer(container_id, SIGTERM);
    Note(s);
    if (delivered(s)) {
      MutexLock lock(mu_);
      inst->record.term_sent = true;
      if (!inst->removing) SaveRecordLocked(*inst).ok();
    } else {
      // The supervisor retries it (and sends SIGKILL at the deadline in any case).
      KLOG(warn, "container runtime: SIGTERM not delivered; retrying",
           {{"instance", instance_id}, {"error", s.ToString()}});
    }
  }
  if (deadline <= now) {
    Status s = engine().KillContainer(container_id, SIGKILL);
    Note(s);
    if (delivered(s)) {
      MutexLock lock(mu_);
      inst->kill_sent = true;
    }
  }
  return Status::Ok();
}

Result<InstanceStatus> DockerRuntime::Wait(const std::string& instance_id, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
    const auto now = std::chrono::steady_clock::now();
    if (status.state != InstanceState::kRunning || now >= deadline) return status;
    MutexLock lock(mu_);
    auto it = instances_.find(instance_id);
    if (it == instances_.end()) continue;  // removed: Inspect says NotFound
    // The follower's end (the output is complete once the container exits) wakes this early.
    const auto wake = std::min(deadline, now + std::chrono::milliseconds(kWaitPollMillis));
    if (!it->second->exit && !shutting_down_) changed_.WaitUntil(mu_, wake);
  }
}

std::string DockerRuntime::OutputPath(const std::string& instance_id) const {
  return ps::Join(InstanceDir(instance_id), kOutputFile);
}

Result<std::vector<std::string>> DockerRuntime::List() {
  MutexLock lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, inst] : instances_) ids.push_back(id);
  return ids;
}

Status DockerRuntime::Remove(const std::string& instance_id) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state == InstanceState::kRunning) {
    return Status::FailedPrecondition("instance " + instance_id + " is still running");
  }
  std::thread follower;
  ContainerRecord record;
  std::shared_ptr<Instance> inst;
  {
    MutexLock lock(mu_);
    auto it = instances_.find(instance_id);
    if (it == instances_.end()) return Status::NotFound("instance " + instance_id + " not found");
    inst = it->second;
    inst->removing = true;
    inst->cancel = true;
    follower = std::move(inst->follower);
    record = inst->record;
    changed_.NotifyAll();
  }
  if (follower.joinable()) follower.join();
  Status removed = engine().RemoveContainer(record.container_id);
  Note(removed);
  if (!removed.ok() && !removed.IsNotFound()) {
    // The state goes anyway: the orphan sweep removes the container once the engine answers.
    KLOG(warn, "container runtime: cannot remove a container now; the orphan sweep will",
         {{"instance", instance_id}, {"container", record.name}, {"error", removed.ToString()}});
  }
  RemoveHolder(record.holder);
  {
    MutexLock lock(mu_);
    auto it = instances_.find(instance_id);
    if (it != instances_.end() && it->second == inst) instances_.erase(it);
  }
  return RemoveAll(InstanceDir(instance_id));
}

Result<InstanceUsage> DockerRuntime::Usage(const std::string& instance_id) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state != InstanceState::kRunning) {
    return Status::FailedPrecondition("instance " + instance_id + " is not running");
  }
  std::shared_ptr<Instance> inst = Find(instance_id);
  if (inst == nullptr) return Status::NotFound("instance " + instance_id + " not found");
  ContainerRecord record;
  {
    MutexLock lock(mu_);
    record = inst->record;
  }
  Result<ContainerStats> stats = engine().Stats(record.container_id);
  Note(stats.status());
  if (!stats.ok()) {
    if (stats.status().IsNotFound()) return Status::FailedPrecondition("instance " + instance_id + " is not running");
    if (EngineUnreachable(stats.status())) return Unreachable(stats.status());
    return stats.status();
  }
  InstanceUsage usage;
  usage.cpu_usec = stats->cpu_total_usec;
  usage.memory_bytes = stats->memory_bytes;
  // Without a limit of its own the engine reports the node's memory as the limit; the contract
  // says 0 then.
  usage.memory_limit_bytes = record.memory_limit_bytes == 0 ? 0
                             : stats->memory_limit_bytes > 0
                                 ? std::min<uint64_t>(stats->memory_limit_bytes, record.memory_limit_bytes)
                                 : record.memory_limit_bytes;
  usage.gpus = record.gpus;
  usage.source = "cgroup";
  return usage;
}

// The engine's State.Pid of the container (its PID 1 as the node sees it). The engine reports it
// for this container only while it runs, so a reused pid is never returned.
Result<AccessPoint> DockerRuntime::Access(const std::string& instance_id) {
  std::shared_ptr<Instance> inst = Find(instance_id);
  if (inst == nullptr) return Status::NotFound("instance " + instance_id + " not found");
  ContainerRecord record;
  {
    MutexLock lock(mu_);
    if (inst->exit) return Status::FailedPrecondition("instance " + instance_id + " is not running");
    record = inst->record;
  }
  Result<ContainerState> st = engine().InspectContainer(record.container_id);
  Note(st.status());
  if (!st.ok()) {
    if (st.status().IsNotFound()) return Status::FailedPrecondition("instance " + instance_id + " is not running");
    if (EngineUnreachable(st.status())) return Unreachable(st.status());
    return st.status().WithPrefix("inspecting container " + record.name);
  }
  if (!st->running || st->pid <= 0) {
    return Status::FailedPrecondition("instance " + instance_id + " is not running (container " + record.name + " is " +
                                      (st->status.empty() ? "stopped" : st->status) + ")");
  }
  AccessPoint point;
  point.host_pid = st->pid;
  point.hostname = record.hostname;
  return point;
}

void DockerRuntime::StartFollowerLocked(const std::shared_ptr<Instance>& inst) {
  inst->follower_active = true;
  inst->follower = std::thread([this, inst] { Follow(inst); });
}

void DockerRuntime::SleepUnlessCancelled(const Instance& inst, int64_t millis) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(millis);
  while (!inst.cancel && !shutting_down_ && changed_.WaitUntil(mu_, deadline) == std::cv_status::no_timeout) {
  }
}

void DockerRuntime::SaveCursor(const std::shared_ptr<Instance>& inst, const LogCursor& cursor) {
  MutexLock lock(mu_);
  if (inst->removing) return;
  const LogCursor& saved = inst->record.log_cursor;
  if (saved.seconds == cursor.seconds && saved.lines == cursor.lines && saved.output_bytes == cursor.output_bytes) {
    return;
  }
  inst->record.log_cursor = cursor;
  if (Status s = SaveRecordLocked(*inst); !s.ok()) {
    KLOG(warn, "container runtime: cannot save the log cursor", {{"instance", inst->id}, {"error", s.ToString()}});
  }
}

// The follower: appends the container's output to the output file, resuming after the cursor.
//
// Resuming: the engine gives lines at or after a whole second (`since`), so the cursor counts the
// lines recorded within its second; on reconnecting, the first `lines` lines of that second are
// skipped. The cursor is saved at most every second, so after a crash the output file may hold
// records beyond the saved cursor's output_bytes: those are exactly the next lines the engine
// gives after the cursor, and they are skipped too (counted in records, a line longer than
// kMaxOutputLineBytes being several). A record torn by a crash mid-write is cut off first.
void DockerRuntime::Follow(std::shared_ptr<Instance> inst) {
  const std::string path = OutputPath(inst->id);
  LogCursor cursor;
  std::string container_id;
  {
    MutexLock lock(mu_);
    cursor = inst->record.log_cursor;
    container_id = inst->record.container_id;
  }
  auto end = [&] {
    MutexLock lock(mu_);
    inst->follower_active = false;
    changed_.NotifyAll();
  };
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    KLOG(error, "container runtime: cannot open the output file",
         {{"instance", inst->id}, {"error", ErrnoStatus(path, errno).ToString()}});
    return end();
  }
  uint64_t written = 0;
  size_t extra_records = 0;  // records beyond the cursor, from before a restart
  {
    struct stat st;
    if (fstat(fd.get(), &st) == 0) written = static_cast<uint64_t>(st.st_size);
    if (cursor.output_bytes > written) cursor.output_bytes = written;  // shortened by hand: trust the cursor
    uint64_t whole = cursor.output_bytes;                              // the end of the last complete record
    char buf[64 * 1024];
    for (uint64_t at = cursor.output_bytes; at < written;) {
      Result<size_t> n = PreadSome(fd.get(), buf, std::min<uint64_t>(sizeof(buf), written - at), at);
      if (!n.ok() || *n == 0) break;
      for (size_t i = 0; i < *n; ++i) {
        if (buf[i] == '\n') {
          ++extra_records;
          whole = at + i + 1;
        }
      }
      at += *n;
    }
    if (whole < written && ftruncate(fd.get(), static_cast<off_t>(whole)) == 0) written = whole;
  }

  int64_t to_skip = 0;  // lines of the cursor's second already recorded, per connection
  int64_t last_save = NowMillis();
  bool write_error_logged = false;
  auto on_line = [&](const LogLine& line) {
    const int64_t second = line.engine_millis / 1000;
    if (second < cursor.seconds) return;  // before the cursor: recorded already
    if (second == cursor.seconds && to_skip > 0) {
      --to_skip;
      return;
    }
    to_skip = 0;
    size_t skip_pieces = 0;
    if (extra_records > 0) {
      const size_t pieces = PieceCount(line);
      skip_pieces = std::min(pieces, extra_records);
      extra_records -= skip_pieces;
    }
    if (skip_pieces < PieceCount(line)) {
      const std::string records = Records(line, NowMillis(), skip_pieces);
      if (Status s = WriteAll(fd.get(), records); s.ok()) {
        written += records.size();
      } else if (!write_error_logged) {
        write_error_logged = true;
        KLOG(error, "container runtime: cannot write output", {{"instance", inst->id}, {"error", s.ToString()}});
      }
    }
    if (second > cursor.seconds) {
      cursor.seconds = second;
      cursor.lines = 1;
    } else {
      ++cursor.lines;
    }
    if (extra_records == 0) {
      cursor.output_bytes = written;
      if (NowMillis() - last_save >= kCursorSaveMillis) {
        SaveCursor(inst, cursor);
        last_save = NowMillis();
      }
    }
  };
  auto cancelled = [&] { return inst->cancel.load(); };
  auto leave_follow = [&] { return inst->cancel.load() || inst->exit_seen.load(); };
  auto save = [&] {
    if (extra_records == 0) SaveCursor(inst, cursor);
  };

  while (!inst->cancel) {
    to_skip = cursor.lines;
    Status s = engine().ContainerLogs(container_id, /*follow=*/true, cursor.seconds, on_line, leave_follow);
    if (s.code() != StatusCode::kAborted) Note(s);
    save();
    if (inst->cancel) break;
    if (s.IsNotFound()) break;  // the container is gone: Inspect reports it lost
    if (!s.ok() && !inst->exit_seen) {
      SleepUnlessCancelled(*inst, kRetryMillis);
      continue;
    }
    Result<ContainerState> st = engine().InspectContainer(container_id);
    Note(st.status());
    if (st.ok() && !StillRunning(*st)) {
      // Lines the follow stream might not have delivered before it closed (the cursor makes a
      // second read harmless).
      to_skip = cursor.lines;
      Status drained = engine().ContainerLogs(container_id, /*follow=*/false, cursor.seconds, on_line, cancelled);
      Note(drained);
      save();
      Finish(inst, *st);
      break;
    }
    if (!st.ok() && st.status().IsNotFound()) break;
    inst->exit_seen = false;
    // Still running (the stream ended early) or the engine went away: follow again.
    SleepUnlessCancelled(*inst, st.ok() ? 200 : kRetryMillis);
  }
  end();
}

void DockerRuntime::Supervise() {
  int64_t next_sweep = 0;  // at once: Open's sweep
  MutexLock lock(mu_);
  while (!shutting_down_) {
    int64_t now = NowMillis();
    if (now >= next_sweep) {
      lock.Unlock();
      SweepOrphans();
      lock.Lock();
      next_sweep = NowMillis() + kSweepIntervalMillis;
      continue;
    }
    struct Action {
      std::shared_ptr<Instance> inst;
      std::string container_id;
      int signal;
    };
    std::vector<Action> actions;
    int64_t wake = next_sweep;
    for (const auto& [id, inst] : instances_) {
      if (inst->exit || inst->removing) continue;
      const ContainerRecord& r = inst->record;
      const bool kill_due = r.stop_deadline_millis > 0 && !inst->kill_sent;
      const bool term_due = r.stop_requested && !r.term_sent;
      if (!kill_due && !term_due) continue;
      if (inst->retry_at > now) {
        wake = std::min(wake, inst->retry_at);
        continue;
      }
      if (term_due) actions.push_back({inst, r.container_id, SIGTERM});
      if (kill_due && r.stop_deadline_millis <= now) {
        actions.push_back({inst, r.container_id, SIGKILL});
      } else if (kill_due) {
        wake = std::min(wake, r.stop_deadline_millis);
      }
    }
    if (actions.empty()) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(1, wake - now));
      changed_.WaitUntil(mu_, until);
      continue;
    }
    lock.Unlock();
    for (const Action& a : actions) {
      Status s = engine().KillContainer(a.container_id, a.signal);
      Note(s);
      const bool delivered = s.ok() || s.code() == StatusCode::kFailedPrecondition || s.IsNotFound();
      MutexLock inner(mu_);
      if (!delivered) {
        a.inst->retry_at = NowMillis() + kRetryMillis;
      } else if (a.signal == SIGKILL) {
        a.inst->kill_sent = true;
      } else {
        a.inst->record.term_sent = true;
        if (!a.inst->removing) SaveRecordLocked(*a.inst).ok();
      }
    }
    lock.Lock();
  }
}

void DockerRuntime::SweepOrphans() {
  const std::string label = options_.container.server_label;
  Result<std::vector<ContainerSummary>> containers = engine().ListContainers("kiln.server=" + label);
  Note(containers.status());
  if (!containers.ok()) return;  // the next sweep tries again
  for (const ContainerSummary& c : *containers) {
    auto it = c.labels.find("kiln.server");
    if (it == c.labels.end() || it->second != label) continue;  // the engine's filter, checked
    auto instance = c.labels.find("kiln.instance");
    // Launch makes the directory before the container, so one of ours without a directory is an
    // orphan (a Remove that could not reach the engine, or a half-made Launch).
    if (instance != c.labels.end() && ps::ValidInstanceId(instance->second) &&
        PathExists(InstanceDir(instance->second))) {
      continue;
    }
    Status removed = engine().RemoveContainer(c.id);
    Note(removed);
    if (removed.ok()) {
      KLOG(info, "container runtime: removed an orphaned container", {{"container", c.name}});
    } else if (!removed.IsNotFound()) {
      KLOG(warn, "container runtime: cannot remove an orphaned container",
           {{"container", c.name}, {"error", removed.ToString()}});
    }
  }
}

}  // namespace

Result<std::unique_ptr<Runtime>> OpenDockerRuntime(DockerRuntimeOptions options) {
  if (options.state_dir.empty()) return Status::InvalidArgument("container runtime: state_dir is required");
  if (options.engine == nullptr) return Status::InvalidArgument("container runtime: an engine is required");
  if (options.container.server_label.empty()) {
    return Status::InvalidArgument("container runtime: container.server_label is required");
  }
  if (options.network_holders != nullptr && options.network_holders_state_dir.empty()) {
    return Status::InvalidArgument("container runtime: network_holders_state_dir is required with network_holders");
  }
  if (options.container.ulimits.empty()) options.container.ulimits = DefaultUlimits();
  auto runtime = std::make_unique<DockerRuntime>(std::move(options));
  RETURN_IF_ERROR(runtime->Start());
  return std::unique_ptr<Runtime>(std::move(runtime));
}

}  // namespace kiln::runtime::docker
