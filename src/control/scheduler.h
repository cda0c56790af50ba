#pragma once
// Scheduler: hands this node's capacity (CPUs by index, memory, GPUs by index) to requests for
// `ml.*` instances, in submission order, on-demand before spot (DESIGN.md §5, training-contract.md
// §1, §9 and §13).
//
// A request asks for `instance_count` instances of one catalog type; it is granted all of them at
// once (a training job's hosts start together) or waits. Each instance gets concrete CPU indices
// (for its cpuset), a memory limit and whole GPUs that no other instance holds.
//
// Shapes (InstanceCatalog) under the policy:
//   kStrict  an instance gets exactly its type's vCPUs, memory and GPUs. A request larger than the
//            whole host can never run: CheckFeasible/Enqueue reject it (ResourceExhausted, which
//            the API answers as ResourceLimitExceeded), saying by how much and naming the option.
//   kShrink  (development boxes) each dimension is capped at what the host has, shared between
//            the request's instances: min(shape, usable / instance_count). Allocation::note says
//            what the instance got instead of its shape.
// GPU types on a host without (suitable) GPUs are rejected unless allow_cpu_fallback; then they
// run with 0 GPUs and the note says so. Reserved CPUs (the lowest-numbered ones) and memory are
// kept back for the server and never granted.
//
// Ordering: the queue holds every non-preemptible (on-demand) request before every preemptible
// (managed spot) one, and each group in `seq` order (ties: enqueue order). Schedule() grants in
// that order while requests fit and stops at the first that does not (head-of-line blocking), so
// jobs start in the order they were submitted even when a later, smaller one would fit; a spot
// request waits behind every queued on-demand one, even one submitted after it. Twenty requests on
// a host that fits two start two at a time, in order, as Release() frees capacity. WaitingMessage's
// place in line and Snapshot's queue follow the same order.
//
// Preemption (managed spot, training-contract.md §9): when the head of the queue is an on-demand
// request that does not fit in what is free now, Preemptions() names preemptible grants whose
// release would let it fit: the most recently granted first, as few as that greedy choice needs
// (a grant whose release turns out not to help is left alone). The scheduler only names them; the
// caller interrupts those jobs and Release()s their grants, and the next Schedule() grants the
// on-demand request. A named grant counts as being freed until it is Released: it is not named
// again, and no further grant is named for the head while the ones being freed suffice. No spot
// grant is named when the head is preemptible or when SchedulerOptions::preempt_for_on_demand is
// false; nothing is named when releasing every candidate would not let the head fit. Warm pools
// (SetReclaimable: a finished job's kept hosts, training-contract.md §19) are candidates for any
// head and go first, oldest first. Other grants (on-demand jobs, endpoint instances) are never named.
//
// Typical use by a controller:
//   RETURN_IF_ERROR(scheduler.CheckFeasible(type, count));      // at create: reject the impossible
//   RETURN_IF_ERROR(scheduler.Enqueue({job, seq, type, count})); // Pending
//   for (Grant& g : scheduler.Schedule()) { ...persist g.allocations, launch... }
//   status_message = scheduler.WaitingMessage(job);               // while still Pending
//   for (Preemption& p : scheduler.Preemptions()) { ...interrupt p.id's spot job... }
//   scheduler.Release(job);                                       // when its instances have exited
// After a server restart, Adopt() each running job's persisted allocations before Schedule().
//
// Thread-safety: every method may be called from any thread (one internal mutex, mu_; the release
// listener has its own, listener_mu_, never held together with mu_).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/status.h"
#include "control/capacity.h"
#include "control/instance_catalog.h"

