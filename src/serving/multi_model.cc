#include "serving/multi_model.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <set>

#include <nlohmann/json.hpp>

#include "base/encoding.h"
#include "base/fs.h"
#include "base/hash.h"
#include "base/log.h"
#include "serving/router.h"

namespace kiln::serving {

namespace {

constexpr std::string_view kInvocationNamespace = "AWS/SageMaker";
constexpr std::string_view kInstanceNamespace = "/aws/sagemaker/Endpoints";
constexpr size_t kMaxOriginalMessage = 2048;

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t EpochMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::chrono::steady_clock::time_point SteadyPoint(int64_t ns) {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

// Cuts `text` to at most `max` bytes without splitting a UTF-8 sequence.
std::string Utf8Prefix(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return std::string(text.substr(0, end));
}

// "s3://bucket/key" → bucket, key (for the download error's wording).
std::pair<std::string, std::string> SplitS3(std::string_view uri) {
  if (uri.rfind("s3://", 0) == 0) uri.remove_prefix(5);
  size_t slash = uri.find('/');
  if (slash == std::string_view::npos) return {std::string(uri), ""};
  return {std::string(uri.substr(0, slash)), std::string(uri.substr(slash + 1))};
}

// The ModelError (424) for a container status (or 0: no answer) during a load, in the router's
// shape (ErrorCode, LogStreamArn, OriginalMessage, OriginalStatusCode).
aws::AwsError LoadError(int status, std::string_view message, const std::string& log_group_arn) {
  const bool client_error = status >= 400 && status < 500;
  std::string original = Utf8Prefix(message, kMaxOriginalMessage);
  aws::AwsError error("ModelError", "", 424);
  error.message = std::string(client_error ? "Received client error (" : "Received server error (") +
                  std::to_string(status) + ") from primary with message \"" + original +
                  "\". See the endpoint's log group for more information.";
  error.With("ErrorCode", client_error ? "CLIENT_ERROR_FROM_MODEL" : "SERVER_ERROR_FROM_MODEL")
      .With("LogStreamArn", log_group_arn)
      .With("OriginalMessage", original)
      .WithInt("OriginalStatusCode", status);
  return error;
}

// The "message" of a model server's JSON error body, else the body itself.
std::string ContainerMessage(const std::string& body) {
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_object()) {
    auto it = parsed.find("message");
    if (it != parsed.end() && it->is_string()) return it->get<std::string>();
  }
  return body;
}

}  // namespace

std::string ContainerModelName(std::string_view target_model) { return Sha256Hex(target_model).substr(0, 32); }

struct MultiModelManager::Job {
  bool drop = false;  // unload + delete (ModelCacheSetting Disabled), not a load
  std::shared_ptr<const InstanceTarget> instance;
  std::string endpoint;
  std::string variant;
  std::string log_group_arn;
  std::string name;  // the container's model name
  std::string target_model;
  std::string uri;  // ModelDataUrl + TargetModel
  std::string models_dir;
  // Cuts the job's container calls: Stop, or its instance failed (CancelJobsOfFailedInstances).
  net::CancelSignal cancel;
  std::atomic<bool> done{false};  // set by the job's thread as its last step
};

MultiModelManager::MultiModelManager(MultiModelOptions options, ModelArtifactFetcher* fetcher, net::HttpClient* client,
                                     observe::MetricStore* metrics, const RoutingTable* routes)
    : options_(options), fetcher_(fetcher), client_(client), metrics_(metrics), routes_(routes) {}

MultiModelManager::~MultiModelManager() { Stop(); }

void MultiModelManager::Start() {
  MutexLock lock(mu_);
  if (flusher_.joinable() || stopping_) return;
  flusher_ = std::thread([this] { FlushLoop(); });
}

void MultiModelManager::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    changed_.NotifyAll();
    stop_cv_.NotifyAll();
  }
  if (flusher_.joinable()) flusher_.join();
  std::vector<Running> jobs;
  {
    MutexLock lock(jobs_mu_);
    jobs.swap(jobs_);
    for (Running& running : jobs) running.job->cancel.Cancel("Kiln is shutting down");
  }
  for (Running& job : jobs) job.thread.join();
  Flush();
}

