#include "control/training_controller.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "base/fs.h"
#include "base/log.h"
#include "control/training_job_run.h"
#include "control/training_plan.h"
#include "control/training_states.h"
#include "control/warm_pools.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::SecondaryStatus;
using JobStatus = store::TrainingJobStatus;
using Phase = store::TrainingPhase;
using namespace training;  // messages and deadline arithmetic

}  // namespace

std::vector<observe::MetricDefinition> MetricDefinitionsFromJson(const json& definitions) {
  std::vector<observe::MetricDefinition> out;
  if (!definitions.is_array()) return out;
  for (const json& d : definitions) {
    if (d.is_object()) out.push_back({d.value("Name", ""), d.value("Regex", "")});
  }
  return out;
}

void RecordSecondaryStatus(store::TrainingJobRecord& record, SecondaryStatus secondary, const std::string& message,
                           int64_t now_millis) {
  auto& transitions = record.state.transitions;
  if (!transitions.empty() && transitions.back().status == secondary) {
    transitions.back().message = message;
  } else {
    if (!transitions.empty()) transitions.back().end_millis = now_millis;
    transitions.push_back(
        {.status = secondary, .start_millis = now_millis, .end_millis = std::nullopt, .message = message});
  }
  record.secondary_status = secondary;
  record.state.status_message = message;
  record.last_modified_millis = now_millis;
}

TrainingController::TrainingController(TrainingControllerOptions options, TrainingControllerDeps deps)
    : options_(std::move(options)), deps_(deps), jobs_(deps.database) {}

TrainingController::~TrainingController() { Shutdown(); }

Status TrainingController::Start() {
  RETURN_IF_ERROR(MakeDirs(options_.work_dir, 0700).WithPrefix("training work dir"));
  // Kept pools first: their grants are as much in use as a running job's.
  AdoptWarmPools();
  ASSIGN_OR_RETURN(auto active, jobs_.ListActive());
  std::vector<std::string> to_queue;
  for (auto& job : active) {
    const Phase phase = job.state.phase;
    if (phase == Phase::kRunning || phase == Phase::kFinishing) {
      std::vector<Allocation> allocations;
      if (job.state.allocations.is_array()) {
        for (const json& a : job.state.allocations) allocations.push_back(a.get<Allocation>());
      }
      Status adopted = deps_.scheduler->Adopt(job.name, allocations, IsManagedSpot(job.request));
      if (!adopted.ok()) {
        KLOG(warn, "could not re-reserve an adopted job's resources",
             {{"job", job.name}, {"error", adopted.ToString()}});
      }
      StartRun(job.name, allocations, /*adopt=*/true);
    } else if (job.status == JobStatus::kStopping) {
      (void)FinishWithoutRunning(job.name, /*max_pending=*/false);
    } else {
      to_queue.push_back(job.name);
    }
  }
  for (const auto& name : to_queue) Submit(name);
  // Capacity freed elsewhere (an endpoint instance going away) must start queued jobs too, not
  // only the end of one of ours: without this a job queued behind an endpoint waited forever.
  deps_.scheduler->SetReleaseListener([this] {
    MutexLock lock(mutex_);
    schedule_needed_ = true;
    wake_.NotifyAll();
  });
  scheduler_thread_ = std::thread([this] { RunScheduler(); });
  return Status::Ok();
}

void TrainingController::Shutdown() {
  // No release may reach this controller once Shutdown starts (and none after it is destroyed).
  if (deps_.scheduler != nullptr) deps_.scheduler->SetReleaseListener({});
  std::map<std::string, std::shared_ptr<TrainingJobRun>> runs;
  {
    MutexLock lock(mutex_);
    if (shutting_down_ && !scheduler_thread_.joinable() && runs_.empty() && finished_runs_.empty()) return;
    shutting_down_ = true;
    runs = runs_;
    wake_.NotifyAll();
  }
  for (auto& [name, run] : runs) run->Shutdown();
  for (auto& [name, run] : runs) run->Join();
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
  // Join the runs that finished before the shutdown without holding mutex_: such a run may still
  // be on its way out through Submit (a retry), which takes mutex_. No run adds itself to
  // finished_runs_ once shutting_down_ is set (OnRunFinished).
  std::vector<std::shared_ptr<TrainingJobRun>> finished;
  {
    MutexLock lock(mutex_);
    finished.swap(finished_runs_);
  }
  for (auto& run : finished) run->Join();
  MutexLock lock(mutex_);
  runs_.clear();
}

