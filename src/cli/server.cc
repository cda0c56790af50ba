#include "cli/server.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "api/autoscaling.h"
#include "api/endpoints.h"
#include "api/logs.h"
#include "api/service_model.h"
#include "api/training_jobs.h"
#include "api/processing_jobs.h"
#include "api/transform_jobs.h"
#include "api/tuning_jobs.h"
#include "base/fs.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/strings.h"
#include "cli/version.h"
#include "control/training_hold.h"
#include "objects/fs_object_store.h"
#include "objects/s3_object_store.h"
#include "runtime/docker/container_config.h"
#include "runtime/docker/docker_runtime.h"
#include "runtime/docker/engine.h"
#include "runtime/process/bridge_networks.h"
#include "runtime/process/process_runtime.h"
#include "runtime/routed_runtime.h"
#include "runtime/slurm/slurm_client.h"

namespace kiln::cli {

namespace {

std::string SelfExecutable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "kiln";
  return std::string(buf, static_cast<size_t>(n));
}

// python/kiln_toolkit/train.py: configured, else beside an installed binary
// (<prefix>/bin/kiln → <prefix>/lib/kiln/python), else the source tree this binary was built from.
std::string ToolkitScript(const Config& config) {
  namespace fs = std::filesystem;
  std::vector<std::string> candidates;
  if (!config.training.toolkit_dir.empty()) candidates.push_back(config.training.toolkit_dir);
  fs::path exe = SelfExecutable();
  candidates.push_back((exe.parent_path().parent_path() / "lib/kiln/python").string());
  candidates.push_back(KILN_SOURCE_DIR "/python");
  for (const auto& dir : candidates) {
    std::error_code ec;
    if (fs::exists(fs::path(dir) / "kiln_toolkit/train.py", ec)) return dir + "/kiln_toolkit/train.py";
  }
  return candidates.back() + "/kiln_toolkit/train.py";
}

// kiln-model-server, the `serve` of framework images: configured, else beside the binary (an
// install), <prefix>/lib/kiln/ (install-service.sh), or the build tree this binary was built in
// (a copied test binary). Empty when none exists: framework endpoints then fail saying so.
std::string ModelServerProgram(const Config& config) {
  namespace fs = std::filesystem;
  if (!config.endpoints.model_server.empty()) return config.endpoints.model_server;
  fs::path exe = SelfExecutable();
  for (const fs::path& candidate :
       {exe.parent_path() / "kiln-model-server", exe.parent_path().parent_path() / "lib/kiln/kiln-model-server",
        fs::path(KILN_BINARY_DIR "/src/modelserver/kiln-model-server")}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

// The option structs the steps below fill from the config (no side effects).

control::ArchiveCapOptions ArchiveCaps(const Config& c, const control::InstanceCatalog* catalog) {
  control::ArchiveCapOptions archive_caps;
  archive_caps.max_unpacked_bytes = static_cast<uint64_t>(c.archives.max_unpacked_mib) << 20;
  archive_caps.max_entries = static_cast<uint64_t>(c.archives.max_entries);
  archive_caps.catalog = catalog;
  return archive_caps;
}

control::TrainingControllerOptions TrainingOptions(const Config& c, const control::ArchiveCapOptions& archive_caps) {
  control::TrainingControllerOptions training;
  training.work_dir = c.data_dir + "/training";
  training.region = c.regions.front();
  // On a Slurm cluster the instances run elsewhere: they reach this server where the nodes do.
  training.endpoint_url = c.runtime == "slurm" ? c.slurm.server_url : ClientEndpoint(c);
  training.remote_instances = c.runtime == "slurm";
  training.toolkit_script = ToolkitScript(c);
  training.kiln_binary = SelfExecutable();
  training.stop_grace = std::chrono::seconds(c.training.stop_grace_seconds);
  training.staging_parallelism = c.training.staging_parallelism;
  training.keep_host_dirs = c.training.keep_host_dirs;
  training.archive_caps = archive_caps;
  // Managed spot (issue 18); config.cc bounds the delay to a year, so the milliseconds fit.
  training.spot.interrupt_after_seconds = c.spot.interrupt_after_seconds;
  training.spot.interrupt_probability_per_hour = c.spot.interrupt_probability_per_hour;
  training.spot.restart_delay = std::chrono::milliseconds(std::llround(c.spot.restart_delay_seconds * 1000));
  training.spot.seed = c.spot.seed;
  return training;
}

control::EndpointControllerOptions EndpointOptions(const Config& c, const control::ArchiveCapOptions& archive_caps) {
  control::EndpointControllerOptions endpoints;
  endpoints.work_dir = c.data_dir + "/endpoints";
  endpoints.model_cache_dir = c.data_dir + "/model-cache";
  endpoints.region = c.regions.front();
  endpoints.account_id = c.account_id;
  endpoints.endpoint_url = c.runtime == "slurm" ? c.slurm.server_url : ClientEndpoint(c);
  endpoints.remote_instances = c.runtime == "slurm";
  endpoints.model_server = ModelServerProgram(c);
  endpoints.serve_worker = std::filesystem::path(ToolkitScript(c)).replace_filename("serve_worker.py").string();
  endpoints.port_range_begin = c.endpoints.port_range_begin;
  endpoints.port_range_end = c.endpoints.port_range_end;
  endpoints.stop_grace = std::chrono::seconds(c.endpoints.stop_grace_seconds);
  endpoints.health_interval =
      std::chrono::milliseconds(static_cast<int64_t>(c.endpoints.health_interval_seconds * 1000));
  endpoints.drain_timeout = std::chrono::seconds(c.endpoints.invocation_timeout_seconds + 5);
  endpoints.default_provision_timeout = std::chrono::seconds(c.endpoints.provision_timeout_seconds);
  endpoints.archive_caps = archive_caps;
  return endpoints;
}

serving::RouterOptions RouterOptionsFor(const Config& c) {
  serving::RouterOptions router_options;
  router_options.invocation_timeout_ms = c.endpoints.invocation_timeout_seconds * 1000;
  return router_options;
}

// The invoke path's upstream clients: the blocking one (chunked and 100-continue invocations) and
// each event loop's own (HttpServerOptions::upstream) get the same options.
net::HttpClientOptions InvokeClientOptions(const Config& c) {
  net::HttpClientOptions client_options;
  client_options.max_response_body_bytes = RouterOptionsFor(c).max_response_body_bytes;
  return client_options;
}

net::HttpServerOptions HttpOptions(const Config& c) {
  net::HttpServerOptions http;
  http.listen = c.listen;
  http.max_connections = static_cast<size_t>(c.http.max_connections);
  http.max_connections_per_address = static_cast<size_t>(c.http.max_connections_per_address);
  http.first_byte_timeout_seconds = c.http.first_byte_timeout_seconds;
  http.header_timeout_seconds = c.http.header_timeout_seconds;
  http.idle_timeout_seconds = c.http.idle_timeout_seconds;
  http.io_timeout_seconds = c.http.io_timeout_seconds;
  http.event_loops = static_cast<size_t>(c.http.event_loops);
  http.worker_threads = static_cast<size_t>(c.http.worker_threads);
  http.upstream = InvokeClientOptions(c);
  return http;
}

}  // namespace

Result<std::unique_ptr<objects::ObjectStore>> OpenObjectStore(const Config& config, store::Database* database) {
  if (config.object_store.backend == "s3") {
    objects::S3ObjectStore::Options options;
    options.endpoint = config.object_store.endpoint;
    options.region = config.object_store.region;
    options.access_key_id = config.object_store.access_key_id;
    options.secret_access_key = config.object_store.secret_access_key;
    options.session_token = config.object_store.session_token;
    ASSIGN_OR_RETURN(auto store, objects::S3ObjectStore::Open(std::move(options)));
    return std::unique_ptr<objects::ObjectStore>(std::move(store));
  }
  objects::FsObjectStore::Options options;
  options.root = config.data_dir + "/objects";
  options.database = database;
  ASSIGN_OR_RETURN(auto store, objects::FsObjectStore::Open(std::move(options)));
  return std::unique_ptr<objects::ObjectStore>(std::move(store));
}

// Each step builds one group of components, in dependency order; Create runs them in sequence.
// A step's error already names what failed; the components built so far are destroyed in
// reverse (member order).
Result<std::unique_ptr<Server>> Server::Create(Config config) {
  std::unique_ptr<Server> server(new Server(std::move(config)));
  const Config& c = server->config_;
  RETURN_IF_ERROR(server->OpenState());
  RETURN_IF_ERROR(server->OpenRuntimeAndCapacity());
  RETURN_IF_ERROR(server->OpenNetworks());
  const control::ArchiveCapOptions archive_caps = ArchiveCaps(c, server->catalog_.get());
  control::TrainingControllerOptions training = TrainingOptions(c, archive_caps);
  server->BuildFrontDoor();
  RETURN_IF_ERROR(server->OpenLogsAndTraining(std::move(training)));
  server->BuildEndpointController(archive_caps);
  server->RegisterJsonServices();
  server->BuildInvokePath();
  RETURN_IF_ERROR(server->BuildAsyncInference());
  RETURN_IF_ERROR(server->BuildRemoteAccess());
  RETURN_IF_ERROR(server->BindHttp());
  return server;
}

// The data dir, the database, the object store backend and the credentials (the configured and
// stored keys, the per-instance ones, and the chain the front door checks), and the metric store.
Status Server::OpenState() {
  const Config& c = config_;
  RETURN_IF_ERROR(MakeDirs(c.data_dir, 0700).WithPrefix("data dir"));

  ASSIGN_OR_RETURN(database_, store::Database::Open(c.data_dir + "/kiln.db", {}));
  ASSIGN_OR_RETURN(object_store_, OpenObjectStore(c, database_.get()));

  api::CredentialStore::Options cred_options;
  cred_options.path = c.data_dir + "/credentials.json";
  cred_options.account_id = c.account_id;
  cred_options.configured = c.credentials;
  ASSIGN_OR_RETURN(credentials_, api::CredentialStore::Open(std::move(cred_options), true));

  instance_credentials_ = std::make_unique<control::InstanceCredentials>(c.account_id);
  all_credentials_ =
      std::make_unique<control::ChainedCredentialProvider>(credentials_.get(), instance_credentials_.get());
  metric_store_ = std::make_unique<observe::MetricStore>(database_.get());
  return Status::Ok();
}

// What instances run on: the process runtime, the instance catalog, the scheduler over the host's
// capacity, the per-instance metrics sampler and the environment table.
Status Server::OpenRuntimeAndCapacity() {
  const Config& c = config_;
  if (c.runtime == "slurm") {
    RETURN_IF_ERROR(OpenSlurmRuntime());
  } else {
    runtime::ProcessRuntimeOptions runtime_options;
    runtime_options.state_dir = c.data_dir + "/instances";
    runtime_options.shim_command = {SelfExecutable(), "shim"};
    ASSIGN_OR_RETURN(runtime_, runtime::OpenProcessRuntime(runtime_options));
  }
  // With an engine, instances whose spec carries a container image go to the container runtime.
  // Without one nothing changes: no image resolves to a container (no patterns below).
  if (c.container_engine.enabled()) {
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::Runtime> containers, OpenContainerRuntime());
    runtime_ = runtime::MakeRoutedRuntime(std::move(runtime_), std::move(containers));
  }
  if (!c.instance_types.is_null()) {
    ASSIGN_OR_RETURN(auto catalog,
                     control::InstanceCatalog::FromJson(c.instance_types, &control::InstanceCatalog::BuiltIn()));
    catalog_ = std::make_unique<control::InstanceCatalog>(std::move(catalog));
  } else {
    catalog_ = std::make_unique<control::InstanceCatalog>(control::InstanceCatalog::BuiltIn());
  }
  ASSIGN_OR_RETURN(
      auto scheduler_options,
      control::SchedulerOptionsFromJson(c.scheduler.is_null() ? nlohmann::json::object() : c.scheduler,
                                        c.runtime == "slurm" ? SlurmCapacity() : control::DiscoverHostCapacity()));
  // From the spot section: whether a queued on-demand job reclaims spot jobs' grants (issue 18).
  scheduler_options.preempt_for_on_demand = c.spot.preempt_for_on_demand;
  scheduler_ = std::make_unique<control::Scheduler>(scheduler_options, catalog_.get());
  control::InstanceMetricsOptions instance_metrics;
  instance_metrics.interval =
      std::chrono::milliseconds(static_cast<int64_t>(c.instance_metrics.interval_seconds * 1000));
  if (!c.instance_metrics.gpu_command.empty()) instance_metrics.gpu_command = c.instance_metrics.gpu_command;
  // MemoryUtilization of an instance without a limit: of the node's memory as the scheduler sees it.
  instance_metrics.host_memory_bytes = scheduler_options.capacity.memory_bytes;
  if (c.runtime == "slurm") {
    // The instances' GPUs are on the Slurm nodes, not here: this machine's nvidia-smi says
    // nothing about them (their usage comes with the node's reports, Runtime::Usage).
    instance_metrics.gpu_sampler = [] {
      return Result<std::vector<runtime::GpuUsage>>(std::vector<runtime::GpuUsage>{});
    };
    instance_metrics.host_memory_bytes = 0;  // not the synthetic capacity: this machine's MemTotal
  }
  instance_metrics_ =
      std::make_unique<control::InstanceMetrics>(std::move(instance_metrics), runtime_.get(), metric_store_.get());
  if (c.environments.is_array()) {
    ASSIGN_OR_RETURN(auto table, runtime::EnvironmentTable::FromJson(c.environments));
    environments_ = std::make_unique<runtime::EnvironmentTable>(std::move(table));
  } else {
    environments_ = std::make_unique<runtime::EnvironmentTable>(runtime::EnvironmentTable::Default());
  }
  if (c.container_engine.enabled()) environments_->SetContainerImages(c.container_engine.images);
  return Status::Ok();
}

// "runtime": "slurm": instances run on the cluster's nodes, which Slurm allocates; the local
// scheduler must never hold work for this machine's capacity, so it sees a capacity no request
// exhausts (its grants' CPU and GPU indices mean nothing there: the node uses what Slurm gave).
control::HostCapacity Server::SlurmCapacity() {
  control::HostCapacity capacity;
  capacity.cpus.resize(1 << 16);
  for (size_t i = 0; i < capacity.cpus.size(); ++i) capacity.cpus[i] = static_cast<int>(i);
  capacity.memory_bytes = uint64_t{1} << 50;
  for (int i = 0; i < 4096; ++i) {
    runtime::GpuInfo gpu;
    gpu.index = i;
    gpu.name = "Slurm GPU";
    capacity.gpus.push_back(gpu);
  }
  return capacity;
}

Status Server::OpenSlurmRuntime() {
  const Config& c = config_;
  runtime::slurm::SlurmRuntimeOptions options;
  options.state_dir = c.data_dir + "/slurm-instances";
  options.client = runtime::slurm::NewCliSlurmClient({.bin_dir = c.slurm.bin_dir});
  options.server_url = c.slurm.server_url;
  options.node_command = c.slurm.node_command;
  options.scratch_dir = c.slurm.scratch_dir;
  if (!c.slurm.partition.empty()) options.placement["partition"] = c.slurm.partition;
  if (!c.slurm.qos.empty()) options.placement["qos"] = c.slurm.qos;
  if (!c.slurm.account.empty()) options.placement["account"] = c.slurm.account;
  options.sbatch_args = c.slurm.sbatch_args;
  options.request_cpus = c.slurm.request_cpus;
  options.request_memory = c.slurm.request_memory;
  options.poll_interval = std::chrono::milliseconds(static_cast<int64_t>(c.slurm.poll_seconds * 1000));
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::slurm::SlurmRuntime> slurm, runtime::slurm::OpenSlurmRuntime(options));
  slurm_runtime_ = slurm.get();
  node_service_ = std::make_unique<runtime::slurm::NodeService>(slurm_runtime_);
  runtime_ = std::move(slurm);
  KLOG(info, "instances run on a Slurm cluster",
       {{"server_url", c.slurm.server_url},
        {"partition", c.slurm.partition.empty() ? "(default)" : c.slurm.partition},
        {"state_dir", options.state_dir}});
  return Status::Ok();
}

