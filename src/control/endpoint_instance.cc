#include "control/endpoint_instance.h"

#include <unistd.h>

#include <algorithm>

#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"
#include "control/endpoint_status.h"
#include "control/serving_launch.h"
#include "control/training_launch.h"
#include "control/training_plan.h"

namespace kiln::control {

namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;  // real-time budgets (EndpointControllerDeps::clock)

std::string FormatExit(const runtime::InstanceStatus& s) {
  if (s.state == runtime::InstanceState::kLost) {
    if (s.lost_reason.empty()) return "was lost (its shim is gone)";
    std::string why = s.lost_reason;
    while (!why.empty() && why.back() == '.') why.pop_back();  // the caller ends the sentence
    return "was lost: " + why;
  }
  if (s.oom_killed) return "was killed for running out of memory";
  if (s.term_signal != 0) return "was killed by signal " + std::to_string(s.term_signal);
  return "exited with code " + std::to_string(s.exit_code);
}

}  // namespace

std::string ContainerHostnameOf(const json& container, size_t index) {
  std::string name = container.is_object() ? container.value("ContainerHostname", "") : "";
  return name.empty() ? "container-" + std::to_string(index + 1) : name;
}

EndpointInstance::EndpointInstance(const EndpointInstanceEnv& env, Spec spec, bool adopted,
                                   std::optional<Allocation> allocation, std::function<void()> on_change)
    : env_(env),
      spec_(std::move(spec)),
      adopted_(adopted),
      launched_(adopted),
      allocation_(std::move(allocation)),
      reserved_(adopted && allocation_.has_value()),
      on_change_(std::move(on_change)) {
  auto target = std::make_shared<serving::InstanceTarget>();
  target->instance_id = spec_.instance_id;
  // Host mode: the node's loopback at the instance's own port; namespaced: its address, where
  // it listens on 8080 like every other instance (the node reaches isolated networks too).
  target->host = spec_.network ? spec_.network->address : "127.0.0.1";
  const int first_port = spec_.network ? kNamespacedServingPort : spec_.port_base;
  target->port = static_cast<uint16_t>(first_port);
  target->container_hostname = "primary";
  const std::string instance_stream = spec_.variant + "/" + spec_.instance_id;
  target->log_stream = spec_.log_stream.empty() ? instance_stream : spec_.log_stream;
  // Multi-model endpoints (serving/multi_model.h): models go under its /opt/ml/models; an adopted
  // instance's vCPUs are those of its reservation (a new one's are set once reserved, before it
  // can be routed).
  target->models_dir = spec_.dir + "/opt_ml/models";
  if (allocation_ && !allocation_->cpus.empty()) target->vcpus = static_cast<int>(allocation_->cpus.size());
  if (spec_.containers.size() <= 1) {
    ContainerRun c;
    c.hostname = "primary";
    c.runtime_id = spec_.runtime_id;
    c.port = first_port;
    c.opt_ml = spec_.dir + "/opt_ml";
    c.offset_path = spec_.dir + "/log-offset";
    c.log_stream = target->log_stream;
    c.definition = spec_.containers.empty() ? spec_.container : spec_.containers[0];
    containers_.push_back(std::move(c));
  } else {
    // Every container on this instance (serving-contract.md §8): its own port block, /opt/ml and
    // log stream "<variant>/<instance-id>/<hostname>" (§15.1).
    for (size_t i = 0; i < spec_.containers.size(); ++i) {
      ContainerRun c;
      c.hostname = ContainerHostnameOf(spec_.containers[i], i);
      c.runtime_id = MultiContainerRuntimeId(spec_.runtime_id, i);
      c.port = MultiContainerPort(first_port, i);
      const std::string base = i == 0 ? spec_.dir : spec_.dir + "/c" + std::to_string(i + 1);
      c.opt_ml = base + "/opt_ml";
      c.offset_path = base + "/log-offset";
      c.log_stream = instance_stream + "/" + c.hostname;
      c.definition = spec_.containers[i];
      target->containers.push_back(serving::ContainerTarget{.hostname = c.hostname,
                                                            .host = target->host,
                                                            .port = static_cast<uint16_t>(c.port),
                                                            .log_stream = c.log_stream});
      containers_.push_back(std::move(c));
    }
    target->container_hostname = containers_[0].hostname;
    target->log_stream = containers_[0].log_stream;
  }
  target_ = std::move(target);
  if (adopted) {
    phase_ = InstancePhase::kStarting;
    launched_containers_ = containers_.size();
  }
}

