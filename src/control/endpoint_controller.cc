#include "control/endpoint_controller.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <limits>

#include "agent/model_data.h"
#include "base/fs.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"
#include "control/endpoint_instance.h"
#include "control/endpoint_plan.h"
#include "control/endpoint_rollout.h"
#include "control/endpoint_states.h"
#include "control/endpoint_status.h"
#include "control/instance_placement.h"
#include "control/log_pump.h"
#include "control/training_launch.h"
#include "serving/data_capture.h"
#include "store/autoscaling_repository.h"

namespace kiln::control {

namespace {

using json = nlohmann::json;

constexpr std::string_view kRuntimePrefix = "endpoint-";

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// "i-" + 17 hex digits, like EC2 instance ids (serving-contract.md §15.1).
std::string NewInstanceId() { return "i-" + RandomHex(9).substr(0, 17); }

using store::Deployment;
using store::EndpointStatus;

// Multi-container models (serving-contract.md §8): every ContainerDefinition of a model with more
// than one in Containers; empty for single-container models.
std::vector<json> ContainersOf(const json& model) {
  std::vector<json> out;
  if (auto it = model.find("Containers"); it != model.end() && it->is_array() && it->size() > 1) {
    for (const json& container : *it) out.push_back(container);
  }
  return out;
}

// A variant model's InferenceExecutionConfig.Mode (§8): kSingle unless it has several containers.
serving::ContainerMode ContainerModeOf(const json& model) {
  if (ContainersOf(model).empty()) return serving::ContainerMode::kSingle;
  auto config = model.find("InferenceExecutionConfig");
  const bool direct = config != model.end() && config->is_object() && config->value("Mode", "") == "Direct";
  return direct ? serving::ContainerMode::kDirect : serving::ContainerMode::kSerial;
}

// The ContainerDefinition a variant runs (PrimaryContainer, or the first of Containers; the
// others of a multi-container model are ContainersOf's).
json ContainerOf(const json& model) {
  if (model.contains("PrimaryContainer")) return model["PrimaryContainer"];
  if (model.contains("Containers") && model["Containers"].is_array() && !model["Containers"].empty()) {
    return model["Containers"][0];
  }
  return json::object();
}

bool PortFree(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// EndpointRun

class EndpointController::EndpointRun {
 public:
  EndpointRun(EndpointController* controller, std::string name) : controller_(controller), name_(std::move(name)) {}
  ~EndpointRun() { Join(); }

  void Adopt(std::shared_ptr<EndpointInstance> instance) { instances_.push_back(std::move(instance)); }
  void SetCredential(aws::Credential credential) { credential_ = std::move(credential); }

  void Start() {
    for (auto& instance : instances_) instance->Start();
    thread_ = std::thread([this] { Run(); });
  }
  void Notify() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    dirty_ = true;
    cv_.NotifyAll();
  }
  void Detach() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    detach_ = true;
    cv_.NotifyAll();
  }
  // Reconciles now and has the instances re-evaluate their waits (EndpointController::Wake).
  void Wake() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    wake_ = true;
    cv_.NotifyAll();
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  const std::string& name() const { return name_; }

 private:
  const EndpointControllerOptions& options() const { return controller_->options_; }
  const EndpointControllerDeps& deps() const { return controller_->deps_; }

  // Reconciles when notified, when the earliest wake a reconcile asked for (Retry: a backoff's
  // end, a delete's re-check) comes, or — when none was asked for — after an idle second, a
  // safety net for a change that would otherwise go unnoticed.
  void Run() EXCLUDES(mu_) {
    while (true) {
      bool wake_instances = false;
      {
        MutexLock lock(mu_);
        while (!dirty_ && !detach_ && !wake_) {
          if (next_wake_ == kNever) {
            // The idle second: until notified or it has passed.
            const auto idle_end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
            while (!dirty_ && !detach_ && !wake_) {
              if (cv_.WaitUntil(mu_, idle_end) == std::cv_status::timeout) break;
            }
            break;
          }
          const int64_t now = controller_->DeadlineMillis();
          if (next_wake_ <= now) break;
          cv_.WaitFor(mu_, std::chrono::milliseconds(next_wake_ - now));
        }
        if (detach_) break;
        wake_instances = wake_;
        wake_ = false;
        dirty_ = false;
        next_wake_ = kNever;
      }
      if (wake_instances) {
        for (auto& instance : instances_) instance->Wake();
      }
      if (Reconcile()) break;
    }
    for (auto& instance : instances_) {
      if (!finished_) instance->Detach();
    }
    for (auto& instance : instances_) instance->Join();
    instances_.clear();
    if (finished_) controller_->OnRunFinished(name_);
  }