std::string ContainerServerLabel(const std::string& data_dir) {
  std::error_code ec;
  std::filesystem::path canonical = std::filesystem::canonical(data_dir, ec);
  return Sha256Hex(ec ? data_dir : canonical.string()).substr(0, 8);
}

std::vector<runtime::docker::Ulimit> ContainerUlimits(const ContainerEngineConfig& ce,
                                                      const std::map<std::string, int64_t>& engine_hard_limits) {
  std::vector<runtime::docker::Ulimit> limits = runtime::docker::DefaultUlimits();
  for (runtime::docker::Ulimit& limit : limits) {
    auto engine = engine_hard_limits.find(limit.name);
    if (engine == engine_hard_limits.end() || engine->second < 0) continue;  // unknown or unlimited
    if (limit.hard < 0 || limit.hard > engine->second) limit.hard = engine->second;
    if (limit.soft < 0 || limit.soft > limit.hard) limit.soft = limit.hard;
  }
  for (const ContainerEngineConfig::Ulimit& configured : ce.ulimits) {
    auto same = std::find_if(limits.begin(), limits.end(),
                             [&](const runtime::docker::Ulimit& u) { return u.name == configured.name; });
    runtime::docker::Ulimit limit{configured.name, configured.soft, configured.hard};
    if (same != limits.end()) {
      *same = limit;
    } else {
      limits.push_back(limit);
    }
  }
  return limits;
}