std::string EndpointInstance::ContainerPhrase(const ContainerRun& c) const {
  if (containers_.size() == 1) return "The primary container for production variant " + spec_.variant;
  return "The container " + c.hostname + " of production variant " + spec_.variant;
}

store::InstanceRecord EndpointInstance::Record() const {
  store::InstanceRecord r;
  r.instance_id = spec_.instance_id;
  r.runtime_id = spec_.runtime_id;
  r.variant = spec_.variant;
  r.model_name = spec_.model_name;
  r.instance_type = spec_.instance_type;
  r.generation = spec_.generation;
  r.port_base = spec_.port_base;
  r.launched_millis = spec_.launched_millis;
  r.reserved = reserved_;
  if (allocation_) r.allocation = *allocation_;
  return r;
}

// Sleeps up to `d`; true when a stop was requested meanwhile.
bool EndpointInstance::SleepFor(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  const auto end = std::chrono::steady_clock::now() + d;
  while (!stop_requested_) {
    if (cv_.WaitUntil(mu_, end) == std::cv_status::timeout) break;
  }
  return stop_requested_;
}

// Like SleepFor, but Wake() also ends it (the capacity wait re-reads the controller's clock).
bool EndpointInstance::NapFor(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  const auto end = std::chrono::steady_clock::now() + d;
  while (!stop_requested_ && !wake_) {
    if (cv_.WaitUntil(mu_, end) == std::cv_status::timeout) break;
  }
  const bool stop = stop_requested_;
  wake_ = false;
  return stop;
}

// Moves to `to` (the run thread is the only writer), checked against endpoint_states.h.
void EndpointInstance::SetPhase(InstancePhase to) {
  InstancePhase from = phase_.exchange(to);
  CheckInstancePhaseChange(spec_.endpoint_name, spec_.instance_id, from, to);
}

void EndpointInstance::Fail(std::string reason) {
  SetPhase(InstancePhase::kFailed);
  {
    MutexLock lock(mu_);
    failure_reason_ = std::move(reason);
  }
  // Requests already sent to it end now (ModelError) instead of waiting out the invocation
  // timeout; requests routed to it but not yet sent go elsewhere (serving/routing.h).
  target_->failure.Cancel(failure_reason());
  KLOG(warn, "endpoint instance failed",
       {{"endpoint", spec_.endpoint_name}, {"instance", spec_.instance_id}, {"reason", failure_reason()}});
  healthy_ = false;
  failed_ = true;
  on_change_();
}

void EndpointInstance::Run() {
  if (!adopted_) Provision();
  if (launched_ && !failed_) {
    StartLogPump();
    if (HealthGate()) Monitor();
  }
  Finish();
}

void EndpointInstance::Provision() {
  // The images first: one Kiln cannot run fails the instance before it waits for capacity or
  // downloads model data, so neither a long wait nor a download error hides the reason.
  std::vector<runtime::ImageResolution> images;
  for (const ContainerRun& c : containers_) {
    std::string image = c.definition.value("Image", "");
    auto resolved = deps().environments->Resolve(image);
    if (!resolved.ok()) {
      Fail("ClientError: Image " + image + " of model " + spec_.model_name + ": " + resolved.status().message());
      return;
    }
    const bool container = resolved->kind == runtime::ImageResolution::Kind::kContainerImage;
    if (resolved->kind != runtime::ImageResolution::Kind::kLocalExecutable && !container) {
      // A framework image: Kiln's model server plays the image's `serve` (src/modelserver).
      if (access(options().model_server.c_str(), X_OK) != 0) {
        Fail("ClientError: Image " + image + " is a framework image, served by Kiln's model server, but " +
             (options().model_server.empty() ? std::string("no kiln-model-server program was found")
                                             : options().model_server + " is missing or not executable") +
             ". Build the kiln-model-server target (scripts/build.sh) or set endpoints.model_server in the Kiln "
             "config file.");
        return;
      }
    }
    images.push_back(std::move(*resolved));
  }
  if (spec_.port_base == 0 && !spec_.network) {
    // Namespaced mode without a lease: the endpoint run could not ensure the network or lease an
    // address (spec_.network_error says which, and what to change).
    Fail(spec_.network_error.empty() ? "InternalServerError: no network address for the instance"
                                     : spec_.network_error);
    return;
  }
  for (size_t i = 0; i < containers_.size(); ++i) {
    if (images[i].kind == runtime::ImageResolution::Kind::kContainerImage &&
        !PrepareImage(containers_[i].definition.value("Image", ""))) {
      return;
    }
  }
  if (!Reserve()) return;

  // Model data of every container (serving-contract.md §1 step 2), each into its own /opt/ml/model.
  for (const ContainerRun& c : containers_) {
    if (Status s = MakeDirs(c.opt_ml, 0755); !s.ok()) {
      Fail("InternalServerError: cannot create the instance directory: " + s.message());
      return;
    }
    if (!DownloadModelData(c)) return;
    (void)MakeDirs(c.opt_ml + "/model", 0755);
  }
  for (size_t i = 0; i < containers_.size(); ++i) {
    if (!LaunchContainer(i, images[i])) return;
  }
  spec_.launched_millis = env_.wall_millis();
  SetPhase(InstancePhase::kStarting);
  KLOG(info, "endpoint instance launched",
       {{"endpoint", spec_.endpoint_name},
        {"instance", spec_.instance_id},
        {"variant", spec_.variant},
        {"address", target_->host + ":" + std::to_string(target_->port)},
        {"containers", std::to_string(containers_.size())},
        {"note", shared_note_}});
  if (!shared_note_.empty()) {
    KLOG(warn, "endpoint instance runs unreserved",
         {{"endpoint", spec_.endpoint_name}, {"instance", spec_.instance_id}, {"reason", shared_note_}});
  }
  on_change_();
}