namespace kiln::control {

enum class ShapePolicy { kStrict, kShrink };

struct SchedulerOptions {
  // What the node has (usually DiscoverHostCapacity(), possibly overridden by config).
  HostCapacity capacity;
  // kShrink lets types larger than the host run on what it has (development boxes); instances then
  // get less than their type promises (SM_NUM_CPUS etc. follow the allocation).
  ShapePolicy policy = ShapePolicy::kStrict;
  // Run GPU instance types with 0 GPUs on a host without GPUs instead of rejecting them.
  bool allow_cpu_fallback = false;
  // Kept back for the server itself; never granted. Reserved CPUs are the lowest-numbered ones.
  uint64_t reserved_memory_bytes = 0;
  int reserved_cpus = 0;
  // Which host GPUs serve a catalog GPU model (limits.md §8: "operators map e.g. A10G-class to
  // their actual cards"): catalog gpu_model -> fnmatch globs over the host GPU name, e.g.
  // {"NVIDIA A10G": ["*A10*", "*RTX 4090*"]}. A model without an entry may use any host GPU.
  std::map<std::string, std::vector<std::string>> gpu_classes;
  // Let Preemptions() name spot grants to reclaim for a queued on-demand request. Off, an on-demand
  // job waits until spot jobs end by themselves (or are interrupted otherwise). Not read from the
  // scheduler section: the server sets it from the `spot` section of the Kiln config.
  bool preempt_for_on_demand = true;
};

// Applies the `scheduler` section of the Kiln config on top of the discovered capacity:
//   {"policy": "strict"|"shrink", "allow_cpu_fallback": bool,
//    "cpus": N | [indices],          N: the first N discovered CPUs; a list: exactly those
//    "memory_gib": x,                replaces the discovered memory
//    "gpus": [index, ...] | [{"index": 0, "uuid": "GPU-..", "name": "..", "memory_gib": 24}, ...],
//                                    indices select discovered GPUs; objects declare GPUs outright
//    "reserved_cpus": N, "reserved_memory_gib": x,
//    "gpu_classes": {"NVIDIA A10G": ["*A10*"]}}
// Every key is optional; null or {} means the discovered capacity with strict shapes.
// InvalidArgument naming the key for bad values or unknown keys (so typos do not pass silently).
Result<SchedulerOptions> SchedulerOptionsFromJson(const nlohmann::json& config_section, HostCapacity discovered);

// One instance (host) of a granted request.
struct Allocation {
  std::vector<int> cpus;               // CPU indices (the instance's cpuset)
  uint64_t memory_bytes = 0;           // memory limit
  std::vector<int> gpus;               // GPU indices (nvidia-smi's), exclusive to this instance
  std::vector<std::string> gpu_uuids;  // same order as gpus
  // Empty when the instance got its type's full shape; otherwise what it got instead, e.g.
  // "shrunk ml.g5.12xlarge (48 vCPUs, 192 GiB, 4 GPUs) to 2 vCPUs, 23 GiB, 0 GPUs (scheduler policy shrink)".
  std::string note;

  bool operator==(const Allocation&) const = default;
};
// JSON form (persisted in job state for adoption after a restart):
//   {"cpus": [0, 1], "memory_bytes": 8589934592, "gpus": [0], "gpu_uuids": ["GPU-.."], "note": ""}
// from_json throws nlohmann::json exceptions on wrong types, like every get<T>(); catch at the call
// site. Missing fields take their defaults.
void to_json(nlohmann::json& j, const Allocation& a);
void from_json(const nlohmann::json& j, Allocation& a);

struct ScheduleRequest {
  std::string id;   // unique among queued and granted requests, e.g. the job's ARN or name
  int64_t seq = 0;  // submission order; lower starts first (ties: enqueue order)
  std::string instance_type;
  int instance_count = 1;
  // A managed-spot training job: queued after every non-preemptible request, and its grant may be
  // named by Preemptions() for an on-demand request that does not fit.
  bool preemptible = false;
};

struct Grant {
  std::string id;
  std::vector<Allocation> allocations;  // one per instance, algo-1 first
};

// A preemptible grant to reclaim: interrupt the job holding `id`, then Release(id), so that the
// queued on-demand request `for_id` can be granted.
struct Preemption {
  std::string id;
  std::string for_id;