std::map<std::string, int64_t> ParseProcLimits(const std::string& text) {
  // "Max processes             32768                32768                processes"
  static const std::pair<const char*, const char*> kNames[] = {
      {"Max cpu time", "cpu"},           {"Max file size", "fsize"},     {"Max data size", "data"},
      {"Max stack size", "stack"},       {"Max core file size", "core"}, {"Max resident set", "rss"},
      {"Max processes", "nproc"},        {"Max open files", "nofile"},   {"Max locked memory", "memlock"},
      {"Max address space", "as"},       {"Max file locks", "locks"},    {"Max pending signals", "sigpending"},
      {"Max msgqueue size", "msgqueue"}, {"Max nice priority", "nice"},  {"Max realtime priority", "rtprio"},
  };
  std::map<std::string, int64_t> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    for (const auto& [label, name] : kNames) {
      const std::string prefix = label;
      if (line.rfind(prefix, 0) != 0 || line.size() <= prefix.size() || line[prefix.size()] != ' ') continue;
      std::istringstream fields(line.substr(prefix.size()));
      std::string soft, hard;
      if (!(fields >> soft >> hard)) break;
      if (hard == "unlimited") {
        out[name] = -1;
      } else if (!hard.empty() && hard.find_first_not_of("0123456789") == std::string::npos) {
        out[name] = std::stoll(hard);
      }
      break;
    }
  }
  return out;
}