bool EndpointInstance::DownloadModelData(const ContainerRun& c) {
  // Bounded by ModelDataDownloadTimeoutInSeconds.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    auto deadline = SteadyClock::now() + spec_.download_timeout;
    MutexLock lock(mu_);
    while (!done.load() && !stop_requested_ && SteadyClock::now() < deadline) {
      cv_.WaitUntil(mu_, std::min(deadline, SteadyClock::now() + std::chrono::milliseconds(200)));
    }
    if (!done.load()) cancel_.Cancel();
  });
  auto prepared = agent::PrepareModelData(*deps().object_store, c.definition, c.opt_ml + "/model",
                                          options().model_cache_dir, &cancel_, spec_.unpack_cap);
  done = true;
  {
    MutexLock lock(mu_);
    cv_.NotifyAll();
  }
  watchdog.join();
  if (stop_requested()) return false;
  if (!prepared.ok()) {
    std::string message = prepared.status().message();
    if (prepared.status().code() == StatusCode::kDeadlineExceeded) {
      message = "ClientError: Downloading the model data of production variant " + spec_.variant +
                " took longer than ModelDataDownloadTimeoutInSeconds (" +
                std::to_string(spec_.download_timeout.count()) + " s).";
    }
    Fail(message);
    return false;
  }
  return true;
}

