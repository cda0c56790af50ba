#include "control/scheduler.h"

#include <fnmatch.h>

#include <algorithm>
#include <limits>
#include <cmath>
#include <set>

#include "base/log.h"
#include "base/strings.h"

namespace kiln::control {
namespace {

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string Plural(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// "2 vCPUs and 8 GiB", "4 vCPUs, 16 GiB and 1 GPU".
std::string NeedsText(int64_t cpus, uint64_t memory, int64_t gpus) {
  std::string s = Plural(cpus, "vCPU", "vCPUs");
  if (gpus > 0) return s + ", " + FormatGiB(memory) + " and " + Plural(gpus, "GPU", "GPUs");
  return s + " and " + FormatGiB(memory);
}

bool Contains(const std::vector<int>& sorted, int v) { return std::binary_search(sorted.begin(), sorted.end(), v); }

void EraseValue(std::vector<int>& sorted, int v) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), v);
  if (it != sorted.end() && *it == v) sorted.erase(it);
}

void InsertValue(std::vector<int>& sorted, int v) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), v);
  if (it == sorted.end() || *it != v) sorted.insert(it, v);
}

Result<uint64_t> GiBField(const nlohmann::json& v, const char* key, bool allow_zero) {
  if (!v.is_number() || v.get<double>() < 0 || (!allow_zero && v.get<double>() == 0)) {
    return Status::InvalidArgument(std::string("scheduler.") + key + ": must be a " +
                                   (allow_zero ? "non-negative" : "positive") + " number of GiB");
  }
  return static_cast<uint64_t>(std::llround(v.get<double>() * kGiB));
}

Result<int> IntField(const nlohmann::json& v, const std::string& key, int min) {
  if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > 1'000'000) {
    return Status::InvalidArgument("scheduler." + key + ": must be an integer >= " + std::to_string(min));
  }
  return static_cast<int>(v.get<int64_t>());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Options
//
// SchedulerOptionsFromJson reads the section in a fixed order — unknown keys, policy and
// allow_cpu_fallback, cpus, memory_gib, gpus, reserved_*, gpu_classes, then the reservations
// against the capacity — so a section with several mistakes always reports the same first one.
// Each step below reads one group of keys into `options` and returns the first error it finds.