std::shared_ptr<const InstanceTarget> MultiModelManager::PickInstanceLocked(const VariantRoute& variant,
                                                                            const std::string& name) {
  // Holders first: loaded (or being loaded) there, and not saturated.
  std::shared_ptr<const InstanceTarget> loaded, loading, any;
  int64_t loaded_out = 0, loading_out = 0, any_out = 0;
  uint64_t any_ties = 0;
  for (const auto& instance : variant.instances) {
    const int64_t out = instance->outstanding.load(std::memory_order_relaxed);
    if (any == nullptr || out < any_out) {
      any = instance;
      any_out = out;
      any_ties = 1;
    } else if (out == any_out && ThreadRandom() % ++any_ties == 0) {
      any = instance;
    }
    if (out >= std::max(1, instance->vcpus)) continue;  // saturated
    auto state = instances_.find(instance->instance_id);
    if (state == instances_.end()) continue;
    auto slot = state->second.slots.find(name);
    if (slot == state->second.slots.end()) continue;
    if (slot->second.state == SlotState::kLoaded && (loaded == nullptr || out < loaded_out)) {
      loaded = instance;
      loaded_out = out;
    } else if (slot->second.state == SlotState::kWorking && (loading == nullptr || out < loading_out)) {
      loading = instance;
      loading_out = out;
    }
  }
  if (loaded != nullptr) return loaded;
  if (loading != nullptr) return loading;
  return any;
}

MultiModelManager::InstanceState& MultiModelManager::StateLocked(const EndpointRoute& route,
                                                                 const VariantRoute& variant,
                                                                 const InstanceTarget& instance) {
  InstanceState& state = instances_[instance.instance_id];
  if (state.endpoint.empty()) {
    state.endpoint = route.name;
    state.variant = variant.name;
    state.models_dir = instance.models_dir;
  }
  return state;
}

std::variant<ModelLease, aws::AwsError> MultiModelManager::Acquire(const EndpointRoute& route,
                                                                   const VariantRoute& variant,
                                                                   std::string_view target_model,
                                                                   int64_t arrival_steady_ns) {
  const std::string name = ContainerModelName(target_model);
  const int64_t wait_start = SteadyNanos();
  const int64_t arrival = arrival_steady_ns != 0 ? arrival_steady_ns : wait_start;
  const int64_t deadline = arrival + std::chrono::duration_cast<std::chrono::nanoseconds>(options_.load_wait).count();
  ModelLease lease;
  bool waited = false;
  {
    MutexLock lock(mu_);
    lease.instance = PickInstanceLocked(variant, name);
    if (lease.instance == nullptr || stopping_) {
      return aws::AwsError("ServiceUnavailable",
                           "Endpoint " + route.name + " has no healthy instance in production variant " + variant.name +
                               " to serve the request. Try again later.",
                           503);
    }
    InstanceState& state = StateLocked(route, variant, *lease.instance);
    Slot& slot = state.slots[name];
    slot.target_model = std::string(target_model);
    int64_t seen_jobs = slot.jobs_ended;
    ++slot.waiters;
    struct Unwait {
      Slot& slot;
      ~Unwait() { --slot.waiters; }
    } unwait{slot};
    while (slot.state != SlotState::kLoaded) {
      if (stopping_) {
        return aws::AwsError("ServiceUnavailable", "Kiln is shutting down; try again later.", 503);
      }
      if (slot.state == SlotState::kIdle) {
        if (slot.jobs_ended > seen_jobs && slot.error.has_value()) return *slot.error;  // our job failed
        // Start the one job for this model on this instance; later requests wait on it.
        slot.state = SlotState::kWorking;
        slot.error.reset();
        seen_jobs = slot.jobs_ended;
        auto job = std::make_shared<Job>();
        job->instance = lease.instance;
        job->endpoint = route.name;
        job->variant = variant.name;
        job->log_group_arn = route.log_group_arn;
        job->name = name;
        job->target_model = std::string(target_model);
        job->uri = variant.model_data_url + std::string(target_model);
        job->models_dir = state.models_dir;
        Spawn(std::move(job));
      }
      waited = true;
      if (SteadyNanos() >= deadline) {
        // The load goes on; a later request finds it loaded (or still loading).
        return aws::AwsError("ModelNotReadyException",
                             "Model " + std::string(target_model) + " of endpoint " + route.name +
                                 " is still being loaded after " + std::to_string(options_.load_wait.count() / 1000) +
                                 " seconds; loading continues in the background. Try again later.",
                             429);
      }
      changed_.WaitUntil(mu_, SteadyPoint(deadline));
    }
    ++slot.in_use;
    slot.last_used = SteadyNanos();
    lease.model_name = name;
    lease.cache_hit = !waited;
  }
  Sample(route.name, variant.name, "ModelCacheHit", lease.cache_hit ? 1.0 : 0.0);
  if (!lease.cache_hit) {
    Sample(route.name, variant.name, "ModelLoadingWaitTime", static_cast<double>((SteadyNanos() - wait_start) / 1000));
  }
  return lease;
}

