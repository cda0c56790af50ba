#include "runtime/slurm/slurm_runtime.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include "agent/tar_extract.h"
#include "base/fs.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "base/time.h"
#include "runtime/process/state.h"

namespace kiln::runtime::slurm {

using json = nlohmann::json;

namespace {

// File names inside an instance's state directory (README.md, "State").
constexpr char kSpecFile[] = "spec.json";      // the InstanceSpec as launched
constexpr char kTokenFile[] = "token";         // the Slurm job's node token (0600)
constexpr char kOutputFile[] = "output";       // the mirror of the node's captured output
constexpr char kMembersFile[] = "members";     // JSON array: the job's instance ids in task order
constexpr char kJobFile[] = "job";             // Slurm's job id, once sbatch accepted the job
constexpr char kStopFile[] = "stop.json";      // {"grace_seconds", "requested_millis"}
constexpr char kReportFile[] = "report.json";  // the node's last report (spec_json's form)
constexpr char kFinalFile[] = "final.json";    // the instance's final status, once decided
constexpr char kBatchFile[] = "batch.sh";      // the batch script (first member only)

std::string Join(const std::string& dir, std::string_view name) { return dir + "/" + std::string(name); }

std::string ShellQuote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

json FinalToJson(const InstanceStatus& s) {
  return {{"state", s.state == InstanceState::kExited ? "exited" : "lost"},
          {"started_millis", s.started_millis},
          {"finished_millis", s.finished_millis},
          {"exit_code", s.exit_code},
          {"term_signal", s.term_signal},
          {"stop_requested", s.stop_requested},
          {"oom_killed", s.oom_killed},
          {"lost_reason", s.lost_reason},
          {"address", s.address},
          {"preempted", s.preempted}};
}

std::optional<InstanceStatus> FinalFromJson(const json& j, const std::string& id) {
  if (!j.is_object()) return std::nullopt;
  InstanceStatus s;
  s.instance_id = id;
  s.state = j.value("state", "lost") == "exited" ? InstanceState::kExited : InstanceState::kLost;
  s.started_millis = j.value("started_millis", int64_t{0});
  s.finished_millis = j.value("finished_millis", int64_t{0});
  s.exit_code = j.value("exit_code", -1);
  s.term_signal = j.value("term_signal", 0);
  s.stop_requested = j.value("stop_requested", false);
  s.oom_killed = j.value("oom_killed", false);
  s.lost_reason = j.value("lost_reason", "");
  s.address = j.value("address", "");
  s.preempted = j.value("preempted", false);
  return s;
}

Result<json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseJsonBounded(text);
}

// libarchive read callback over a ByteSource (the request body of a files push).
struct BodyArchiveSource {
  ByteSource* body = nullptr;
  Status error;
  char buf[65536];
};

la_ssize_t ReadBody(struct archive* a, void* opaque, const void** out) {
  auto* src = static_cast<BodyArchiveSource*>(opaque);
  Result<size_t> n = src->body->Read(src->buf, sizeof src->buf);
  if (!n.ok()) {
    src->error = n.status();
    archive_set_error(a, EIO, "%s", n.status().message().c_str());
    return -1;
  }
  *out = src->buf;
  return static_cast<la_ssize_t>(*n);
}

// Whether a files push may write `relative` (a path under /opt/ml): the program's results only —
// model/, output/, checkpoints/, and processing/ (a processing job's S3Output LocalPaths live
// there) — never config/, input/ or code/.
bool PushablePath(std::string_view relative) {
  std::string_view top = relative.substr(0, relative.find('/'));
  return top == "model" || top == "output" || top == "checkpoints" || top == "processing";
}

// Moves every entry of `from` over the same relative path under `to` (files replace files;
// directories are merged). Both are on the same file system.
Status MergeTree(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(from, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = fs::relative(it->path(), from, ec);
    if (ec) break;
    const fs::path target = fs::path(to) / rel;
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(st)) {
      if (fs::is_symlink(fs::symlink_status(target, ec)) || (fs::exists(target, ec) && !fs::is_directory(target, ec))) {
        fs::remove(target, ec);
      }
      fs::create_directories(target, ec);
      if (ec) return Status::Internal("cannot create " + target.string() + ": " + ec.message());
      continue;
    }
    fs::create_directories(target.parent_path(), ec);
    if (fs::is_directory(fs::symlink_status(target, ec))) fs::remove_all(target, ec);
    ec.clear();
    if (rename(it->path().c_str(), target.c_str()) != 0) return ErrnoStatus("rename to " + target.string(), errno);
  }
  if (ec) return Status::Internal("cannot read " + from + ": " + ec.message());
  return Status::Ok();
}

class SlurmRuntimeImpl final : public SlurmRuntime {
 public:
  explicit SlurmRuntimeImpl(SlurmRuntimeOptions options) : options_(std::move(options)) {}