bool EndpointInstance::LaunchContainer(size_t index, const runtime::ImageResolution& image) {
  ContainerRun& c = containers_[index];
  const bool multi = containers_.size() > 1;
  if (multi && options().remote_instances) {
    // Each container would be an allocation of its own, possibly on another node, where
    // serving-contract.md §2 has them share one host and network.
    Fail("ClientError: The model of production variant " + spec_.variant + " has " +
         std::to_string(containers_.size()) +
         " containers; this Kiln server runs its instances on a Slurm cluster, which cannot host a multi-container "
         "model yet. Use a single-container model.");
    return false;
  }
  // The command: `<image entrypoint> serve`, or the model server for framework images.
  ServingLaunchContext launch;
  launch.region = options().region;
  launch.endpoint_url = options().endpoint_url;
  launch.credential = spec_.credential;
  launch.port = c.port;
  launch.port_block = kInstancePortBlock;
  launch.model_server = options().model_server;
  launch.serve_worker = options().serve_worker;
  ServingLaunchPlan plan = PlanServingLaunch(c.definition, image, launch);
  runtime::InstanceSpec spec;
  spec.instance_id = c.runtime_id;
  spec.container = std::move(plan.container);
  spec.opt_ml_dir = c.opt_ml;
  // Multi-container: each container's ContainerHostname is its host name (serving-contract.md §2).
  spec.hostname = multi && c.definition.contains("ContainerHostname") ? c.hostname : spec_.instance_id;
  spec.argv = std::move(plan.argv);
  spec.extra_mounts = std::move(plan.binds);
  auto& env = spec.env;
  env = std::move(plan.env);
  if (allocation_) {
    AddGpuEnvironment(*allocation_, env);
    // Containers of one instance share its resources: equal shares of its CPUs (when there are
    // at least as many as containers) and of its memory (serving-contract.md §2 Resources).
    spec.cpus = MultiContainerCpus(allocation_->cpus, index, containers_.size());
    spec.memory_limit_bytes = allocation_->memory_bytes / containers_.size();
    spec.gpus = allocation_->gpus;
  } else {
    env["NVIDIA_VISIBLE_DEVICES"] = "void";
  }
  // Backends that allocate elsewhere (Slurm): the type's whole shape, one allocation per
  // container, no time limit (an endpoint runs until deleted).
  spec.instance_type = spec_.instance_type;
  spec.placement = spec_.placement;
  if (allocation_) {
    spec.shape_vcpus = static_cast<int>(allocation_->cpus.size());
    spec.shape_memory_bytes = allocation_->memory_bytes;
    spec.shape_gpus = static_cast<int>(allocation_->gpus.size());
  }
  env.erase("CUDA_VISIBLE_DEVICES");  // serving-contract.md §2: NVIDIA_VISIBLE_DEVICES only
  // Every container's name resolves to the instance's address (§2).
  std::vector<std::string> names = {spec_.instance_id};
  if (multi) {
    for (const ContainerRun& other : containers_) names.push_back(other.hostname);
  }
  if (spec_.network) {
    std::vector<std::pair<std::string, std::string>> hosts;
    for (const std::string& name : names) hosts.emplace_back(name, spec_.network->address);
    spec.hosts_file_lines = NamespacedHostsFileLines(hosts);
    if (index == 0) {
      // Its own namespace: its hostname resolves to its address (serving-contract.md §2).
      spec.network = spec_.network;
    } else {
      // The others join the first container's namespace: one address, a port each.
      auto first = deps().runtime->Access(containers_[0].runtime_id);
      if (!first.ok()) {
        Fail("InternalServerError: The container " + c.hostname + " of production variant " + spec_.variant +
             " could not join the network of container " + containers_[0].hostname + ": " + first.status().message());
        return false;
      }
      spec.network_namespace = "/proc/" + std::to_string(first->host_pid) + "/ns/net";
    }
  } else {
    spec.hosts_file_lines = HostsFileLines(names);
  }
  Status launched = deps().runtime->Launch(spec);
  if (!launched.ok()) {
    // An engine that went away is Kiln's side, anything else the model's container.
    Fail(std::string(launched.code() == StatusCode::kUnavailable ? "InternalServerError" : "ClientError") + ": " +
         (multi ? "The container " + c.hostname : std::string("The container")) + " of production variant " +
         spec_.variant + " could not start: " + launched.message());
    return false;
  }
  launched_containers_ = index + 1;
  launched_ = true;
  return true;
}

bool EndpointInstance::PrepareImage(const std::string& image) {
  const std::string message = "Downloading the image " + image + " of model " + spec_.model_name;
  SetWaiting(message);
  // Progress comes many times a second; VariantStatus is rewritten at once, then at most once a
  // second.
  std::optional<SteadyClock::time_point> last;
  const auto progress = [&](const std::string& text) {
    if (last && SteadyClock::now() - *last < std::chrono::seconds(1)) return;
    last = SteadyClock::now();
    SetWaiting(message + ": " + text);
  };
  const Status prepared = deps().runtime->PrepareImage(
      runtime::ContainerImage{.requested = image, .reference = "", .entrypoint = std::nullopt}, progress,
      [this] { return cancel_.cancelled(); });
  SetWaiting("");
  if (stop_requested()) return false;
  if (!prepared.ok()) {
    // The user's image (or registry) is a ClientError, an unreachable engine Kiln's side.
    const Status why = training::ImagePreparationError(
        Status(prepared.code(), "Image " + image + " of model " + spec_.model_name + ": " + prepared.message()));
    Fail(why.message());
    return false;
  }
  return true;
}