void MultiModelManager::Release(const EndpointRoute& route, const VariantRoute& variant, const ModelLease& lease,
                                bool lost) {
  if (lease.instance == nullptr) return;
  MutexLock lock(mu_);
  auto state = instances_.find(lease.instance->instance_id);
  if (state == instances_.end()) return;
  auto it = state->second.slots.find(lease.model_name);
  if (it == state->second.slots.end()) return;
  Slot& slot = it->second;
  if (slot.in_use > 0) --slot.in_use;
  slot.last_used = SteadyNanos();
  if (lost && slot.state == SlotState::kLoaded) {
    slot.state = SlotState::kIdle;  // the next request loads it again (409 if it was there after all)
    changed_.NotifyAll();
    return;
  }
  if (!variant.model_cache_enabled && slot.in_use == 0 && slot.state == SlotState::kLoaded && !stopping_) {
    slot.state = SlotState::kUnloading;
    auto job = std::make_shared<Job>();
    job->drop = true;
    job->instance = lease.instance;
    job->endpoint = route.name;
    job->variant = variant.name;
    job->log_group_arn = route.log_group_arn;
    job->name = lease.model_name;
    job->target_model = slot.target_model;
    job->models_dir = state->second.models_dir;
    Spawn(std::move(job));
  }
}

void MultiModelManager::Spawn(std::shared_ptr<Job> job) {
  MutexLock lock(jobs_mu_);
  // Join the jobs that ended, so the list follows the running ones.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->job->done.load()) {
      it->thread.join();
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  Running running;
  running.job = job;
  running.thread = std::thread([this, job = std::move(job)] {
    if (job->drop) {
      RunDrop(*job);
    } else {
      RunLoad(*job);
    }
    // The instance's target goes now: the endpoint controller drains an instance until nothing
    // but its run holds the target.
    MutexLock done(jobs_mu_);
    job->instance.reset();
    job->done.store(true);
  });
  jobs_.push_back(std::move(running));
}

void MultiModelManager::CancelJobsOfFailedInstances() {
  MutexLock lock(jobs_mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = *it->job;
    if (job.done.load()) {  // ended: its thread returns at once
      it->thread.join();
      it = jobs_.erase(it);
      continue;
    }
    if (job.instance != nullptr && job.instance->failure.cancelled() && !job.cancel.cancelled()) {
      job.cancel.Cancel(job.instance->failure.reason());
    }
    ++it;
  }
}

void MultiModelManager::RunLoad(Job& job) {
  const std::string dir = job.models_dir + "/" + job.name + "/model";
  if (job.models_dir.empty()) {
    EndJob(job, LoadError(0, "Kiln does not know the instance's model directory", job.log_group_arn));
    return;
  }
  if (!PathExists(dir)) {
    FreeDisk(job);
    if (Status made = MakeDirs(job.models_dir + "/" + job.name, 0755); !made.ok()) {
      EndJob(job, LoadError(0, "Failed to create the model directory: " + made.message(), job.log_group_arn));
      return;
    }
    const int64_t start = SteadyNanos();
    Status fetched = fetcher_->Fetch(job.uri, dir);
    if (!fetched.ok()) {
      (void)RemoveAll(job.models_dir + "/" + job.name);
      KLOG(warn, "multi-model download failed",
           {{"endpoint", job.endpoint}, {"target_model", job.target_model}, {"error", fetched.message()}});
      if (fetched.code() == StatusCode::kNotFound) {
        auto [bucket, key] = SplitS3(job.uri);
        EndJob(job, aws::AwsError("ValidationError",
                                  "Failed to download model data(bucket: " + bucket + ", key: " + key +
                                      "). Please ensure that there is an object located at the URL and that the "
                                      "role passed to CreateModel has permissions to download the model.",
                                  400));
      } else {
        EndJob(job, LoadError(0, "Failed to download model data for " + job.target_model + ": " + fetched.message(),
                              job.log_group_arn));
      }
      return;
    }
    Sample(job.endpoint, job.variant, "ModelDownloadingTime", static_cast<double>((SteadyNanos() - start) / 1000));
  }
  EndJob(job, LoadIntoContainer(job));
}