namespace {

Status CheckSchedulerKeys(const nlohmann::json& section) {
  static const std::set<std::string> kKeys = {
      "policy",        "allow_cpu_fallback",  "cpus",       "memory_gib", "gpus",
      "reserved_cpus", "reserved_memory_gib", "gpu_classes"};
  for (auto it = section.begin(); it != section.end(); ++it) {
    if (kKeys.count(it.key()) == 0) {
      return Status::InvalidArgument("scheduler: unknown key \"" + it.key() +
                                     "\" (expected policy, allow_cpu_fallback, cpus, memory_gib, gpus, "
                                     "reserved_cpus, reserved_memory_gib, gpu_classes)");
    }
  }
  return Status::Ok();
}

// "policy" and "allow_cpu_fallback".
Status ReadPolicy(const nlohmann::json& section, SchedulerOptions& options) {
  if (auto it = section.find("policy"); it != section.end()) {
    std::string policy = it->is_string() ? it->get<std::string>() : "";
    if (policy == "strict") {
      options.policy = ShapePolicy::kStrict;
    } else if (policy == "shrink") {
      options.policy = ShapePolicy::kShrink;
    } else {
      return Status::InvalidArgument("scheduler.policy: must be \"strict\" or \"shrink\"");
    }
  }
  if (auto it = section.find("allow_cpu_fallback"); it != section.end()) {
    if (!it->is_boolean()) return Status::InvalidArgument("scheduler.allow_cpu_fallback: must be true or false");
    options.allow_cpu_fallback = it->get<bool>();
  }
  return Status::Ok();
}

// "cpus": a count (the first n of the discovered CPUs) or a list of discovered CPU indices.
Status ReadCpus(const nlohmann::json& v, std::vector<int>& cpus) {
  if (v.is_number_integer()) {
    ASSIGN_OR_RETURN(int n, IntField(v, "cpus", 1));
    if (static_cast<size_t>(n) > cpus.size()) {
      return Status::InvalidArgument("scheduler.cpus: " + std::to_string(n) + " is more than the " +
                                     std::to_string(cpus.size()) + " CPUs this process may run on");
    }
    cpus.resize(static_cast<size_t>(n));
    return Status::Ok();
  }
  if (!v.is_array() || v.empty()) {
    return Status::InvalidArgument("scheduler.cpus: must be a count or a non-empty list of CPU indices");
  }
  std::vector<int> chosen;
  for (const auto& c : v) {
    ASSIGN_OR_RETURN(int cpu, IntField(c, "cpus[]", 0));
    if (!Contains(cpus, cpu)) {
      return Status::InvalidArgument("scheduler.cpus: CPU " + std::to_string(cpu) +
                                     " is not one this process may run on");
    }
    chosen.push_back(cpu);
  }
  std::sort(chosen.begin(), chosen.end());
  if (std::adjacent_find(chosen.begin(), chosen.end()) != chosen.end()) {
    return Status::InvalidArgument("scheduler.cpus: a CPU is listed twice");
  }
  cpus = std::move(chosen);
  return Status::Ok();
}

// "memory_gib": replaces the discovered memory (more than discovered is allowed, with a warning).
Status ReadMemory(const nlohmann::json& v, HostCapacity& capacity) {
  ASSIGN_OR_RETURN(uint64_t bytes, GiBField(v, "memory_gib", false));
  if (bytes > capacity.memory_bytes && capacity.memory_bytes > 0) {
    KLOG(warn, "scheduler.memory_gib is more than the host has; instances may be OOM-killed",
         {{"configured", FormatGiB(bytes)}, {"discovered", FormatGiB(capacity.memory_bytes)}});
  }
  capacity.memory_bytes = bytes;
  return Status::Ok();
}

// One "gpus" element: a discovered GPU's index, or an object describing a GPU.
Result<runtime::GpuInfo> ReadGpu(const nlohmann::json& v, const std::vector<runtime::GpuInfo>& discovered) {
  runtime::GpuInfo gpu;
  if (v.is_number_integer()) {
    ASSIGN_OR_RETURN(int index, IntField(v, "gpus[]", 0));
    auto found =
        std::find_if(discovered.begin(), discovered.end(), [&](const runtime::GpuInfo& g) { return g.index == index; });
    if (found == discovered.end()) {
      return Status::InvalidArgument("scheduler.gpus: GPU " + std::to_string(index) + " was not found on this host (" +
                                     std::to_string(discovered.size()) + " discovered)");
    }
    return *found;
  }
  if (!v.is_object()) {
    return Status::InvalidArgument("scheduler.gpus: must be a list of GPU indices or GPU objects");
  }
  for (auto f = v.begin(); f != v.end(); ++f) {
    if (f.key() != "index" && f.key() != "uuid" && f.key() != "name" && f.key() != "memory_gib") {
      return Status::InvalidArgument("scheduler.gpus[]: unknown key \"" + f.key() +
                                     "\" (expected index, uuid, name, memory_gib)");
    }
  }
  if (!v.contains("index")) return Status::InvalidArgument("scheduler.gpus[]: needs an \"index\"");
  ASSIGN_OR_RETURN(gpu.index, IntField(v["index"], "gpus[].index", 0));
  if (v.contains("uuid")) {
    if (!v["uuid"].is_string()) return Status::InvalidArgument("scheduler.gpus[].uuid: must be a string");
    gpu.uuid = v["uuid"].get<std::string>();
  }
  if (v.contains("name")) {
    if (!v["name"].is_string()) return Status::InvalidArgument("scheduler.gpus[].name: must be a string");
    gpu.name = v["name"].get<std::string>();
  }
  if (v.contains("memory_gib")) {
    ASSIGN_OR_RETURN(gpu.memory_bytes, GiBField(v["memory_gib"], "gpus[].memory_gib", true));
  }
  return gpu;
}

// "gpus": replaces the discovered GPUs, sorted by index; an index may appear once.
Status ReadGpus(const nlohmann::json& v, HostCapacity& capacity) {
  if (!v.is_array()) return Status::InvalidArgument("scheduler.gpus: must be a list of GPU indices or GPU objects");
  std::vector<runtime::GpuInfo> gpus;
  std::set<int> seen;
  for (const auto& g : v) {
    ASSIGN_OR_RETURN(runtime::GpuInfo gpu, ReadGpu(g, capacity.gpus));
    if (!seen.insert(gpu.index).second) {
      return Status::InvalidArgument("scheduler.gpus: GPU " + std::to_string(gpu.index) + " is listed twice");
    }
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  capacity.gpus = std::move(gpus);
  return Status::Ok();
}

// "reserved_cpus" and "reserved_memory_gib" (checked against the capacity by CheckReservations).
Status ReadReserved(const nlohmann::json& section, SchedulerOptions& options) {
  if (auto it = section.find("reserved_cpus"); it != section.end()) {
    ASSIGN_OR_RETURN(options.reserved_cpus, IntField(*it, "reserved_cpus", 0));
  }
  if (auto it = section.find("reserved_memory_gib"); it != section.end()) {
    ASSIGN_OR_RETURN(options.reserved_memory_bytes, GiBField(*it, "reserved_memory_gib", true));
  }
  return Status::Ok();
}

// "gpu_classes": catalog GPU model → list of name globs.
Status ReadGpuClasses(const nlohmann::json& v, std::map<std::string, std::vector<std::string>>& gpu_classes) {
  if (!v.is_object()) {
    return Status::InvalidArgument("scheduler.gpu_classes: must map a catalog GPU model to a list of name globs");
  }
  for (auto c = v.begin(); c != v.end(); ++c) {
    if (!c.value().is_array()) {
      return Status::InvalidArgument("scheduler.gpu_classes." + c.key() + ": must be a list of name globs");
    }
    std::vector<std::string>& globs = gpu_classes[c.key()];
    for (const auto& g : c.value()) {
      if (!g.is_string()) return Status::InvalidArgument("scheduler.gpu_classes." + c.key() + ": must be strings");
      globs.push_back(g.get<std::string>());
    }
  }
  return Status::Ok();
}

// The reservations must leave instances at least one CPU and some memory.
Status CheckReservations(const SchedulerOptions& options) {
  if (options.reserved_cpus >= static_cast<int>(options.capacity.cpus.size())) {
    return Status::InvalidArgument("scheduler.reserved_cpus: " + std::to_string(options.reserved_cpus) +
                                   " leaves none of the " + std::to_string(options.capacity.cpus.size()) +
                                   " CPUs for instances");
  }
  if (options.reserved_memory_bytes >= options.capacity.memory_bytes) {
    return Status::InvalidArgument("scheduler.reserved_memory_gib: leaves no memory for instances (the host has " +
                                   FormatGiB(options.capacity.memory_bytes) + ")");
  }
  return Status::Ok();
}

}  // namespace

Result<SchedulerOptions> SchedulerOptionsFromJson(const nlohmann::json& section, HostCapacity discovered) {
  SchedulerOptions options;
  options.capacity = std::move(discovered);
  if (section.is_null()) return options;
  if (!section.is_object()) return Status::InvalidArgument("scheduler: must be an object");
  RETURN_IF_ERROR(CheckSchedulerKeys(section));
  RETURN_IF_ERROR(ReadPolicy(section, options));
  if (auto it = section.find("cpus"); it != section.end()) RETURN_IF_ERROR(ReadCpus(*it, options.capacity.cpus));
  if (auto it = section.find("memory_gib"); it != section.end()) RETURN_IF_ERROR(ReadMemory(*it, options.capacity));
  if (auto it = section.find("gpus"); it != section.end()) RETURN_IF_ERROR(ReadGpus(*it, options.capacity));
  RETURN_IF_ERROR(ReadReserved(section, options));
  if (auto it = section.find("gpu_classes"); it != section.end()) {
    RETURN_IF_ERROR(ReadGpuClasses(*it, options.gpu_classes));
  }
  RETURN_IF_ERROR(CheckReservations(options));
  return options;
}

// ---------------------------------------------------------------------------------------------
// JSON forms

void to_json(nlohmann::json& j, const Allocation& a) {
  j = nlohmann::json{{"cpus", a.cpus},
                     {"memory_bytes", a.memory_bytes},
                     {"gpus", a.gpus},
                     {"gpu_uuids", a.gpu_uuids},
                     {"note", a.note}};
}

void from_json(const nlohmann::json& j, Allocation& a) {
  a = Allocation();
  if (j.contains("cpus")) j.at("cpus").get_to(a.cpus);
  if (j.contains("memory_bytes")) j.at("memory_bytes").get_to(a.memory_bytes);
  if (j.contains("gpus")) j.at("gpus").get_to(a.gpus);
  if (j.contains("gpu_uuids")) j.at("gpu_uuids").get_to(a.gpu_uuids);
  if (j.contains("note")) j.at("note").get_to(a.note);
}

void to_json(nlohmann::json& j, const SchedulerSnapshot& s) {
  nlohmann::json queue = nlohmann::json::array();
  for (const auto& q : s.queue) {
    queue.push_back({{"id", q.id},
                     {"seq", q.seq},
                     {"instance_type", q.instance_type},
                     {"instance_count", q.instance_count},
                     {"preemptible", q.preemptible}});
  }
  nlohmann::json granted = nlohmann::json::object();
  for (const auto& [id, allocations] : s.granted) granted[id] = allocations;
  j = nlohmann::json{{"cpus", s.cpus},
                     {"free_cpus", s.free_cpus},
                     {"memory_bytes", s.memory_bytes},
                     {"free_memory_bytes", s.free_memory_bytes},
                     {"gpus", s.gpus},
                     {"free_gpus", s.free_gpus},
                     {"queue", queue},
                     {"granted", granted},
                     {"preemptible", s.preemptible},
                     {"being_preempted", s.being_preempted}};
}

// ---------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(SchedulerOptions options, const InstanceCatalog* catalog)
    : options_(std::move(options)), catalog_(catalog) {
  std::vector<int> cpus = options_.capacity.cpus;
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  size_t reserved = std::min(cpus.size(), static_cast<size_t>(std::max(0, options_.reserved_cpus)));
  usable_cpus_.assign(cpus.begin() + static_cast<std::ptrdiff_t>(reserved), cpus.end());
  usable_memory_ = options_.capacity.memory_bytes > options_.reserved_memory_bytes
                       ? options_.capacity.memory_bytes - options_.reserved_memory_bytes
                       : 0;
  for (const runtime::GpuInfo& gpu : options_.capacity.gpus) {
    gpu_uuids_[gpu.index] = gpu.uuid;
    InsertValue(free_gpus_, gpu.index);
  }
  free_cpus_ = usable_cpus_;
  free_memory_ = usable_memory_;
}

std::vector<int> Scheduler::EligibleGpus(const std::string& gpu_model) const {
  std::vector<int> eligible;
  auto cls = options_.gpu_classes.find(gpu_model);
  for (const runtime::GpuInfo& gpu : options_.capacity.gpus) {
    bool ok = cls == options_.gpu_classes.end();
    if (!ok) {
      for (const std::string& glob : cls->second) {
        if (fnmatch(glob.c_str(), gpu.name.c_str(), 0) == 0) ok = true;
      }
    }
    if (ok) InsertValue(eligible, gpu.index);
  }
  return eligible;
}

Result<Scheduler::Need> Scheduler::ComputeNeed(const std::string& instance_type, int count) const {
  if (count < 1) {
    return Status::InvalidArgument("instance count must be at least 1, got " + std::to_string(count));
  }
  const InstanceShape* shape = catalog_->Find(instance_type);
  if (shape == nullptr) {
    return Status::ResourceExhausted("no capacity for " + instance_type +
                                     ": the type is not in Kiln's instance-type catalog (an operator can "
                                     "add it to the catalog file)");
  }
  Need need;
  need.cpus = shape->vcpus;
  need.memory_bytes = shape->memory_bytes();
  need.gpus = shape->gpus;
  need.eligible_gpus = EligibleGpus(shape->gpu_model);
  const int64_t host_cpus = static_cast<int64_t>(usable_cpus_.size());
  const int64_t host_gpus = static_cast<int64_t>(need.eligible_gpus.size());
  const bool classed = options_.gpu_classes.count(shape->gpu_model) > 0;
  const std::string gpu_text =
      Plural(shape->gpus, "GPU", "GPUs") + (shape->gpu_model.empty() ? "" : " (" + shape->gpu_model + ")");
  const std::string shape_text = DescribeResources(shape->vcpus, shape->memory_bytes(), shape->gpus);
  const std::string what = count == 1 ? instance_type : std::to_string(count) + " x " + instance_type;
  const std::string fallback_hint =
      "set \"allow_cpu_fallback\": true in the scheduler section of the Kiln config to run GPU instance "
      "types on CPU";

  bool fallback = false;
  if (need.gpus > 0 && host_gpus == 0) {
    if (!options_.allow_cpu_fallback) {
      return Status::ResourceExhausted(
          instance_type + " needs " + gpu_text + " per instance, but this host has no GPUs" +
          (classed && !options_.capacity.gpus.empty() ? " of that class (scheduler gpu_classes)" : "") + "; " +
          fallback_hint);
    }
    need.gpus = 0;
    fallback = true;
  }

  if (options_.policy == ShapePolicy::kStrict) {
    const int64_t want_cpus = int64_t{need.cpus} * count;
    const uint64_t want_memory = need.memory_bytes * static_cast<uint64_t>(count);
    const int64_t want_gpus = int64_t{need.gpus} * count;
    std::vector<std::string> short_by;
    if (want_cpus > host_cpus) short_by.push_back(Plural(want_cpus - host_cpus, "vCPU", "vCPUs"));
    if (want_memory > usable_memory_) short_by.push_back(FormatGiB(want_memory - usable_memory_));
    if (want_gpus > host_gpus) short_by.push_back(Plural(want_gpus - host_gpus, "GPU", "GPUs"));
    if (!short_by.empty()) {
      return Status::ResourceExhausted(
          "no capacity for " + what + " on this host: " + (count == 1 ? "it needs " : "they need ") +
          NeedsText(want_cpus, want_memory, want_gpus) + " but the host has " +
          NeedsText(host_cpus, usable_memory_, host_gpus) + " for instances (short by " + Join(short_by, ", ") +
          "); the scheduler policy is \"strict\", set \"policy\": \"shrink\" in the scheduler section of the "
          "Kiln config to run instances on what the host has");
    }
    if (fallback) {
      need.note = instance_type + " runs without its " + gpu_text +
                  ": this host has none (scheduler option allow_cpu_fallback)";
    }
    return need;
  }

  // Shrink: cap every dimension at an equal share of the host.
  if (host_cpus < count) {
    return Status::ResourceExhausted("no capacity for " + what +
                                     " on this host, even shrunk: each instance needs "
                                     "at least 1 vCPU and the host has " +
                                     Plural(host_cpus, "vCPU", "vCPUs") + " for instances");
  }
  const uint64_t memory_share = (usable_memory_ / static_cast<uint64_t>(count)) / kMiB * kMiB;
  if (memory_share == 0) {
    return Status::ResourceExhausted("no capacity for " + what + " on this host, even shrunk: the host has " +
                                     FormatGiB(usable_memory_) + " for instances");
  }
  need.cpus = static_cast<int>(std::min<int64_t>(need.cpus, host_cpus / count));
  need.memory_bytes = std::min(need.memory_bytes, memory_share);
  if (need.gpus > 0) {
    int64_t share = host_gpus / count;
    if (share == 0) {
      if (!options_.allow_cpu_fallback) {
        return Status::ResourceExhausted("no capacity for " + what +
                                         " on this host, even shrunk: " + std::to_string(count) +
                                         " instances need at least 1 GPU each and the host has " +
                                         Plural(host_gpus, "GPU", "GPUs") + "; " + fallback_hint);
      }
      fallback = true;
    }
    need.gpus = static_cast<int>(std::min<int64_t>(need.gpus, share));
  }
  if (need.cpus < shape->vcpus || need.memory_bytes < shape->memory_bytes() || need.gpus < shape->gpus) {
    need.note = "shrunk " + instance_type + " (" + shape_text + ") to " +
                DescribeResources(need.cpus, need.memory_bytes, need.gpus, shape->gpus > 0) +
                " (scheduler policy shrink" + (fallback ? "; no GPU for it on this host, allow_cpu_fallback" : "") +
                ")";
  }
  return need;
}

Status Scheduler::CheckFeasible(const std::string& instance_type, int instance_count) const {
  return ComputeNeed(instance_type, instance_count).status();
}

Status Scheduler::Enqueue(const ScheduleRequest& request) {
  if (request.id.empty()) return Status::InvalidArgument("schedule request without an id");
  ASSIGN_OR_RETURN(Need need, ComputeNeed(request.instance_type, request.instance_count));
  MutexLock lock(mu_);
  if (granted_.count(request.id) != 0) {
    return Status::AlreadyExists("request " + request.id + " already holds a grant");
  }
  if (IsQueuedLocked(request.id)) return Status::Ok();
  const QueueKey key = KeyOf(request);
  auto pos = std::upper_bound(queue_.begin(), queue_.end(), key,
                              [](const QueueKey& k, const Queued& q) { return k < KeyOf(q.request); });
  queue_.insert(pos, Queued{request, std::move(need)});
  queued_key_[request.id] = key;
  return Status::Ok();
}

bool Scheduler::IsQueuedLocked(const std::string& id) const { return queued_key_.count(id) != 0; }

Result<std::vector<Allocation>> Scheduler::AllocateNow(const ScheduleRequest& request) {
  if (request.id.empty()) return Status::InvalidArgument("schedule request without an id");
  ASSIGN_OR_RETURN(Need need, ComputeNeed(request.instance_type, request.instance_count));
  MutexLock lock(mu_);
  if (granted_.count(request.id) != 0 || IsQueuedLocked(request.id)) {
    return Status::AlreadyExists("request " + request.id + " is already queued or granted");
  }
  std::optional<std::vector<Allocation>> allocations = TryAllocateLocked(need, request.instance_count);
  if (!allocations) {
    return Status::Unavailable(ShortfallLocked(request.instance_type, need, request.instance_count))
        .WithReason(ErrorReason::kDoesNotFitNow);
  }
  HoldLocked(request.id, *allocations, request.preemptible);
  return *allocations;
}

std::optional<std::vector<Allocation>> Scheduler::Allocate(const Need& need, int count, Pools& pools) const {
  std::vector<int>& cpus = pools.cpus;
  std::vector<int>& gpus = pools.gpus;
  uint64_t& memory = pools.memory;
  std::vector<Allocation> allocations;
  for (int i = 0; i < count; ++i) {
    Allocation a;
    if (cpus.size() < static_cast<size_t>(need.cpus) || memory < need.memory_bytes) return std::nullopt;
    a.cpus.assign(cpus.begin(), cpus.begin() + need.cpus);
    cpus.erase(cpus.begin(), cpus.begin() + need.cpus);
    memory -= need.memory_bytes;
    a.memory_bytes = need.memory_bytes;
    for (auto it = gpus.begin(); it != gpus.end() && static_cast<int>(a.gpus.size()) < need.gpus;) {
      if (Contains(need.eligible_gpus, *it)) {
        a.gpus.push_back(*it);
        a.gpu_uuids.push_back(gpu_uuids_.at(*it));
        it = gpus.erase(it);
      } else {
        ++it;
      }
    }
    if (static_cast<int>(a.gpus.size()) < need.gpus) return std::nullopt;
    a.note = need.note;
    allocations.push_back(std::move(a));
  }
  return allocations;
}

std::optional<std::vector<Allocation>> Scheduler::TryAllocateLocked(const Need& need, int count) {
  Pools pools{free_cpus_, free_memory_, free_gpus_};
  std::optional<std::vector<Allocation>> allocations = Allocate(need, count, pools);
  if (!allocations) return std::nullopt;
  free_cpus_ = std::move(pools.cpus);
  free_gpus_ = std::move(pools.gpus);
  free_memory_ = pools.memory;
  return allocations;
}

void Scheduler::HoldLocked(const std::string& id, std::vector<Allocation> allocations, bool preemptible) {
  granted_[id] = Held{std::move(allocations), preemptible, next_grant_order_++, /*being_preempted=*/false};
}

void Scheduler::FreeLocked(const std::vector<Allocation>& allocations) {
  for (const Allocation& a : allocations) {
    for (int cpu : a.cpus) InsertValue(free_cpus_, cpu);
    for (int gpu : a.gpus) InsertValue(free_gpus_, gpu);
    free_memory_ = std::min(usable_memory_, free_memory_ + a.memory_bytes);
  }
}

std::vector<Grant> Scheduler::Schedule() {
  MutexLock lock(mu_);
  std::vector<Grant> grants;
  while (!queue_.empty()) {
    Queued& head = queue_.front();
    std::optional<std::vector<Allocation>> allocations = TryAllocateLocked(head.need, head.request.instance_count);
    if (!allocations) break;  // head-of-line: later requests wait even if they would fit
    HoldLocked(head.request.id, *allocations, head.request.preemptible);
    grants.push_back(Grant{head.request.id, std::move(*allocations)});
    queued_key_.erase(head.request.id);
    queue_.pop_front();
  }
  return grants;
}

std::vector<Preemption> Scheduler::Preemptions() {
  MutexLock lock(mu_);
  if (queue_.empty()) return {};
  const Queued& head = queue_.front();
  // Warm pools give way to any request; spot grants only to an on-demand one, when allowed.
  const bool spot_may_go = options_.preempt_for_on_demand && !head.request.preemptible;
  const int count = head.request.instance_count;
  auto fits = [&](const Pools& pools) {
    Pools scratch = pools;
    return Allocate(head.need, count, scratch).has_value();
  };
  auto add = [](Pools& pools, const std::vector<Allocation>& allocations) {
    for (const Allocation& a : allocations) {
      for (int cpu : a.cpus) InsertValue(pools.cpus, cpu);
      for (int gpu : a.gpus) InsertValue(pools.gpus, gpu);
      pools.memory += a.memory_bytes;
    }
  };
  // What will be free once the grants already being preempted are released.
  Pools freed{free_cpus_, free_memory_, free_gpus_};
  // (rank, id): warm pools first, oldest first (the least likely to be reused); then spot grants,
  // newest first (the least work lost).
  std::vector<std::pair<int64_t, const std::string*>> candidates;
  for (const auto& [id, held] : granted_) {
    if (held.being_preempted) {
      add(freed, held.allocations);
    } else if (held.reclaimable) {
      candidates.emplace_back(std::numeric_limits<int64_t>::min() + static_cast<int64_t>(held.order), &id);
    } else if (held.preemptible && spot_may_go) {
      candidates.emplace_back(-static_cast<int64_t>(held.order), &id);
    }
  }
  if (fits(freed)) return {};  // fits now, or once the outstanding preemptions are through
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<const std::string*> chosen;
  Pools pools = freed;
  for (const auto& candidate : candidates) {
    add(pools, granted_.at(*candidate.second).allocations);
    chosen.push_back(candidate.second);
    if (fits(pools)) break;
  }
  if (chosen.empty() || !fits(pools)) return {};  // even every spot grant would not make room
  // Leave out any grant (newest first) whose release turns out not to be needed, e.g. a CPU-only
  // job chosen before the GPU job that makes room for a GPU request. The last chosen is needed.
  for (size_t i = 0; i + 1 < chosen.size();) {
    Pools without = freed;
    for (size_t k = 0; k < chosen.size(); ++k) {
      if (k != i) add(without, granted_.at(*chosen[k]).allocations);
    }
    if (fits(without)) {
      chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  std::vector<Preemption> preemptions;
  for (const std::string* id : chosen) {
    granted_.at(*id).being_preempted = true;
    preemptions.push_back(Preemption{*id, head.request.id});
  }
  return preemptions;
}

Status Scheduler::Transfer(const std::string& from, const std::string& to) {
  MutexLock lock(mu_);
  auto it = granted_.find(from);
  if (it == granted_.end()) return Status::NotFound("no grant held by " + from);
  if (from == to) return Status::Ok();
  if (granted_.count(to) != 0 || queued_key_.count(to) != 0) {
    return Status::AlreadyExists(to + " is already queued or granted");
  }
  Held held = std::move(it->second);
  granted_.erase(it);
  held.being_preempted = false;
  held.reclaimable = false;  // a new holder is not a pool until it says so (SetReclaimable)
  granted_.emplace(to, std::move(held));
  return Status::Ok();
}

Status Scheduler::SetReclaimable(const std::string& id, bool reclaimable) {
  MutexLock lock(mu_);
  auto it = granted_.find(id);
  if (it == granted_.end()) return Status::NotFound("no grant held by " + id);
  it->second.reclaimable = reclaimable;
  if (!reclaimable) it->second.being_preempted = false;
  return Status::Ok();
}

bool Scheduler::Cancel(const std::string& id) {
  MutexLock lock(mu_);
  if (queued_key_.erase(id) == 0) return false;
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [&](const Queued& q) { return q.request.id == id; }),
               queue_.end());
  return true;
}

void Scheduler::Release(const std::string& id) {
  {
    MutexLock lock(mu_);
    auto it = granted_.find(id);
    if (it == granted_.end()) return;
    FreeLocked(it->second.allocations);
    granted_.erase(it);
  }
  MutexLock listener_lock(listener_mu_);
  if (release_listener_) release_listener_();
}

void Scheduler::SetReleaseListener(std::function<void()> listener) {
  MutexLock listener_lock(listener_mu_);
  release_listener_ = std::move(listener);
}

std::string Scheduler::HolderOfCpuLocked(int cpu) const {
  for (const auto& [id, held] : granted_) {
    for (const Allocation& a : held.allocations) {
      if (std::find(a.cpus.begin(), a.cpus.end(), cpu) != a.cpus.end()) return id;
    }
  }
  return "another instance";
}

std::string Scheduler::HolderOfGpuLocked(int gpu) const {
  for (const auto& [id, held] : granted_) {
    for (const Allocation& a : held.allocations) {
      if (std::find(a.gpus.begin(), a.gpus.end(), gpu) != a.gpus.end()) return id;
    }
  }
  return "another instance";
}

Status Scheduler::Adopt(const std::string& id, const std::vector<Allocation>& allocations, bool preemptible) {
  MutexLock lock(mu_);
  if (granted_.count(id) != 0) return Status::AlreadyExists("cannot adopt " + id + ": it already holds a grant");
  if (IsQueuedLocked(id)) return Status::AlreadyExists("cannot adopt " + id + ": it is queued");
  const std::string prefix = "cannot adopt " + id + ": ";
  std::set<int> cpus, gpus;
  uint64_t memory = 0;
  for (const Allocation& a : allocations) {
    for (int cpu : a.cpus) {
      if (!Contains(usable_cpus_, cpu)) {
        return Status::FailedPrecondition(prefix + "CPU " + std::to_string(cpu) +
                                          " is not one the scheduler may give out (not on this host, or reserved)");
      }
      if (!Contains(free_cpus_, cpu) || !cpus.insert(cpu).second) {
        return Status::FailedPrecondition(prefix + "CPU " + std::to_string(cpu) + " is already held by " +
                                          (cpus.count(cpu) ? id : HolderOfCpuLocked(cpu)));
      }
    }
    for (size_t i = 0; i < a.gpus.size(); ++i) {
      int gpu = a.gpus[i];
      auto known = gpu_uuids_.find(gpu);
      if (known == gpu_uuids_.end()) {
        return Status::FailedPrecondition(prefix + "GPU " + std::to_string(gpu) + " is not on this host");
      }
      if (i < a.gpu_uuids.size() && !a.gpu_uuids[i].empty() && !known->second.empty() &&
          a.gpu_uuids[i] != known->second) {
        return Status::FailedPrecondition(prefix + "GPU " + std::to_string(gpu) + " is now " + known->second +
                                          ", not " + a.gpu_uuids[i] + " as recorded");
      }
      if (!Contains(free_gpus_, gpu) || !gpus.insert(gpu).second) {
        return Status::FailedPrecondition(prefix + "GPU " + std::to_string(gpu) + " is already held by " +
                                          (gpus.count(gpu) ? id : HolderOfGpuLocked(gpu)));
      }
    }
    memory += a.memory_bytes;
  }
  if (memory > free_memory_) {
    return Status::FailedPrecondition(prefix + "it holds " + FormatGiB(memory) + " of memory but only " +
                                      FormatGiB(free_memory_) + " is free");
  }
  for (int cpu : cpus) EraseValue(free_cpus_, cpu);
  for (int gpu : gpus) EraseValue(free_gpus_, gpu);
  free_memory_ -= memory;
  HoldLocked(id, allocations, preemptible);
  return Status::Ok();
}

std::string Scheduler::ShortfallLocked(const std::string& instance_type, const Need& need, int count) const {
  const int64_t want_cpus = int64_t{need.cpus} * count;
  const uint64_t want_memory = need.memory_bytes * static_cast<uint64_t>(count);
  const int64_t want_gpus = int64_t{need.gpus} * count;
  int64_t free_gpus = 0;
  for (int gpu : free_gpus_) free_gpus += Contains(need.eligible_gpus, gpu) ? 1 : 0;

  std::string msg = count == 1 ? instance_type + " needs " : std::to_string(count) + " x " + instance_type + " need ";
  msg += NeedsText(want_cpus, want_memory, want_gpus);
  std::vector<std::string> short_parts;
  if (static_cast<int64_t>(free_cpus_.size()) < want_cpus) {
    short_parts.push_back(std::to_string(free_cpus_.size()) + " of " +
                          Plural(static_cast<int64_t>(usable_cpus_.size()), "vCPU", "vCPUs") + " free");
  }
  if (free_memory_ < want_memory) {
    short_parts.push_back(FormatGiB(free_memory_) + " of " + FormatGiB(usable_memory_) + " free");
  }
  if (free_gpus < want_gpus) {
    short_parts.push_back(std::to_string(free_gpus) + " of " +
                          Plural(static_cast<int64_t>(need.eligible_gpus.size()), "GPU", "GPUs") + " free");
  }
  if (short_parts.empty()) return msg;
  return msg + "; " + Join(short_parts, ", ");
}

const Scheduler::Queued* Scheduler::FindQueuedLocked(const std::string& id, size_t* ahead) const {
  *ahead = 0;
  auto key = queued_key_.find(id);
  if (key == queued_key_.end()) return nullptr;
  // The queue is sorted by key: find the first entry of that key, then the id among its ties.
  auto it = std::lower_bound(queue_.begin(), queue_.end(), key->second,
                             [](const Queued& q, const QueueKey& k) { return KeyOf(q.request) < k; });
  for (; it != queue_.end() && KeyOf(it->request) == key->second; ++it) {
    if (it->request.id == id) {
      *ahead = static_cast<size_t>(it - queue_.begin());
      return &*it;
    }
  }
  return nullptr;
}

std::string Scheduler::WaitingReason(const std::string& id) const {
  MutexLock lock(mu_);
  size_t ahead = 0;
  const Queued* entry = FindQueuedLocked(id, &ahead);
  if (entry == nullptr) return "";
  return "Waiting for compute capacity: " +
         ShortfallLocked(entry->request.instance_type, entry->need, entry->request.instance_count);
}

std::string Scheduler::WaitingMessage(const std::string& id) const {
  MutexLock lock(mu_);
  size_t ahead = 0;
  const Queued* entry = FindQueuedLocked(id, &ahead);
  if (entry == nullptr) return "";
  std::string msg = "Waiting for compute capacity: " +
                    ShortfallLocked(entry->request.instance_type, entry->need, entry->request.instance_count);
  if (msg.find(';') == std::string::npos) {
    msg += entry->request.preemptible ? "; that much is free, but on-demand requests and spot requests submitted "
                                        "earlier start first"
                                      : "; that much is free, but requests submitted earlier start first";
  }
  msg += ahead == 0 ? " (next in line)" : " (" + Plural(static_cast<int64_t>(ahead), "job", "jobs") + " ahead)";
  return msg;
}

std::optional<std::vector<Allocation>> Scheduler::Granted(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = granted_.find(id);
  if (it == granted_.end()) return std::nullopt;
  return it->second.allocations;
}

bool Scheduler::IsQueued(const std::string& id) const {
  MutexLock lock(mu_);
  return IsQueuedLocked(id);
}

SchedulerSnapshot Scheduler::Snapshot() const {
  MutexLock lock(mu_);
  SchedulerSnapshot s;
  s.cpus = usable_cpus_;
  s.free_cpus = free_cpus_;
  s.memory_bytes = usable_memory_;
  s.free_memory_bytes = free_memory_;
  for (const auto& [index, uuid] : gpu_uuids_) s.gpus.push_back(index);
  s.free_gpus = free_gpus_;
  for (const Queued& q : queue_) {
    s.queue.push_back(
        {q.request.id, q.request.seq, q.request.instance_type, q.request.instance_count, q.request.preemptible});
  }
  for (const auto& [id, held] : granted_) {
    s.granted[id] = held.allocations;
    if (held.preemptible) s.preemptible.insert(id);
    if (held.being_preempted) s.being_preempted.insert(id);
  }
  return s;
}

}  // namespace kiln::control