// Reserves the instance's resources (Scheduler::AllocateNow: endpoints do not queue behind
// training jobs). A type that can never run here fails at once; under `strict` one that does
// not fit now waits, saying so in waiting_for(), for at most the provision budget and then
// fails with AWS's capacity reason; under `shrink` it runs unreserved. False when the instance
// failed or was stopped meanwhile.
bool EndpointInstance::Reserve() {
  const int64_t deadline = env_.deadline_millis() + std::chrono::milliseconds(spec_.provision_timeout).count();
  while (!stop_requested()) {
    ScheduleRequest request{spec_.runtime_id, 0, spec_.instance_type, 1};
    auto granted = deps().scheduler->AllocateNow(request);
    if (granted.ok()) {
      allocation_ = granted->front();
      reserved_ = true;
      if (!allocation_->cpus.empty()) target_->vcpus = static_cast<int>(allocation_->cpus.size());
      break;
    }
    if (!granted.status().Is(ErrorReason::kDoesNotFitNow)) {
      SetWaiting("");
      Fail(CapacityNeverReason(spec_.variant, granted.status().message()));
      return false;
    }
    if (deps().scheduler->options().policy == ShapePolicy::kShrink) {
      // A development box: run beside what holds the CPUs rather than wait (documented).
      shared_note_ = "the host has no free capacity for " + spec_.instance_type +
                     "; the instance shares CPUs and memory with others (scheduler policy shrink)";
      break;
    }
    const int64_t now = env_.deadline_millis();
    if (now >= deadline) {
      SetWaiting("");
      Fail(CapacityTimeoutReason(spec_.variant, granted.status().message(), spec_.provision_timeout));
      return false;
    }
    auto left = std::chrono::ceil<std::chrono::seconds>(std::chrono::milliseconds(deadline - now));
    SetWaiting(CapacityWaitMessage(granted.status().message(), spec_.provision_timeout, left));
    if (NapFor(std::chrono::milliseconds(std::min<int64_t>(2000, deadline - now)))) break;
  }
  SetWaiting("");
  return !stop_requested();
}

// Records what the instance waits for; the endpoint run rewrites VariantStatus when it changes.
void EndpointInstance::SetWaiting(std::string message) {
  {
    MutexLock lock(mu_);
    if (waiting_for_ == message) return;
    waiting_for_ = std::move(message);
  }
  on_change_();
}

void EndpointInstance::StartLogPump() {
  // One stream per container (serving-contract.md §15.1).
  for (ContainerRun& c : containers_) {
    LogPump::Options pump;
    pump.output_path = deps().runtime->OutputPath(c.runtime_id);
    pump.offset_path = c.offset_path;
    pump.start_offset = LogPump::ReadOffset(pump.offset_path);
    pump.group = spec_.log_group.empty() ? "/aws/sagemaker/Endpoints/" + spec_.endpoint_name : spec_.log_group;
    pump.stream = c.log_stream;
    c.log_pump = std::make_unique<LogPump>(std::move(pump), deps().log_store);
    c.log_pump->Start();
  }
  // Instance metrics (serving-contract.md §15.3) from now until Finish, over all its containers.
  if (deps().instance_metrics != nullptr) {
    InstanceMetricsTarget target =
        spec_.metrics ? *spec_.metrics
                      : EndpointInstanceMetricsTarget(spec_.runtime_id, spec_.endpoint_name, spec_.variant,
                                                      spec_.instance_id, spec_.dir + "/opt_ml");
    for (size_t i = 1; i < containers_.size(); ++i) target.more_instance_ids.push_back(containers_[i].runtime_id);
    (void)deps().instance_metrics->Track(target);
  }
}

bool EndpointInstance::Ping(ContainerRun& c) {
  net::ClientRequest request;
  request.method = "GET";
  request.target = "/ping";
  net::ClientTimeouts timeouts;
  timeouts.connect_ms = static_cast<int>(options().ping_timeout.count());
  timeouts.response_ms = static_cast<int>(options().ping_timeout.count());
  auto response = env_.ping_client->Send(target_->host, static_cast<uint16_t>(c.port), request, timeouts);
  if (!response.ok()) {
    c.last_ping_error = response.status().message();
    return false;
  }
  if (response->status != 200) {
    c.last_ping_error = "GET /ping answered " + std::to_string(response->status);
    return false;
  }
  return true;
}

// Exit status of the first container that is no longer running, and which.
std::optional<std::pair<size_t, runtime::InstanceStatus>> EndpointInstance::Exited() {
  for (size_t i = 0; i < launched_containers_; ++i) {
    auto status = deps().runtime->Inspect(containers_[i].runtime_id);
    if (!status.ok()) {
      runtime::InstanceStatus lost;
      lost.state = runtime::InstanceState::kLost;
      return std::make_pair(i, lost);
    }
    if (status->state != runtime::InstanceState::kRunning) return std::make_pair(i, *status);
  }
  return std::nullopt;
}

