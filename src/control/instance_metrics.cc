#include "control/instance_metrics.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <set>

#include "base/fs.h"
#include "base/log.h"
#include "control/capacity.h"

namespace kiln::control {
namespace {

constexpr char kPercent[] = "Percent";

// DiskUtilization of the filesystem holding `dir`: used / (used + available to unprivileged
// users) × 100, the figure `df` prints (the root-reserved blocks count as neither).
std::optional<double> DiskPercent(const std::string& dir) {
  if (dir.empty()) return std::nullopt;
  struct statvfs st;
  if (statvfs(dir.c_str(), &st) != 0) return std::nullopt;
  double used = static_cast<double>(st.f_blocks - st.f_bfree) * static_cast<double>(st.f_frsize);
  double avail = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
  if (used + avail <= 0) return std::nullopt;
  return std::clamp(used / (used + avail) * 100.0, 0.0, 100.0);
}

uint64_t HostMemoryBytes() {
  Result<std::string> meminfo = ReadFile("/proc/meminfo");
  if (!meminfo.ok()) return 0;
  return ParseMemInfoTotal(*meminfo).value_or(0);
}

}  // namespace

InstanceMetricsTarget TrainingHostMetricsTarget(const std::string& instance_id, const std::string& job,
                                                const std::string& host, const std::string& opt_ml_dir) {
  return {instance_id, kTrainingMetricsNamespace, {{{"Host", job + "/" + host}}}, opt_ml_dir};
}

InstanceMetricsTarget EndpointInstanceMetricsTarget(const std::string& instance_id, const std::string& endpoint,
                                                    const std::string& variant, const std::string& endpoint_instance_id,
                                                    const std::string& opt_ml_dir) {
  return {instance_id,
          kEndpointInstanceMetricsNamespace,
          {{{"EndpointName", endpoint}, {"VariantName", variant}},
           {{"Host", endpoint + "/" + variant + "/" + endpoint_instance_id}}},
          opt_ml_dir};
}

InstanceMetrics::InstanceMetrics(InstanceMetricsOptions options, runtime::Runtime* runtime, observe::MetricStore* store)
    : options_(std::move(options)),
      runtime_(runtime),
      store_(store),
      max_cpu_percent_(100.0 * std::max(1u, std::thread::hardware_concurrency())) {
  host_memory_bytes_ = options_.host_memory_bytes != 0 ? options_.host_memory_bytes : HostMemoryBytes();
}

InstanceMetrics::~InstanceMetrics() { Stop(); }

void InstanceMetrics::Start() {
  MutexLock lock(mutex_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void InstanceMetrics::Stop() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
    cv_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

Status InstanceMetrics::Track(InstanceMetricsTarget target) {
  if (target.instance_id.empty()) return Status::InvalidArgument("instance metrics: no instance id");
  if (target.ns.empty() || target.dimension_sets.empty()) {
    return Status::InvalidArgument("instance metrics: " + target.instance_id + " has no namespace or dimensions");
  }
  MutexLock lock(mutex_);
  if (entries_.size() >= options_.max_instances && !entries_.contains(target.instance_id)) {
    return Status::ResourceExhausted("instance metrics: already sampling " + std::to_string(entries_.size()) +
                                     " instances");
  }
  Entry entry;
  entry.generation = next_generation_++;
  std::string id = target.instance_id;
  entry.target = std::move(target);
  entries_[id] = std::move(entry);
  have_new_ = true;
  cv_.NotifyAll();
  return Status::Ok();
}

void InstanceMetrics::Untrack(const std::string& instance_id) {
  MutexLock lock(mutex_);
  entries_.erase(instance_id);
}

size_t InstanceMetrics::TEST_SampleOnce() { return SampleRound(/*only_new=*/false); }

size_t InstanceMetrics::TEST_Tracked() const {
  MutexLock lock(mutex_);
  return entries_.size();
}

void InstanceMetrics::Run() {
  MutexLock lock(mutex_);
  auto next = std::chrono::steady_clock::now() + options_.interval;
  while (!stop_) {
    // Until stopped, a new entry, or the next full round is due.
    while (!stop_ && !have_new_) {
      if (cv_.WaitUntil(mutex_, next) == std::cv_status::timeout) break;
    }
    if (stop_) break;
    const auto now = std::chrono::steady_clock::now();
    const bool full = now >= next;
    have_new_ = false;
    lock.Unlock();
    SampleRound(/*only_new=*/!full);
    lock.Lock();
    if (full) {
      next += options_.interval;
      // A round that overran (a slow nvidia-smi) is not made up with a burst of rounds.
      if (next <= std::chrono::steady_clock::now()) next = std::chrono::steady_clock::now() + options_.interval;
    }
  }
}

Result<std::vector<runtime::GpuUsage>> InstanceMetrics::SampleGpus() {
  if (options_.gpu_sampler) return options_.gpu_sampler();
  return runtime::SampleGpuUsage(options_.gpu_command, options_.gpu_timeout);
}

// One instance's part of a round: its entry as the round found it (id, generation, target, CPU
// baseline), then what the round read.
struct InstanceMetrics::Sample {
  std::string id;
  uint64_t generation;
  InstanceMetricsTarget target;
  std::optional<uint64_t> cpu_usec;
  std::string cpu_source;
  std::chrono::steady_clock::time_point cpu_at;
  // Results.
  Result<runtime::InstanceUsage> usage = Status::Unavailable("not sampled");
  std::chrono::steady_clock::time_point sampled_at{};
  int64_t timestamp_millis = 0;
};

// What a round decided, applied to entries_ at its end (only to entries not re-tracked meanwhile).
struct InstanceMetrics::RoundOutcome {
  struct Baseline {
    uint64_t cpu_usec;
    std::string source;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, std::vector<observe::MetricDatum>> batches;  // by namespace
  std::set<std::string> gone;                                        // ids whose instance is not running
  std::map<std::string, Baseline> baselines;                         // new CPU baselines by id
};

namespace {

using MetricValues = std::vector<std::pair<const char*, double>>;

// GPUUtilization / GPUMemoryUtilization: sums over the instance's GPUs that the query reported.
void AppendGpuValues(const std::vector<int>& indices, const std::map<int, runtime::GpuUsage>& gpus,
                     MetricValues& values) {
  double util = 0, mem = 0;
  bool have_util = false, have_mem = false;
  for (int index : indices) {
    auto it = gpus.find(index);
    if (it == gpus.end()) continue;
    if (it->second.utilization_percent) {
      util += *it->second.utilization_percent;
      have_util = true;
    }
    if (it->second.memory_percent) {
      mem += *it->second.memory_percent;
      have_mem = true;
    }
  }
  if (have_util) values.emplace_back("GPUUtilization", util);
  if (have_mem) values.emplace_back("GPUMemoryUtilization", mem);
}

// Every value under every dimension set of `target`.
void AppendPoints(const InstanceMetricsTarget& target, int64_t timestamp_millis, const MetricValues& values,
                  std::vector<observe::MetricDatum>& batch) {
  for (const observe::Dimensions& dims : target.dimension_sets) {
    for (const auto& [name, value] : values) {
      observe::MetricDatum d;
      d.name = name;
      d.dimensions = dims;
      d.timestamp_millis = timestamp_millis;
      d.value = value;
      d.unit = kPercent;
      batch.push_back(std::move(d));
    }
  }
}

}  // namespace

// A round: select the entries, read their usage (and the GPUs, once), turn it into points,
// store them, then record new baselines and drop the instances that are gone.
size_t InstanceMetrics::SampleRound(bool only_new) {
  MutexLock round(round_mutex_);
  std::vector<Sample> samples = SelectSamples(only_new);
  if (samples.empty()) return 0;
  const bool any_gpus = ReadUsage(samples);
  const std::map<int, runtime::GpuUsage> gpus = any_gpus ? ReadGpuTable() : std::map<int, runtime::GpuUsage>{};
  RoundOutcome outcome;
  for (const Sample& s : samples) Evaluate(s, gpus, outcome);
  const size_t written = PutBatches(outcome.batches);
  ApplyOutcome(samples, outcome);
  return written;
}

std::vector<InstanceMetrics::Sample> InstanceMetrics::SelectSamples(bool only_new) {
  std::vector<Sample> samples;
  MutexLock lock(mutex_);
  for (const auto& [id, e] : entries_) {
    if (only_new && e.cpu_usec.has_value()) continue;
    samples.push_back({id, e.generation, e.target, e.cpu_usec, e.cpu_source, e.cpu_at});
  }
  return samples;
}

bool InstanceMetrics::ReadUsage(std::vector<Sample>& samples) {
  bool any_gpus = false;
  for (Sample& s : samples) {
    s.usage = runtime_->Usage(s.id);
    for (const std::string& more : s.target.more_instance_ids) {
      if (!s.usage.ok()) break;
      Result<runtime::InstanceUsage> other = runtime_->Usage(more);
      if (!other.ok() || other->source != s.usage->source) continue;
      s.usage->cpu_usec += other->cpu_usec;
      s.usage->memory_bytes += other->memory_bytes;
      // Limits add up to the instance's (each container has its share); one without a limit
      // means the instance has none.
      s.usage->memory_limit_bytes = s.usage->memory_limit_bytes == 0 || other->memory_limit_bytes == 0
                                        ? 0
                                        : s.usage->memory_limit_bytes + other->memory_limit_bytes;
      s.usage->process_count += other->process_count;
    }
    s.sampled_at = std::chrono::steady_clock::now();
    s.timestamp_millis = NowMillis();
    if (s.usage.ok() && !s.usage->gpus.empty()) any_gpus = true;
  }
  return any_gpus;
}

std::map<int, runtime::GpuUsage> InstanceMetrics::ReadGpuTable() {
  std::map<int, runtime::GpuUsage> gpus;
  Result<std::vector<runtime::GpuUsage>> sampled = SampleGpus();
  if (sampled.ok()) {
    for (const runtime::GpuUsage& g : *sampled) gpus[g.index] = g;
    return gpus;
  }
  MutexLock lock(mutex_);
  if (!gpu_warned_) {
    gpu_warned_ = true;
    KLOG(warn, "instance metrics: no GPU metrics (the GPU query failed; said once)",
         {{"error", sampled.status().ToString()}});
  }
  return gpus;
}

void InstanceMetrics::Evaluate(const Sample& s, const std::map<int, runtime::GpuUsage>& gpus,
                               RoundOutcome& outcome) const {
  if (!s.usage.ok()) {
    StatusCode code = s.usage.status().code();
    if (code == StatusCode::kNotFound || code == StatusCode::kFailedPrecondition ||
        code == StatusCode::kUnimplemented) {
      outcome.gone.insert(s.id);
    } else {
      KLOG(debug, "instance metrics: usage not read", {{"instance", s.id}, {"error", s.usage.status().ToString()}});
    }
    return;
  }
  const runtime::InstanceUsage& u = *s.usage;
  MetricValues values;
  if (s.cpu_usec && s.cpu_source == u.source) {
    if (u.cpu_usec >= *s.cpu_usec) {
      auto wall = std::chrono::duration_cast<std::chrono::microseconds>(s.sampled_at - s.cpu_at).count();
      if (wall > 0) {
        double percent = static_cast<double>(u.cpu_usec - *s.cpu_usec) / static_cast<double>(wall) * 100.0;
        values.emplace_back("CPUUtilization", std::min(percent, max_cpu_percent_));
      }
      outcome.baselines[s.id] = {u.cpu_usec, u.source, s.sampled_at};
    }
    // else: went backwards (a torn /proc read); keep the earlier baseline.
  } else {
    outcome.baselines[s.id] = {u.cpu_usec, u.source, s.sampled_at};
  }
  const uint64_t limit = u.memory_limit_bytes != 0 ? u.memory_limit_bytes : host_memory_bytes_;
  // A running program always holds memory: a reading of zero caught it starting or exiting (a
  // zombie's RSS, an emptied cgroup) and is no sample, or Minimum would read 0 % at a job's edge.
  if (limit != 0 && u.memory_bytes != 0) {
    values.emplace_back(
        "MemoryUtilization",
        std::clamp(static_cast<double>(u.memory_bytes) / static_cast<double>(limit) * 100.0, 0.0, 100.0));
  }
  if (std::optional<double> disk = DiskPercent(s.target.opt_ml_dir)) values.emplace_back("DiskUtilization", *disk);
  if (!u.gpus.empty() && !gpus.empty()) AppendGpuValues(u.gpus, gpus, values);
  AppendPoints(s.target, s.timestamp_millis, values, outcome.batches[s.target.ns]);
}

size_t InstanceMetrics::PutBatches(const std::map<std::string, std::vector<observe::MetricDatum>>& batches) {
  size_t written = 0;
  for (const auto& [ns, batch] : batches) {
    Status put = store_->Put(ns, batch);
    if (put.ok()) {
      written += batch.size();
    } else {
      KLOG(warn, "instance metrics not stored", {{"namespace", ns}, {"error", put.ToString()}});
    }
  }
  return written;
}

void InstanceMetrics::ApplyOutcome(const std::vector<Sample>& samples, const RoundOutcome& outcome) {
  MutexLock lock(mutex_);
  for (const Sample& s : samples) {
    auto it = entries_.find(s.id);
    if (it == entries_.end() || it->second.generation != s.generation) continue;  // untracked or re-tracked meanwhile
    if (outcome.gone.contains(s.id)) {
      entries_.erase(it);
      continue;
    }
    if (auto b = outcome.baselines.find(s.id); b != outcome.baselines.end()) {
      it->second.cpu_usec = b->second.cpu_usec;
      it->second.cpu_source = b->second.source;
      it->second.cpu_at = b->second.at;
    }
  }
}

}  // namespace kiln::control
