// TrainingController: warm pools (training_controller.h, warm_pools.h; training-contract.md §19).
//
// A pool's life: the job's run ends with its row saying Available (TrainingJobRun::Finish decides,
// from the row's KeepAlivePeriodInSeconds) → OnRunFinished moves the job's grant to
// WarmPoolGrantId(job) and records the pool in pools_ → a matching job submitted meanwhile takes
// it (ClaimWarmPool: Reused / InUse, the grant moves again, the run starts at once and takes the
// kept directories) — or it expires, is reclaimed for a queued job that needs the capacity, or
// UpdateTrainingJob sets its period to 0 (TerminateWarmPool: Terminated).
//
// pools_ is claimed under mutex_ (an entry is erased by whoever acts on it), so a pool is reused
// or terminated exactly once even when a submission and the scheduler thread race for it; the row
// writes follow outside the lock.

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/log.h"
#include "control/training_controller.h"
#include "control/training_plan.h"
#include "control/training_states.h"
#include "control/warm_pools.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::SecondaryStatus;
using store::WarmPoolStatus;
using Phase = store::TrainingPhase;
using namespace training;  // IsManagedSpot, AllocationNote

std::vector<Allocation> AllocationsFromJson(const json& allocations) {
  std::vector<Allocation> out;
  if (!allocations.is_array()) return out;
  for (const json& a : allocations) out.push_back(a.get<Allocation>());
  return out;
}