std::optional<aws::AwsError> MultiModelManager::LoadIntoContainer(Job& job) {
  const InstanceTarget& instance = *job.instance;
  const std::string body =
      nlohmann::json{{"model_name", job.name}, {"url", "/opt/ml/models/" + job.name + "/model"}}.dump();
  HeaderMap headers{{"Content-Type", "application/json"}, {"X-Amzn-SageMaker-Target-Model", job.target_model}};
  bool listed = false;  // the container's own list was read once (AdoptListedModels)
  while (true) {
    net::ClientRequest load;
    load.method = "POST";
    load.target = "/models";
    load.headers = &headers;
    load.body = body;
    load.cancel = &job.cancel;
    const int64_t start = SteadyNanos();
    auto answer = client_->Send(instance.host, instance.port, load,
                                net::ClientTimeouts{options_.connect_timeout_ms, options_.load_timeout_ms});
    if (!answer.ok()) return LoadError(0, answer.status().message(), job.log_group_arn);
    if (answer->status == 200) {
      Sample(job.endpoint, job.variant, "ModelLoadingTime", static_cast<double>((SteadyNanos() - start) / 1000));
      return std::nullopt;
    }
    if (answer->status == 409) return std::nullopt;  // already loaded
    if (answer->status != 507) return LoadError(answer->status, ContainerMessage(answer->body), job.log_group_arn);
    // 507: make room by unloading the least recently used model nobody is using.
    std::string victim;
    {
      MutexLock lock(mu_);
      auto state = instances_.find(instance.instance_id);
      if (state != instances_.end()) {
        int64_t oldest = 0;
        for (auto& [name, slot] : state->second.slots) {
          if (name == job.name || slot.state != SlotState::kLoaded || slot.in_use > 0) continue;
          if (victim.empty() || slot.last_used < oldest) {
            victim = name;
            oldest = slot.last_used;
          }
        }
        if (!victim.empty()) state->second.slots[victim].state = SlotState::kUnloading;
      }
    }
    if (victim.empty() && !listed) {
      // Models Kiln does not know of (loaded before a server restart adopted the instance) count
      // as the least recently used: the container's list (first page) names them.
      listed = true;
      if (AdoptListedModels(job) > 0) continue;
    }
    if (victim.empty()) return LoadError(507, ContainerMessage(answer->body), job.log_group_arn);
    if (Status dropped = Unload(job, victim); !dropped.ok()) {
      return LoadError(0, "Failed to unload model " + victim + " to make room: " + dropped.message(),
                       job.log_group_arn);
    }
  }
}

int MultiModelManager::AdoptListedModels(const Job& job) {
  net::ClientRequest request;
  request.method = "GET";
  request.target = "/models?limit=1000";
  request.cancel = &job.cancel;
  auto answer = client_->Send(job.instance->host, job.instance->port, request,
                              net::ClientTimeouts{options_.connect_timeout_ms, options_.unload_timeout_ms});
  if (!answer.ok() || answer->status != 200) return 0;
  nlohmann::json list = nlohmann::json::parse(answer->body, nullptr, false);
  if (!list.is_object() || !list.contains("models") || !list["models"].is_array()) return 0;
  int adopted = 0;
  MutexLock lock(mu_);
  auto state = instances_.find(job.instance->instance_id);
  if (state == instances_.end()) return 0;
  for (const nlohmann::json& model : list["models"]) {
    if (!model.is_object() || !model.contains("modelName") || !model["modelName"].is_string()) continue;
    const std::string name = model["modelName"].get<std::string>();
    if (name == job.name) continue;
    Slot& slot = state->second.slots[name];
    if (slot.state != SlotState::kIdle || slot.waiters > 0) continue;
    slot.state = SlotState::kLoaded;
    slot.last_used = 0;  // older than anything this server used
    ++adopted;
  }
  return adopted;
}