std::string EndpointInstance::LastOutputLine(const ContainerRun& c) const {
  if (!c.log_pump) return "";
  std::string line = c.log_pump->last_stderr_line();
  return line.empty() ? "" : " Last error output: " + line;
}

bool EndpointInstance::RemoteStarted() {
  auto status = deps().runtime->Inspect(containers_[0].runtime_id);
  if (!status.ok() || status->state != runtime::InstanceState::kRunning) return true;  // Exited() says
  SetWaiting(status->waiting_reason);
  if (!status->waiting_reason.empty() || status->address.empty()) return false;
  // Not yet routed (the gate has not passed), so nothing reads the target's host meanwhile.
  if (target_->host != status->address) {
    target_->host = status->address;
    for (serving::ContainerTarget& c : target_->containers) c.host = status->address;
  }
  return true;
}

// Pings until every container answers 200 or the startup budget ends. True when healthy.
bool EndpointInstance::HealthGate() {
  auto start = SteadyClock::now();
  // An adopted instance was healthy before the restart: it gets the regular budget again.
  auto deadline = start + spec_.startup_timeout;
  auto interval = std::chrono::milliseconds(20);
  std::vector<bool> passed(containers_.size(), false);
  while (!stop_requested()) {
    if (auto exited = Exited()) {
      const ContainerRun& c = containers_[exited->first];
      Fail("ClientError: " + ContainerPhrase(c) + " " + FormatExit(exited->second) +
           " before it passed the ping health check." + LastOutputLine(c));
      return false;
    }
    if (options().remote_instances && !RemoteStarted()) {
      // Queued on the cluster: not yet the container's time to answer.
      deadline = SteadyClock::now() + spec_.startup_timeout;
      if (SleepFor(std::chrono::milliseconds(500))) return false;
      continue;
    }
    bool all = true;
    for (size_t i = 0; i < containers_.size(); ++i) {
      if (!passed[i]) passed[i] = Ping(containers_[i]);
      all = all && passed[i];
    }
    if (all) {
      SetPhase(InstancePhase::kInService);
      healthy_ = true;
      KLOG(
          info, "endpoint instance healthy",
          {{"endpoint", spec_.endpoint_name},
           {"instance", spec_.instance_id},
           {"millis", std::to_string(
                          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start).count())}});
      on_change_();
      return true;
    }
    if (SteadyClock::now() >= deadline) {
      size_t failing = 0;
      while (passed[failing]) ++failing;
      const ContainerRun& c = containers_[failing];
      const std::string where =
          spec_.network ? "Kiln runs every instance in a network namespace of its own (here at " + target_->host +
                              "); the container must answer GET /ping on port " + std::to_string(c.port) +
                              " (SAGEMAKER_BIND_TO_PORT)"
                        : "Kiln runs the instances on the node's network and gives each container its own port in "
                          "SAGEMAKER_BIND_TO_PORT (here " +
                              std::to_string(c.port) + "); the container must answer GET /ping there";
      Fail("ClientError: " + ContainerPhrase(c) + " did not pass the ping health check. " + where + " within " +
           std::to_string(spec_.startup_timeout.count()) + " s. Last attempt: " + c.last_ping_error + "." +
           LastOutputLine(c));
      return false;
    }
    if (SleepFor(interval)) return false;
    interval = std::min(interval * 2, std::chrono::milliseconds(spec_.serverless ? 100 : 500));
  }
  return false;
}

void EndpointInstance::Monitor() {
  // Any container exiting or failing its pings fails the instance (serving-contract.md §1, §8).
  std::vector<int> failures(containers_.size(), 0);
  while (!SleepFor(options().health_interval)) {
    if (auto exited = Exited()) {
      healthy_ = false;
      const ContainerRun& c = containers_[exited->first];
      Fail("The container " + (containers_.size() > 1 ? c.hostname + " " : std::string()) + "of instance " +
           spec_.instance_id + " " + FormatExit(exited->second) + "." + LastOutputLine(c));
      return;
    }
    for (size_t i = 0; i < containers_.size(); ++i) {
      if (Ping(containers_[i])) {
        failures[i] = 0;
        continue;
      }
      if (++failures[i] >= options().unhealthy_threshold) {
        healthy_ = false;
        Fail("Instance " + spec_.instance_id + " failed " + std::to_string(failures[i]) + " health checks in a row" +
             (containers_.size() > 1 ? " of container " + containers_[i].hostname : std::string()) + ": " +
             containers_[i].last_ping_error);
        return;
      }
    }
  }
}