std::map<std::string, int64_t> EngineHardLimits(const std::string& socket) {
  std::string path = socket.rfind("unix://", 0) == 0 ? socket.substr(7) : socket;
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) return {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  ucred peer{};
  socklen_t length = sizeof(peer);
  const bool known = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0 &&
                     ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && peer.pid > 0;
  ::close(fd);
  if (!known) return {};
  Result<std::string> limits = ReadFile("/proc/" + std::to_string(peer.pid) + "/limits");
  if (!limits.ok()) return {};
  return ParseProcLimits(*limits);
}

Result<std::unique_ptr<runtime::Runtime>> Server::OpenContainerRuntime() {
  namespace docker = runtime::docker;
  const Config& c = config_;
  const ContainerEngineConfig& ce = c.container_engine;
  // Network holders: `sleep infinity` instances of a process runtime of their own, whose network
  // namespaces the containers join.
  runtime::ProcessRuntimeOptions holders;
  holders.state_dir = c.data_dir + "/container-networks";
  holders.shim_command = {SelfExecutable(), "shim"};
  ASSIGN_OR_RETURN(network_holders_, runtime::OpenProcessRuntime(holders));

  docker::HttpEngineOptions engine_options;
  engine_options.socket = ce.socket;
  // Asked once now, briefly: what the engine is decides the GPU request mode (auto) and goes in the
  // log. An engine that does not answer does not stop the server: jobs on container images fail
  // with the engine's address and how to start it until it answers.
  docker::HttpEngineOptions probe_options = engine_options;
  probe_options.timeout_ms = 5000;
  Result<docker::EngineVersion> version = docker::OpenHttpEngine(probe_options)->Version();

  docker::DockerRuntimeOptions options;
  options.state_dir = c.data_dir + "/containers";
  options.engine = docker::OpenHttpEngine(engine_options);
  options.container.server_label = ContainerServerLabel(c.data_dir);
  options.container.shm_fraction = ce.shm_fraction;
  // Containers cannot get more than the engine's own limits (see ContainerUlimits).
  const std::map<std::string, int64_t> engine_limits = EngineHardLimits(ce.socket);
  options.container.ulimits = ContainerUlimits(ce, engine_limits);
  std::vector<std::string> lowered;
  for (const docker::Ulimit& limit : options.container.ulimits) {
    for (const docker::Ulimit& own : docker::DefaultUlimits()) {
      if (own.name == limit.name && own.hard != limit.hard)
        lowered.push_back(limit.name + "=" + std::to_string(limit.hard));
    }
  }
  if (!lowered.empty()) {
    KLOG(info, "container ulimits differ from the server's",
         {{"hard", Join(lowered, ",")},
          {"reason", "configured in container_engine.ulimits, or the engine's own hard limit is lower"}});
  }
  options.container.log_driver = ce.log_driver;
  if (ce.gpus == "cdi") {
    options.container.gpu_mode = docker::GpuRequestMode::kCdi;
  } else if (ce.gpus == "device_requests") {
    options.container.gpu_mode = docker::GpuRequestMode::kDeviceRequests;
  } else if (ce.gpus == "devices") {
    options.container.gpu_mode = docker::GpuRequestMode::kDevices;
  } else {
    // auto: Docker (with the NVIDIA runtime) takes device requests; Podman 4's compat API ignores
    // CDI requests (measured), so on Podman the device nodes themselves, plus the NVIDIA OCI hook
    // where installed (it reads NVIDIA_VISIBLE_DEVICES).
    options.container.gpu_mode =
        version.ok() && version->podman ? docker::GpuRequestMode::kDevices : docker::GpuRequestMode::kDeviceRequests;
  }
  options.container.gpu_control_devices = docker::NvidiaControlDevices();
  const std::string gpu_mode = options.container.gpu_mode == docker::GpuRequestMode::kCdi       ? "cdi"
                               : options.container.gpu_mode == docker::GpuRequestMode::kDevices ? "devices"
                                                                                                : "device_requests";
  if (version.ok()) options.engine_is_podman = version->podman;
  options.images.ecr_mirror = ce.ecr_mirror;
  for (const auto& [host, credential] : ce.registries) {
    options.images.registries[host] = docker::RegistryCredential{credential.username, credential.password};
  }
  options.network_holders = network_holders_.get();
  options.network_holders_state_dir = holders.state_dir;
  options.engine_lost_after = std::chrono::seconds(ce.lost_after_seconds);
  const std::string label = options.container.server_label;
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Runtime> containers, docker::OpenDockerRuntime(std::move(options)));

  if (version.ok()) {
    KLOG(info, "container engine",
         {{"address", ce.socket},
          {"name", version->name},
          {"version", version->version},
          {"api_version", version->api_version},
          {"images", Join(ce.images, ",")},
          {"gpus", gpu_mode},
          {"server_label", label}});
    if (!version->podman) {
      // Docker Engine cannot join a container to a namespace it did not make (no ns: network
      // mode): under network.mode auto every instance then shares the node's network
      // (OpenNetworks); under "namespaces" container instances fail to launch, saying so.
      container_engine_cannot_join_namespaces_ = version->name;
      if (config_.network.mode == "namespaces") {
        KLOG(warn, "container instances with their own network need Podman",
             {{"reason", version->name +
                             " has no ns: network mode: a container instance fails to launch while network.mode "
                             "is namespaces; use Podman's socket, or set network.mode to auto or host"}});
      }
    }
  } else {
    KLOG(warn, "container engine unreachable",
         {{"address", ce.socket},
          {"error", version.status().message()},
          {"gpus", gpu_mode + (ce.gpus == "auto" ? " (auto: the engine's kind is unknown until it answers)" : "")},
          {"hint",
           "jobs and endpoints on container images fail until it answers; start it (podman system service "
           "--time=0 " +
               ce.socket + " &, or systemctl start docker)"}});
  }
  return containers;
}