void TrainingController::Submit(const std::string& name) {
  auto record = jobs_.Get(name);
  if (!record.ok()) return;
  // Stopped while it waited to resume (an interrupted spot job): nothing to queue.
  if (!store::IsActive(record->status)) return;
  // Stopped in the moment between its run's last write and the run leaving runs_ (a retry or an
  // interruption on its way back to the queue; RequestStop found a run that no longer listens):
  // it ends Stopped now instead of waiting in line.
  if (record->status == JobStatus::kStopping) {
    (void)FinishWithoutRunning(name, /*max_pending=*/false);
    return;
  }
  const json& rc = record->request.value("ResourceConfig", json::object());
  ScheduleRequest request;
  request.id = record->name;
  request.seq = record->seq;
  request.instance_type = rc.value("InstanceType", "");
  request.instance_count = rc.value("InstanceCount", 1);
  // Managed spot runs on preemptible capacity: behind every on-demand job in line, and reclaimed
  // for one that needs the node (Scheduler::Preemptions).
  request.preemptible = IsManagedSpot(record->request);
  const std::optional<int64_t> wait_deadline = MaxWaitDeadline(record->request, record->creation_millis);
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  if (record->state.resume_after_millis && *record->state.resume_after_millis > now) {
    // Interrupted: it waits until capacity "returns" (SpotOptions::restart_delay), showing
    // Interrupted; the scheduler thread submits it again when due (ExpireWaitDeadlines).
    MutexLock lock(mutex_);
    resume_at_.emplace(*record->state.resume_after_millis, record->name);
    if (wait_deadline) wait_deadlines_.emplace(*wait_deadline, record->name);
    schedule_needed_ = true;  // the scheduler thread's next wake is computed again
    wake_.NotifyAll();
    return;
  }
  // A matching warm pool starts it at once, on the kept hosts (§19).
  if (KeepAliveSeconds(record->request) > 0 && ClaimWarmPool(*record)) return;
  Status enqueued = deps_.scheduler->Enqueue(request);
  // Already granted (a pass or a pool's offer got there first): its run carries it on.
  if (enqueued.code() == StatusCode::kAlreadyExists) return;
  if (!enqueued.ok()) {
    std::string why = "ClientError: " + enqueued.message();
    (void)jobs_.Mutate(name, [&](store::TrainingJobRecord& rec) {
      SetStatus(rec, JobStatus::kFailed);
      SetPhase(rec, Phase::kDone);
      rec.state.failure_reason = why;
      RecordSecondaryStatus(rec, SecondaryStatus::kFailed, why, now);
      return Status::Ok();
    });
    return;
  }
  // CreateTrainingJob inserts the row queued already; a retried or re-queued (restart) job is
  // written back to queued here.
  if (record->state.phase != Phase::kQueued) {
    (void)jobs_.Mutate(name, [&](store::TrainingJobRecord& rec) {
      SetPhase(rec, Phase::kQueued);
      return Status::Ok();
    });
  }
  // StoppingCondition.MaxPendingTimeInSeconds: a job that waited that long is stopped (§10). An
  // interrupted spot job waiting to resume is not pending in that sense (MaxWaitTime governs it).
  const int64_t max_pending_seconds =
      record->state.interruptions == 0 ? StoppingSeconds(record->request, "MaxPendingTimeInSeconds", -1) : -1;
  MutexLock lock(mutex_);
  if (max_pending_seconds >= 0) {
    pending_deadlines_.emplace(AddSaturating(record->creation_millis, SecondsToMillisSaturating(max_pending_seconds)),
                               record->name);
  }
  // MaxWaitTimeInSeconds (spot): waiting counts too; the run watches it once the job runs.
  if (wait_deadline) wait_deadlines_.emplace(*wait_deadline, record->name);
  entering_pending_.push_back(record->name);
  schedule_needed_ = true;
  wake_.NotifyAll();
}