  std::shared_ptr<EndpointInstance> Launch(const store::EndpointRecord& record, const Deployment& deployment,
                                           const std::string& variant) {
    const json* config_variant = deployment.FindVariant(variant);
    if (config_variant == nullptr) return nullptr;
    std::string model_name = config_variant->value("ModelName", "");
    json model = deployment.Model(model_name);
    if (credential_.access_key_id.empty()) {
      credential_ = deps().credentials->Issue(model.value("ExecutionRoleArn", ""), record.name);
      deps().credentials->Register(credential_);
      credential_dirty_ = true;
    }
    EndpointInstance::Spec spec;
    spec.endpoint_name = record.name;
    spec.instance_id = NewInstanceId();
    spec.runtime_id = std::string(kRuntimePrefix) + record.name + "-" + spec.instance_id;
    if (options().remote_instances && deps().database != nullptr) {
      // Where the cluster should place it: the endpoint's kiln:slurm-* tags.
      if (auto tags = store::TagRepository(deps().database).List(record.arn); tags.ok()) {
        spec.placement = PlacementFromTags(*tags);
      }
    }
    int port_base = 0;
    if (deps().networks != nullptr) {
      // Namespaced: no port block; a lease on the endpoint's network (a failure fails the
      // instance with the reason, as any other provisioning failure does).
      auto isolated = model.find("EnableNetworkIsolation");
      AttachNetwork(record.name, isolated != model.end() && isolated->is_boolean() && isolated->get<bool>(), spec);
    } else {
      // One block of ports per container (multi-container models, serving-contract.md §2).
      port_base = controller_->ReservePorts(std::max<int>(1, static_cast<int>(ContainersOf(model).size())));
      if (port_base == 0) {
        KLOG(error, "no free port block for an endpoint instance", {{"endpoint", name_}});
        return nullptr;
      }
    }
    spec.variant = variant;
    spec.model_name = model_name;
    spec.instance_type = config_variant->value("InstanceType", "");
    if (config_variant->contains("ServerlessConfig")) {
      // A serverless instance is sized by the variant's memory (instance_catalog.h).
      spec.serverless = true;
      spec.instance_type =
          ServerlessInstanceType((*config_variant)["ServerlessConfig"].value("MemorySizeInMB", int64_t{1024}));
    }
    spec.generation = deployment.deployed_millis;
    spec.container = ContainerOf(model);
    spec.containers = ContainersOf(model);
    spec.startup_timeout =
        std::chrono::seconds(config_variant->value("ContainerStartupHealthCheckTimeoutInSeconds",
                                                   static_cast<int64_t>(options().default_startup_timeout.count())));
    spec.download_timeout = std::chrono::seconds(config_variant->value(
        "ModelDataDownloadTimeoutInSeconds", static_cast<int64_t>(options().default_download_timeout.count())));
    spec.provision_timeout = ProvisionTimeout(*config_variant, options().default_provision_timeout);
    spec.unpack_cap = ModelDataCap(*config_variant, options().archive_caps);
    spec.credential = credential_;
    spec.dir = options().work_dir + "/" + record.name + "/" + spec.instance_id;
    spec.port_base = port_base;
    auto instance = std::make_shared<EndpointInstance>(*controller_->instance_env_, std::move(spec), false,
                                                       std::nullopt, [this] { Notify(); });
    instances_.push_back(instance);
    instance->Start();
    return instance;
  }

  void StopAll() {
    for (auto& instance : instances_) instance->RequestStop();
  }

  // Namespaced mode: the endpoint's network exists with the model's isolation (Ensure, once per
  // run and setting) and the instance has a lease on it (the runtime id is the lease id: Sweep
  // keeps the leases of running instances). Sets spec.network, or spec.network_error.
  void AttachNetwork(const std::string& endpoint, bool isolated, EndpointInstance::Spec& spec) {
    const std::string network = EndpointNetworkName(endpoint);
    if (network_ != NetworkState::kEnsured || network_isolated_ != isolated) {
      auto ensured = deps().networks->Ensure(network, isolated);
      if (!ensured.ok()) {
        network_ = NetworkState::kUnknown;
        if (ensured.status().code() == StatusCode::kFailedPrecondition) {
          // An UpdateEndpoint whose model changes EnableNetworkIsolation: the instances of both
          // deployments share the endpoint's one network while the update runs.
          spec.network_error = "ClientError: Kiln cannot change EnableNetworkIsolation (to " +
                               std::string(isolated ? "true" : "false") + ") of endpoint " + endpoint +
                               " while it has instances: they share network " + network +
                               ". Delete the endpoint and create it again with the new model.";
        } else {
          spec.network_error = "InternalServerError: The network of endpoint " + endpoint +
                               " could not be created: " + ensured.status().message();
        }
        return;
      }
      network_ = NetworkState::kEnsured;
      network_isolated_ = isolated;
    }
    auto attached = deps().networks->Attach(network, spec.runtime_id, LoopbackForwards(options().endpoint_url));
    if (!attached.ok()) {
      spec.network_error = "InternalServerError: No address for an instance of endpoint " + endpoint + " on network " +
                           network + ": " + attached.status().message();
      return;
    }
    spec.network = std::move(*attached);
  }

  // Namespaced mode: removes the endpoint's network once no instance of the run is left (it is
  // deleted, gone, or Failed). Once per run until a launch ensures it again.
  void RemoveNetwork(const std::string& endpoint) {
    if (deps().networks == nullptr || !instances_.empty() || network_ == NetworkState::kRemoved) return;
    if (Status s = deps().networks->Remove(EndpointNetworkName(endpoint)); !s.ok()) {
      KLOG(warn, "endpoint network not removed", {{"endpoint", endpoint}, {"error", s.ToString()}});
      return;
    }
    network_ = NetworkState::kRemoved;
  }