// Per-instance networks (config "network", runtime/process/bridge_networks.h): "host" keeps every
// instance on the node's network; "namespaces" requires BridgeNetworks (the server refuses to
// start without it); "auto" uses it when it opens (root with CAP_NET_ADMIN) and otherwise says in
// one line why instances share the node's network. Networks whose instances are all gone (a
// server that crashed) are swept here, before the controllers adopt the running instances.
Status Server::OpenNetworks() {
  const NetworkConfig& n = config_.network;
  if (config_.runtime == "slurm") {
    KLOG(info, "instances use their Slurm nodes' networks", {{"reason", "runtime is slurm"}});
    return Status::Ok();
  }
  if (n.mode == "host") {
    KLOG(info, "instances share the node's network", {{"reason", "network.mode is host"}});
    return Status::Ok();
  }
  if (n.mode == "auto" && !container_engine_cannot_join_namespaces_.empty()) {
    KLOG(warn, "instances share the node's network",
         {{"reason", "network.mode auto: the container engine (" + container_engine_cannot_join_namespaces_ +
                         ") cannot join a container to a network namespace (no ns: network mode); use Podman's "
                         "socket for per-instance networks"}});
    return Status::Ok();
  }
  runtime::BridgeNetworksOptions options;
  options.state_dir = config_.data_dir + "/networks";
  options.cidr = n.cidr;
  options.subnet_prefix = n.subnet_prefix;
  options.firewall = n.firewall;
  auto opened = runtime::OpenBridgeNetworks(options);
  if (!opened.ok()) {
    if (n.mode == "namespaces") {
      return opened.status().WithPrefix("network.mode \"namespaces\": per-instance networks cannot work here");
    }
    KLOG(warn, "instances share the node's network",
         {{"reason", "network.mode auto: per-instance networks unavailable: " + opened.status().message()}});
    return Status::Ok();
  }
  networks_ = std::move(opened).value();
  // Instances still running keep their networks; every other network of this server goes.
  std::set<std::string> live;
  ASSIGN_OR_RETURN(std::vector<std::string> ids, runtime_->List());
  for (const std::string& id : ids) {
    auto status = runtime_->Inspect(id);
    if (status.ok() && status->state == runtime::InstanceState::kRunning) live.insert(id);
  }
  // Containers' networks are held by their holders (same ids): a holder still running keeps its
  // network even when the engine cannot be asked about the container now.
  if (network_holders_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<std::string> holder_ids, network_holders_->List());
    for (const std::string& id : holder_ids) {
      auto status = network_holders_->Inspect(id);
      if (status.ok() && status->state == runtime::InstanceState::kRunning) live.insert(id);
    }
  }
  auto removed = networks_->Sweep(live);
  if (!removed.ok()) {
    KLOG(warn, "sweeping the instance networks failed", {{"error", removed.status().ToString()}});
  } else {
    KLOG(
        info, "per-instance networks",
        {{"cidr", n.cidr},
         {"subnet_prefix", std::to_string(n.subnet_prefix)},
         {"firewall", n.firewall ? "on" : "off"},
         {"swept", removed->empty() ? "none" : Join(std::vector<std::string>(removed->begin(), removed->end()), ",")}});
  }
  return Status::Ok();
}

// The S3 front and the front door that every request goes through (services are added later).
void Server::BuildFrontDoor() {
  const Config& c = config_;
  objects::S3ApiOptions s3_options;
  s3_options.virtual_host_suffixes = c.virtual_host_suffixes;
  s3_options.default_region = c.regions.front();
  s3_options.account_id = c.account_id;
  s3_ = std::make_unique<objects::S3Api>(std::move(s3_options), object_store_.get());

  api::FrontDoorOptions door;
  door.auth_enabled = c.auth_enabled;
  door.regions = c.regions;
  door.accept_any_region = c.accept_any_region;
  door.account_id = c.account_id;
  door.version = KilnVersion();
  front_door_ = std::make_unique<api::FrontDoor>(door, all_credentials_.get(), s3_.get());
  if (c.console.enabled) {
    api::Console::Options console;
    console.sessions.ttl_millis = int64_t{c.console.session_minutes} * 60 * 1000;
    console.assets = api::EmbeddedConsoleAssets();
    console_ = std::make_unique<api::Console>(std::move(console), all_credentials_.get());
    front_door_->SetConsole(console_.get());
    if (!console_->built()) {
      KLOG(warn, "the web console was not built into this binary: /console/ answers 503",
           {{"fix", "run scripts/build.sh (it needs npm: scripts/install-deps.sh installs it)"}});
    }
  }
  if (node_service_ != nullptr) {
    runtime::slurm::NodeService* service = node_service_.get();
    front_door_->SetNodeService(
        [service](net::HttpRequest& request, net::ResponseWriter& response) { service->Handle(request, response); });
  }
}