  bool operator==(const Preemption&) const = default;
};

// For `kiln status` and tests.
struct SchedulerSnapshot {
  struct Queued {
    std::string id;
    int64_t seq = 0;
    std::string instance_type;
    int instance_count = 0;
    bool preemptible = false;
  };
  std::vector<int> cpus;  // usable (not reserved) CPU indices
  std::vector<int> free_cpus;
  uint64_t memory_bytes = 0;  // usable (not reserved)
  uint64_t free_memory_bytes = 0;
  std::vector<int> gpus;  // GPU indices
  std::vector<int> free_gpus;
  std::vector<Queued> queue;  // in grant order
  std::map<std::string, std::vector<Allocation>> granted;
  std::set<std::string> preemptible;      // the granted ids that are preemptible
  std::set<std::string> being_preempted;  // those named by Preemptions() and not yet Released
};
void to_json(nlohmann::json& j, const SchedulerSnapshot& s);

class Scheduler {
 public:
  // `catalog` must outlive the scheduler.
  Scheduler(SchedulerOptions options, const InstanceCatalog* catalog);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Whether `instance_count` instances of `instance_type` could EVER run on this host under the
  // options (ignoring what is in use now). OK, or:
  //   ResourceExhausted "no capacity for ml.x ..." for a type not in the catalog;
  //   ResourceExhausted for a GPU type on a host without (suitable) GPUs, naming allow_cpu_fallback;
  //   ResourceExhausted for a request larger than the host under strict, with the shortfall per
  //     dimension and the `"policy": "shrink"` option (under shrink: more instances than CPUs);
  //   InvalidArgument for instance_count < 1.
  Status CheckFeasible(const std::string& instance_type, int instance_count) const;

  // Queues a request (CheckFeasible first; its errors are returned and nothing is queued).
  // Idempotent while queued: enqueuing the same id again is OK and changes nothing.
  // AlreadyExists if the id holds a grant.
  Status Enqueue(const ScheduleRequest& request) EXCLUDES(mu_);

  // Grants `request` at once if it fits in what is free now, without queueing and ahead of
  // anything queued: endpoint instances (small, latency-critical, replaced automatically) must
  // not wait behind a training job at the head of the line. The grant is held until Release();
  // it is preemptible if request.preemptible is (endpoints leave it false).
  // Errors: CheckFeasible's (the request can never fit); Unavailable with reason kDoesNotFitNow
  // when it does not fit in what is free now, nothing held, with what it needs and what is short
  // as the message:
  // "ml.m5.xlarge needs 4 vCPUs and 16 GiB; 2 of 6 vCPUs free"; AlreadyExists if the id is
  // queued or granted.
  Result<std::vector<Allocation>> AllocateNow(const ScheduleRequest& request) EXCLUDES(mu_);

  // Grants queued requests in queue order (on-demand before spot, then seq) while they fit; stops
  // at the first that does not. The granted requests leave the queue and hold their resources until
  // Release(); a preemptible request's grant stays preemptible.
  std::vector<Grant> Schedule() EXCLUDES(mu_);

  // The preemptible grants to reclaim now for the head of the queue (see "Preemption" above), each
  // with for_id = the head's id; empty when there is nothing (more) to reclaim. Each id is returned
  // once: later calls leave it out until it is Released (and granted again). The caller should
  // interrupt each named job and Release() its grant when its instances have exited; the grant
  // holds its resources until then. Costs a scan of the grants and a few trial allocations, so
  // callers may run it on every scheduling pass.
  std::vector<Preemption> Preemptions() EXCLUDES(mu_);