  ~SlurmRuntimeImpl() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      changed_.NotifyAll();
    }
    if (poller_.joinable()) poller_.join();
  }

  Status Open() {
    RETURN_IF_ERROR(MakeDirs(options_.state_dir));
    DIR* d = opendir(options_.state_dir.c_str());
    if (d == nullptr) return ErrnoStatus("open " + options_.state_dir, errno);
    std::vector<std::string> ids;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == ".." || !process_state::ValidInstanceId(name)) continue;
      ids.push_back(name);
    }
    closedir(d);
    MutexLock lock(mu_);
    for (const std::string& id : ids) LoadLocked(id);
    if (options_.start_poller) poller_ = std::thread([this] { PollLoop(); });
    return Status::Ok();
  }

  // Runtime ---------------------------------------------------------------------------------

  Status Launch(const InstanceSpec& spec) override {
    if (!process_state::ValidInstanceId(spec.instance_id)) {
      return Status::InvalidArgument("invalid instance id \"" + spec.instance_id + "\"");
    }
    if (spec.container) {
      return Status::FailedPrecondition("the Slurm runtime cannot run container images yet (" +
                                        spec.container->requested + "): use an image that maps to a host environment");
    }
    if (spec.argv.empty()) return Status::InvalidArgument("instance " + spec.instance_id + " has no program (argv)");
    if (spec.group_size > 1 && spec.group.empty()) {
      return Status::InvalidArgument("instance " + spec.instance_id + " is one of a group of " +
                                     std::to_string(spec.group_size) + " without a group name");
    }
    if (spec.group_index < 0 || spec.group_index >= std::max(spec.group_size, 1)) {
      return Status::InvalidArgument("instance " + spec.instance_id + ": group_index outside the group");
    }
    std::vector<std::string> members;
    std::string token;
    {
      MutexLock lock(mu_);
      const std::string dir = Dir(spec.instance_id);
      if (live_.count(spec.instance_id) != 0 || PathExists(dir)) {
        return Status::AlreadyExists("instance " + spec.instance_id + " exists");
      }
      const bool grouped = spec.group_size > 1;
      PendingGroup* group = nullptr;
      if (grouped) {
        auto [it, inserted] = groups_.try_emplace(spec.group);
        group = &it->second;
        if (inserted) {
          group->size = spec.group_size;
          group->token = RandomHex(32);
          group->ids.assign(static_cast<size_t>(spec.group_size), "");
        }
        if (group->size != spec.group_size) {
          return Status::InvalidArgument("instance " + spec.instance_id + " says its group " + spec.group + " has " +
                                         std::to_string(spec.group_size) + " instances; earlier ones said " +
                                         std::to_string(group->size));
        }
        if (!group->ids[static_cast<size_t>(spec.group_index)].empty()) {
          return Status::AlreadyExists("group " + spec.group + " already has an instance at index " +
                                       std::to_string(spec.group_index));
        }
      }
      token = grouped ? group->token : RandomHex(32);
      RETURN_IF_ERROR(MakeDirs(dir, 0700));
      Status written = WriteInstanceFiles(dir, spec, token);
      if (!written.ok()) {
        (void)RemoveAll(dir);
        return written;
      }
      Live& live = live_[spec.instance_id];
      live.spec = spec;
      live.token = token;
      if (!grouped) {
        members = {spec.instance_id};
      } else {
        group->ids[static_cast<size_t>(spec.group_index)] = spec.instance_id;
        for (const std::string& id : group->ids) {
          if (id.empty()) return Status::Ok();  // the group waits for its other instances
        }
        members = group->ids;
        groups_.erase(spec.group);
        // A member stopped while the group waited: the group never starts.
        for (const std::string& id : members) {
          if (live_[id].final_status) {
            const std::string why =
                "instance " + id + " of group " + spec.group + " was stopped before the group started";
            for (const std::string& other : members) {
              if (!live_[other].final_status) FinalizeLocked(other, LostStatus(other, why));
            }
            return Status::FailedPrecondition(why);
          }
        }
      }
      for (const std::string& id : members) live_[id].submitting = true;
    }
    return Submit(members, token);
  }

  Result<InstanceStatus> Inspect(const std::string& instance_id) override {
    MutexLock lock(mu_);
    auto it = live_.find(instance_id);
    if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
    return StatusLocked(instance_id, it->second);
  }

  Status Signal(const std::string& instance_id, int signal) override {
    MutexLock lock(mu_);
    auto it = live_.find(instance_id);
    if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
    Live& live = it->second;
    if (live.final_status) return Status::FailedPrecondition("instance " + instance_id + " has exited");
    if (!live.report || live.report->state != "running") {
      return Status::FailedPrecondition("instance " + instance_id + " has not started yet");
    }
    live.signals.push_back(signal);
    return Status::Ok();
  }

  Status Stop(const std::string& instance_id, std::chrono::seconds grace) override {
    std::string cancel_job;
    {
      MutexLock lock(mu_);
      auto it = live_.find(instance_id);
      if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
      Live& live = it->second;
      if (live.final_status) return Status::Ok();
      const int64_t seconds = std::max<int64_t>(0, grace.count());
      if (!live.stop_grace || seconds < *live.stop_grace) live.stop_grace = seconds;
      if (live.stop_millis == 0) live.stop_millis = NowMillis();
      json stop = {{"grace_seconds", *live.stop_grace}, {"requested_millis", live.stop_millis}};
      (void)ReplaceFile(Join(Dir(instance_id), kStopFile), stop.dump());
      if (live.job_id.empty() && !live.submitting) {
        // Never submitted (its group is incomplete): it ends here, never having run.
        InstanceStatus s = BaseStatus(instance_id, live);
        s.state = InstanceState::kExited;
        s.term_signal = SIGKILL;
        s.finished_millis = NowMillis();
        FinalizeLocked(instance_id, s);
        return Status::Ok();
      }
      // Pending in Slurm (or the node is still preparing): nothing runs that a grace would
      // serve; cancel the job now. A running program gets the stop in its node's next answer.
      if (!live.job_id.empty() && (!live.report || live.report->state == "starting")) {
        cancel_job = live.job_id;
        live.last_cancel_millis = NowMillis();
      }
    }
    if (!cancel_job.empty()) {
      Status cancelled = options_.client->Cancel(cancel_job);
      if (!cancelled.ok()) {
        KLOG(warn, "scancel failed; retried by the poller", {{"job", cancel_job}, {"error", cancelled.ToString()}});
      }
    }
    return Status::Ok();
  }

  Result<InstanceStatus> Wait(const std::string& instance_id, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mu_);
    while (true) {
      auto it = live_.find(instance_id);
      if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
      if (it->second.final_status || std::chrono::steady_clock::now() >= deadline) {
        return StatusLocked(instance_id, it->second);
      }
      changed_.WaitUntil(mu_, deadline);
    }
  }

  std::string OutputPath(const std::string& instance_id) const override { return Join(Dir(instance_id), kOutputFile); }

  Result<std::vector<std::string>> List() override {
    MutexLock lock(mu_);
    std::vector<std::string> ids;
    for (const auto& [id, live] : live_) ids.push_back(id);
    return ids;
  }

  Status Remove(const std::string& instance_id) override {
    std::string cancel_job;
    {
      MutexLock lock(mu_);
      auto it = live_.find(instance_id);
      if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
      Live& live = it->second;
      if (!live.final_status) return Status::FailedPrecondition("instance " + instance_id + " is still running");
      // Nothing orphaned on the cluster: once no instance of its job is left unfinished, a job
      // Slurm still runs is cancelled — at once when a node never reported its exit (it may run
      // on), later (options_.finish_grace) when every node did: they are only cleaning up their
      // scratch and end by themselves, and a job they end is COMPLETED in Slurm's records.
      if (!live.job_id.empty() && !live.job_terminal) {
        bool others_running = false;
        bool all_reported_exit = live.report && live.report->state == "exited";
        for (const std::string& other : live.members) {
          auto o = live_.find(other);
          if (other == instance_id || o == live_.end()) continue;
          if (!o->second.final_status) others_running = true;
          if (!o->second.report || o->second.report->state != "exited") all_reported_exit = false;
        }
        if (!others_running && all_reported_exit) {
          deferred_cancels_[live.job_id] = NowMillis() + static_cast<int64_t>(options_.finish_grace.count());
        } else if (!others_running) {
          cancel_job = live.job_id;
        }
      }
      if (live.spec.group_size > 1 && live.job_id.empty()) {
        auto g = groups_.find(live.spec.group);
        if (g != groups_.end()) {
          for (std::string& id : g->second.ids) {
            if (id == instance_id) id.clear();
          }
        }
      }
      live_.erase(it);
      RETURN_IF_ERROR(RemoveAll(Dir(instance_id)));
    }
    if (!cancel_job.empty()) (void)options_.client->Cancel(cancel_job);
    return Status::Ok();
  }

  Result<InstanceUsage> Usage(const std::string& instance_id) override {
    MutexLock lock(mu_);
    auto it = live_.find(instance_id);
    if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
    const Live& live = it->second;
    if (live.final_status || !live.report || live.report->state != "running") {
      return Status::FailedPrecondition("instance " + instance_id + " is not running");
    }
    if (!live.report->usage) return Status::Unavailable("the node has not reported the usage of " + instance_id);
    return *live.report->usage;
  }

  Result<AccessPoint> Access(const std::string& instance_id) override {
    return Status::Unimplemented("remote access to instance " + instance_id +
                                 " on a Slurm node is not implemented yet (the Slurm runtime, README.md)");
  }

  // SlurmRuntime: the node protocol ----------------------------------------------------------

  Status Authenticate(const std::string& instance_id, const std::string& token) override {
    MutexLock lock(mu_);
    auto it = live_.find(instance_id);
    if (it == live_.end()) return Status::NotFound("no instance " + instance_id + " on this Kiln server");
    if (token.empty() || !ConstantTimeEquals(Sha256Hex(token), Sha256Hex(it->second.token))) {
      return Status::Unauthenticated("wrong node token for instance " + instance_id);
    }
    return Status::Ok();
  }

  Result<InstanceSpec> NodeSpec(const std::string& instance_id) override {
    MutexLock lock(mu_);
    auto it = live_.find(instance_id);
    if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
    return it->second.spec;
  }

  Status AppendOutput(const std::string& instance_id, uint64_t offset, std::string_view data, uint64_t* size) override {
    MutexLock lock(mu_);
    if (live_.count(instance_id) == 0) return Status::NotFound("no instance " + instance_id);
    const std::string path = OutputPath(instance_id);
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoStatus("open " + path, errno);
    struct stat st {};
    if (fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
    *size = static_cast<uint64_t>(st.st_size);
    if (offset != *size) {
      return Status::Aborted("output offset " + std::to_string(offset) + " is not the server's size " +
                             std::to_string(*size));
    }
    RETURN_IF_ERROR(WriteAll(fd.get(), data));
    *size += data.size();
    return Status::Ok();
  }

  Status ApplyFiles(const std::string& instance_id, ByteSource& body) override {
    std::string opt_ml;
    {
      MutexLock lock(mu_);
      auto it = live_.find(instance_id);
      if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
      opt_ml = it->second.spec.opt_ml_dir;
    }
    if (opt_ml.empty()) return Status::FailedPrecondition("instance " + instance_id + " has no opt_ml_dir");
    while (opt_ml.size() > 1 && opt_ml.back() == '/') opt_ml.pop_back();
    // Staged beside opt_ml_dir (same file system, so the merge renames), never inside it.
    const std::string staging = opt_ml + ".push-" + RandomHex(6);
    struct Cleanup {
      std::string path;
      ~Cleanup() { (void)RemoveAll(path); }
    } cleanup{staging};
    agent::ArchiveReadPtr reader = agent::NewTarReader();
    BodyArchiveSource source;
    source.body = &body;
    if (archive_read_open(reader.get(), &source, nullptr, ReadBody, nullptr) != ARCHIVE_OK) {
      return Status::InvalidArgument("the pushed files are not a tar: " + agent::ArchiveErrorText(reader.get()));
    }
    agent::ExtractOptions extract;
    extract.dest_name = "/opt/ml";
    extract.archive_name = "the files pushed by the node";
    Status extracted = agent::ExtractTar(
        reader.get(), staging, extract,
        [](const std::string& why) { return Status::InvalidArgument("the pushed files are refused: " + why); },
        nullptr);
    if (!source.error.ok()) return source.error;
    RETURN_IF_ERROR(extracted);
    // Only the program's results may come back: never its inputs or configuration.
    if (PathExists(staging)) {
      DIR* d = opendir(staging.c_str());
      if (d == nullptr) return ErrnoStatus("open " + staging, errno);
      std::vector<std::string> tops;
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name != "." && name != "..") tops.push_back(name);
      }
      closedir(d);
      for (const std::string& top : tops) {
        if (!PushablePath(top)) {
          return Status::InvalidArgument(
              "the pushed files may only hold model/, output/, checkpoints/ and processing/, not " + top);
        }
      }
      RETURN_IF_ERROR(MergeTree(staging, opt_ml));
    }
    return Status::Ok();
  }

  Result<NodeReportAnswer> Report(const std::string& instance_id, const NodeReport& report) override {
    MutexLock lock(mu_);
    auto it = live_.find(instance_id);
    if (it == live_.end()) return Status::NotFound("no instance " + instance_id);
    Live& live = it->second;
    if (live.final_status) {
      return Status::FailedPrecondition("instance " + instance_id + " has already ended on this server (" +
                                        DescribeFinal(*live.final_status) + ")");
    }
    // An exited report is final for the node: a later "running" (a retry that crossed it) is ignored.
    if (live.report && live.report->state == "exited" && report.state != "exited") return Answer(live);
    const bool first_exit = report.state == "exited" && (!live.report || live.report->state != "exited");
    live.report = report;
    if (first_exit) live.exit_millis = NowMillis();
    (void)ReplaceFile(Join(Dir(instance_id), kReportFile), ReportToJson(report).dump());
    if (report.state == "exited") {
      if (!report.error.empty()) {
        InstanceStatus s = BaseStatus(instance_id, live);
        s.state = InstanceState::kLost;
        s.lost_reason = report.error;
        FinalizeLocked(instance_id, s);
      } else if (report.term_signal == 0 || report.oom_killed || live.stop_grace) {
        FinalizeLocked(instance_id, ExitedFromReport(instance_id, live));
      }
      // Otherwise killed by a signal nobody here sent: the poller waits for Slurm's word on why
      // (preempted, time limit) before it settles the exit.
    }
    changed_.NotifyAll();
    return Answer(live);
  }

  void PollOnce() override {
    std::set<std::string> jobs;
    std::vector<std::string> backstops;
    const int64_t now = NowMillis();
    {
      MutexLock lock(mu_);
      for (auto& [id, live] : live_) {
        if (live.final_status || live.job_id.empty()) continue;
        jobs.insert(live.job_id);
        // Settle an exit by a signal Slurm never explained.
        if (live.report && live.report->state == "exited" &&
            now - live.exit_millis >= static_cast<int64_t>(options_.exit_settle.count())) {
          FinalizeLocked(id, ExitedFromReport(id, live));
          continue;
        }
        if (live.stop_grace && !live.backstop_sent &&
            now >= live.stop_millis + (*live.stop_grace + options_.stop_backstop.count()) * 1000) {
          live.backstop_sent = true;
          backstops.push_back(live.job_id);
        }
        // A stop that found the job pending, whose scancel failed then: again.
        if (live.stop_grace && !live.backstop_sent && (!live.report || live.report->state == "starting") &&
            now - live.last_cancel_millis >= 5000) {
          live.last_cancel_millis = now;
          backstops.push_back(live.job_id);
        }
      }
    }
    {
      MutexLock lock(mu_);
      for (const auto& [job, deadline] : deferred_cancels_) {
        jobs.insert(job);
        if (now >= deadline) backstops.push_back(job);
      }
      for (const std::string& job : backstops) deferred_cancels_.erase(job);
    }
    for (const std::string& job : backstops) {
      KLOG(info, "cancelling the Slurm job of stopped or removed instances", {{"job", job}});
      (void)options_.client->Cancel(job);
    }
    if (jobs.empty()) return;
    Result<std::map<std::string, JobInfo>> found =
        options_.client->Query(std::vector<std::string>(jobs.begin(), jobs.end()));
    MutexLock lock(mu_);
    if (!found.ok()) {
      if (query_error_.empty()) KLOG(warn, "cannot ask Slurm about jobs", {{"error", found.status().ToString()}});
      query_error_ = found.status().message();
      return;
    }
    query_error_.clear();
    // Deferred cancels of jobs that ended by themselves (or that Slurm forgot) are done.
    for (auto it = deferred_cancels_.begin(); it != deferred_cancels_.end();) {
      auto info = found->find(it->first);
      it = info == found->end() || IsTerminalState(info->second.state) ? deferred_cancels_.erase(it) : std::next(it);
    }
    std::set<std::string> unheard;  // jobs whose nodes never reached this server: cancelled below
    for (auto& [id, live] : live_) {
      if (live.final_status || live.job_id.empty() || jobs.count(live.job_id) == 0) continue;
      auto info = found->find(live.job_id);
      if (info == found->end()) {
        if (++live.missing_polls < 2) continue;
        live.job_terminal = true;
        if (live.report && live.report->state == "exited") {
          FinalizeLocked(id, ExitedFromReport(id, live));
        } else {
          FinalizeLocked(id, LostStatus(id, "Slurm no longer knows job " + live.job_id +
                                                ": it ended without the node's final report"));
        }
        continue;
      }
      live.missing_polls = 0;
      live.slurm = info->second;
      if (info->second.state == "RUNNING" && !live.report) {
        // Allocated, but its node has not called: a wrong server_url or node_command would
        // otherwise hold the allocation, and the job, forever.
        if (live.unheard_since_millis == 0) live.unheard_since_millis = now;
        if (now - live.unheard_since_millis >= static_cast<int64_t>(options_.node_contact_timeout.count())) {
          unheard.insert(live.job_id);
          FinalizeLocked(id, LostStatus(id, "Slurm job " + live.job_id + " ran on " + NodeOf(live) + " for " +
                                                std::to_string(options_.node_contact_timeout.count() / 1000) +
                                                " s without its node reaching this server at " + options_.server_url +
                                                ": check slurm.server_url (how the nodes reach this server) and "
                                                "slurm.node_command (kiln on the nodes); the batch log is " +
                                                options_.scratch_dir + "/kiln-" + live.job_id + ".log on the node"));
        }
        continue;
      }
      if (!IsTerminalState(info->second.state)) continue;
      live.job_terminal = true;
      // The node's exit report is written before its process ends, so it is on disk by the time
      // Slurm calls the job ended; a second round is only a margin for a report in flight.
      if (live.report && live.report->state == "exited") {
        FinalizeLocked(id, Explain(ExitedFromReport(id, live), live));
        continue;
      }
      if (++live.terminal_polls < 2) continue;
      FinalizeLocked(id, FromSlurmEnd(id, live));
    }
    lock.Unlock();
    for (const std::string& job : unheard) {
      KLOG(warn, "cancelling a Slurm job whose node never reached the server", {{"job", job}});
      (void)options_.client->Cancel(job);
    }
  }

 private:
  struct Live {
    InstanceSpec spec;
    std::string token;
    std::string job_id;                // empty until sbatch accepted the job
    std::vector<std::string> members;  // the job's instance ids, in task order
    bool submitting = false;           // sbatch runs for it now
    std::optional<NodeReport> report;  // the node's last report
    int64_t exit_millis = 0;           // when the exited report arrived
    std::optional<int64_t> stop_grace;
    int64_t stop_millis = 0;
    int64_t last_cancel_millis = 0;
    bool backstop_sent = false;
    std::vector<int> signals;      // to deliver in the next answer
    std::optional<JobInfo> slurm;  // what the last poll said
    bool job_terminal = false;     // Slurm said the job ended (or forgot it)
    int missing_polls = 0, terminal_polls = 0;
    int64_t unheard_since_millis = 0;  // first poll that saw the job RUNNING without a report
    std::optional<InstanceStatus> final_status;
  };
  struct PendingGroup {
    int size = 0;
    std::string token;
    std::vector<std::string> ids;  // by group_index; "" where not launched yet
  };

  std::string Dir(const std::string& id) const { return Join(options_.state_dir, id); }

  Status WriteInstanceFiles(const std::string& dir, const InstanceSpec& spec, const std::string& token) {
    RETURN_IF_ERROR(ReplaceFile(Join(dir, kSpecFile), EncodeSpec(spec)));
    RETURN_IF_ERROR(ReplaceFile(Join(dir, kTokenFile), token, 0600));
    return ReplaceFile(Join(dir, kOutputFile), "");
  }

  void LoadLocked(const std::string& id) REQUIRES(mu_) {
    const std::string dir = Dir(id);
    Result<std::string> spec_text = ReadFile(Join(dir, kSpecFile));
    if (!spec_text.ok()) return;  // a Launch that died half-way: not an instance
    Result<InstanceSpec> spec = DecodeSpec(*spec_text);
    Result<std::string> token = ReadFile(Join(dir, kTokenFile));
    if (!spec.ok() || !token.ok()) {
      KLOG(warn, "unreadable Slurm instance state left alone", {{"dir", dir}});
      return;
    }
    Live& live = live_[id];
    live.spec = std::move(spec).value();
    live.token = *token;
    if (Result<std::string> job = ReadFile(Join(dir, kJobFile)); job.ok()) live.job_id = std::string(Trim(*job));
    if (Result<json> members = ReadJsonFile(Join(dir, kMembersFile)); members.ok() && members->is_array()) {
      for (const json& m : *members) {
        if (m.is_string()) live.members.push_back(m.get<std::string>());
      }
    }
    if (Result<json> report = ReadJsonFile(Join(dir, kReportFile)); report.ok()) {
      if (Result<NodeReport> r = ReportFromJson(*report); r.ok()) {
        live.report = std::move(r).value();
        if (live.report->state == "exited") live.exit_millis = NowMillis();
      }
    }
    if (Result<json> stop = ReadJsonFile(Join(dir, kStopFile)); stop.ok() && stop->is_object()) {
      live.stop_grace = stop->value("grace_seconds", int64_t{0});
      live.stop_millis = stop->value("requested_millis", NowMillis());
    }
    if (Result<json> final_json = ReadJsonFile(Join(dir, kFinalFile)); final_json.ok()) {
      live.final_status = FinalFromJson(*final_json, id);
    }
    // An incomplete group (the old server died between its Launch calls) waits again.
    if (live.job_id.empty() && !live.final_status && live.spec.group_size > 1) {
      PendingGroup& group = groups_[live.spec.group];
      if (group.ids.empty()) {
        group.size = live.spec.group_size;
        group.token = live.token;
        group.ids.assign(static_cast<size_t>(group.size), "");
      }
      if (live.spec.group_index < group.size) group.ids[static_cast<size_t>(live.spec.group_index)] = id;
    } else if (live.job_id.empty() && !live.final_status) {
      // Recorded but never submitted (the server died inside sbatch, or before it): whether Slurm
      // took it is unknown, so it is written off rather than run twice.
      FinalizeLocked(id, LostStatus(id, "the Kiln server stopped while submitting it to Slurm"));
    }
  }

  Status Submit(const std::vector<std::string>& members, const std::string& token) {
    InstanceSpec first;
    {
      MutexLock lock(mu_);
      first = live_[members.front()].spec;
    }
    const std::string first_dir = Dir(members.front());
    const std::string script_path = Join(first_dir, kBatchFile);
    Status status = ReplaceFile(
        script_path, BatchScript(options_.node_command, options_.server_url, members, options_.scratch_dir), 0755);
    SubmitRequest request;
    if (status.ok()) {
      request.job_name = "kiln-" + (first.group.empty() ? first.instance_id : first.group);
      if (request.job_name.size() > 100) request.job_name.resize(100);
      request.script_path = script_path;
      request.nodes = static_cast<int>(members.size());
      if (options_.request_cpus) request.cpus_per_task = first.shape_vcpus;
      if (options_.request_memory) request.memory_bytes = first.shape_memory_bytes;
      request.gpus_per_node = first.shape_gpus;
      request.time_limit_seconds = first.time_limit_seconds;
      auto placement = [&](const char* key) {
        auto it = first.placement.find(key);
        if (it != first.placement.end() && !it->second.empty()) return it->second;
        auto d = options_.placement.find(key);
        return d != options_.placement.end() ? d->second : std::string();
      };
      request.partition = placement("partition");
      request.qos = placement("qos");
      request.account = placement("account");
      request.output_path = options_.scratch_dir + "/kiln-%j.log";
      request.working_dir = options_.scratch_dir;
      request.env = {{"KILN_NODE_TOKEN", token}};
      request.extra_args = options_.sbatch_args;
    }
    Result<std::string> job = status.ok() ? options_.client->Submit(request) : Result<std::string>(status);
    MutexLock lock(mu_);
    if (!job.ok()) {
      const std::string why = (job.status().code() == StatusCode::kUnavailable ? "Slurm could not be reached: "
                                                                               : "Slurm refused the job: ") +
                              job.status().message();
      for (const std::string& id : members) {
        auto it = live_.find(id);
        if (it == live_.end()) continue;
        it->second.submitting = false;
        if (!it->second.final_status) FinalizeLocked(id, LostStatus(id, why));
      }
      KLOG(warn, "sbatch failed", {{"instances", std::to_string(members.size())}, {"error", job.status().ToString()}});
      return Status(job.status().code(), why);
    }
    const json member_list = members;
    for (const std::string& id : members) {
      auto it = live_.find(id);
      if (it == live_.end()) continue;  // removed meanwhile: the poller's Remove path cancels nothing
      Live& live = it->second;
      live.submitting = false;
      live.job_id = *job;
      live.members = members;
      (void)ReplaceFile(Join(Dir(id), kMembersFile), member_list.dump());
      (void)ReplaceFile(Join(Dir(id), kJobFile), *job);
    }
    KLOG(info, "submitted Slurm job",
         {{"job", *job}, {"instances", std::to_string(members.size())}, {"first", members.front()}});
    return Status::Ok();
  }

  NodeReportAnswer Answer(Live& live) REQUIRES(mu_) {
    NodeReportAnswer answer;
    answer.stop_grace_seconds = live.stop_grace;
    answer.signals.swap(live.signals);
    return answer;
  }

  InstanceStatus BaseStatus(const std::string& id, const Live& live) const {
    InstanceStatus s;
    s.instance_id = id;
    s.stop_requested = live.stop_grace.has_value();
    if (live.report) {
      s.started_millis = live.report->started_millis;
      s.address = live.report->address;
    }
    return s;
  }

  InstanceStatus LostStatus(const std::string& id, const std::string& why) REQUIRES(mu_) {
    InstanceStatus s = BaseStatus(id, live_[id]);
    s.state = InstanceState::kLost;
    s.lost_reason = why;
    s.finished_millis = NowMillis();
    return s;
  }

  InstanceStatus ExitedFromReport(const std::string& id, const Live& live) const {
    InstanceStatus s = BaseStatus(id, live);
    s.state = InstanceState::kExited;
    s.finished_millis = live.report->finished_millis;
    s.exit_code = live.report->exit_code;
    s.term_signal = live.report->term_signal;
    s.oom_killed = live.report->oom_killed;
    return s;
  }

  // What Slurm's end state adds to an exit the node reported (why a signal came).
  static InstanceStatus Explain(InstanceStatus s, const Live& live) {
    if (!live.slurm || s.stop_requested) return s;
    const std::string& state = live.slurm->state;
    if (state == "PREEMPTED") {
      s.preempted = true;
      s.lost_reason = "Slurm preempted job " + live.job_id;
    } else if (state == "TIMEOUT" || (state == "CANCELLED" && s.term_signal != 0)) {
      // The program did not end by itself: the instance is lost, saying who ended it.
      s.state = InstanceState::kLost;
      s.exit_code = -1;
      s.term_signal = 0;
      s.lost_reason = state == "TIMEOUT"
                          ? "Slurm ended job " + live.job_id + " at its time limit"
                          : "Slurm job " + live.job_id + " was cancelled outside Kiln (scancel or an administrator)";
    } else if (state == "OUT_OF_MEMORY") {
      s.oom_killed = true;
    }
    return s;
  }

  std::string NodeOf(const Live& live) const {
    if (live.report && !live.report->node.empty()) return live.report->node;
    if (live.slurm && !live.slurm->node_list.empty()) return live.slurm->node_list;
    return "(unknown)";
  }

  // The final status of an instance whose Slurm job ended without the node's exit report.
  InstanceStatus FromSlurmEnd(const std::string& id, const Live& live) {
    const JobInfo& info = *live.slurm;
    InstanceStatus s = BaseStatus(id, live);
    s.finished_millis = NowMillis();
    const std::string job = "Slurm job " + live.job_id;
    if (live.stop_grace) {
      // Kiln cancelled it (a stop): the program, if it ran, was killed.
      s.state = InstanceState::kExited;
      s.term_signal = SIGKILL;
      return s;
    }
    s.state = InstanceState::kLost;
    const std::string& st = info.state;
    if (st == "NODE_FAIL") {
      s.lost_reason = "Slurm node " + NodeOf(live) + " failed (" + job + " ended NODE_FAIL)";
    } else if (st == "PREEMPTED") {
      s.preempted = true;
      s.lost_reason = "Slurm preempted job " + live.job_id + " (on " + NodeOf(live) + ")";
    } else if (st == "TIMEOUT") {
      s.lost_reason = "Slurm ended job " + live.job_id + " at its time limit";
    } else if (st == "OUT_OF_MEMORY") {
      s.state = InstanceState::kExited;
      s.term_signal = SIGKILL;
      s.oom_killed = true;
      s.lost_reason = job + " ran out of memory (Slurm's memory limit)";
    } else if (st == "CANCELLED") {
      s.lost_reason = job + " was cancelled outside Kiln (scancel or an administrator)";
    } else if (st == "BOOT_FAIL") {
      s.lost_reason = "Slurm could not boot node " + NodeOf(live) + " for " + job;
    } else if (st == "DEADLINE") {
      s.lost_reason = job + " reached its deadline";
    } else {
      std::string detail = "ended " + st;
      if (!info.reason.empty() && info.reason != "None") detail += " (" + info.reason + ")";
      if (info.exit_code >= 0) {
        detail += ", exit code " + std::to_string(info.exit_code) + ":" + std::to_string(info.term_signal);
      }
      s.lost_reason = job + " " + detail + " before the node reported an exit" +
                      (live.report ? "" : " (the node never reached the server)") + "; its batch log is " +
                      options_.scratch_dir + "/kiln-" + live.job_id + ".log on " + NodeOf(live);
    }
    return s;
  }

  static std::string DescribeFinal(const InstanceStatus& s) {
    if (s.state == InstanceState::kLost) return "lost: " + s.lost_reason;
    return "exited with code " + std::to_string(s.exit_code) +
           (s.term_signal != 0 ? ", signal " + std::to_string(s.term_signal) : "");
  }

  void FinalizeLocked(const std::string& id, const InstanceStatus& status) REQUIRES(mu_) {
    Live& live = live_[id];
    if (live.final_status) return;
    live.final_status = status;
    Status written = ReplaceFile(Join(Dir(id), kFinalFile), FinalToJson(status).dump());
    if (!written.ok())
      KLOG(warn, "cannot record a Slurm instance's end", {{"instance", id}, {"error", written.ToString()}});
    KLOG(info, "Slurm instance ended", {{"instance", id}, {"job", live.job_id}, {"how", DescribeFinal(status)}});
    changed_.NotifyAll();
  }

  InstanceStatus StatusLocked(const std::string& id, const Live& live) REQUIRES(mu_) {
    if (live.final_status) return *live.final_status;
    InstanceStatus s = BaseStatus(id, live);
    s.state = InstanceState::kRunning;
    if (live.report && live.report->state != "starting") {
      if (live.report->state == "running") s.started_millis = live.report->started_millis;
      return s;  // running, or exited and settling: no waiting reason
    }
    s.started_millis = 0;
    if (live.job_id.empty()) {
      if (live.submitting) {
        s.waiting_reason = "submitting to Slurm";
      } else {
        int missing = 0;
        auto g = groups_.find(live.spec.group);
        if (g != groups_.end()) {
          for (const std::string& m : g->second.ids) missing += m.empty() ? 1 : 0;
        }
        s.waiting_reason = "waiting for " + std::to_string(missing) + " more instance(s) of " + live.spec.group +
                           " before submitting to Slurm";
      }
      return s;
    }
    const std::string job = "Slurm job " + live.job_id;
    if (live.report) {
      s.waiting_reason = job + " is running on " + NodeOf(live) + ": the node is preparing /opt/ml";
    } else if (!live.slurm) {
      s.waiting_reason = job + " is submitted";
    } else if (live.slurm->state == "PENDING") {
      s.waiting_reason = job + " is pending: " + live.slurm->reason;
    } else {
      s.waiting_reason = job + " is " + ToLower(live.slurm->state) +
                         (live.slurm->node_list.empty() ? "" : " on " + live.slurm->node_list) +
                         ": waiting for the node to start";
    }
    if (!query_error_.empty()) s.waiting_reason += " (Slurm cannot be asked now: " + query_error_ + ")";
    return s;
  }

  void PollLoop() {
    MutexLock lock(mu_);
    while (!stopping_) {
      lock.Unlock();
      PollOnce();
      lock.Lock();
      const auto until = std::chrono::steady_clock::now() + options_.poll_interval;
      while (!stopping_ && std::chrono::steady_clock::now() < until) changed_.WaitUntil(mu_, until);
    }
  }

  const SlurmRuntimeOptions options_;
  mutable Mutex mu_;
  CondVar changed_;  // an instance reached its final state; or stopping_
  std::map<std::string, Live> live_ GUARDED_BY(mu_);
  std::map<std::string, PendingGroup> groups_ GUARDED_BY(mu_);  // incomplete groups, by name
  std::string query_error_ GUARDED_BY(mu_);                     // the last poll's failure, if any
  // Jobs of removed instances whose nodes all reported their exit, by id: cancelled at the
  // deadline (millis) unless Slurm says first that they ended. Not kept across restarts.
  std::map<std::string, int64_t> deferred_cancels_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace

std::string BatchScript(const std::vector<std::string>& node_command, const std::string& server_url,
                        const std::vector<std::string>& instance_ids, const std::string& scratch_dir) {
  std::string ids;
  for (const std::string& id : instance_ids) ids += (ids.empty() ? "" : ",") + id;
  std::string script =
      "#!/bin/sh\n"
      "# Written by Kiln (runtime/slurm): one `kiln node` per node, task i runs instance i.\n"
      "# Everything else is on the sbatch command line; KILN_NODE_TOKEN comes in the environment.\n"
      "exec srun --ntasks-per-node=1 --kill-on-bad-exit=0";
  for (const std::string& part : node_command) script += " " + ShellQuote(part);
  script += " node --server " + ShellQuote(server_url) + " --instances " + ShellQuote(ids) + " --scratch " +
            ShellQuote(scratch_dir) + "\n";
  return script;
}

Result<std::unique_ptr<SlurmRuntime>> OpenSlurmRuntime(SlurmRuntimeOptions options) {
  if (options.state_dir.empty()) return Status::InvalidArgument("the Slurm runtime needs a state directory");
  if (!options.client) return Status::InvalidArgument("the Slurm runtime needs a Slurm client");
  if (options.server_url.empty()) {
    return Status::InvalidArgument("the Slurm runtime needs slurm.server_url (how the nodes reach this server)");
  }
  if (options.node_command.empty()) return Status::InvalidArgument("slurm.node_command is empty");
  auto runtime = std::make_unique<SlurmRuntimeImpl>(std::move(options));
  RETURN_IF_ERROR(runtime->Open());
  return std::unique_ptr<SlurmRuntime>(std::move(runtime));
}

}  // namespace kiln::runtime::slurm