// The log store and the training controller that writes into it.
Status Server::OpenLogsAndTraining(control::TrainingControllerOptions training) {
  const Config& c = config_;
  ASSIGN_OR_RETURN(log_store_, observe::LogStore::Open({c.data_dir + "/logs", database_.get(), nullptr}));
  control::TrainingControllerDeps deps;
  deps.database = database_.get();
  deps.object_store = object_store_.get();
  deps.metric_store = metric_store_.get();
  deps.runtime = runtime_.get();
  deps.scheduler = scheduler_.get();
  deps.environments = environments_.get();
  deps.credentials = instance_credentials_.get();
  deps.instance_metrics = instance_metrics_.get();
  deps.log_store = log_store_.get();
  deps.networks = networks_.get();
  // A trial that ends wakes the tuning controller (built later, before anything runs).
  deps.on_run_finished = [this](const std::string& job) {
    if (tuning_) tuning_->Submit(job);
  };
  // Processing jobs run on the same instances, images and networks as training jobs
  // (training-contract.md §17), in host directories of their own.
  control::ProcessingControllerOptions processing;
  processing.work_dir = c.data_dir + "/processing";
  processing.region = training.region;
  processing.endpoint_url = training.endpoint_url;
  processing.stop_grace = training.stop_grace;
  processing.staging_parallelism = training.staging_parallelism;
  processing.keep_host_dirs = training.keep_host_dirs;
  control::ProcessingControllerDeps processing_deps;
  processing_deps.database = database_.get();
  processing_deps.object_store = object_store_.get();
  processing_deps.log_store = log_store_.get();
  processing_deps.runtime = runtime_.get();
  processing_deps.scheduler = scheduler_.get();
  processing_deps.environments = environments_.get();
  processing_deps.credentials = instance_credentials_.get();
  processing_deps.instance_metrics = instance_metrics_.get();
  processing_deps.networks = networks_.get();
  processing_ = std::make_unique<control::ProcessingController>(processing, processing_deps);
  training_ = std::make_unique<control::TrainingController>(training, deps);
  // `kiln interrupt <job>` (POST /_kiln/training/interrupt): a spot reclaim on demand.
  front_door_->SetTrainingInterrupter(
      [this](const std::string& job) { return training_->Interrupt(job, "interrupted by kiln interrupt"); });
  return Status::Ok();
}

// Endpoints: the routing table (the controller publishes snapshots that the invoke path reads),
// the invoke path's pooled client, and the endpoint controller.
void Server::BuildEndpointController(const control::ArchiveCapOptions& archive_caps) {
  const Config& c = config_;
  routes_ = std::make_unique<serving::RoutingTable>();
  control::EndpointControllerOptions endpoints = EndpointOptions(c, archive_caps);
  control::EndpointControllerDeps endpoint_deps;
  endpoint_deps.database = database_.get();
  endpoint_deps.object_store = object_store_.get();
  endpoint_deps.runtime = runtime_.get();
  endpoint_deps.scheduler = scheduler_.get();
  endpoint_deps.environments = environments_.get();
  endpoint_deps.credentials = instance_credentials_.get();
  endpoint_deps.log_store = log_store_.get();
  endpoint_deps.routes = routes_.get();
  endpoint_deps.instance_metrics = instance_metrics_.get();
  endpoint_deps.networks = networks_.get();
  // The invoke path's pooled connections to the instances (the router, built in BuildInvokePath,
  // uses it; the controller drops a stopped instance's idle connections from it).
  invoke_client_ = std::make_unique<net::HttpClient>(InvokeClientOptions(c));
  endpoint_deps.invoke_client = invoke_client_.get();
  // And from the event loops' pools (the server is bound later, before anything is served).
  endpoint_deps.forget_upstream = [this](const std::string& host, uint16_t port) {
    if (http_) http_->ForgetUpstream(host, port);
  };
  endpoints_ = std::make_unique<control::EndpointController>(endpoints, endpoint_deps);
  // Batch transform jobs run serving instances like an endpoint's (serving-contract.md §13).
  control::TransformControllerOptions transform;
  transform.work_dir = c.data_dir + "/transform";
  control::TransformControllerDeps transform_deps;
  transform_deps.database = database_.get();
  transform_deps.object_store = object_store_.get();
  transform_deps.log_store = log_store_.get();
  transform_deps.runtime = runtime_.get();
  transform_deps.endpoints = endpoints_.get();
  transform_deps.credentials = instance_credentials_.get();
  transform_ = std::make_unique<control::TransformController>(transform, transform_deps);
}

