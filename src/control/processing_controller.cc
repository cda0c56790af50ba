#include "control/processing_controller.h"

#include <algorithm>
#include <utility>

#include "base/fs.h"
#include "base/log.h"
#include "control/processing_job_run.h"

namespace kiln::control {

using nlohmann::json;
using store::ProcessingJobRecord;
using store::ProcessingJobStatus;

std::string ProcessingGrantId(const std::string& job) { return "processing-job/" + job; }

namespace {

// ProcessingResources.ClusterConfig's instance type and count.
std::pair<std::string, int> ClusterShape(const json& request) {
  const json cluster = request.value("ProcessingResources", json::object()).value("ClusterConfig", json::object());
  const json& count = cluster.contains("InstanceCount") ? cluster["InstanceCount"] : json(1);
  return {cluster.value("InstanceType", ""), count.is_number_integer() ? count.get<int>() : 1};
}

bool Launched(const store::ProcessingJobState& state) {
  return std::any_of(state.hosts.begin(), state.hosts.end(),
                     [](const store::ProcessingHostState& h) { return !h.runtime_id.empty(); });
}

}  // namespace

ProcessingController::ProcessingController(ProcessingControllerOptions options, ProcessingControllerDeps deps)
    : options_(std::move(options)), deps_(deps), jobs_(deps.database) {}

ProcessingController::~ProcessingController() { Shutdown(); }

int64_t ProcessingController::Now() const {
  return deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
}

Status ProcessingController::Start() {
  RETURN_IF_ERROR(MakeDirs(options_.work_dir, 0700).WithPrefix("processing work dir"));
  ASSIGN_OR_RETURN(auto active, jobs_.ListActive());
  std::vector<std::string> to_queue;
  for (auto& job : active) {
    if (Launched(job.state)) {
      std::vector<Allocation> allocations;
      try {
        const json& recorded = job.state.extra.value("allocations", json::array());
        for (const json& a : recorded) allocations.push_back(a.get<Allocation>());
      } catch (const json::exception& e) {
        KLOG(warn, "processing job's allocations unreadable", {{"job", job.name}, {"error", e.what()}});
      }
      Status adopted = deps_.scheduler->Adopt(ProcessingGrantId(job.name), allocations);
      if (!adopted.ok()) {
        KLOG(warn, "could not re-reserve an adopted processing job's resources",
             {{"job", job.name}, {"error", adopted.ToString()}});
      }
      StartRun(job.name, std::move(allocations), /*adopt=*/true);
    } else if (job.status == ProcessingJobStatus::kStopping) {
      FinishWithoutRunning(job.name);
    } else {
      to_queue.push_back(job.name);  // staged again from the top (idempotent)
    }
  }
  for (const auto& name : to_queue) Submit(name);
  dispatcher_ = std::thread([this] { RunDispatcher(); });
  return Status::Ok();
}

void ProcessingController::Shutdown() {
  std::map<std::string, std::shared_ptr<ProcessingJobRun>> runs;
  {
    MutexLock lock(mutex_);
    if (shutting_down_ && !dispatcher_.joinable() && runs_.empty() && finished_runs_.empty()) return;
    shutting_down_ = true;
    runs = runs_;
    wake_.NotifyAll();
  }
  for (auto& [name, run] : runs) run->Shutdown();
  for (auto& [name, run] : runs) run->Join();
  if (dispatcher_.joinable()) dispatcher_.join();
  // No run adds itself to finished_runs_ once shutting_down_ is set (OnRunFinished).
  std::vector<std::shared_ptr<ProcessingJobRun>> finished;
  {
    MutexLock lock(mutex_);
    finished.swap(finished_runs_);
  }
  for (auto& run : finished) run->Join();
  MutexLock lock(mutex_);
  runs_.clear();
}

void ProcessingController::Submit(const std::string& name) {
  auto record = jobs_.Get(name);
  if (!record.ok()) return;
  if (!store::IsActive(record->status)) return;
  if (record->status == ProcessingJobStatus::kStopping) {
    FinishWithoutRunning(name);
    return;
  }
  const auto [type, count] = ClusterShape(record->request);
  // A shape that can never run here fails now rather than waiting forever (the API checks the
  // same at create; a changed scheduler configuration after a restart can still get here).
  if (Status feasible = deps_.scheduler->CheckFeasible(type, count); !feasible.ok()) {
    FailWithoutRunning(name, "ClientError: " + feasible.message());
    return;
  }
  MutexLock lock(mutex_);
  for (const auto& [seq, waiting] : waiting_) {
    if (waiting == record->name) return;  // queued already
  }
  if (runs_.count(record->name)) return;  // running already
  waiting_.emplace(record->seq, record->name);
  dispatch_needed_ = true;
  wake_.NotifyAll();
}

void ProcessingController::RequestStop(const std::string& name) {
  std::shared_ptr<ProcessingJobRun> run;
  bool was_waiting = false;
  {
    MutexLock lock(mutex_);
    auto it = runs_.find(name);
    if (it != runs_.end()) run = it->second;
    for (auto w = waiting_.begin(); w != waiting_.end(); ++w) {
      if (w->second == name) {
        waiting_.erase(w);
        was_waiting = true;
        break;
      }
    }
  }
  if (run) {
    run->RequestStop();
    return;
  }
  // Waiting (or between its grant and its run, which then finds the row terminal and ends): it
  // never launched, so it ends Stopped now.
  (void)was_waiting;
  FinishWithoutRunning(name);
}

void ProcessingController::FinishWithoutRunning(const std::string& name) {
  const int64_t now = Now();
  auto r = jobs_.Mutate(name, [&](ProcessingJobRecord& rec) {
    if (!store::IsActive(rec.status)) return Status::Ok();
    rec.status = ProcessingJobStatus::kStopped;
    if (rec.state.stop_reason.empty()) rec.state.stop_reason = std::string(store::kProcessingStopRequested);
    rec.end_millis = now;
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  if (!r.ok()) KLOG(warn, "processing job not stopped", {{"job", name}, {"error", r.status().ToString()}});
}

void ProcessingController::FailWithoutRunning(const std::string& name, const std::string& reason) {
  const int64_t now = Now();
  auto r = jobs_.Mutate(name, [&](ProcessingJobRecord& rec) {
    if (!store::IsActive(rec.status)) return Status::Ok();
    rec.status = ProcessingJobStatus::kFailed;
    rec.state.failure_reason = reason;
    rec.end_millis = now;
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  if (!r.ok()) KLOG(warn, "processing job not failed", {{"job", name}, {"error", r.status().ToString()}});
  KLOG(info, "processing job failed", {{"job", name}, {"reason", reason}});
}

void ProcessingController::Dispatch() {
  while (true) {
    int64_t seq = 0;
    std::string name;
    {
      MutexLock lock(mutex_);
      if (shutting_down_ || waiting_.empty()) return;
      seq = waiting_.begin()->first;
      name = waiting_.begin()->second;
    }
    auto record = jobs_.Get(name);
    if (!record.ok() || !store::IsActive(record->status)) {
      MutexLock lock(mutex_);
      waiting_.erase(seq);
      continue;
    }
    const auto [type, count] = ClusterShape(record->request);
    auto granted = deps_.scheduler->AllocateNow(
        ScheduleRequest{.id = ProcessingGrantId(name), .seq = seq, .instance_type = type, .instance_count = count});
    if (!granted.ok()) {
      if (granted.status().Is(ErrorReason::kDoesNotFitNow)) return;  // the head waits; so do the others
      {
        MutexLock lock(mutex_);
        waiting_.erase(seq);
      }
      if (granted.status().code() == StatusCode::kAlreadyExists) {
        // A grant under this id is still held (a run of the job is ending): try again later.
        KLOG(warn, "processing job's grant still held", {{"job", name}});
        MutexLock lock(mutex_);
        waiting_.emplace(seq, name);
        return;
      }
      FailWithoutRunning(name, "ClientError: " + granted.status().message());
      continue;
    }
    bool still_waiting = false;
    {
      MutexLock lock(mutex_);
      auto it = waiting_.find(seq);
      still_waiting = it != waiting_.end() && it->second == name;
      if (still_waiting) waiting_.erase(it);
    }
    if (!still_waiting) {
      // Stopped while its capacity was reserved (RequestStop took it out of line).
      deps_.scheduler->Release(ProcessingGrantId(name));
      continue;
    }
    StartRun(name, std::move(granted).value(), /*adopt=*/false);
  }
}

void ProcessingController::RunDispatcher() {
  MutexLock lock(mutex_);
  while (!shutting_down_) {
    const auto wait = waiting_.empty() ? std::chrono::milliseconds(5000) : options_.capacity_retry_interval;
    const auto wake_by = std::chrono::steady_clock::now() + wait;
    while (!shutting_down_ && !dispatch_needed_ && finished_runs_.empty()) {
      if (wake_.WaitUntil(mutex_, wake_by) == std::cv_status::timeout) break;
    }
    if (shutting_down_) break;
    dispatch_needed_ = false;
    // Join finished runs without the lock (a run finishing meanwhile appends to finished_runs_).
    std::vector<std::shared_ptr<ProcessingJobRun>> finished;
    finished.swap(finished_runs_);
    lock.Unlock();
    for (auto& run : finished) run->Join();
    finished.clear();
    Dispatch();
    lock.Lock();
  }
}

void ProcessingController::StartRun(const std::string& name, std::vector<Allocation> allocations, bool adopt) {
  ProcessingJobRun::Context context{
      .options = &options_, .deps = &deps_, .jobs = &jobs_, .on_finished = [this](const std::string& job) {
        OnRunFinished(job);
      }};
  auto run = std::make_shared<ProcessingJobRun>(std::move(context), name, std::move(allocations), adopt);
  {
    MutexLock lock(mutex_);
    if (shutting_down_) return;  // its grant goes with the server's scheduler
    runs_[name] = run;
  }
  run->Start();
}

void ProcessingController::OnRunFinished(const std::string& name) {
  deps_.scheduler->Release(ProcessingGrantId(name));
  MutexLock lock(mutex_);
  auto it = runs_.find(name);
  if (it != runs_.end() && !shutting_down_) {
    finished_runs_.push_back(it->second);
    runs_.erase(it);
  }
  dispatch_needed_ = true;
  wake_.NotifyAll();
}

}  // namespace kiln::control