std::string TrainingController::PendingMessage(const std::string& job_name) const {
  return deps_.scheduler->WaitingMessage(job_name);
}

void TrainingController::RequestStop(const std::string& name) {
  std::shared_ptr<TrainingJobRun> run;
  {
    MutexLock lock(mutex_);
    auto it = runs_.find(name);
    if (it != runs_.end()) run = it->second;
  }
  if (run) {
    run->RequestStop();
    return;
  }
  // Not granted yet: it leaves the queue and ends Stopped at once.
  deps_.scheduler->Cancel(name);
  (void)FinishWithoutRunning(name, /*max_pending=*/false);
  MutexLock lock(mutex_);
  schedule_needed_ = true;
  wake_.NotifyAll();
}

Status TrainingController::Interrupt(const std::string& name, const std::string& reason) {
  auto record = jobs_.Get(name);
  if (!record.ok()) {
    if (record.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("Requested resource not found: training job " + name + " does not exist.");
    }
    return record.status();
  }
  if (!IsManagedSpot(record->request)) {
    return Status::FailedPrecondition("Training job " + name +
                                      " does not run on spot capacity (EnableManagedSpotTraining is not set); only "
                                      "managed spot jobs are interrupted. Use StopTrainingJob to stop it.");
  }
  if (record->status != JobStatus::kInProgress) {
    return Status::FailedPrecondition("Training job " + name + " is " + std::string(store::ToString(record->status)) +
                                      "; only an InProgress job can be interrupted.");
  }
  std::string refused;
  auto written = jobs_.Mutate(name, [&](store::TrainingJobRecord& rec) {
    const Phase phase = rec.state.phase;
    if (rec.status != JobStatus::kInProgress) {
      refused = "Training job " + name + " is " + std::string(store::ToString(rec.status)) +
                "; only an InProgress job can be interrupted.";
    } else if (rec.state.interrupt_requested) {
      refused = "Training job " + name + " is already being interrupted (" + *rec.state.interrupt_requested + ").";
    } else if (phase != Phase::kStaging && phase != Phase::kRunning) {
      refused = "Training job " + name + " holds no instances to reclaim (" +
                std::string(store::ToString(rec.secondary_status)) + "); it is waiting for capacity or finishing.";
    }
    if (!refused.empty()) return Status::Ok();
    rec.state.interrupt_requested = reason;
    return Status::Ok();
  });
  if (!written.ok()) return written.status();
  if (!refused.empty()) return Status::FailedPrecondition(refused);
  // The run that holds the job now (looked up after the write: a run started since reads the
  // row itself and carries the interruption out from its first step).
  std::shared_ptr<TrainingJobRun> run;
  {
    MutexLock lock(mutex_);
    auto it = runs_.find(name);
    if (it != runs_.end()) run = it->second;
  }
  if (run) run->RequestInterrupt();
  return Status::Ok();
}

Status TrainingController::CheckFeasible(const std::string& instance_type, int instance_count) const {
  return deps_.scheduler->CheckFeasible(instance_type, instance_count);
}

namespace {
// A spot job that trained and ends while it waits to resume: its training ended when it was last
// interrupted (TrainingEndTime, and the times Describe derives from it).
void EndTrainingAtLastInterruption(store::TrainingJobRecord& rec) {
  if (!rec.state.training_start_millis || rec.training_end_millis) return;
  for (auto it = rec.state.transitions.rbegin(); it != rec.state.transitions.rend(); ++it) {
    if (it->status == SecondaryStatus::kInterrupted) {
      rec.training_end_millis = it->start_millis;
      rec.state.training_end_millis = it->start_millis;
      return;
    }
  }
}
}  // namespace