// The JSON services exist from the start so that every operation Kiln does not implement yet
// answers UnknownOperationException naming it. SageMaker requests are validated against the
// botocore model before any handler runs.
void Server::RegisterJsonServices() {
  const Config& c = config_;
  auto sagemaker = std::make_unique<api::JsonService>("SageMaker", "sagemaker", aws::Protocol::kJson11);
  sagemaker->SetModel(api::ServiceModel::SageMaker());
  api::TrainingJobsContext training_api;
  training_api.database = database_.get();
  training_api.controller = training_.get();
  training_api.account_id = c.account_id;
  training_api.region = c.regions.front();
  training_api.catalog = catalog_.get();
  api::RegisterTrainingJobOperations(sagemaker.get(), training_api);
  api::ProcessingJobsContext processing_api;
  processing_api.database = database_.get();
  processing_api.on_created = [this](const std::string& name) { processing_->Submit(name); };
  processing_api.on_stop_requested = [this](const std::string& name) { processing_->RequestStop(name); };
  processing_api.account_id = c.account_id;
  processing_api.region = c.regions.front();
  processing_api.catalog = catalog_.get();
  processing_api.check_feasible = [this](const std::string& instance_type, int instance_count) {
    return scheduler_->CheckFeasible(instance_type, instance_count);
  };
  api::RegisterProcessingJobOperations(sagemaker.get(), processing_api);
  api::TransformJobsContext transform_api;
  transform_api.database = database_.get();
  transform_api.on_created = [this](const std::string& name) { transform_->Submit(name); };
  transform_api.on_stop_requested = [this](const std::string& name) { transform_->RequestStop(name); };
  transform_api.account_id = c.account_id;
  transform_api.region = c.regions.front();
  transform_api.catalog = catalog_.get();
  transform_api.check_feasible = [this](const std::string& instance_type, int instance_count) {
    return scheduler_->CheckFeasible(instance_type, instance_count);
  };
  api::RegisterTransformJobOperations(sagemaker.get(), transform_api);
  // Hyperparameter tuning: its controller launches trials as CreateTrainingJob would.
  trial_launcher_ = std::make_unique<api::TrainingJobTrialLauncher>(training_api);
  control::TuningControllerOptions tuning_options;
  tuning_options.max_number_of_training_jobs = c.tuning.max_number_of_training_jobs;
  tuning_options.region = c.regions.front();
  tuning_options.account_id = c.account_id;
  control::TuningControllerDeps tuning_deps;
  tuning_deps.database = database_.get();
  tuning_deps.metric_store = metric_store_.get();
  tuning_deps.launcher = trial_launcher_.get();
  tuning_ = std::make_unique<control::TuningController>(tuning_options, tuning_deps);
  api::TuningJobsContext tuning_api;
  tuning_api.database = database_.get();
  tuning_api.training = training_.get();
  tuning_api.training_context = training_api;
  tuning_api.on_created = [this](const std::string& name) { tuning_->Submit(name); };
  tuning_api.on_stop_requested = [this](const std::string& name) { tuning_->RequestStop(name); };
  tuning_api.account_id = c.account_id;
  tuning_api.region = c.regions.front();
  tuning_api.max_parallel_training_jobs = c.tuning.max_parallel_training_jobs;
  tuning_api.max_number_of_training_jobs = c.tuning.max_number_of_training_jobs;
  tuning_api.catalog = catalog_.get();
  api::RegisterTuningJobOperations(sagemaker.get(), tuning_api);
  api::EndpointsContext endpoints_api;
  endpoints_api.database = database_.get();
  endpoints_api.notifier = endpoints_.get();
  endpoints_api.catalog = catalog_.get();
  endpoints_api.account_id = c.account_id;
  endpoints_api.region = c.regions.front();
  api::RegisterInferenceOperations(sagemaker.get(), endpoints_api);
  front_door_->AddJsonService(std::move(sagemaker));
  auto logs = std::make_unique<api::JsonService>("Logs_20140328", "logs", aws::Protocol::kJson11);
  api::RegisterLogsOperations(logs.get(), log_store_.get(), c.account_id, c.regions.front());
  front_door_->AddJsonService(std::move(logs));
  // Application Auto Scaling (issue 19): the API stores targets, policies and scheduled actions;
  // the autoscaler evaluates them every autoscaling.period_seconds and writes endpoint rows.
  auto autoscaling =
      std::make_unique<api::JsonService>("AnyScaleFrontendService", "application-autoscaling", aws::Protocol::kJson11);
  api::AutoscalingContext autoscaling_api;
  autoscaling_api.database = database_.get();
  autoscaling_api.account_id = c.account_id;
  autoscaling_api.region = c.regions.front();
  api::RegisterAutoscalingOperations(autoscaling.get(), autoscaling_api);
  front_door_->AddJsonService(std::move(autoscaling));
  control::AutoscalerOptions autoscaler_options;
  autoscaler_options.period_seconds = c.autoscaling.period_seconds;
  autoscaler_ = std::make_unique<control::Autoscaler>(
      autoscaler_options, control::AutoscalerDeps{database_.get(), metric_store_.get(), endpoints_.get()});
  // CloudWatch metrics over the metric store, in JSON 1.0, Query and RPC v2 CBOR.
  api::CloudWatchOptions cloudwatch_options;
  cloudwatch_options.store = metric_store_.get();
  cloudwatch_options.alarms = api::ScalingAlarmSource(database_.get(), c.autoscaling.period_seconds);
  cloudwatch_options.alarm_database = database_.get();
  cloudwatch_options.alarm_arn_prefix = "arn:aws:cloudwatch:" + c.regions.front() + ":" + c.account_id + ":alarm:";
  cloudwatch_ = std::make_unique<api::CloudWatch>(cloudwatch_options);
  front_door_->AddJsonService(cloudwatch_->MakeJsonService());
  front_door_->SetCloudWatch(cloudwatch_.get());
}

// The invoke path: the router over the routing table and the pooled client, per-second
// invocation metrics, /metrics.
void Server::BuildInvokePath() {
  serving::InvocationMetricsOptions metrics_options;
  // A deleted endpoint's Prometheus totals go with its route (memory follows live endpoints).
  metrics_options.is_live = [routes = routes_.get()](std::string_view endpoint) {
    return routes->Find(endpoint) != nullptr;
  };
  invocation_metrics_ = std::make_unique<serving::InvocationMetrics>(std::move(metrics_options), metric_store_.get());
  router_ = std::make_unique<serving::Router>(RouterOptionsFor(config_), routes_.get(), invoke_client_.get(),
                                              invocation_metrics_.get());
  // Data capture (§14) and shadow variants (§9): told of every invocation of an endpoint that has
  // either, off the answer's way.
  capture_uploader_ = std::make_unique<control::ObjectStoreCaptureUploader>(object_store_.get());
  serving::DataCaptureOptions capture_options;
  capture_options.flush_interval =
      std::chrono::milliseconds(static_cast<int64_t>(config_.data_capture.flush_interval_seconds * 1000));
  capture_options.max_pending_bytes = static_cast<size_t>(config_.data_capture.max_buffer_mb) * 1024 * 1024;
  data_capture_ = std::make_unique<serving::DataCapture>(capture_options, capture_uploader_.get());
  serving::ShadowVariantsOptions shadow_options;
  shadow_options.invocation_timeout_ms = RouterOptionsFor(config_).invocation_timeout_ms;
  shadow_variants_ = std::make_unique<serving::ShadowVariants>(shadow_options, invoke_client_.get(),
                                                               invocation_metrics_.get(), data_capture_.get());
  data_capture_->SetShadows(shadow_variants_.get());
  router_->SetInvocationObserver(data_capture_.get());
  prometheus_ =
      std::make_unique<serving::PrometheusExporter>(invocation_metrics_.get(), routes_.get(), invoke_client_.get());
  prometheus_->SetExtraIdleConnections([this] { return http_ ? http_->stats().upstream_idle_connections : 0; });
  // Serverless variants (serving-contract.md §12): the scaler admits their invocations and sizes
  // their pools through the endpoint rows.
  control::ServerlessScalerOptions serverless_options;
  serverless_options.idle = std::chrono::seconds(config_.serverless.idle_seconds);
  serverless_options.account_max_concurrency = config_.serverless.account_max_concurrency;
  serverless_scaler_ = std::make_unique<control::ServerlessScaler>(
      serverless_options, control::ServerlessScalerDeps{.database = database_.get(),
                                                        .metrics = metric_store_.get(),
                                                        .notifier = endpoints_.get(),
                                                        .routes = routes_.get()});
  router_->SetServerlessGate(serverless_scaler_.get());
  // Multi-model endpoints (serving-contract.md §7): TargetModel placed and loaded per request.
  multi_model_fetcher_ = std::make_unique<control::MultiModelFetcher>(
      object_store_.get(), config_.data_dir + "/model-cache",
      control::ModelDataCap(nlohmann::json::object(), ArchiveCaps(config_, catalog_.get())));
  serving::MultiModelOptions multi_model_options;
  multi_model_options.load_wait =
      std::chrono::milliseconds(static_cast<int64_t>(config_.multi_model.load_wait_seconds * 1000));
  multi_model_ = std::make_unique<serving::MultiModelManager>(multi_model_options, multi_model_fetcher_.get(),
                                                              invoke_client_.get(), metric_store_.get(), routes_.get());
  router_->SetMultiModel(multi_model_.get());
  front_door_->SetRuntime(router_.get());
  front_door_->SetMetricsExporter(prometheus_.get());
}