  // Moves the grant held by `from` to `to`, resources, spot flag and grant order unchanged, no longer
  // reclaimable (a finished
  // training job's hosts kept as a warm pool, a warm pool taken by the job that reuses it).
  // NotFound if `from` holds no grant; AlreadyExists if `to` is queued or granted.
  Status Transfer(const std::string& from, const std::string& to) EXCLUDES(mu_);
  // Marks a grant as a warm pool's (training-contract.md §19): Preemptions() names it for the head
  // of the queue whatever that is (on-demand or spot, whatever preempt_for_on_demand says), before
  // any spot grant, oldest pool first. The caller terminates the pool and Release()s it. NotFound
  // if `id` holds no grant.
  Status SetReclaimable(const std::string& id, bool reclaimable) EXCLUDES(mu_);
  // Removes a queued request (a job stopped while Pending). No-op if not queued; a granted id
  // keeps its grant (use Release).
  // True when it was queued (and is not any more): whoever Cancel()s it first owns it.
  bool Cancel(const std::string& id) EXCLUDES(mu_);

  // Frees a granted request's resources (and forgets that Preemptions() named it, if it did).
  // No-op for an unknown id. Call Schedule() afterwards to start what now fits; the release
  // listener (below) is told, so the owner of the queue learns of capacity freed by someone else
  // (an endpoint instance released while a job waits).
  void Release(const std::string& id) EXCLUDES(mu_, listener_mu_);

  // `listener` runs after every Release() that freed a grant, on the releasing thread, outside the
  // scheduler's lock; it must be cheap and must not call Release(). Replaces any earlier listener;
  // an empty function removes it, and returns only once no call of the old listener is running
  // (so its owner may be destroyed afterwards).
  void SetReleaseListener(std::function<void()> listener) EXCLUDES(listener_mu_);

  // Re-reserves exactly `allocations` for `id` after a server restart (before Schedule(), so
  // that nothing else is granted the same CPUs or GPUs). All or nothing: FailedPrecondition if a
  // CPU or GPU is not usable on this host (unknown, reserved) or already held, if a GPU index now
  // has another UUID than recorded, or if the memory is not free; AlreadyExists if the id is
  // queued or granted. `preemptible`: the grant is a managed-spot job's (Preemptions() may name it);
  // adopted grants count as granted in the order of the Adopt() calls, before any later grant.
  Status Adopt(const std::string& id, const std::vector<Allocation>& allocations, bool preemptible = false)
      EXCLUDES(mu_);

  // For StatusMessage while Pending: what the request waits for and its place in line, e.g.
  // "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free (2 jobs ahead)".
  // Empty if the id is not queued. Computed from the live queue on every call (O(log n)):
  // callers render it when it is read and never store it, since it changes with every grant.
  std::string WaitingMessage(const std::string& id) const EXCLUDES(mu_);
  // The same without the place in line ("Waiting for compute capacity: ml.m5.large needs ...;
  // 0 of 2 vCPUs free"): what a job records once as it enters Pending. Empty if not queued.
  std::string WaitingReason(const std::string& id) const EXCLUDES(mu_);

  // The grant of `id`, or nullopt if it holds none.
  std::optional<std::vector<Allocation>> Granted(const std::string& id) const EXCLUDES(mu_);
  bool IsQueued(const std::string& id) const EXCLUDES(mu_);
  SchedulerSnapshot Snapshot() const EXCLUDES(mu_);

  const SchedulerOptions& options() const { return options_; }

 private:
  // What one instance of a request receives (the shape after policy).
  struct Need {
    int cpus = 0;
    uint64_t memory_bytes = 0;
    int gpus = 0;
    std::vector<int> eligible_gpus;  // GPU indices of a compatible class
    std::string note;
  };
  struct Queued {
    ScheduleRequest request;
    Need need;
  };
  // A request's place in the queue: on-demand (false) before preemptible (true), then seq.
  using QueueKey = std::pair<bool, int64_t>;
  static QueueKey KeyOf(const ScheduleRequest& r) { return {r.preemptible, r.seq}; }
  // A held grant.
  struct Held {
    std::vector<Allocation> allocations;
    bool preemptible = false;
    uint64_t order = 0;            // grant order (next_grant_order_ when granted): higher is newer
    bool being_preempted = false;  // named by Preemptions(); cleared with the grant on Release
    bool reclaimable = false;      // a warm pool's (SetReclaimable)
  };
  // Free resources, as Allocate() takes from them.
  struct Pools {
    std::vector<int> cpus;  // ascending
    uint64_t memory = 0;
    std::vector<int> gpus;  // ascending
  };