namespace {
// A job that ends without running used up a warm pool it took (stopped between the claim and its
// run): the pool is Terminated; returns the directory to remove once the row is written.
std::string UseUpTakenPool(store::TrainingJobRecord& rec) {
  store::WarmPoolState& w = rec.state.warm_pool;
  if (w.status != store::WarmPoolStatus::kInUse) return "";
  std::string directory = std::move(w.directory);
  w.directory.clear();
  w.status = store::WarmPoolStatus::kTerminated;
  return directory;
}
}  // namespace

Status TrainingController::FinishWithoutRunning(const std::string& name, bool max_pending) {
  int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  std::string taken_pool;
  auto r = jobs_.Mutate(name, [&](store::TrainingJobRecord& rec) {
    if (!store::IsActive(rec.status)) return Status::Ok();
    taken_pool = UseUpTakenPool(rec);
    SetStatus(rec, JobStatus::kStopped);
    SetPhase(rec, Phase::kDone);
    EndTrainingAtLastInterruption(rec);
    rec.state.resume_after_millis.reset();
    RecordSecondaryStatus(rec, SecondaryStatus::kStopped, max_pending ? kMsgMaxPending : kMsgStopped, now);
    rec.state.transitions.back().end_millis = now;
    return Status::Ok();
  });
  if (r.ok() && !taken_pool.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(taken_pool, ec);
  }
  return r.status();
}

Status TrainingController::FinishMaxWait(const std::string& name) {
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  auto r = jobs_.Mutate(name, [&](store::TrainingJobRecord& rec) {
    if (!store::IsActive(rec.status)) return Status::Ok();
    SetStatus(rec, JobStatus::kStopped);
    SetPhase(rec, Phase::kDone);
    rec.state.stop_requested = store::StopRequest::kMaxWaitTime;
    rec.state.resume_after_millis.reset();
    EndTrainingAtLastInterruption(rec);
    // training-contract.md §9: "Starting → Stopping → MaxWaitTimeExceeded" (never got capacity),
    // "… → Interrupted → … → Stopping → MaxWaitTimeExceeded".
    RecordSecondaryStatus(rec, SecondaryStatus::kStopping, kMsgStopping, now);
    RecordSecondaryStatus(rec, SecondaryStatus::kMaxWaitTimeExceeded, kMsgMaxWait, now);
    rec.state.transitions.back().end_millis = now;
    return Status::Ok();
  });
  return r.status();
}

bool TrainingController::ExpireWaitDeadlines() {
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  std::vector<std::string> expired;
  std::vector<std::string> due;
  std::set<std::string> resuming;  // interrupted jobs still waiting to resume
  {
    MutexLock lock(mutex_);
    auto end = wait_deadlines_.upper_bound(now);
    for (auto it = wait_deadlines_.begin(); it != end; ++it) expired.push_back(it->second);
    wait_deadlines_.erase(wait_deadlines_.begin(), end);
    for (const auto& [at, name] : resume_at_) resuming.insert(name);
    // An interrupted job whose wait ran out never resumes.
    for (const auto& name : expired) {
      for (auto it = resume_at_.begin(); it != resume_at_.end();) {
        it = it->second == name ? resume_at_.erase(it) : std::next(it);
      }
    }
    auto due_end = resume_at_.upper_bound(now);
    for (auto it = resume_at_.begin(); it != due_end; ++it) due.push_back(it->second);
    resume_at_.erase(resume_at_.begin(), due_end);
  }
  bool any = false;
  for (const auto& name : expired) {
    // A running job's run watches the deadline itself (and uploads what it trained).
    if (!resuming.count(name) && !deps_.scheduler->IsQueued(name)) continue;
    deps_.scheduler->Cancel(name);
    (void)FinishMaxWait(name);
    any = true;
  }
  for (const auto& name : due) {
    Submit(name);
    any = true;
  }
  return any;
}