  // Joins and drops stopped instances. True when any was dropped. A failed instance stays until
  // Reconcile has acted on its failure: one that fails before launch (image, capacity, model
  // data) stops at once, and dropping it first would lose the failure and launch it again.
  bool Reap() {
    bool any = false;
    for (auto it = instances_.begin(); it != instances_.end();) {
      if ((*it)->stopped() && (!(*it)->failed() || (*it)->failure_handled)) {
        (*it)->Join();
        it = instances_.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    return any;
  }

  // The endpoint is Failed, Deleting or gone: no failure needs acting on any more, so every
  // stopped instance may be reaped.
  void ForgetFailures() {
    for (auto& instance : instances_) {
      if (instance->failed()) instance->failure_handled = true;
    }
  }

  // One level-triggered step. True when the run is over (the endpoint is gone).
  bool Reconcile() {
    Reap();
    auto loaded = controller_->endpoints_.Get(name_);
    if (!loaded.ok()) {
      if (loaded.status().code() != StatusCode::kNotFound) {
        KLOG(warn, "endpoint read failed", {{"endpoint", name_}, {"error", loaded.status().ToString()}});
        return false;
      }
      // Gone (deleted by us, or by hand): nothing may keep running.
      StopAll();
      ForgetFailures();
      Reap();
      deps().routes->Remove(route_name_.empty() ? name_ : route_name_);
      if (!instances_.empty()) {
        Retry();
        return false;
      }
      RemoveNetwork(route_name_.empty() ? name_ : route_name_);
      finished_ = true;
      return true;
    }
    store::EndpointRecord record = std::move(*loaded);
    route_name_ = record.name;
    if (credential_.access_key_id.empty() && !record.state.credentials.is_null()) {
      credential_ = CredentialFromJson(record.state.credentials);
      deps().credentials->Register(credential_);
    }

    if (record.status == EndpointStatus::kDeleting) return ReconcileDeleting(record);
    if (record.status == EndpointStatus::kFailed) {
      StopAll();
      ForgetFailures();
      Publish(record, Deployment{}, 0);
      WriteObserved(record, Deployment{});
      RemoveNetwork(record.name);  // its subnet is free until an update launches again
      return false;
    }

    return Execute(record, PlanEndpoint(PlanInputFor(record)));
  }

  // What the plan needs of this run's instances and backoffs now.
  PlanInput PlanInputFor(const store::EndpointRecord& record) const {
    PlanInput input;
    input.record = &record;
    input.backoff = backoff_;
    input.now = controller_->DeadlineMillis();
    input.replacement_backoff = options().replacement_backoff;
    for (const auto& instance : instances_) {
      const auto& spec = instance->spec();
      input.instances.push_back({.instance_id = spec.instance_id,
                                 .variant = spec.variant,
                                 .generation = spec.generation,
                                 .healthy = instance->healthy(),
                                 .failed = instance->failed(),
                                 .failure_handled = instance->failure_handled,
                                 .stop_requested = instance->stop_requested(),
                                 .launched_millis = spec.launched_millis,
                                 .failure_reason = instance->failed() ? instance->failure_reason() : ""});
    }
    // A guarded update whose traffic shifts: its alarms, read each pass (bakes poll them).
    input.wall_now = controller_->WallMillis();
    input.alarm = AlarmInAlarm(record);
    return input;
  }

  // The first AutoRollbackConfiguration alarm in ALARM (CloudWatch PutMetricAlarm's, evaluated by
  // control/autoscaler.cc), while the rollout of the pending deployment has shifted traffic; ""
  // otherwise (also for an alarm deleted meanwhile).
  std::string AlarmInAlarm(const store::EndpointRecord& record) const {
    if (!record.pending || !record.state.rollout ||
        record.state.rollout->generation != record.pending->deployed_millis) {
      return "";
    }
    if (!record.request.is_object() || !record.request.contains("DeploymentConfig")) return "";
    auto policy = ParseDeploymentConfig(record.request["DeploymentConfig"]);
    if (!policy.ok()) return "";
    store::AutoscalingRepository alarms(deps().database);
    for (const std::string& name : policy->alarms) {
      auto alarm = alarms.Get(store::AutoscalingKind::kAlarm, "cloudwatch", "", "", name);
      if (alarm.ok() && alarm->state.is_object() && alarm->state.value("state", "") == "ALARM") return name;
    }
    return "";
  }

  std::shared_ptr<EndpointInstance> FindInstance(const std::string& instance_id) const {
    for (const auto& instance : instances_) {
      if (instance->spec().instance_id == instance_id) return instance;
    }
    return nullptr;
  }

  // Carries out one pass's actions in order (endpoint_plan.h); the last one ends the pass.
  bool Execute(const store::EndpointRecord& record, const std::vector<EndpointAction>& actions) {
    const Deployment& target = record.pending ? *record.pending : record.deployment;
    for (const EndpointAction& action : actions) {
      switch (action.kind) {
        case EndpointAction::Kind::kHandleFailure:
          if (auto instance = FindInstance(action.instance_id)) instance->failure_handled = true;
          break;
        case EndpointAction::Kind::kSetBackoff: backoff_[action.variant] = action.backoff; break;
        case EndpointAction::Kind::kClearBackoff: backoff_.erase(action.variant); break;
        case EndpointAction::Kind::kStopInstance:
          if (auto instance = FindInstance(action.instance_id)) instance->RequestStop();
          break;
        case EndpointAction::Kind::kLaunch:
          for (int i = 0; i < action.count; ++i) {
            if (!Launch(record, target, action.variant)) break;
          }
          break;
        case EndpointAction::Kind::kRetryAt: Retry(action.when); break;
        case EndpointAction::Kind::kFailEndpoint: return FailEndpoint(record, action.reason);
        case EndpointAction::Kind::kRollBack: return RollBack(record, action.reason);
        case EndpointAction::Kind::kRollbackFailed: return RollbackFailed(record, action.reason);
        case EndpointAction::Kind::kShift: return Shift(record, action.rollout);
        case EndpointAction::Kind::kComplete: {
          store::EndpointRecord next = record;
          next.state.rollout.reset();  // a rollout (or its rollback) ends here
          if (!action.promote_pending || !record.pending) return Complete(record, std::move(next));
          next.config_name = record.pending->config_name;
          next.deployment = *record.pending;
          next.pending.reset();
          next.failure_reason.clear();
          return Complete(record, std::move(next));
        }
        case EndpointAction::Kind::kPublish: {
          // Route and observed state: the pending deployment serves only once it has taken over
          // (a guarded update's shift: its share).
          const Deployment& routed = record.pending ? record.deployment : target;
          PublishRollout(record, routed, record.state.rollout ? &*record.state.rollout : nullptr);
          WriteObserved(record, routed);
          return false;
        }
      }
    }
    return false;
  }

  // Routes `routed` (its instances of `generation`). During a guarded update's shift (`shift`, a
  // rollout of the pending deployment) the route carries the new fleet too, with its share of the
  // traffic: the recorded fraction, or (rolling updates, `by_instances`) its share of the routable
  // instances. `fallback` (RollingBack): instances of that generation serve while `routed` has
  // none routable.
  void Publish(const store::EndpointRecord& record, const Deployment& routed, int64_t generation,
               const store::RolloutState* shift = nullptr, bool by_instances = false, int64_t fallback = 0) {
    std::string signature;
    std::shared_ptr<serving::EndpointRoute> route = BuildRoute(record, routed, generation, signature);
    std::shared_ptr<serving::EndpointRoute> other;
    double fraction = 0;
    if (shift != nullptr && record.pending) {
      // The new fleet's variants as they will serve (their desired weights: no pending left).
      store::EndpointRecord promoted = record;
      promoted.pending.reset();
      other = BuildRoute(promoted, *record.pending, record.pending->deployed_millis, signature);
      fraction = shift->fraction;
      if (by_instances) {
        size_t old_count = 0;
        size_t new_count = 0;
        for (const auto& v : route->variants) old_count += v.instances.size();
        for (const auto& v : other->variants) new_count += v.instances.size();
        fraction = new_count + old_count == 0 ? 0 : static_cast<double>(new_count) / (new_count + old_count);
      }
    } else if (fallback != 0) {
      size_t old_count = 0;
      for (const auto& v : route->variants) old_count += v.instances.size();
      if (old_count == 0) {
        other = BuildRoute(record, routed, fallback, signature);
        fraction = 1;
      }
    }
    if (other) {
      route->new_variants = std::move(other->variants);
      route->new_fleet_fraction = fraction;
      signature += "|shift:" + std::to_string(fraction);
    }
    if (signature == published_signature_) return;
    published_signature_ = signature;
    deps().routes->Publish(std::move(route));
  }

  // One deployment's route (Publish); appends what identifies it to `signature`.
  std::shared_ptr<serving::EndpointRoute> BuildRoute(const store::EndpointRecord& record, const Deployment& routed,
                                                     int64_t generation, std::string& signature) {
    auto route = std::make_shared<serving::EndpointRoute>();
    route->name = record.name;
    route->arn = record.arn;
    route->status = std::string(store::ToString(record.status));
    route->log_group_arn = "arn:aws:logs:" + options().region + ":" + options().account_id +
                           ":log-group:/aws/sagemaker/Endpoints/" + record.name;
    if (routed.endpoint_config.is_object() && routed.endpoint_config.contains("AsyncInferenceConfig")) {
      route->async = true;
      route->async_config = routed.endpoint_config["AsyncInferenceConfig"].dump();
    }
    signature += route->status + "|" + route->async_config;
    for (const std::string& variant : routed.VariantNames()) {
      serving::VariantRoute v;
      v.name = variant;
      v.weight = CurrentWeight(record, routed, variant);
      const json* config_variant = routed.FindVariant(variant);
      if (config_variant && config_variant->contains("ServerlessConfig")) {
        // The configuration's ServerlessConfig with UpdateEndpointWeightsAndCapacities' (and the
        // autoscaler's) overrides; `desired` is the routed deployment's unless an update is pending.
        auto desired = record.desired.find(variant);
        const json serverless = store::EffectiveServerlessConfig(
            *config_variant, !record.pending && desired != record.desired.end() ? &desired->second : nullptr);
        route->serverless_max_concurrency = serverless.value("MaxConcurrency", 1);
        route->serverless_provisioned = serverless.value("ProvisionedConcurrency", 0);
        signature += "|serverless:" + std::to_string(route->serverless_max_concurrency) + ":" +
                     std::to_string(route->serverless_provisioned);
      }
      if (config_variant && config_variant->contains("RoutingConfig") &&
          (*config_variant)["RoutingConfig"].value("RoutingStrategy", "") == "RANDOM") {
        v.strategy = serving::RoutingStrategy::kRandom;
      }
      // Multi-model (§7): the prefix TargetModel is relative to, and the cache setting.
      if (config_variant != nullptr) {
        // Multi-container (§8): how the variant's containers are called.
        v.container_mode = ContainerModeOf(routed.Model(config_variant->value("ModelName", "")));
        if (v.container_mode != serving::ContainerMode::kSingle) {
          if (v.container_mode == serving::ContainerMode::kSerial) route->pipeline = true;
          if (v.container_mode == serving::ContainerMode::kDirect) route->direct = true;
          signature += "|containers:" + std::to_string(static_cast<int>(v.container_mode));
        }
        json container = ContainerOf(routed.Model(config_variant->value("ModelName", "")));
        if (container.value("Mode", "") == "MultiModel") {
          route->multi_model = true;
          v.model_data_url = container.value("ModelDataUrl", "");
          v.model_cache_enabled = !(container.contains("MultiModelConfig") &&
                                    container["MultiModelConfig"].value("ModelCacheSetting", "") == "Disabled");
          signature += "|mme:" + v.model_data_url + (v.model_cache_enabled ? "" : ":nocache");
        }
      }
      signature += "|" + variant + ":" + std::to_string(v.weight) + ":" + std::to_string(static_cast<int>(v.strategy));
      for (auto& instance : instances_) {
        const auto& spec = instance->spec();
        if (spec.generation != generation || spec.variant != variant) continue;
        if (!instance->healthy() || instance->stop_requested() || instance->failed()) continue;
        v.instances.push_back(instance->target());
        signature += "," + spec.instance_id;
      }
      route->variants.push_back(std::move(v));
    }
    // Shadow variants (§9): sent copies by the router's observer, never picked for a request.
    for (const std::string& variant : routed.ShadowVariantNames()) {
      serving::VariantRoute v;
      v.name = variant;
      v.weight = 0;
      signature += "|shadow:" + variant;
      for (auto& instance : instances_) {
        const auto& spec = instance->spec();
        if (spec.generation != generation || spec.variant != variant) continue;
        if (!instance->healthy() || instance->stop_requested() || instance->failed()) continue;
        v.instances.push_back(instance->target());
        signature += "," + spec.instance_id;
      }
      route->shadow_variants.push_back(std::move(v));
    }
    // Data capture (§14): the settings the invoke path samples and writes with.
    if (routed.endpoint_config.is_object() && routed.endpoint_config.contains("DataCaptureConfig")) {
      const json& capture = routed.endpoint_config["DataCaptureConfig"];
      auto settings = serving::ParseDataCaptureConfig(capture);
      if (settings.ok()) {
        route->data_capture = *settings;
      } else {
        KLOG(warn, "data capture not set up", {{"endpoint", name_}, {"error", settings.status().ToString()}});
      }
      signature += "|capture:" + capture.dump();
    }
    return route;
  }

  // The AWS-shaped ProductionVariants summaries and the instance records, written when changed.
  void WriteObserved(const store::EndpointRecord& record, const Deployment& routed) {
    store::EndpointObservedState observed = Observed(record, routed);
    if (observed == last_observed_ && !credential_dirty_) return;
    int64_t version = record.version;
    auto written = controller_->endpoints_.Mutate(record.name, [&](store::EndpointRecord& rec) {
      if (rec.version != version) return Status::Aborted("changed meanwhile");
      MergeObserved(observed, rec.state);
      return Status::Ok();
    });
    if (written.ok()) {
      last_observed_ = observed;
      credential_dirty_ = false;
    } else {
      Retry();
    }
  }

  store::EndpointObservedState Observed(const store::EndpointRecord& record, const Deployment& routed) const {
    store::EndpointObservedState observed;
    int64_t generation = routed.deployed_millis;
    // Shadow variants' summaries too (DescribeEndpoint shows them as ShadowProductionVariants).
    for (const std::string& variant : routed.AllVariantNames()) {
      const json* config_variant = routed.FindVariant(variant);
      int current = 0;
      VariantProgress progress;
      progress.endpoint_status = record.status;
      progress.start_time = static_cast<double>(record.last_modified_millis) / 1000.0;
      for (auto& instance : instances_) {
        const auto& spec = instance->spec();
        if (spec.variant != variant) continue;
        if (spec.generation == generation && instance->healthy() && !instance->stop_requested()) ++current;
        if (!instance->healthy() && !instance->stop_requested() && !instance->failed()) {
          progress.provisioning = true;
          if (progress.waiting_for.empty()) progress.waiting_for = instance->waiting_for();
        }
      }
      store::VariantSummary summary;
      summary.variant_name = variant;
      summary.current_weight = CurrentWeight(record, routed, variant);
      summary.desired_weight = DesiredWeight(record, routed, variant);
      summary.current_instance_count = current;
      summary.desired_instance_count = DesiredCount(record, routed, variant);
      std::string model_name = config_variant ? config_variant->value("ModelName", "") : "";
      // DeployedImages: one per container (multi-container models, §8).
      std::vector<json> containers = ContainersOf(routed.Model(model_name));
      if (containers.empty()) containers.push_back(ContainerOf(routed.Model(model_name)));
      for (const json& container : containers) {
        if (auto image = container.find("Image"); image != container.end() && image->is_string()) {
          summary.deployed_images.push_back({.specified_image = image->get<std::string>(),
                                             .resolved_image = image->get<std::string>(),
                                             .resolution_time = static_cast<double>(generation) / 1000.0});
        }
      }
      summary.variant_status = VariantStatusEntries(progress);
      if (config_variant && config_variant->contains("RoutingConfig")) {
        summary.routing_config = (*config_variant)["RoutingConfig"];
      }
      observed.production_variants.push_back(std::move(summary));
    }
    for (auto& instance : instances_) {
      if (instance->launched() && !instance->stopped()) observed.instances.push_back(instance->Record());
    }
    if (!credential_.access_key_id.empty()) observed.credentials = CredentialToJson(credential_);
    observed.rollout = record.state.rollout;  // Shift/RollBack/Complete write it; kept as it is
    return observed;
  }

  // Writes what Observed() computed into a row's state. Credentials stay when the run has none
  // (they were issued before and are not forgotten).
  static void MergeObserved(const store::EndpointObservedState& observed, store::EndpointObservedState& state) {
    state.production_variants = observed.production_variants;
    state.instances = observed.instances;
    if (!observed.credentials.is_null()) state.credentials = observed.credentials;
    state.rollout = observed.rollout;
  }

  // Status changes that end an operation (→ InService): the route is published and the observed
  // state computed for the record as it will be, and both are written with the status in one
  // transaction, so that a client seeing InService also sees (and gets) the new weights, counts
  // and deployment.
  bool Complete(const store::EndpointRecord& record, store::EndpointRecord next) {
    next.status = EndpointStatus::kInService;
    Publish(next, next.deployment, next.deployment.deployed_millis);
    store::EndpointObservedState observed = Observed(next, next.deployment);
    bool written = TransitionWritten(record, [&](store::EndpointRecord& rec) {
      SetStatus(rec, next.status);
      rec.deployment = next.deployment;
      rec.pending = next.pending;
      rec.config_name = next.config_name;
      rec.failure_reason = next.failure_reason;
      MergeObserved(observed, rec.state);
      return Status::Ok();
    });
    if (written) {
      last_observed_ = observed;
      credential_dirty_ = false;
    }
    Retry();
    return false;
  }

  bool Transition(const store::EndpointRecord& record, const std::function<Status(store::EndpointRecord&)>& change) {
    TransitionWritten(record, change);
    Retry();  // reconcile again at once from what was written (or what changed meanwhile)
    return false;
  }

  // True when written (false: the row changed meanwhile, or the store failed).
  bool TransitionWritten(const store::EndpointRecord& record,
                         const std::function<Status(store::EndpointRecord&)>& change) {
    int64_t version = record.version;
    auto written = controller_->endpoints_.Mutate(record.name, [&](store::EndpointRecord& rec) {
      if (rec.version != version) return Status::Aborted("changed meanwhile");
      RETURN_IF_ERROR(change(rec));
      rec.last_modified_millis = controller_->WallMillis();
      return Status::Ok();
    });
    if (!written.ok()) {
      KLOG(debug, "endpoint status not written", {{"endpoint", record.name}, {"error", written.status().ToString()}});
      return false;
    }
    KLOG(info, "endpoint status",
         {{"endpoint", record.name}, {"status", std::string(store::ToString(written->status))}});
    return true;
  }

  // The observed state is written with the status in one transaction (as Complete does), so
  // that no DescribeEndpoint shows Failed beside a variant that is still "Creating".
  bool FailEndpoint(const store::EndpointRecord& record, const std::string& reason) {
    StopAll();
    store::EndpointRecord failed = record;
    failed.status = EndpointStatus::kFailed;
    store::EndpointObservedState observed = Observed(failed, Deployment{});
    bool written = TransitionWritten(record, [&](store::EndpointRecord& rec) {
      SetStatus(rec, EndpointStatus::kFailed);
      rec.failure_reason = reason;
      MergeObserved(observed, rec.state);
      return Status::Ok();
    });
    if (written) last_observed_ = observed;
    Retry();
    return false;
  }

  // UpdateEndpoint failed: the new fleet goes, the old one keeps serving (AWS: RollingBack, then
  // InService with FailureReason).
  // After a guarded update's traffic shifted (a rollout is recorded), the old fleet takes all
  // the traffic back at once and the endpoint is RollingBack until the new fleet is gone (and,
  // for a rolling update, the old one is whole again: endpoint_plan.h).
  bool RollBack(const store::EndpointRecord& record, const std::string& reason) {
    int64_t gen_target = record.pending ? record.pending->deployed_millis : 0;
    const bool shifted = record.state.rollout && record.state.rollout->generation == gen_target;
    if (shifted) {
      Publish(record, record.deployment, record.deployment.deployed_millis, nullptr, false, gen_target);
      KLOG(info, "endpoint update rolling back",
           {{"endpoint", record.name}, {"reason", reason}, {"wall_millis", std::to_string(controller_->WallMillis())}});
    }
    for (auto& instance : instances_) {
      if (!shifted && instance->spec().generation == gen_target) instance->RequestStop();
    }
    store::DesiredVariants desired;
    for (const std::string& variant : record.deployment.VariantNames()) {
      desired[variant] = {.weight = CurrentWeight(record, record.deployment, variant),
                          .instance_count = DesiredCount(record, record.deployment, variant)};
      for (const store::VariantSummary& v : record.state.production_variants) {
        if (v.variant_name == variant) desired[variant].instance_count = v.desired_instance_count;
      }
    }
    return Transition(record, [&](store::EndpointRecord& rec) {
      rec.pending.reset();
      rec.desired = desired;
      SetStatus(rec, shifted ? EndpointStatus::kRollingBack : EndpointStatus::kInService);
      if (!shifted) rec.state.rollout.reset();
      rec.failure_reason = "UpdateEndpoint rolled back to " + rec.config_name + ": " + reason;
      return Status::Ok();
    });
  }

  // RollingBack, and the fleet rolled back to cannot serve: UpdateRollbackFailed.
  bool RollbackFailed(const store::EndpointRecord& record, const std::string& reason) {
    return Transition(record, [&](store::EndpointRecord& rec) {
      SetStatus(rec, EndpointStatus::kUpdateRollbackFailed);
      rec.failure_reason = rec.failure_reason + " The rollback failed: " + reason;
      return Status::Ok();
    });
  }

  // A guarded update's next traffic step: routed at once, then recorded (a restarted server
  // routes by the record).
  bool Shift(const store::EndpointRecord& record, const store::RolloutState& rollout) {
    PublishRollout(record, record.deployment, &rollout);
    KLOG(info, "endpoint traffic shift",
         {{"endpoint", record.name},
          {"phase", std::string(store::ToString(rollout.phase))},
          {"step", std::to_string(rollout.step)},
          {"fraction", std::to_string(rollout.fraction)}});
    return Transition(record, [&](store::EndpointRecord& rec) {
      rec.state.rollout = rollout;
      return Status::Ok();
    });
  }

  // Publish for the deployment that serves, with a rollout's shift (rolling updates: by
  // instance count) or a rollback's fallback.
  void PublishRollout(const store::EndpointRecord& record, const Deployment& routed,
                      const store::RolloutState* rollout) {
    const bool shifting =
        rollout != nullptr && record.pending && rollout->generation == record.pending->deployed_millis;
    bool rolling = false;
    if (shifting && record.request.is_object() && record.request.contains("DeploymentConfig")) {
      auto policy = ParseDeploymentConfig(record.request["DeploymentConfig"]);
      rolling = policy.ok() && policy->given && policy->kind == DeploymentPolicy::Kind::kRolling;
    }
    const int64_t fallback =
        record.status == EndpointStatus::kRollingBack && rollout != nullptr ? rollout->generation : 0;
    Publish(record, routed, routed.deployed_millis, shifting ? rollout : nullptr, rolling, fallback);
  }

  bool ReconcileDeleting(const store::EndpointRecord& record) {
    StopAll();
    ForgetFailures();
    Reap();
    Publish(record, Deployment{}, 0);
    if (!instances_.empty()) {
      Retry(controller_->DeadlineMillis() + 100);
      return false;
    }
    // The route and the network go before the row: once DescribeEndpoint says the endpoint is gone
    // a new one of the same name may be created, and its run must not find (or lose) ours.
    deps().routes->Remove(record.name);
    RemoveNetwork(record.name);
    Status deleted = controller_->endpoints_.Delete(record.name);
    if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) {
      KLOG(warn, "endpoint delete failed", {{"endpoint", record.name}, {"error", deleted.ToString()}});
      Retry(controller_->DeadlineMillis() + 1000);
      return false;
    }
    if (!credential_.access_key_id.empty()) deps().credentials->Revoke(credential_.access_key_id);
    (void)RemoveAll(options().work_dir + "/" + record.name);
    KLOG(info, "endpoint deleted", {{"endpoint", record.name}});
    finished_ = true;
    return true;
  }

  // Reconcile again soon: at `when` (DeadlineMillis), default at once. Called by the run thread
  // during Reconcile; Run clears what was asked before it reconciles, so each pass asks anew.
  void Retry(int64_t when = 0) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (when <= controller_->DeadlineMillis() + 20) {
      dirty_ = true;
      return;
    }
    next_wake_ = std::min(next_wake_, when);
  }

  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // What this run knows of the endpoint's network (namespaced mode).
  enum class NetworkState { kUnknown, kEnsured, kRemoved };