  // The per-instance shape of a request under the options, or why it can never run.
  // Uses only constant members: no lock needed.
  Result<Need> ComputeNeed(const std::string& instance_type, int instance_count) const;
  std::vector<int> EligibleGpus(const std::string& gpu_model) const;
  bool IsQueuedLocked(const std::string& id) const REQUIRES(mu_);
  // The queued entry of `id` and how many entries are ahead of it, or nullptr.
  const Queued* FindQueuedLocked(const std::string& id, size_t* ahead) const REQUIRES(mu_);
  // "<type> needs 4 vCPUs and 16 GiB; 2 of 6 vCPUs free": the request's whole need and each
  // dimension that is short now (no "; ..." part when nothing is).
  std::string ShortfallLocked(const std::string& instance_type, const Need& need, int count) const REQUIRES(mu_);
  // Takes the resources of `count` instances of `need` from `pools`, or returns nullopt and leaves
  // `pools` in an unspecified state (callers pass a copy). Uses only constant members.
  std::optional<std::vector<Allocation>> Allocate(const Need& need, int count, Pools& pools) const;
  // Takes the resources of `count` instances of `need` from the free pools, or returns nullopt
  // and changes nothing.
  std::optional<std::vector<Allocation>> TryAllocateLocked(const Need& need, int count) REQUIRES(mu_);
  // Records a grant of `id` (a new grant order).
  void HoldLocked(const std::string& id, std::vector<Allocation> allocations, bool preemptible) REQUIRES(mu_);
  void FreeLocked(const std::vector<Allocation>& allocations) REQUIRES(mu_);
  std::string HolderOfCpuLocked(int cpu) const REQUIRES(mu_);
  std::string HolderOfGpuLocked(int gpu) const REQUIRES(mu_);

  // Constant after construction.
  const SchedulerOptions options_;
  const InstanceCatalog* const catalog_;
  std::vector<int> usable_cpus_;          // capacity.cpus minus the reserved ones, ascending
  uint64_t usable_memory_ = 0;            // capacity.memory_bytes minus reserved_memory_bytes
  std::map<int, std::string> gpu_uuids_;  // GPU index -> UUID

  mutable Mutex mu_;
  // Guards release_listener_ and is held while it runs (SetReleaseListener waits out a call).
  Mutex listener_mu_;
  std::function<void()> release_listener_ GUARDED_BY(listener_mu_);
  std::vector<int> free_cpus_ GUARDED_BY(mu_);  // ascending
  uint64_t free_memory_ GUARDED_BY(mu_) = 0;
  std::vector<int> free_gpus_ GUARDED_BY(mu_);  // ascending
  // A deque: Schedule() takes from the front, so a grant costs O(1) however long the queue is.
  std::deque<Queued> queue_ GUARDED_BY(mu_);  // sorted by KeyOf (stable)
  // id -> KeyOf of every queued request: IsQueued, Enqueue's idempotence and a request's place in
  // line (WaitingMessage, read by every Describe of a Pending job) in O(log n), not a scan.
  std::unordered_map<std::string, QueueKey> queued_key_ GUARDED_BY(mu_);
  std::map<std::string, Held> granted_ GUARDED_BY(mu_);
  uint64_t next_grant_order_ GUARDED_BY(mu_) = 0;
};

}  // namespace kiln::control