void TrainingController::PreemptForOnDemand() {
  for (const Preemption& p : deps_.scheduler->Preemptions()) {
    if (std::string pool = WarmPoolJobOfGrant(p.id); !pool.empty()) {
      TerminateWarmPool(pool, "its capacity is needed by training job " + p.for_id);
      continue;
    }
    Status s = Interrupt(p.id, "spot capacity reclaimed for the on-demand training job " + p.for_id);
    if (!s.ok()) KLOG(info, "spot job not preempted", {{"job", p.id}, {"for", p.for_id}, {"why", s.ToString()}});
  }
}

bool TrainingController::ExpirePendingDeadlines() {
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  std::vector<std::string> expired;
  {
    MutexLock lock(mutex_);
    auto end = pending_deadlines_.upper_bound(now);
    for (auto it = pending_deadlines_.begin(); it != end; ++it) expired.push_back(it->second);
    pending_deadlines_.erase(pending_deadlines_.begin(), end);
  }
  bool any = false;
  for (const auto& name : expired) {
    // Granted (or gone) by now: the deadline no longer applies.
    if (!deps_.scheduler->IsQueued(name)) continue;
    // Queued again after a spot interruption: it ran, so it is not pending (MaxWaitTime governs).
    if (auto record = jobs_.Get(name); record.ok() && record->state.interruptions > 0) continue;
    deps_.scheduler->Cancel(name);
    (void)FinishWithoutRunning(name, /*max_pending=*/true);
    any = true;
  }
  return any;
}

void TrainingController::RunPass() {
  std::vector<Grant> grants = deps_.scheduler->Schedule();
  Status grant_written = Status::Ok();
  // The grants of this pass in one transaction: the phase, the resources (for adoption) and the
  // message. A job that waited for capacity goes from Pending straight to Downloading
  // (control-plane-api.md §9.1); one granted at once shows the provisioning message under
  // Starting. (The intermediate "Launching requested ML instances" would be replaced within the
  // same status before anyone could read it; committing it would only lengthen the job start.)
  if (!grants.empty()) {
    std::map<std::string, const Grant*> by_name;
    std::vector<std::string> names;
    for (const auto& grant : grants) {
      by_name[grant.id] = &grant;
      names.push_back(grant.id);
    }
    const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
    Status persisted = jobs_.MutateEach(names, [&](store::TrainingJobRecord& r) {
      // Stopped while its grant was on the way (RequestStop found no run yet): its run ends at once.
      if (!store::IsActive(r.status)) return false;
      auto it = by_name.find(r.name);
      if (it == by_name.end()) return false;
      const std::vector<Allocation>& allocations = it->second->allocations;
      SetPhase(r, Phase::kStaging);
      json persisted_allocations = json::array();
      for (const auto& a : allocations) persisted_allocations.push_back(a);
      r.state.allocations = persisted_allocations;
      if (r.secondary_status != SecondaryStatus::kPending && r.status != JobStatus::kStopping) {
        RecordSecondaryStatus(r, SecondaryStatus::kStarting, kMsgPreparing + AllocationNote(allocations), now);
      }
      return true;
    });
    // Not written (every row rolled back): each run fails in Prepare with the error, releasing
    // its grant, as a job whose own grant write failed always did.
    grant_written = persisted;
  }
  for (auto& grant : grants) StartRun(grant.id, std::move(grant.allocations), /*adopt=*/false, grant_written);

  // Jobs that entered the queue since the last pass and still wait record Pending once, with what
  // they wait for; their place in line is rendered live when read (TrainingQueueView).
  std::vector<std::string> entering;
  {
    MutexLock lock(mutex_);
    entering.swap(entering_pending_);
  }
  std::vector<std::string> waiting;
  std::map<std::string, std::string> reasons;
  for (const auto& name : entering) {
    std::string reason = deps_.scheduler->WaitingReason(name);
    if (reason.empty()) continue;  // granted (above) or cancelled
    reasons[name] = std::move(reason);
    waiting.push_back(name);
  }
  if (waiting.empty()) return;
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  Status recorded = jobs_.MutateEach(waiting, [&](store::TrainingJobRecord& rec) {
    // An interrupted spot job keeps showing Interrupted ("waiting for capacity") until it starts.
    if (rec.status != JobStatus::kInProgress || rec.secondary_status == SecondaryStatus::kPending ||
        rec.secondary_status == SecondaryStatus::kInterrupted) {
      return false;
    }
    auto it = reasons.find(rec.name);
    RecordSecondaryStatus(rec, SecondaryStatus::kPending, it == reasons.end() ? kMsgWaiting : it->second, now);
    return true;
  });
  if (!recorded.ok())
    KLOG(warn, "Pending not recorded", {{"jobs", std::to_string(waiting.size())}, {"error", recorded.ToString()}});
}