Status Server::BuildAsyncInference() {
  const Config& c = config_;
  serving::AsyncQueueOptions queue_options;
  queue_options.dir = c.data_dir + "/async";
  queue_options.max_per_endpoint = static_cast<size_t>(c.async_inference.max_queue_per_endpoint);
  auto queue = serving::AsyncQueue::Open(queue_options);
  if (!queue.ok()) return queue.status().WithPrefix("async queue");
  async_queue_ = std::move(queue).value();
  async_invoker_ = std::make_unique<api::AsyncInvoker>(
      api::AsyncInvokerDeps{.routes = routes_.get(), .objects = object_store_.get(), .queue = async_queue_.get()});
  front_door_->SetAsyncInvoker(async_invoker_.get());
  control::AsyncDispatcherOptions options;
  options.default_max_concurrency = c.async_inference.default_max_concurrency;
  options.notification_webhooks = c.async_inference.notifications;
  options.region = c.regions.front();
  control::AsyncDispatcherDeps deps;
  deps.queue = async_queue_.get();
  deps.routes = routes_.get();
  deps.objects = object_store_.get();
  deps.logs = log_store_.get();
  deps.metrics = metric_store_.get();
  // A deleted endpoint's queue goes: its requests can never run.
  deps.endpoint_gone = [database = database_.get()](const std::string& endpoint) {
    return store::EndpointRepository(database).Get(endpoint).status().IsNotFound();
  };
  async_dispatcher_ = std::make_unique<control::AsyncDispatcher>(options, std::move(deps));
  return Status::Ok();
}

// Remote access (issue 16): the tunnel service spawns `<this binary> agent` per connection (as the
// process runtime spawns `<this binary> shim`), with the server's SSH host key under the data dir.
Status Server::BuildRemoteAccess() {
  const Config& c = config_;
  access::TunnelServiceOptions options;
  options.enabled = c.remote_access.enabled;
  options.allowed_principals = c.remote_access.allowed_principals;
  options.allow_network_isolated = c.remote_access.allow_network_isolated;
  options.idle_timeout = std::chrono::seconds(c.remote_access.idle_timeout_seconds);
  options.max_connection = std::chrono::seconds(c.remote_access.max_connection_seconds);
  options.agent_command = {SelfExecutable(), "agent"};
  options.host_key_path = c.data_dir + "/access/ssh_host_ed25519_key";
  options.training_log_group = control::kTrainingLogGroup;
  options.held_instance_id = control::HeldInstanceId;
  options.is_holding_before_start = control::IsHoldingBeforeStart;
  options.region = c.regions.front();
  options.account_id = c.account_id;
  access::TunnelServiceDeps deps;
  deps.database = database_.get();
  deps.runtime = runtime_.get();
  deps.log_store = log_store_.get();
  ASSIGN_OR_RETURN(tunnels_, access::TunnelService::Create(std::move(options), deps));
  front_door_->SetRemoteAccess(tunnels_.get());
  return Status::Ok();
}

// Binds the listen address (serving starts in Start()); every request goes to the front door:
// invocations it claims on the event loops (FrontDoor as the AsyncService), the rest to Handle.
Status Server::BindHttp() {
  api::FrontDoor* door_ptr = front_door_.get();
  ASSIGN_OR_RETURN(http_, net::HttpServer::Create(
                              HttpOptions(config_),
                              [door_ptr](net::HttpRequest& request, net::ResponseWriter& response) {
                                door_ptr->Handle(request, response);
                              },
                              door_ptr));
  return Status::Ok();
}

Server::~Server() { Stop(); }

Status Server::Start() {
  RETURN_IF_ERROR(training_->Start().WithPrefix("training controller"));
  RETURN_IF_ERROR(endpoints_->Start().WithPrefix("endpoint controller"));
  RETURN_IF_ERROR(tuning_->Start().WithPrefix("tuning controller"));
  RETURN_IF_ERROR(processing_->Start().WithPrefix("processing controller"));
  RETURN_IF_ERROR(transform_->Start().WithPrefix("transform controller"));
  invocation_metrics_->Start();
  data_capture_->Start();
  shadow_variants_->Start();
  instance_metrics_->Start();
  tunnels_->Start();
  async_dispatcher_->Start();
  autoscaler_->Start();
  serverless_scaler_->Start();
  multi_model_->Start();
  return http_->Start();
}

void Server::Stop(int grace_seconds) {
  // Open tunnels close first ("server stopping"; their agents end with them); connects still in
  // flight are refused.
  if (tunnels_) tunnels_->Stop();
  if (http_) http_->Stop(grace_seconds);
  // Shadow calls in flight end; open capture files are written.
  if (shadow_variants_) shadow_variants_->Stop();
  if (data_capture_) data_capture_->Stop();
  // Requests in flight stay queued (journaled) and run after the restart.
  if (async_dispatcher_) async_dispatcher_->Stop();
  // Instances keep running; the next server adopts them. Tuning first: it launches trials.
  if (autoscaler_) autoscaler_->Stop();
  if (serverless_scaler_) serverless_scaler_->Stop();
  if (multi_model_) multi_model_->Stop();  // loads in flight are cut; the metrics written
  if (tuning_) tuning_->Shutdown();
  if (training_) training_->Shutdown();
  if (processing_) processing_->Shutdown();
  if (transform_) transform_->Shutdown();  // before endpoints_: its instances are endpoint instances
  if (endpoints_) endpoints_->Shutdown();
  if (invocation_metrics_) invocation_metrics_->Stop();
  if (instance_metrics_) instance_metrics_->Stop();
}

}  // namespace kiln::cli