  EndpointController* controller_;
  const std::string name_;
  std::string route_name_;
  std::thread thread_;
  std::vector<std::shared_ptr<EndpointInstance>> instances_;  // run thread only (and before Start)
  std::map<std::string, ReplacementBackoff> backoff_;         // by variant (endpoint_plan.h)
  aws::Credential credential_;
  bool credential_dirty_ = false;
  std::string published_signature_;
  std::optional<store::EndpointObservedState> last_observed_;  // as last written
  bool finished_ = false;
  NetworkState network_ = NetworkState::kUnknown;  // run thread only
  bool network_isolated_ = false;                  // kEnsured: with this setting

  Mutex mu_;
  CondVar cv_;
  bool dirty_ GUARDED_BY(mu_) = true;
  bool detach_ GUARDED_BY(mu_) = false;
  bool wake_ GUARDED_BY(mu_) = false;           // Wake()
  int64_t next_wake_ GUARDED_BY(mu_) = kNever;  // the earliest Retry(when) of the last pass
};

// ---------------------------------------------------------------------------------------------
// EndpointController

EndpointController::EndpointController(EndpointControllerOptions options, EndpointControllerDeps deps)
    : options_(std::move(options)), deps_(deps), endpoints_(deps.database), ping_client_(net::HttpClientOptions{}) {
  instance_env_ = std::make_unique<EndpointInstanceEnv>(EndpointInstanceEnv{
      .options = &options_,
      .deps = &deps_,
      .ping_client = &ping_client_,
      .wall_millis = [this] { return WallMillis(); },
      .deadline_millis = [this] { return DeadlineMillis(); },
      .release_ports = [this](int base, int count) { ReleasePorts(base, count); },
  });
}

EndpointController::~EndpointController() { Shutdown(); }

int64_t EndpointController::WallMillis() const { return deps_.clock ? deps_.clock->NowMillis() : NowMillis(); }

int64_t EndpointController::DeadlineMillis() const {
  if (deps_.clock) return deps_.clock->NowMillis();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void EndpointController::Wake() {
  MutexLock lock(mutex_);
  for (auto& [name, run] : runs_) run->Wake();
}

Status EndpointController::Start() {
  RETURN_IF_ERROR(MakeDirs(options_.work_dir, 0755).WithPrefix("endpoint work dir"));
  if (!options_.model_cache_dir.empty()) {
    RETURN_IF_ERROR(MakeDirs(options_.model_cache_dir, 0755).WithPrefix("model cache dir"));
  }
  ASSIGN_OR_RETURN(auto records, endpoints_.List({}));
  std::set<std::string> adopted_ids;
  std::vector<std::shared_ptr<EndpointRun>> runs;
  for (auto& record : records) {
    auto run = std::make_shared<EndpointRun>(this, record.name);
    if (!record.state.credentials.is_null()) {
      aws::Credential credential = CredentialFromJson(record.state.credentials);
      deps_.credentials->Register(credential);
      run->SetCredential(credential);
    }
    for (const store::InstanceRecord& r : record.state.instances) {
      EndpointInstance::Spec spec;
      spec.endpoint_name = record.name;
      spec.instance_id = r.instance_id;
      spec.runtime_id = r.runtime_id;
      spec.variant = r.variant;
      spec.model_name = r.model_name;
      spec.instance_type = r.instance_type;
      spec.generation = r.generation;
      spec.port_base = static_cast<int>(r.port_base);
      spec.launched_millis = r.launched_millis;
      spec.dir = options_.work_dir + "/" + record.name + "/" + spec.instance_id;
      // Multi-container (§8): the containers of the deployment it runs, each found by its
      // runtime id (MultiContainerRuntimeId); the instance runs only while all of them do.
      const Deployment& deployment =
          record.pending && record.pending->deployed_millis == r.generation ? *record.pending : record.deployment;
      spec.containers = ContainersOf(deployment.Model(r.model_name));
      spec.container = ContainerOf(deployment.Model(r.model_name));
      const size_t container_count = std::max<size_t>(1, spec.containers.size());
      bool running = true;
      for (size_t i = 0; i < container_count; ++i) {
        auto status = deps_.runtime->Inspect(MultiContainerRuntimeId(spec.runtime_id, i));
        running = running && status.ok() && status->state == runtime::InstanceState::kRunning;
      }
      if (running && spec.port_base == 0) {
        // Namespaced: the same lease id gets the same address again (InstanceNetworks::Attach).
        if (deps_.networks == nullptr) {
          KLOG(warn, "endpoint instance runs in a network namespace but networks are off; replacing it",
               {{"endpoint", record.name}, {"instance", spec.instance_id}});
        } else if (auto attached = deps_.networks->Attach(EndpointNetworkName(record.name), spec.runtime_id,
                                                          LoopbackForwards(options_.endpoint_url));
                   attached.ok()) {
          spec.network = std::move(*attached);
        } else {
          KLOG(warn, "endpoint instance's network address not found; replacing it",
               {{"endpoint", record.name}, {"instance", spec.instance_id}, {"error", attached.status().ToString()}});
        }
      }
      if (!running || (spec.port_base == 0 && !spec.network)) {
        // Unreachable (no address) or with a container gone: it cannot be routed, so it goes
        // (every container of it) and is replaced.
        for (size_t i = 0; i < container_count; ++i) {
          const std::string id = MultiContainerRuntimeId(spec.runtime_id, i);
          (void)deps_.runtime->Stop(id, std::chrono::seconds(0));
          (void)deps_.runtime->Wait(id, std::chrono::seconds(5));
          (void)deps_.runtime->Remove(id);
        }
        (void)RemoveAll(spec.dir);
        if (spec.port_base == 0 && deps_.networks != nullptr) {
          (void)deps_.networks->Detach(EndpointNetworkName(record.name), spec.runtime_id);
        }
        continue;  // replaced by the run's reconcile
      }
      std::optional<Allocation> allocation;
      if (r.reserved && !r.allocation.is_null()) {
        try {
          Allocation a = r.allocation.get<Allocation>();
          if (deps_.scheduler->Adopt(spec.runtime_id, {a}).ok()) allocation = a;
        } catch (const std::exception& e) {
          // Runs unreserved (as an instance whose Adopt failed does); the scheduler may place
          // another on its CPUs until it is replaced.
          KLOG(warn, "unreadable endpoint instance allocation", {{"endpoint", record.name}, {"error", e.what()}});
        }
      }
      if (spec.port_base != 0) MarkPortsUsed(spec.port_base, static_cast<int>(container_count));
      for (size_t i = 0; i < container_count; ++i) adopted_ids.insert(MultiContainerRuntimeId(spec.runtime_id, i));
      std::weak_ptr<EndpointRun> weak = run;
      run->Adopt(std::make_shared<EndpointInstance>(*instance_env_, std::move(spec), true, allocation, [weak] {
        if (auto r = weak.lock()) r->Notify();
      }));
    }
    runs.push_back(std::move(run));
  }
  // Runtime instances of endpoints that are not recorded anywhere: stop them.
  if (auto ids = deps_.runtime->List(); ids.ok()) {
    for (const std::string& id : *ids) {
      if (!StartsWith(id, kRuntimePrefix) || adopted_ids.count(id)) continue;
      KLOG(info, "removing an orphaned endpoint instance", {{"runtime_id", id}});
      (void)deps_.runtime->Stop(id, std::chrono::seconds(0));
      (void)deps_.runtime->Wait(id, std::chrono::seconds(5));
      (void)deps_.runtime->Remove(id);
    }
  }
  {
    MutexLock lock(mutex_);
    started_ = true;
    for (auto& run : runs) runs_[Lower(run->name())] = run;
  }
  for (auto& run : runs) run->Start();
  return Status::Ok();
}

void EndpointController::Shutdown() {
  std::map<std::string, std::shared_ptr<EndpointRun>> runs;
  std::vector<std::shared_ptr<EndpointRun>> finished;
  {
    MutexLock lock(mutex_);
    if (shutting_down_) return;
    shutting_down_ = true;
    runs.swap(runs_);
    finished.swap(finished_);
  }
  for (auto& [name, run] : runs) run->Detach();
  for (auto& [name, run] : runs) run->Join();
  for (auto& run : finished) run->Join();
}

void EndpointController::EndpointChanged(const std::string& endpoint_name) {
  std::shared_ptr<EndpointRun> run;
  std::vector<std::shared_ptr<EndpointRun>> finished;
  {
    MutexLock lock(mutex_);
    if (shutting_down_ || !started_) return;
    finished.swap(finished_);
    auto it = runs_.find(Lower(endpoint_name));
    if (it != runs_.end()) {
      run = it->second;
    }
  }
  for (auto& f : finished) f->Join();
  if (run) {
    run->Notify();
    return;
  }
  StartRun(endpoint_name);
}

void EndpointController::StartRun(const std::string& name) {
  auto run = std::make_shared<EndpointRun>(this, name);
  {
    MutexLock lock(mutex_);
    if (shutting_down_) return;
    auto [it, inserted] = runs_.emplace(Lower(name), run);
    if (!inserted) {
      it->second->Notify();
      return;
    }
  }
  run->Start();
}

void EndpointController::OnRunFinished(const std::string& name) {
  MutexLock lock(mutex_);
  if (shutting_down_) return;
  auto it = runs_.find(Lower(name));
  if (it == runs_.end()) return;
  finished_.push_back(it->second);
  runs_.erase(it);
}

int EndpointController::ReservePorts(int blocks) {
  MutexLock lock(mutex_);
  const int span = kInstancePortBlock * std::max(1, blocks);
  for (int base = options_.port_range_begin; base + span <= options_.port_range_end; base += kInstancePortBlock) {
    bool free = true;
    for (int b = base; b < base + span && free; b += kInstancePortBlock) {
      free = !used_port_blocks_.count(b) && PortFree(b);
    }
    if (!free) continue;
    for (int b = base; b < base + span; b += kInstancePortBlock) used_port_blocks_.insert(b);
    return base;
  }
  return 0;
}

void EndpointController::MarkPortsUsed(int base, int blocks) {
  MutexLock lock(mutex_);
  for (int i = 0; i < std::max(1, blocks); ++i) used_port_blocks_.insert(base + i * kInstancePortBlock);
}

void EndpointController::ReleasePorts(int base, int blocks) {
  MutexLock lock(mutex_);
  for (int i = 0; i < std::max(1, blocks); ++i) used_port_blocks_.erase(base + i * kInstancePortBlock);
}

}  // namespace kiln::control