void TrainingController::RunScheduler() {
  MutexLock lock(mutex_);
  while (!shutting_down_) {
    // At most 5 s (MaxPendingTime deadlines are checked on every wake), less when there is work
    // or an interrupted job is due to resume (or its MaxWaitTime ends) sooner.
    int64_t next_due = INT64_MAX;
    if (!resume_at_.empty()) next_due = resume_at_.begin()->first;
    if (!wait_deadlines_.empty()) next_due = std::min(next_due, wait_deadlines_.begin()->first);
    for (const auto& [job, pool] : pools_) next_due = std::min(next_due, pool.expires_millis);
    int64_t wait_ms = 5000;
    if (next_due != INT64_MAX) {
      const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
      wait_ms = std::clamp<int64_t>(next_due - now + 1, 0, 5000);
    }
    const auto wake_by = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (!shutting_down_ && !schedule_needed_ && finished_runs_.empty()) {
      if (wake_.WaitUntil(mutex_, wake_by) == std::cv_status::timeout) break;
    }
    if (shutting_down_) break;
    // Take the finished runs out under the lock and join them without it: runs finishing
    // meanwhile append to finished_runs_ (iterating it unlocked would race with them, and a
    // JobRun destroyed unjoined terminates the process).
    std::vector<std::shared_ptr<TrainingJobRun>> finished;
    finished.swap(finished_runs_);
    lock.Unlock();
    for (auto& run : finished) run->Join();
    finished.clear();
    // A job stopped at the head of the line may let the ones behind it start.
    bool expired = ExpirePendingDeadlines();
    expired |= ExpireWaitDeadlines();
    expired |= ExpireWarmPools();
    // A job at the head of the line that does not fit reclaims warm pools (any job) and spot
    // capacity (an on-demand job).
    PreemptForOnDemand();
    lock.Lock();
    if (!schedule_needed_ && !expired) continue;
    schedule_needed_ = false;
    lock.Unlock();
    RunPass();
    lock.Lock();
  }
}

void TrainingController::StartRun(const std::string& name, std::vector<Allocation> allocations, bool adopt,
                                  Status grant_written) {
  TrainingJobRun::Context context{.options = &options_,
                                  .deps = &deps_,
                                  .jobs = &jobs_,
                                  .on_finished = [this](const std::string& job) { OnRunFinished(job); },
                                  // Queued again, behind nobody it overtook.
                                  .resubmit = [this](const std::string& job) { Submit(job); }};
  auto run = std::make_shared<TrainingJobRun>(std::move(context), name, std::move(allocations), adopt,
                                              std::move(grant_written));
  {
    MutexLock lock(mutex_);
    if (shutting_down_) return;
    runs_[name] = run;
  }
  run->Start();
}

void TrainingController::OnRunFinished(const std::string& name) {
  KeepOrReleaseGrant(name);
  if (deps_.on_run_finished) deps_.on_run_finished(name);
  MutexLock lock(mutex_);
  auto it = runs_.find(name);
  if (it != runs_.end()) {
    if (!shutting_down_) finished_runs_.push_back(it->second);
    if (!shutting_down_) runs_.erase(it);
  }
  schedule_needed_ = true;
  wake_.NotifyAll();
}

}  // namespace kiln::control