Status MultiModelManager::Unload(const Job& job, const std::string& name) {
  const InstanceTarget& instance = *job.instance;
  net::ClientRequest request;
  request.method = "DELETE";
  const std::string target = "/models/" + name;
  request.target = target;
  request.cancel = &job.cancel;
  const int64_t start = SteadyNanos();
  auto answer = client_->Send(instance.host, instance.port, request,
                              net::ClientTimeouts{options_.connect_timeout_ms, options_.unload_timeout_ms});
  Status result = Status::Ok();
  if (!answer.ok()) {
    result = answer.status();
  } else if (answer->status == 200) {
    Sample(job.endpoint, job.variant, "ModelUnloadingTime", static_cast<double>((SteadyNanos() - start) / 1000));
  } else if (answer->status != 404) {  // 404: not loaded there any more, as wanted
    result = Status::Internal("DELETE /models/" + name + " answered " + std::to_string(answer->status) + ": " +
                              ContainerMessage(answer->body));
  }
  MutexLock lock(mu_);
  auto state = instances_.find(instance.instance_id);
  if (state != instances_.end()) {
    auto slot = state->second.slots.find(name);
    if (slot != state->second.slots.end() && slot->second.state == SlotState::kUnloading) {
      // Failed: still loaded as far as we know.
      slot->second.state = result.ok() ? SlotState::kIdle : SlotState::kLoaded;
    }
  }
  changed_.NotifyAll();
  return result;
}

bool MultiModelManager::StillLoaded(const ModelLease& lease) const {
  if (lease.instance == nullptr) return true;
  net::ClientRequest request;
  request.method = "GET";
  const std::string target = "/models/" + lease.model_name;
  request.target = target;
  request.cancel = &lease.instance->failure;
  auto answer = client_->Send(lease.instance->host, lease.instance->port, request,
                              net::ClientTimeouts{options_.connect_timeout_ms, options_.unload_timeout_ms});
  return !(answer.ok() && answer->status == 404);
}

void MultiModelManager::RunDrop(Job& job) {
  Status unloaded = Unload(job, job.name);
  if (!unloaded.ok()) {
    KLOG(warn, "multi-model unload failed",
         {{"endpoint", job.endpoint}, {"target_model", job.target_model}, {"error", unloaded.message()}});
    return;
  }
  // Disabled cache: the files go too, unless a request loaded the model again meanwhile.
  {
    MutexLock lock(mu_);
    auto state = instances_.find(job.instance->instance_id);
    if (state == instances_.end()) return;
    auto slot = state->second.slots.find(job.name);
    if (slot == state->second.slots.end() || slot->second.state != SlotState::kIdle) return;
    slot->second.state = SlotState::kWorking;  // no load starts while the files go
  }
  (void)RemoveAll(job.models_dir + "/" + job.name);
  MutexLock lock(mu_);
  auto state = instances_.find(job.instance->instance_id);
  if (state != instances_.end()) state->second.slots[job.name].state = SlotState::kIdle;
  changed_.NotifyAll();
}

void MultiModelManager::FreeDisk(const Job& job) {
  auto too_full = [&] {
    struct statvfs fs {};
    if (::statvfs(job.models_dir.c_str(), &fs) != 0 || fs.f_blocks == 0) return false;
    return 1.0 - static_cast<double>(fs.f_bavail) / static_cast<double>(fs.f_blocks) > options_.disk_high_water;
  };
  while (too_full()) {
    std::string victim;
    {
      MutexLock lock(mu_);
      auto state = instances_.find(job.instance->instance_id);
      if (state == instances_.end()) return;
      int64_t oldest = 0;
      for (auto& [name, slot] : state->second.slots) {
        if (name == job.name || slot.state != SlotState::kIdle || slot.waiters > 0) continue;
        if (!PathExists(job.models_dir + "/" + name)) continue;
        if (victim.empty() || slot.last_used < oldest) {
          victim = name;
          oldest = slot.last_used;
        }
      }
      if (victim.empty()) return;  // nothing left to delete: the download tries anyway
      state->second.slots[victim].state = SlotState::kWorking;
    }
    (void)RemoveAll(job.models_dir + "/" + victim);
    MutexLock lock(mu_);
    auto state = instances_.find(job.instance->instance_id);
    if (state != instances_.end()) state->second.slots[victim].state = SlotState::kIdle;
    changed_.NotifyAll();
  }
}

void MultiModelManager::EndJob(Job& job, std::optional<aws::AwsError> error) {
  MutexLock lock(mu_);
  auto state = instances_.find(job.instance->instance_id);
  if (state != instances_.end()) {
    Slot& slot = state->second.slots[job.name];
    slot.state = error.has_value() ? SlotState::kIdle : SlotState::kLoaded;
    slot.error = std::move(error);
    ++slot.jobs_ended;
    slot.last_used = SteadyNanos();
  }
  changed_.NotifyAll();
}

void MultiModelManager::Sample(const std::string& endpoint, const std::string& variant, std::string_view metric,
                               double value) {
  if (metrics_ == nullptr) return;
  MutexLock lock(metrics_mu_);
  samples_[{endpoint, variant, std::string(metric)}].push_back(value);
}