void EndpointInstance::Finish() {
  if (deps().instance_metrics != nullptr) deps().instance_metrics->Untrack(spec_.runtime_id);
  if (detached()) {
    SetPhase(InstancePhase::kDetached);
    for (ContainerRun& c : containers_) {
      if (c.log_pump) c.log_pump->Stop(false);
    }
    if (!launched_) {
      (void)RemoveAll(spec_.dir);
      if (reserved_) deps().scheduler->Release(spec_.runtime_id);
      ReleaseNetwork();  // never launched: no next server adopts it
    }
    stopped_ = true;
    return;
  }
  SetPhase(InstancePhase::kDraining);
  healthy_ = false;
  on_change_();  // the endpoint run publishes a snapshot without this instance
  // Drain: once no snapshot and no request in flight references the target, only this run
  // holds it.
  auto drain_deadline = SteadyClock::now() + options().drain_timeout;
  while (target_.use_count() > 1 && SteadyClock::now() < drain_deadline && !detached()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (target_.use_count() > 1 && !detached()) {
    // The drain time is over and requests still hold it: they are cut now with a message that
    // says so, rather than by a reset when the process stops (or not until their timeout).
    KLOG(warn, "endpoint instance drain timed out",
         {{"endpoint", spec_.endpoint_name},
          {"instance", spec_.instance_id},
          {"in_flight", std::to_string(target_->outstanding.load())}});
    target_->failure.Cancel("its drain time of " + std::to_string(options().drain_timeout.count()) +
                            " s ended before the request finished, and it was stopped.");
  }
  if (launched_) {
    // Every container at once (SIGTERM, SIGKILL after the grace), then each waited for.
    for (size_t i = 0; i < launched_containers_; ++i) {
      (void)deps().runtime->Stop(containers_[i].runtime_id, options().stop_grace);
    }
    auto stop_deadline = SteadyClock::now() + options().stop_grace + std::chrono::seconds(5);
    for (size_t i = 0; i < launched_containers_; ++i) {
      while (SteadyClock::now() < stop_deadline && !detached()) {
        auto status = deps().runtime->Wait(containers_[i].runtime_id, std::chrono::milliseconds(200));
        if (!status.ok() || status->state != runtime::InstanceState::kRunning) break;
      }
    }
    if (detached()) {
      SetPhase(InstancePhase::kDetached);
      for (ContainerRun& c : containers_) {
        if (c.log_pump) c.log_pump->Stop(false);
      }
      stopped_ = true;
      return;
    }
    for (size_t i = 0; i < launched_containers_; ++i) {
      if (containers_[i].log_pump) containers_[i].log_pump->Stop(true);
      (void)deps().runtime->Remove(containers_[i].runtime_id);
    }
  }
  for (const ContainerRun& c : containers_) {
    const auto port = static_cast<uint16_t>(c.port);
    env_.ping_client->Forget(target_->host, port);
    if (deps().invoke_client != nullptr) deps().invoke_client->Forget(target_->host, port);
    if (deps().forget_upstream) deps().forget_upstream(target_->host, port);
  }
  if (reserved_) deps().scheduler->Release(spec_.runtime_id);
  (void)RemoveAll(spec_.dir);
  if (spec_.port_base != 0) env_.release_ports(spec_.port_base, static_cast<int>(containers_.size()));
  ReleaseNetwork();
  SetPhase(InstancePhase::kStopped);
  stopped_ = true;
  KLOG(info, "endpoint instance stopped", {{"endpoint", spec_.endpoint_name}, {"instance", spec_.instance_id}});
  on_change_();
}

void EndpointInstance::ReleaseNetwork() {
  if (!spec_.network || deps().networks == nullptr) return;
  if (Status s = deps().networks->Detach(spec_.network->network, spec_.runtime_id); !s.ok()) {
    // The lease stays until the network is removed (endpoint deleted) or swept at a restart.
    KLOG(warn, "endpoint instance network lease not released",
         {{"endpoint", spec_.endpoint_name}, {"instance", spec_.instance_id}, {"error", s.ToString()}});
  }
}

}  // namespace kiln::control
