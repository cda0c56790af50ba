#pragma once
// InstanceMetrics: the instance metrics SageMaker publishes for training hosts and endpoint
// instances (training-contract.md §15, serving-contract.md §15.3), sampled from the runtime
// (Runtime::Usage: the instance's cgroup or its processes in /proc), the filesystem holding its
// /opt/ml, and nvidia-smi, every `interval` (10 s), into the MetricStore:
//
//   CPUUtilization        Σ over cores, 0–100 × vCPUs: CPU time used between two samples / wall time
//   MemoryUtilization     0–100 of the instance's memory limit (the host's memory when it has none)
//   DiskUtilization       0–100 of the filesystem holding its /opt/ml (used / (used + available), as df)
//   GPUUtilization        Σ over its GPUs of utilization.gpu, 0–100 × GPUs (only with GPUs)
//   GPUMemoryUtilization  Σ over its GPUs of memory.used / memory.total, 0–100 × GPUs (only with GPUs)
//
// Every metric is written, with unit Percent, under each dimension set of the instance: a
// training host has {Host=<job>/algo-<n>} in /aws/sagemaker/TrainingJobs; an endpoint instance
// has {EndpointName, VariantName} (one series that all the variant's instances write into, so
// its statistics are over the instances, as CloudWatch's are) and Kiln's
// {Host=<endpoint>/<variant>/<instance-id>} in /aws/sagemaker/Endpoints.
//
// CPU needs two samples: an instance's first sample (taken right after Track, not a whole
// interval later) gives memory and disk only. A sample whose cumulative CPU time went backwards
// (a process of the tree ended between two /proc reads, so its time was briefly in neither it
// nor its parent) gives no CPU point and keeps the earlier baseline.
//
// Instances that are not running (Usage: FailedPrecondition/NotFound) are dropped from tracking,
// so a caller that misses an Untrack leaks nothing; tracking is capped at max_instances.
//
// Thread-safety: all public methods may be called from any thread. One sampling thread; the
// runtime, the store and nvidia-smi are called without the lock held.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "observe/metric_store.h"
#include "runtime/gpus.h"
#include "runtime/runtime.h"