std::vector<std::string> MultiModelManager::LoadedModelsForTest(const std::string& instance_id) const {
  MutexLock lock(mu_);
  std::vector<std::pair<int64_t, std::string>> loaded;
  auto state = instances_.find(instance_id);
  if (state == instances_.end()) return {};
  for (const auto& [name, slot] : state->second.slots) {
    if (slot.state == SlotState::kLoaded) loaded.emplace_back(slot.last_used, name);
  }
  std::sort(loaded.begin(), loaded.end());
  std::vector<std::string> names;
  for (auto& [used, name] : loaded) names.push_back(name);
  return names;
}

void MultiModelManager::FlushForTest() { Flush(); }

void MultiModelManager::FlushLoop() {
  while (true) {
    {
      MutexLock lock(mu_);
      const auto until = std::chrono::steady_clock::now() + options_.flush_interval;
      while (!stopping_ && std::chrono::steady_clock::now() < until) stop_cv_.WaitUntil(mu_, until);
      if (stopping_) return;
    }
    CancelJobsOfFailedInstances();
    Flush();
  }
}

void MultiModelManager::Flush() {
  if (metrics_ == nullptr) return;
  const int64_t now_millis = EpochMillis();
  const int64_t now = SteadyNanos();
  std::vector<observe::MetricDatum> invocation_batch;
  std::vector<observe::MetricDatum> instance_batch;
  {
    std::map<std::tuple<std::string, std::string, std::string>, std::vector<double>> samples;
    {
      MutexLock lock(metrics_mu_);
      samples.swap(samples_);
    }
    for (auto& [key, values] : samples) {
      const auto& [endpoint, variant, metric] = key;
      std::map<double, double> counts;
      for (double v : values) counts[v] += 1;
      observe::MetricDatum datum;
      datum.name = metric;
      datum.dimensions = {{"EndpointName", endpoint}, {"VariantName", variant}};
      datum.timestamp_millis = now_millis;
      datum.values_counts.assign(counts.begin(), counts.end());
      datum.unit = metric == "ModelCacheHit" ? "Count" : "Microseconds";
      invocation_batch.push_back(std::move(datum));
    }
  }
  {
    std::set<std::string> live;
    bool know_live = false;
    if (routes_ != nullptr) {
      know_live = true;
      for (const auto& [name, route] : *routes_->All()) {
        for (const VariantRoute& variant : route->variants) {
          for (const auto& instance : variant.instances) live.insert(instance->instance_id);
        }
      }
    }
    MutexLock lock(mu_);
    for (auto it = instances_.begin(); it != instances_.end();) {
      InstanceState& state = it->second;
      bool busy = false;
      int loaded = 0;
      for (const auto& [name, slot] : state.slots) {
        if (slot.state == SlotState::kLoaded) ++loaded;
        if (slot.state == SlotState::kWorking || slot.state == SlotState::kUnloading || slot.in_use > 0 ||
            slot.waiters > 0) {
          busy = true;
        }
      }
      if (know_live && !live.contains(it->first) && !busy) {
        it = instances_.erase(it);  // the instance left its routes: its models went with it
        continue;
      }
      if (loaded != state.written_count ||
          now - state.last_count_write >=
              std::chrono::duration_cast<std::chrono::nanoseconds>(options_.count_refresh).count()) {
        state.written_count = loaded;
        state.last_count_write = now;
        for (bool with_host : {false, true}) {
          observe::MetricDatum datum;
          datum.name = "LoadedModelCount";
          datum.dimensions = {{"EndpointName", state.endpoint}, {"VariantName", state.variant}};
          if (with_host) datum.dimensions["Host"] = state.endpoint + "/" + state.variant + "/" + it->first;
          datum.timestamp_millis = now_millis;
          datum.value = loaded;
          datum.unit = "Count";
          instance_batch.push_back(std::move(datum));
        }
      }
      ++it;
    }
  }
  if (!invocation_batch.empty()) {
    if (Status s = metrics_->Put(kInvocationNamespace, invocation_batch); !s.ok()) {
      KLOG(warn, "multi-model metrics not written", {{"error", s.message()}});
    }
  }
  if (!instance_batch.empty()) {
    if (Status s = metrics_->Put(kInstanceNamespace, instance_batch); !s.ok()) {
      KLOG(warn, "multi-model instance metrics not written", {{"error", s.message()}});
    }
  }
}

}  // namespace kiln::serving