void RemoveDirectory(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace

bool TrainingController::ClaimWarmPool(const store::TrainingJobRecord& record) {
  if (record.state.phase != Phase::kQueued || IsManagedSpot(record.request)) return false;
  std::string kept_job;
  {
    MutexLock lock(mutex_);
    if (shutting_down_) return false;
    int64_t oldest = INT64_MAX;
    for (const auto& [job, pool] : pools_) {
      if (pool.kept_millis < oldest && WarmPoolMatches(pool.request, record.request)) {
        oldest = pool.kept_millis;
        kept_job = job;
      }
    }
    if (kept_job.empty()) return false;
    pools_.erase(kept_job);
  }
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  // The kept job hands its pool on.
  store::WarmPoolState handed;
  auto reused = jobs_.Mutate(kept_job, [&](store::TrainingJobRecord& rec) {
    store::WarmPoolState& w = rec.state.warm_pool;
    if (w.status != WarmPoolStatus::kAvailable) return Status::FailedPrecondition("the pool is no longer Available");
    handed = w;
    w.status = WarmPoolStatus::kReused;
    w.retained_millis = std::max<int64_t>(now - w.available_since_millis, 0);
    w.reused_by_job = record.name;
    w.expires_millis = 0;
    w.directory.clear();
    w.allocations = json();
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  const std::string grant_id = WarmPoolGrantId(kept_job);
  if (!reused.ok()) {
    KLOG(warn, "warm pool not reused",
         {{"pool", kept_job}, {"job", record.name}, {"error", reused.status().ToString()}});
    deps_.scheduler->Release(grant_id);
    RemoveDirectory(handed.directory);
    return false;
  }
  Status moved = deps_.scheduler->Transfer(grant_id, record.name);
  if (moved.ok()) moved = deps_.scheduler->SetReclaimable(record.name, false);
  std::optional<std::vector<Allocation>> allocations = deps_.scheduler->Granted(record.name);
  if (!moved.ok() || !allocations) {
    // The kept grant is gone (a bug, or the scheduler's state lost): the job queues as usual.
    KLOG(error, "warm pool grant not handed on",
         {{"pool", kept_job}, {"job", record.name}, {"error", moved.ToString()}});
    deps_.scheduler->Release(grant_id);
    RemoveDirectory(handed.directory);
    return false;
  }
  json persisted_allocations = json::array();
  for (const auto& a : *allocations) persisted_allocations.push_back(a);
  auto granted = jobs_.Mutate(record.name, [&](store::TrainingJobRecord& rec) {
    if (!store::IsActive(rec.status) || rec.state.phase != Phase::kQueued) {
      return Status::FailedPrecondition("the job is no longer waiting");
    }
    SetPhase(rec, Phase::kStaging);
    rec.state.allocations = persisted_allocations;
    store::WarmPoolState& w = rec.state.warm_pool;
    w = store::WarmPoolState{};
    w.status = WarmPoolStatus::kInUse;
    w.reused_from_job = kept_job;
    w.chain_start_millis = handed.chain_start_millis != 0 ? handed.chain_start_millis : handed.available_since_millis;
    w.directory = handed.directory;  // the run takes the kept files from here (Prepare, Stage)
    RecordSecondaryStatus(rec, SecondaryStatus::kStarting,
                          "Reusing the warm pool of training job " + kept_job + AllocationNote(*allocations), now);
    return Status::Ok();
  });
  if (!granted.ok()) {
    // Stopped meanwhile: the pool it took is gone with it.
    deps_.scheduler->Release(record.name);
    RemoveDirectory(handed.directory);
    return false;
  }
  KLOG(info, "warm pool reused", {{"pool", kept_job}, {"job", record.name}});
  StartRun(record.name, std::move(*allocations), /*adopt=*/false);
  return true;
}

void TrainingController::KeepOrReleaseGrant(const std::string& name) {
  auto record = jobs_.Get(name);
  const bool keep = record.ok() && record->state.warm_pool.status == WarmPoolStatus::kAvailable &&
                    deps_.scheduler->Granted(name).has_value();
  if (!keep) {
    deps_.scheduler->Release(name);
    // A row that says Available with no grant to keep (an adopted job whose resources could not be
    // re-reserved): the pool is over before it began.
    if (record.ok() && record->state.warm_pool.status == WarmPoolStatus::kAvailable) {
      TerminateWarmPool(name, "its grant is gone", /*claimed=*/true);
    }
    return;
  }
  const std::string grant_id = WarmPoolGrantId(name);
  if (Status moved = deps_.scheduler->Transfer(name, grant_id); !moved.ok()) {
    KLOG(error, "warm pool grant not kept", {{"job", name}, {"error", moved.ToString()}});
    deps_.scheduler->Release(name);
    TerminateWarmPool(name, "its grant could not be kept", /*claimed=*/true);
    return;
  }
  bool changed_meanwhile = false;
  {
    MutexLock lock(mutex_);
    pools_[name] = KeptPool{record->request, record->state.warm_pool.expires_millis,
                            record->state.warm_pool.available_since_millis};
    changed_meanwhile = pending_pool_changes_.erase(name) != 0;
  }
  KLOG(info, "warm pool kept",
       {{"job", name}, {"until_millis", std::to_string(record->state.warm_pool.expires_millis)}});
  // A matching job already in line takes it first; only then may the scheduler reclaim it for
  // whatever waits (before, the job in line would see its own pool reclaimed for it).
  OfferPoolToQueue(record->request);
  (void)deps_.scheduler->SetReclaimable(grant_id, true);  // NotFound: a job took it meanwhile
  // UpdateTrainingJob changed the period after the row said Available and before the pool was
  // registered here (the run was still cleaning up or holding the hosts): it applies now.
  if (changed_meanwhile) WarmPoolChanged(name);
  MutexLock lock(mutex_);
  schedule_needed_ = true;
  wake_.NotifyAll();
}

void TrainingController::OfferPoolToQueue(const json& kept_request) {
  // A matching job submitted while the pool's job was finishing (its row already Completed, its
  // grant not yet kept) waits in line: it takes the pool now, as it would have at submission.
  for (const auto& queued : deps_.scheduler->Snapshot().queue) {
    auto record = jobs_.Get(queued.id);
    if (!record.ok() || !WarmPoolMatches(kept_request, record->request)) continue;
    // Only the thread that takes the job out of line may hand it a pool: a pass may have granted
    // it since the snapshot (its run is starting), or another pool's offer taken it.
    if (!deps_.scheduler->Cancel(queued.id)) continue;
    if (ClaimWarmPool(*record)) return;
    Submit(queued.id);  // the pool went elsewhere meanwhile: back in line, in its place
  }
}

void TrainingController::TerminateWarmPool(const std::string& name, const std::string& why, bool claimed) {
  {
    // Whoever erases the entry acts on the pool: a job claiming it at this moment (ClaimWarmPool)
    // keeps it.
    MutexLock lock(mutex_);
    if (pools_.erase(name) == 0 && !claimed) return;
  }
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  std::string directory;
  auto ended = jobs_.Mutate(name, [&](store::TrainingJobRecord& rec) {
    store::WarmPoolState& w = rec.state.warm_pool;
    if (w.status != WarmPoolStatus::kAvailable) return Status::Ok();
    directory = w.directory;
    w.status = WarmPoolStatus::kTerminated;
    w.retained_millis = std::max<int64_t>(std::min(now, w.expires_millis) - w.available_since_millis, 0);
    w.expires_millis = 0;
    w.directory.clear();
    w.allocations = json();
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  if (!ended.ok()) KLOG(warn, "warm pool end not recorded", {{"job", name}, {"error", ended.status().ToString()}});
  deps_.scheduler->Release(WarmPoolGrantId(name));
  RemoveDirectory(directory);
  KLOG(info, "warm pool terminated", {{"job", name}, {"why", why}});
}

bool TrainingController::ExpireWarmPools() {
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  std::vector<std::string> expired;
  {
    MutexLock lock(mutex_);
    for (const auto& [job, pool] : pools_) {
      if (pool.expires_millis <= now) expired.push_back(job);
    }
  }
  for (const auto& job : expired) TerminateWarmPool(job, "its KeepAlivePeriodInSeconds ended");
  return !expired.empty();
}

void TrainingController::WarmPoolChanged(const std::string& name) {
  auto record = jobs_.Get(name);
  if (!record.ok() || record->state.warm_pool.status != WarmPoolStatus::kAvailable) return;
  {
    MutexLock lock(mutex_);
    if (pools_.count(name) == 0) {
      // Not registered yet (KeepOrReleaseGrant applies the change then), or being reused or ended
      // right now (then the name is never looked up again).
      pending_pool_changes_.insert(name);
      return;
    }
  }
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  const store::WarmPoolState& w = record->state.warm_pool;
  const int64_t expires = WarmPoolExpiry(now, KeepAliveSeconds(record->request), w.chain_start_millis);
  if (expires <= now) {
    TerminateWarmPool(name, "UpdateTrainingJob set KeepAlivePeriodInSeconds to 0");
    return;
  }
  auto written = jobs_.Mutate(name, [&](store::TrainingJobRecord& rec) {
    if (rec.state.warm_pool.status == WarmPoolStatus::kAvailable) rec.state.warm_pool.expires_millis = expires;
    return Status::Ok();
  });
  if (!written.ok()) return;
  MutexLock lock(mutex_);
  auto it = pools_.find(name);
  if (it == pools_.end()) return;
  it->second.expires_millis = expires;
  it->second.request = written->request;
  wake_.NotifyAll();
}

void TrainingController::AdoptWarmPools() {
  store::ListFilter available;
  available.warm_pool_status_equals = std::string(store::ToString(WarmPoolStatus::kAvailable));
  auto kept = jobs_.List(available);
  if (!kept.ok()) {
    KLOG(warn, "warm pools not read", {{"error", kept.status().ToString()}});
    return;
  }
  const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
  for (const auto& job : *kept) {
    const store::WarmPoolState& w = job.state.warm_pool;
    Status adopted = w.expires_millis > now
                         ? deps_.scheduler->Adopt(WarmPoolGrantId(job.name), AllocationsFromJson(w.allocations))
                         : Status::DeadlineExceeded("expired while no server ran");
    if (adopted.ok()) adopted = deps_.scheduler->SetReclaimable(WarmPoolGrantId(job.name), true);
    if (!adopted.ok()) {
      TerminateWarmPool(job.name, "not kept across the restart: " + adopted.ToString(), /*claimed=*/true);
      continue;
    }
    MutexLock lock(mutex_);
    pools_[job.name] = KeptPool{job.request, w.expires_millis, w.available_since_millis};
  }
  SweepWarmPoolDirectories();
}

void TrainingController::SweepWarmPoolDirectories() {
  // Kept or taken directories no row refers to any more (a server that died between the steps of
  // a hand-over): nothing will ever take them.
  std::set<std::string> referenced;
  store::ListFilter any;
  auto rows = jobs_.List(any);
  if (!rows.ok()) return;
  for (const auto& job : *rows) {
    const store::WarmPoolState& w = job.state.warm_pool;
    if (!w.directory.empty()) referenced.insert(w.directory);
  }
  std::error_code ec;
  const std::string root = options_.work_dir + "/.warm-pools";
  for (auto it = std::filesystem::directory_iterator(root, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    if (referenced.count(it->path().string()) != 0) continue;
    std::error_code removed;
    std::filesystem::remove_all(it->path(), removed);
    KLOG(info, "stale warm pool directory removed", {{"directory", it->path().string()}});
  }
}

}  // namespace kiln::control