namespace kiln::control {

inline constexpr char kTrainingMetricsNamespace[] = "/aws/sagemaker/TrainingJobs";
inline constexpr char kEndpointInstanceMetricsNamespace[] = "/aws/sagemaker/Endpoints";

struct InstanceMetricsOptions {
  // Time between samples. SageMaker's is 60 s for training and endpoints; the issue asks for 10 s.
  // Each round costs one /proc scan (or a few cgroup reads) per instance and one nvidia-smi run
  // when any instance has GPUs.
  std::chrono::milliseconds interval{10'000};
  // MemoryUtilization's denominator for instances without a memory limit; 0: /proc/meminfo's
  // MemTotal, read once.
  uint64_t host_memory_bytes = 0;
  // The GPU query (runtime::SampleGpuUsage); DefaultGpuUsageCommand() unless configured.
  std::vector<std::string> gpu_command = runtime::DefaultGpuUsageCommand();
  std::chrono::milliseconds gpu_timeout{5'000};
  // Replaces the nvidia-smi run (tests).
  std::function<Result<std::vector<runtime::GpuUsage>>()> gpu_sampler;
  // Instances tracked at most; Track beyond it is refused (ResourceExhausted).
  size_t max_instances = 4096;
  const Clock* clock = nullptr;  // the points' timestamps; nullptr: the system clock
};

// What to publish for one instance.
struct InstanceMetricsTarget {
  std::string instance_id;                          // the runtime's id
  std::string ns;                                   // the namespace of its points
  std::vector<observe::Dimensions> dimension_sets;  // each metric is written under each set
  std::string opt_ml_dir;                           // host directory of its /opt/ml (DiskUtilization); "" for none
  // A multi-container endpoint instance's other containers (serving-contract.md §8, §15.3: the
  // metrics cover all containers of the instance): their runtime ids, whose CPU time, memory and
  // memory limits are added to `instance_id`'s (one measured with another source, or not
  // running, is left out).
  std::vector<std::string> more_instance_ids = {};
};

// The dimension sets of a training host / an endpoint instance (see the file comment).
InstanceMetricsTarget TrainingHostMetricsTarget(const std::string& instance_id, const std::string& job,
                                                const std::string& host, const std::string& opt_ml_dir);
InstanceMetricsTarget EndpointInstanceMetricsTarget(const std::string& instance_id, const std::string& endpoint,
                                                    const std::string& variant, const std::string& endpoint_instance_id,
                                                    const std::string& opt_ml_dir);

class InstanceMetrics {
 public:
  // `runtime` and `store` must outlive this object.
  InstanceMetrics(InstanceMetricsOptions options, runtime::Runtime* runtime, observe::MetricStore* store);
  ~InstanceMetrics();  // Stop()
  InstanceMetrics(const InstanceMetrics&) = delete;
  InstanceMetrics& operator=(const InstanceMetrics&) = delete;

  // Starts the sampling thread (idempotent).
  void Start() EXCLUDES(mutex_);
  // Stops and joins it (idempotent). Tracked instances stay tracked for a later Start().
  void Stop() EXCLUDES(mutex_);

  // Samples `target.instance_id` from now on (replacing an earlier target of that id, and its CPU
  // baseline). InvalidArgument without an id or dimension set; ResourceExhausted at max_instances.
  Status Track(InstanceMetricsTarget target) EXCLUDES(mutex_);
  // Stops sampling it; unknown ids are ignored.
  void Untrack(const std::string& instance_id) EXCLUDES(mutex_);

  // One sampling round of every tracked instance, now, on the calling thread (what the thread
  // does every interval). Returns the points written.
  size_t TEST_SampleOnce() EXCLUDES(mutex_, round_mutex_);
  size_t TEST_Tracked() const EXCLUDES(mutex_);

 private:
  struct Entry {
    InstanceMetricsTarget target;
    uint64_t generation = 0;  // a Track of the same id makes a new entry
    // The last CPU sample: cumulative CPU time (of `source`) at a steady-clock time.
    std::optional<uint64_t> cpu_usec;
    std::string cpu_source;
    std::chrono::steady_clock::time_point cpu_at{};
  };

  void Run() EXCLUDES(mutex_);
  // Samples the entries selected by `only_new` (no baseline yet) or all; returns points written.
  size_t SampleRound(bool only_new) EXCLUDES(mutex_, round_mutex_);
  // SampleRound's steps, in order (types defined in the .cc). Only the first and last (and the
  // GPU query's warn-once flag) take mutex_; the runtime, nvidia-smi and the store are called
  // without it. Each runs inside one round (round_mutex_).
  struct Sample;
  struct RoundOutcome;
  // Copies the selected entries (and their CPU baselines) out of entries_.
  std::vector<Sample> SelectSamples(bool only_new) REQUIRES(round_mutex_) EXCLUDES(mutex_);
  // Reads each sample's usage; true when any instance has GPUs.
  bool ReadUsage(std::vector<Sample>& samples) REQUIRES(round_mutex_) EXCLUDES(mutex_);
  // The GPU query's figures by GPU index; empty (warned once) when it fails.
  std::map<int, runtime::GpuUsage> ReadGpuTable() REQUIRES(round_mutex_) EXCLUDES(mutex_);
  // One sample's points (into outcome.batches), its new CPU baseline, or its being gone.
  void Evaluate(const Sample& s, const std::map<int, runtime::GpuUsage>& gpus, RoundOutcome& outcome) const
      REQUIRES(round_mutex_) EXCLUDES(mutex_);
  // Stores each namespace's points; returns those stored.
  size_t PutBatches(const std::map<std::string, std::vector<observe::MetricDatum>>& batches) REQUIRES(round_mutex_)
      EXCLUDES(mutex_);
  // Records the new baselines and drops gone instances, skipping entries untracked or re-tracked
  // since SelectSamples.
  void ApplyOutcome(const std::vector<Sample>& samples, const RoundOutcome& outcome) REQUIRES(round_mutex_)
      EXCLUDES(mutex_);
  Result<std::vector<runtime::GpuUsage>> SampleGpus();
  int64_t NowMillis() const { return options_.clock ? options_.clock->NowMillis() : Clock::System().NowMillis(); }

  const InstanceMetricsOptions options_;
  runtime::Runtime* const runtime_;
  observe::MetricStore* const store_;
  uint64_t host_memory_bytes_ = 0;
  const double max_cpu_percent_;  // 100 × the host's CPUs: a bound for a torn sample

  mutable Mutex mutex_;
  CondVar cv_;
  std::map<std::string, Entry> entries_ GUARDED_BY(mutex_);
  uint64_t next_generation_ GUARDED_BY(mutex_) = 1;
  bool have_new_ GUARDED_BY(mutex_) = false;  // an entry waits for its first sample
  bool stop_ GUARDED_BY(mutex_) = false;
  bool gpu_warned_ GUARDED_BY(mutex_) = false;
  // Started under mutex_ (Start), joined by Stop without it: Start and Stop are the owner's, never
  // concurrent with each other, so it carries no GUARDED_BY.
  std::thread thread_;
  // One round at a time (the thread, TEST_SampleOnce); it guards no member, only serialises
  // SampleRound, and is taken before mutex_.
  Mutex round_mutex_ ACQUIRED_BEFORE(mutex_);
};

}  // namespace kiln::control
