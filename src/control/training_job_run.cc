#include "control/training_job_run.h"

#include "control/instance_placement.h"

#include "control/training_hold.h"
#include "control/training_job_run_host.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <filesystem>
#include <optional>
#include <set>

#include "agent/artifacts.h"
#include "agent/checkpoints.h"
#include "agent/errors.h"
#include "agent/pipe_feeder.h"
#include "agent/staging.h"
#include "agent/training_layout.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"
#include "control/log_pump.h"
#include "control/training_launch.h"
#include "control/training_plan.h"
#include "control/training_states.h"
#include "control/warm_pools.h"
#include "store/remote_connection_repository.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::SecondaryStatus;
using store::StopRequest;
using JobStatus = store::TrainingJobStatus;
using Phase = store::TrainingPhase;
using namespace training;  // messages and deadline arithmetic
namespace fs = std::filesystem;

// The job's network (DESIGN.md §6): one per job, named after it.
std::string NetworkName(const std::string& job) { return "training-" + job; }

// EnableNetworkIsolation as a bool (the service model checked its type; older rows may hold anything).
bool NetworkIsolation(const json& request) {
  return request.contains("EnableNetworkIsolation") && request["EnableNetworkIsolation"].is_boolean() &&
         request["EnableNetworkIsolation"].get<bool>();
}

// A network that cannot be created or joined is Kiln's failure (retried under RetryStrategy);
// the reason says what the operator can change.
Status NetworkFailure(const std::string& what, const Status& status) {
  std::string advice =
      status.code() == StatusCode::kResourceExhausted
          ? " Widen network.cidr (or lengthen network.subnet_prefix) in the Kiln config, or wait for other jobs "
            "and endpoints to end."
          : " Check the node's networking, or set network.mode to \"host\" in the Kiln config to run instances on "
            "the node's network.";
  std::string message = status.message();
  if (!message.empty() && message.back() != '.') message += '.';
  return agent::InternalServerError(what + ": " + message + advice);
}

}  // namespace

TrainingJobRun::TrainingJobRun(Context context, std::string name, std::vector<Allocation> allocations, bool adopt,
                               Status grant_written)
    : context_(std::move(context)),
      name_(std::move(name)),
      allocations_(std::move(allocations)),
      adopt_(adopt),
      grant_written_(std::move(grant_written)) {}

TrainingJobRun::~TrainingJobRun() = default;

void TrainingJobRun::Start() {
  thread_ = std::thread([this] { Run(); });
}

void TrainingJobRun::RequestStop() {
  stop_requested_.store(true);
  cancel_.Cancel();
}

void TrainingJobRun::RequestInterrupt() {
  interrupt_requested_.store(true);
  cancel_.Cancel();
}

void TrainingJobRun::Shutdown() {
  shutting_down_.store(true);
  cancel_.Cancel();
}

void TrainingJobRun::Join() {
  if (thread_.joinable()) thread_.join();
}

int64_t TrainingJobRun::Now() const { return deps().clock ? deps().clock->NowMillis() : Clock::System().NowMillis(); }

Result<store::TrainingJobRecord> TrainingJobRun::Update(const std::function<void(store::TrainingJobRecord&)>& fn) {
  return context_.jobs->Mutate(name_, [&](store::TrainingJobRecord& r) {
    fn(r);
    return Status::Ok();
  });
}

void TrainingJobRun::SetSecondary(SecondaryStatus secondary, const std::string& message) {
  int64_t now = Now();
  auto r = Update([&](store::TrainingJobRecord& rec) {
    // A stop the API recorded wins over progress: keep showing Stopping.
    if (rec.status == JobStatus::kStopping && secondary != SecondaryStatus::kStopping) return;
    RecordSecondaryStatus(rec, secondary, message, now);
  });
  if (!r.ok()) KLOG(warn, "training job update failed", {{"job", name_}, {"error", r.status().ToString()}});
}

void TrainingJobRun::Run() {
  RunSteps();
  context_.on_finished(name_);
  if (retrying_) context_.resubmit(name_);  // queued again, behind nobody it overtook
}

// RetryStrategy (training-contract.md §10): a job that failed for Kiln's own reasons
// (FailureKind::kInternalServerError) starts again, up to MaximumRetryAttempts times, going through
// Restarting → Starting. Returns true (and records the restart) when it will be retried.
bool TrainingJobRun::RetryIfAllowed(const JobFailure& failure) {
  if (failure.kind != FailureKind::kInternalServerError || shutting_down_.load() || stop_requested_.load()) {
    return false;
  }
  const std::string& why = failure.reason;
  const int max_attempts = request_.value("RetryStrategy", json::object()).value("MaximumRetryAttempts", 0);
  const int64_t now = Now();
  bool retry = false;
  (void)Update([&](store::TrainingJobRecord& rec) {
    const int retries = rec.state.retries;
    if (!RetryAllowed(failure.kind, rec.status, retries, max_attempts)) return;
    rec.state.retries = retries + 1;
    SetPhase(rec, Phase::kQueued);
    rec.state.last_failure = why;
    rec.state.hosts.clear();
    rec.state.allocations = json();
    RecordSecondaryStatus(rec, SecondaryStatus::kRestarting,
                          "Restarting the training job (attempt " + std::to_string(retries + 2) + " of " +
                              std::to_string(max_attempts + 1) + "): " + why,
                          now);
    retry = true;
  });
  if (retry) {
    KLOG(info, "training job restarting", {{"job", name_}, {"reason", why}});
    retrying_ = true;
  }
  return retry;
}

void TrainingJobRun::RunSteps() {
  auto loaded = context_.jobs->Get(name_);
  if (!loaded.ok()) {
    KLOG(error, "training job vanished before it ran", {{"job", name_}, {"error", loaded.status().ToString()}});
    return;
  }
  store::TrainingJobRecord record = std::move(loaded).value();
  if (!store::IsActive(record.status)) {
    // Stopped while its grant was on the way (RequestStop found no run yet): nothing to do but
    // drop the warm pool directory it took, if any (FinishWithoutRunning ended the pool).
    if (record.state.warm_pool.status == store::WarmPoolStatus::kInUse && !record.state.warm_pool.directory.empty()) {
      std::error_code ec;
      fs::remove_all(record.state.warm_pool.directory, ec);
    }
    return;
  }
  request_ = record.request;
  job_dir_ = options().work_dir + "/" + record.name;
  if (record.state.warm_pool.status == store::WarmPoolStatus::kInUse)
    taken_pool_dir_ = record.state.warm_pool.directory;
  if (record.state.stop_requested != StopRequest::kNone) {
    stop_requested_.store(true);
    stop_reason_ = record.state.stop_requested == StopRequest::kMaxRuntime    ? StopReason::kMaxRuntime
                   : record.state.stop_requested == StopRequest::kMaxWaitTime ? StopReason::kMaxWaitTime
                                                                              : StopReason::kUser;
  }
  // Managed spot: an interruption recorded before this run (a server that died meanwhile) is
  // carried out; the earlier attempts' running time counts against MaxRuntimeInSeconds.
  interruptions_ = record.state.interruptions;
  billable_before_ = record.state.billable_millis;
  creation_millis_ = record.creation_millis;
  // A finishing job's hosts all exited on their own: it ends as it is, whatever was recorded.
  if (record.state.interrupt_requested && record.state.phase != Phase::kFinishing) {
    interrupt_requested_.store(true);
    // Its hosts may have exited while no server watched (a restart during the stop grace): the
    // monitor then finishes at once, and Finish must still treat the job as interrupted.
    if (record.state.stop_requested == StopRequest::kNone) stop_reason_ = StopReason::kInterruption;
  }

  const Phase phase = record.state.phase;
  if (adopt_ && (phase == Phase::kRunning || phase == Phase::kFinishing)) {
    Adopt(record);
    if (phase == Phase::kRunning) {
      Monitor(record);
    } else {
      // Every host of a finishing job has exited: read how (the outcome depends on it). Without
      // this a job whose server died while uploading was failed as "lost" when adopted.
      ObserveHosts();
    }
  } else {
    Status prepared = Prepare(record);
    if (prepared.ok() && !stop_requested_.load() && !shutting_down_.load() && !interrupt_requested_.load()) {
      prepared = Stage(record);
    }
    if (shutting_down_.load()) {
      // The next server stages the job again from the start.
      StopAgents();
      return;
    }
    const bool stopped_while_staging = prepared.code() == StatusCode::kAborted && stop_requested_.load();
    const bool interrupted_while_staging = prepared.code() == StatusCode::kAborted && interrupt_requested_.load();
    if (!prepared.ok() && !stopped_while_staging && !interrupted_while_staging) {
      StopAgents();
      Fail(FailureFromStatus(prepared));
      return;
    }
    if (!stop_requested_.load() && interrupt_requested_.load()) {
      // Reclaimed before it trained: nothing to sync; it waits for capacity again.
      StopAgents();
      if (FinishInterrupted(/*ran=*/false)) {
        Cleanup();
        retrying_ = true;
        return;
      }
      stop_requested_.store(true);  // a user's stop came meanwhile: it wins
    }
    if (stop_requested_.load()) {
      StopAgents();
      Finish(/*ran=*/false);
      return;
    }
    if (Status launched = Launch(record); !launched.ok()) {
      StopAgents();
      Fail(FailureFromStatus(launched));
      return;
    }
    Monitor(record);
  }
  if (shutting_down_.load()) {
    // Instances keep running; the next server adopts them and resumes the pumps.
    StopPumps(/*drain=*/false);
    StopAgents();
    return;
  }
  Finish(/*ran=*/true);
}

Status TrainingJobRun::Prepare(store::TrainingJobRecord& record) {
  // The grant (phase staging, allocations, Starting message) was written by the scheduling pass,
  // together with the other grants of that pass (RunPass). Under the `shrink` policy (or CPU
  // fallback) the scheduler may give less than the instance type's shape; the status message
  // says so (the job still shows it while it trains).
  allocation_note_ = AllocationNote(allocations_);
  RETURN_IF_ERROR(grant_written_);

  if (deps().networks != nullptr) {
    // A previous attempt's (or server's) network goes first: its leases belong to instances that
    // are gone, and a fresh network gives algo-1..N the first addresses in order.
    const std::string network = NetworkName(record.name);
    if (Status removed = deps().networks->Remove(network); !removed.ok()) {
      KLOG(warn, "stale job network not removed", {{"job", name_}, {"error", removed.ToString()}});
    }
    if (auto ensured = deps().networks->Ensure(network, NetworkIsolation(request_)); !ensured.ok()) {
      return NetworkFailure("the job's network " + network + " could not be created", ensured.status());
    }
  }

  std::error_code ec;
  fs::remove_all(job_dir_, ec);
  std::vector<agent::HostLayout> layouts = agent::HostLayoutsForRequest(request_);
  for (size_t i = 0; i < layouts.size(); ++i) {
    auto host = std::make_unique<Host>();
    host->host = layouts[i].current_host;
    host->shard_index = layouts[i].ShardIndex();
    host->root = job_dir_ + "/" + host->host;
    host->opt_ml = host->root + "/opt_ml";
    host->instance_id = "training-" + record.name + "-" + host->host;
    // A previous attempt (a server that died while staging) may have left an instance behind.
    if (deps().runtime->Inspect(host->instance_id).ok()) {
      (void)deps().runtime->Stop(host->instance_id, std::chrono::seconds(0));
      (void)deps().runtime->Wait(host->instance_id, std::chrono::seconds(5));
      (void)deps().runtime->Remove(host->instance_id);
    }
    if (Status made = MakeDirs(host->root, 0755); !made.ok()) {
      return agent::InternalServerError("cannot create the host directory: " + made.message(), made.code());
    }
    RETURN_IF_ERROR(agent::WriteTrainingLayout(host->opt_ml, request_, layouts[i]));
    if (KeepAliveSeconds(request_) > 0) {
      // The persistent cache: what the pool this job took kept there, or a new empty directory.
      const std::string cache = host->opt_ml + "/" + kWarmPoolCacheUnderOptMl;
      const std::string kept_cache =
          taken_pool_dir_.empty() ? "" : taken_pool_dir_ + "/" + host->host + "/opt_ml/" + kWarmPoolCacheUnderOptMl;
      RETURN_IF_ERROR(MakeDirs(fs::path(cache).parent_path().string(), 0755));
      if (kept_cache.empty() || rename(kept_cache.c_str(), cache.c_str()) != 0) {
        RETURN_IF_ERROR(MakeDirs(cache, 0755));
      }
    }
    hosts_.push_back(std::move(host));
  }
  return Status::Ok();
}

Status TrainingJobRun::Stage(const store::TrainingJobRecord& record) {
  // The image first: one Kiln cannot run fails the job before its channels are downloaded, and
  // a download error cannot hide it (issue 10). Launch resolves it again for the command.
  const std::string image = request_.value("AlgorithmSpecification", json::object()).value("TrainingImage", "");
  auto resolved = deps().environments->Resolve(image);
  if (!resolved.ok()) return agent::ClientError(resolved.status().message());
  if (resolved->kind == runtime::ImageResolution::Kind::kContainerImage) {
    // The engine's copy of the image (pulled when missing) also before the channels: a missing
    // image fails the job at once, and the pull's progress is the status message meanwhile.
    RETURN_IF_ERROR(PrepareImage(resolved->image));
  }
  if (options().remote_instances) {
    // A FIFO on this machine cannot feed a program on a Slurm node.
    for (const json& channel : request_.value("InputDataConfig", json::array())) {
      if (agent::ChannelInputMode(request_, channel) == "Pipe") {
        return agent::ClientError("Channel " + channel.value("ChannelName", std::string("?")) +
                                  " uses Pipe input mode, which this Kiln server cannot offer: its instances run "
                                  "on a Slurm cluster, and a pipe cannot cross machines. Use File or "
                                  "FastFile input mode.");
      }
    }
  }
  SetSecondary(SecondaryStatus::kDownloading, kMsgDownloading);
  const int host_count = static_cast<int>(hosts_.size());
  // Script-mode code (sagemaker_submit_directory) is fetched here, while the channels download,
  // so that the toolkit finds /opt/ml/code filled and starts the user's script at once.
  std::optional<std::string> submit_dir = DecodedHyperparameter(request_, "sagemaker_submit_directory");
  for (int i = 0; i < host_count; ++i) {
    Host& host = *hosts_[i];
    agent::StageOptions stage_options;
    stage_options.parallelism = options().staging_parallelism;
    if (!taken_pool_dir_.empty())
      stage_options.reuse_manifest = taken_pool_dir_ + "/" + host.host + "/" + kStagedInputs;
    ASSIGN_OR_RETURN(agent::StagingReport report,
                     agent::StageChannels(*deps().object_store, request_, host.shard_index, host_count, host.opt_ml,
                                          cancel_, stage_options));
    KLOG(info, "staged input channels",
         {{"job", name_},
          {"host", host.host},
          {"objects", std::to_string(report.objects)},
          {"bytes", std::to_string(report.bytes)},
          {"reused_objects", std::to_string(report.reused_objects)},
          {"seconds", std::to_string(report.elapsed_seconds)}});
    if (KeepAliveSeconds(request_) > 0) {
      // What a pool kept from this job offers the next one (agent::StageOptions::reuse_manifest).
      if (Status s = agent::WriteStagedManifest(host.root + "/" + kStagedInputs, report.files); !s.ok()) {
        KLOG(warn, "staged-files manifest not written", {{"job", name_}, {"error", s.ToString()}});
      }
    }
    if (submit_dir && (StartsWith(*submit_dir, "s3://") || StartsWith(*submit_dir, "file://"))) {
      RETURN_IF_ERROR(agent::DownloadSourceDir(*deps().object_store, *submit_dir, host.opt_ml + "/code",
                                               SourceDirCap(request_, options().archive_caps)));
    }
    if (request_.contains("CheckpointConfig")) {
      ASSIGN_OR_RETURN(host.checkpoints, MakeCheckpointSync(host));
      RETURN_IF_ERROR(host.checkpoints->Restore(&cancel_));
    }
    ASSIGN_OR_RETURN(host.output_syncs, MakeOutputSyncs(host));
    agent::PipeFeeder::Options feeder_options;
    feeder_options.on_error = [this](const std::string& channel, const Status& error) {
      KLOG(warn, "pipe channel failed", {{"job", name_}, {"channel", channel}, {"error", error.ToString()}});
    };
    auto feeder = std::make_unique<agent::PipeFeeder>(*deps().object_store, request_, host.shard_index, host_count,
                                                      host.opt_ml, feeder_options);
    RETURN_IF_ERROR(feeder->Start());
    host.feeder = std::move(feeder);
  }
  // What the taken pool kept and this job did not use goes.
  if (!taken_pool_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(taken_pool_dir_, ec);
  }
  (void)record;
  return Status::Ok();
}

Status TrainingJobRun::PrepareImage(const std::string& image) {
  const std::string message = std::string(kMsgDownloadingImage) + " " + image;
  SetSecondary(SecondaryStatus::kDownloading, message);
  // Progress comes many times a second: the row is written at once, then at most once a second
  // (a real-time throttle: the run's clock may be a test's, which does not move).
  std::optional<std::chrono::steady_clock::time_point> last_write;
  const auto progress = [&](const std::string& text) {
    const auto now = std::chrono::steady_clock::now();
    if (last_write && now - *last_write < std::chrono::seconds(1)) return;
    last_write = now;
    SetSecondary(SecondaryStatus::kDownloading, message + ": " + text);
  };
  const Status prepared = deps().runtime->PrepareImage(
      runtime::ContainerImage{.requested = image, .reference = "", .entrypoint = std::nullopt}, progress,
      [this] { return cancel_.cancelled(); });
  if (!prepared.ok()) {
    KLOG(info, "training image not prepared", {{"job", name_}, {"image", image}, {"error", prepared.ToString()}});
  }
  return ImagePreparationError(prepared);
}

Status TrainingJobRun::Launch(store::TrainingJobRecord& record) {
  const json& algorithm = request_.value("AlgorithmSpecification", json::object());
  const std::string image = algorithm.value("TrainingImage", "");
  auto resolved = deps().environments->Resolve(image);
  if (!resolved.ok()) return agent::ClientError(resolved.status().message());
  const runtime::ImageResolution& resolution = *resolved;

  // Credentials for the instances: issued once per job and kept in its state, so that a
  // restarted server can accept them again.
  aws::Credential credential = !record.state.credentials.is_null()
                                   ? CredentialFromJson(record.state.credentials)
                                   : deps().credentials->Issue(request_.value("RoleArn", ""), record.name);
  deps().credentials->Register(credential);

  TrainingLaunchContext launch;
  launch.job_name = record.name;
  launch.job_arn = record.arn;
  launch.region = options().region;
  launch.endpoint_url = options().endpoint_url;
  launch.toolkit_script = options().toolkit_script;
  launch.credential = credential;
  TrainingLaunchPlan plan = PlanTrainingLaunch(request_, resolution, launch);
  if (KeepAliveSeconds(request_) > 0) plan.env[kWarmPoolCacheVariable] = kWarmPoolCacheDirectory;
  // The hold before start (training_hold.h): only where remote access is enabled, since nobody
  // could otherwise connect to release it, and on the process runtime.
  if (deps().database != nullptr) {
    auto tags = store::TagRepository(deps().database).List(record.arn);
    if (!tags.ok()) return tags.status();
    auto hold = HoldStartSeconds(*tags);
    if (!hold.ok()) return agent::ClientError(hold.status().message());
    const bool remote_access =
        request_.value("RemoteDebugConfig", json::object()).value("EnableRemoteDebug", false) == true;
    auto idle = IdleStopSeconds(*tags);
    if (!idle.ok()) return agent::ClientError(idle.status().message());
    idle_stop_seconds_ = idle->value_or(0);
    auto hold_exit = HoldExitSeconds(*tags);
    if (!hold_exit.ok()) return agent::ClientError(hold_exit.status().message());
    // Holds need remote access into the instance, which instances on other machines lack so far.
    if (options().remote_instances) {
      hold = std::optional<int>();
      hold_exit = std::optional<int>();
    }
    if (hold_exit->value_or(0) > 0 && remote_access) {
      if (plan.container) {
        return agent::ClientError("The tag " + std::string(kHoldExitTag) +
                                  " holds instances of Kiln's process runtime; it cannot hold the container image " +
                                  plan.container->requested + " yet. Remove the tag.");
      }
      hold_exit_seconds_ = **hold_exit;
    }
    job_arn_ = record.arn;
    if (hold->has_value() && **hold > 0 && remote_access) {
      if (plan.container) {
        return agent::ClientError("The tag " + std::string(kHoldStartTag) +
                                  " holds programs started by Kiln's process runtime; the container image " +
                                  plan.container->requested + " starts its own entrypoint. Remove the tag.");
      }
      if (options().kiln_binary.empty())
        return agent::ClientError("this Kiln server cannot hold a program before start");
      plan.argv = HoldStartArgv(options().kiln_binary, **hold, plan.argv);
      BindIfInTmp(options().kiln_binary, plan.binds);
      holding_ = true;
    }
  }
  // Backends that place instances elsewhere (Slurm): scheduler hints from the job's tags.
  std::map<std::string, std::string> placement;
  if (deps().database != nullptr) {
    if (auto tags = store::TagRepository(deps().database).List(record.arn); tags.ok()) {
      placement = PlacementFromTags(*tags);
    }
  }
  const std::string instance_type = request_.value("ResourceConfig", json::object()).value("InstanceType", "");
  // Namespaced hosts: an address each on the job's network (algo-1, algo-2, ... in order), and
  // /etc/hosts naming them all; otherwise they share the node's network and every name is 127.0.0.1.
  std::vector<std::optional<runtime::NetworkAttachment>> attachments(hosts_.size());
  std::vector<std::string> hosts_lines;
  if (deps().networks != nullptr) {
    const std::string network = NetworkName(record.name);
    const std::vector<int> forwards = LoopbackForwards(options().endpoint_url);
    std::vector<std::pair<std::string, std::string>> names_and_addresses;
    for (size_t i = 0; i < hosts_.size(); ++i) {
      auto attached = deps().networks->Attach(network, hosts_[i]->instance_id, forwards);
      if (!attached.ok()) {
        return NetworkFailure(hosts_[i]->host + " could not join the job's network " + network, attached.status());
      }
      names_and_addresses.emplace_back(hosts_[i]->host, attached->address);
      attachments[i] = std::move(attached).value();
    }
    hosts_lines = NamespacedHostsFileLines(names_and_addresses);
  } else {
    std::vector<std::string> host_names;
    for (const auto& h : hosts_) host_names.push_back(h->host);
    hosts_lines = HostsFileLines(host_names);
  }
  // More MPI processes per host than its GPUs: accepted, said in the Training message.
  if (!allocations_.empty()) allocation_note_ += ProcessesPerHostNote(request_, allocations_.front().gpus.size());

  std::vector<store::TrainingHostState> hosts_state;
  int64_t last_stream_epoch = 0;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    Host& host = *hosts_[i];
    const Allocation& allocation = allocations_.at(std::min(i, allocations_.size() - 1));
    runtime::InstanceSpec spec;
    spec.instance_id = host.instance_id;
    spec.opt_ml_dir = host.opt_ml;
    spec.extra_mounts = plan.binds;
    spec.hostname = host.host;
    spec.hosts_file_lines = hosts_lines;
    spec.argv = plan.argv;
    spec.env = plan.env;
    AddGpuEnvironment(allocation, spec.env);
    spec.working_dir = plan.working_dir;
    spec.cpus = allocation.cpus;
    spec.memory_limit_bytes = allocation.memory_bytes;
    spec.gpus = allocation.gpus;
    spec.network = attachments[i];
    spec.container = plan.container;
    // One allocation for all hosts where the backend allocates (Slurm: one job of N nodes), of the
    // type's shape (the scheduler granted it whole: Slurm's is the capacity there).
    spec.group = record.name;
    spec.group_size = static_cast<int>(hosts_.size());
    spec.group_index = static_cast<int>(i);
    spec.shape_vcpus = static_cast<int>(allocation.cpus.size());
    spec.shape_memory_bytes = allocation.memory_bytes;
    spec.shape_gpus = static_cast<int>(allocation.gpus.size());
    spec.instance_type = instance_type;
    spec.time_limit_seconds = InstanceTimeLimitSeconds(request_, options().stop_grace);
    spec.placement = placement;
    host.spec = spec;
    Status launched = deps().runtime->Launch(spec);
    if (!launched.ok()) {
      // Nothing of this job may keep running.
      for (size_t j = 0; j < i; ++j) {
        (void)deps().runtime->Stop(hosts_[j]->instance_id, std::chrono::seconds(0));
      }
      const std::string what = "the training program could not be started on " + host.host + ": " + launched.message();
      if (launched.code() == StatusCode::kUnavailable) {
        // The container engine went away: Kiln's side (retried under RetryStrategy).
        return agent::InternalServerError(what);
      }
      return agent::ClientError(what + (plan.container ? ". Check AlgorithmSpecification.TrainingImage (and "
                                                         "ContainerEntrypoint, ContainerArguments)."
                                                       : ". Check AlgorithmSpecification.TrainingImage (and "
                                                         "ContainerEntrypoint) and the environment it maps to."));
    }
    host.started_millis = Now();
    // A restarted job's container gets a new stream even when it starts within the same second.
    const int64_t previous_epoch = record.state.last_stream_epoch;
    const int64_t epoch = std::max<int64_t>(host.started_millis / 1000, previous_epoch + 1);
    last_stream_epoch = std::max(last_stream_epoch, epoch);
    host.log_stream = record.name + "/" + host.host + "-" + std::to_string(epoch);
    hosts_state.push_back({.host = host.host,
                           .shard_index = host.shard_index,
                           .instance_id = host.instance_id,
                           .root = host.root,
                           .log_stream = host.log_stream,
                           .started_millis = host.started_millis});
  }
  training_start_millis_ = hosts_.empty() ? Now() : hosts_.front()->started_millis;
  json credential_state = CredentialToJson(credential);
  int64_t now = Now();
  auto r = Update([&](store::TrainingJobRecord& rec) {
    SetPhase(rec, Phase::kRunning);
    rec.state.hosts = hosts_state;
    rec.state.last_stream_epoch = last_stream_epoch;
    rec.state.credentials = credential_state;
    // TrainingStartTime is the first start of an interrupted spot job (its TrainingTimeInSeconds
    // is wall time from there); a RetryStrategy attempt starts it afresh, as before.
    if (!rec.state.training_start_millis || rec.state.interruptions == 0) {
      rec.state.training_start_millis = training_start_millis_;
    }
    rec.state.attempt_start_millis = training_start_millis_;
    rec.state.resume_after_millis.reset();
    if (rec.status != JobStatus::kStopping) {
      RecordSecondaryStatus(rec, SecondaryStatus::kTraining,
                            holding_ ? std::string(kMsgWaitingForRemoteConnection) : kMsgTraining + allocation_note_,
                            now);
    }
  });
  if (!r.ok()) return r.status();

  const json metric_definitions = algorithm.value("MetricDefinitions", json::array());
  for (auto& host : hosts_) {
    StartPump(*host, metric_definitions, 0);
    if (host->checkpoints) host->checkpoints->Start();
    for (auto& sync : host->output_syncs) sync->Start();
  }
  return Status::Ok();
}

void TrainingJobRun::Adopt(const store::TrainingJobRecord& record) {
  training_start_millis_ = record.state.attempt_start_millis.value_or(record.state.training_start_millis.value_or(0));
  holding_ = record.state.status_message == kMsgWaitingForRemoteConnection;
  job_arn_ = record.arn;
  if (deps().database != nullptr) {
    if (auto tags = store::TagRepository(deps().database).List(record.arn); tags.ok()) {
      if (auto idle = IdleStopSeconds(*tags); idle.ok()) idle_stop_seconds_ = idle->value_or(0);
    }
  }
  if (!record.state.credentials.is_null()) {
    deps().credentials->Register(CredentialFromJson(record.state.credentials));
  }
  const json metric_definitions =
      request_.value("AlgorithmSpecification", json::object()).value("MetricDefinitions", json::array());
  {
    MutexLock lock(metrics_mutex_);
    final_metrics_ = record.state.final_metrics;
  }
  const bool running = record.state.phase == Phase::kRunning;
  for (const store::TrainingHostState& h : record.state.hosts) {
    auto host = std::make_unique<Host>();
    host->host = h.host;
    host->instance_id = h.instance_id;
    host->root = h.root;
    host->opt_ml = host->root + "/opt_ml";
    host->log_stream = h.log_stream;
    host->started_millis = h.started_millis;
    const int64_t offset = LogPump::ReadOffset(host->root + "/log.offset");
    if (request_.contains("CheckpointConfig")) {
      auto checkpoints = MakeCheckpointSync(*host);
      if (checkpoints.ok()) {
        host->checkpoints = std::move(checkpoints).value();
        if (running) host->checkpoints->Start();
      }
    }
    if (auto syncs = MakeOutputSyncs(*host); syncs.ok()) {
      host->output_syncs = std::move(syncs).value();
      if (running) {
        for (auto& sync : host->output_syncs) sync->Start();
      }
    }
    if (running) {
      // Pipe channels: a new feeder continues where the old server's stopped (its progress is
      // recorded beside the FIFOs).
      agent::PipeFeeder::Options feeder_options;
      feeder_options.resume = true;
      std::string job = name_;
      feeder_options.on_error = [job](const std::string& channel, const Status& error) {
        KLOG(warn, "pipe channel failed", {{"job", job}, {"channel", channel}, {"error", error.ToString()}});
      };
      int host_count = request_.value("ResourceConfig", json::object()).value("InstanceCount", 1);
      auto feeder = std::make_unique<agent::PipeFeeder>(*deps().object_store, request_, h.shard_index, host_count,
                                                        host->opt_ml, feeder_options);
      Status started = feeder->Start();
      if (started.ok()) {
        host->feeder = std::move(feeder);
      } else {
        KLOG(warn, "pipe feeding not resumed", {{"job", name_}, {"error", started.ToString()}});
      }
    }
    hosts_.push_back(std::move(host));
    StartPump(*hosts_.back(), metric_definitions, offset);
  }
  KLOG(info, "adopted running training job", {{"job", name_}, {"hosts", std::to_string(hosts_.size())}});
}

// Observe, plan (training_plan.h PlanMonitor), act, wait: until every host has exited or the
// server shuts down.
void TrainingJobRun::Monitor(const store::TrainingJobRecord& record) {
  MonitorInput input;
  input.deadline_millis = AttemptDeadline(request_, training_start_millis_, billable_before_);
  if (auto wait = MaxWaitDeadline(request_, creation_millis_)) input.wait_deadline_millis = *wait;
  const bool spot = IsManagedSpot(request_);
  int64_t last_metrics_flush = Now();
  int64_t last_idle_check = 0;
  while (!shutting_down_.load()) {
    // Exit statuses first: a host that ended is recorded even if a stop is also under way.
    ObserveHosts();
    // ObserveHosts moves the attempt's start to when a backend's queue let the hosts run.
    input.deadline_millis = AttemptDeadline(request_, training_start_millis_, billable_before_);
    if (spot && !input.stop_sent) CheckSpotSources();
    input.stop_requested = stop_requested_.load();
    input.requested_reason = stop_reason_;
    input.interrupt_requested = interrupt_requested_.load();
    input.hosts.clear();
    for (const auto& host : hosts_) input.hosts.push_back({.exited = host->exited, .exit_code = host->exit_code});
    const MonitorActions actions = PlanMonitor(input, Now());
    if (actions.finish) break;
    if (actions.stop != StopReason::kNone) {
      StopHosts(actions.stop, actions.record_max_runtime || actions.record_max_wait);
      input.stop_sent = true;
    }
    if (Now() - last_metrics_flush >= 2000) {
      last_metrics_flush = Now();
      FlushMetrics();
    }
    if (holding_) ObserveHold();
    if (idle_stop_seconds_ > 0 && !input.stop_requested && Now() - last_idle_check >= 1000) {
      last_idle_check = Now();
      StopIfIdle();
    }
    // Wait on the first running host: returns as soon as it exits, so job end is noticed at once.
    for (auto& host : hosts_) {
      if (!host->exited) {
        (void)deps().runtime->Wait(host->instance_id, std::chrono::milliseconds(250));
        break;
      }
    }
  }
  (void)record;
}

// While any host still runs the hold before start, the message stays "Waiting for remote
// connection"; once every host has exec()ed its program (released, or the hold passed), it becomes
// the usual Training message. Read from /proc each monitor pass (cheap: one small file per host).
void TrainingJobRun::ObserveHold() {
  for (const auto& host : hosts_) {
    if (host->exited) continue;
    auto access = deps().runtime->Access(host->instance_id);
    if (access.ok() && IsHoldingBeforeStart(access->host_pid)) return;
  }
  holding_ = false;
  const int64_t now = Now();
  (void)Update([&](store::TrainingJobRecord& rec) {
    if (rec.status == JobStatus::kInProgress && rec.secondary_status == SecondaryStatus::kTraining) {
      RecordSecondaryStatus(rec, SecondaryStatus::kTraining, kMsgTraining + allocation_note_, now);
    }
  });
}

// Idle stop (training_hold.h): the audit rows of the job's remote connections tell whether one is
// open and when the last ended. A stop is then requested as StopTrainingJob does (status
// Stopping, the user's reason, so the job ends Stopped), with a [kiln] line in every host's stream.
void TrainingJobRun::StopIfIdle() {
  if (deps().database == nullptr) return;
  auto connections = store::RemoteConnectionRepository(deps().database).List(job_arn_, 1000);
  if (!connections.ok()) return;
  const std::optional<int64_t> since = IdleSinceMillis(*connections, training_start_millis_);
  const int64_t now = Now();
  if (!since || now - *since < int64_t{idle_stop_seconds_} * 1000) return;
  const std::string why =
      "no remote connection for " + std::to_string(idle_stop_seconds_) + " s (" + kIdleStopTag + "); stopping the job";
  bool stopping = false;
  (void)Update([&](store::TrainingJobRecord& rec) {
    if (rec.status != JobStatus::kInProgress) return;
    SetStatus(rec, JobStatus::kStopping);
    rec.state.stop_requested = StopRequest::kUser;
    RecordSecondaryStatus(rec, SecondaryStatus::kStopping, "Stopping the training job: " + why, now);
    stopping = true;
  });
  if (!stopping) return;
  KLOG(info, "remote idle stop", {{"job", name_}, {"idle_seconds", std::to_string(idle_stop_seconds_)}});
  SayInLogs(why);
  stop_requested_.store(true);
}

void TrainingJobRun::SayInLogs(const std::string& line) {
  if (deps().log_store == nullptr) return;
  const int64_t now = Now();
  (void)deps().log_store->CreateGroup(kTrainingLogGroup);
  for (const auto& host : hosts_) {
    if (host->log_stream.empty()) continue;  // not launched
    (void)deps().log_store->CreateStream(kTrainingLogGroup, host->log_stream);
    (void)deps().log_store->Append(kTrainingLogGroup, host->log_stream, {{now, "[kiln] " + line}});
  }
}

// Managed spot (training-contract.md §9): the operator's schedule interrupts the n-th attempt
// after it trained interrupt_after_seconds[n]; the probability is a Poisson process over training
// time, drawn about once a second (a rate of λ per hour interrupts within dt with 1 - e^(-λ·dt)).
void TrainingJobRun::CheckSpotSources() {
  if (interrupt_requested_.load() || stop_requested_.load()) return;
  const SpotOptions& spot = options().spot;
  const int64_t now = Now();
  const int64_t trained = now - training_start_millis_;
  if (ScheduledInterruptionDue(spot.interrupt_after_seconds, interruptions_, trained)) {
    (void)InterruptSelf("spot capacity reclaimed on the operator's schedule (spot.interrupt_after_seconds: attempt " +
                        std::to_string(interruptions_ + 1) + " after " + std::to_string(trained / 1000) +
                        " s of training)");
    return;
  }
  if (spot.interrupt_probability_per_hour <= 0) return;
  if (last_spot_draw_millis_ == 0) {
    last_spot_draw_millis_ = now;
    spot_random_state_ = (spot.seed != 0 ? spot.seed : static_cast<uint64_t>(now)) ^
                         (std::hash<std::string>{}(name_) + 0x9e3779b97f4a7c15ULL * (interruptions_ + 1));
    if (spot_random_state_ == 0) spot_random_state_ = 1;
    return;
  }
  const int64_t elapsed = now - last_spot_draw_millis_;
  if (elapsed < 1000) return;
  last_spot_draw_millis_ = now;
  // xorshift64*: deterministic for a seed on every standard library.
  spot_random_state_ ^= spot_random_state_ >> 12;
  spot_random_state_ ^= spot_random_state_ << 25;
  spot_random_state_ ^= spot_random_state_ >> 27;
  const uint64_t bits = spot_random_state_ * 0x2545F4914F6CDD1DULL;
  const double uniform = static_cast<double>(bits >> 11) * 0x1.0p-53;
  const double p = 1.0 - std::exp(-spot.interrupt_probability_per_hour * static_cast<double>(elapsed) / 3.6e6);
  if (uniform < p) {
    (void)InterruptSelf("spot capacity reclaimed at random (spot.interrupt_probability_per_hour " +
                        nlohmann::json(spot.interrupt_probability_per_hour).dump() + ")");
  }
}

bool TrainingJobRun::InterruptSelf(const std::string& why) {
  bool recorded = false;
  (void)Update([&](store::TrainingJobRecord& rec) {
    if (rec.status != JobStatus::kInProgress || rec.state.interrupt_requested) return;
    rec.state.interrupt_requested = why;
    recorded = true;
  });
  if (!recorded) return false;
  RequestInterrupt();
  return true;
}

bool TrainingJobRun::FinishInterrupted(bool ran) {
  if (ran) StopPumps(/*drain=*/true);
  for (auto& host : hosts_) {
    if (host->feeder) host->feeder->Stop();
  }
  // What the script saved until it exited is what the next attempt restores.
  for (auto& host : hosts_) {
    if (!host->checkpoints) continue;
    Status s = ran ? host->checkpoints->Final() : Status::Ok();
    host->checkpoints.reset();
    if (!s.ok()) {
      KLOG(warn, "final checkpoint sync of an interrupted job failed", {{"job", name_}, {"error", s.ToString()}});
      SayInLogs("the final checkpoint sync failed: " + s.message() + "; the job resumes from the last synced files");
    }
  }
  for (auto& host : hosts_) {
    for (auto& sync : host->output_syncs) {
      Status s = ran ? sync->Final() : Status::Ok();
      if (!s.ok()) KLOG(warn, "output sync of an interrupted job failed", {{"job", name_}, {"error", s.ToString()}});
    }
    host->output_syncs.clear();
  }
  const int64_t now = Now();
  int64_t end_millis = now;
  if (ran) {
    // The attempt ran until its last host exited (as Finish bills a job), never past now.
    int64_t last_exit = 0;
    for (auto& host : hosts_) {
      auto status = deps().runtime->Inspect(host->instance_id);
      if (status.ok() && status->finished_millis > 0) last_exit = std::max<int64_t>(last_exit, status->finished_millis);
    }
    if (last_exit > 0) end_millis = std::min(end_millis, last_exit);
  }
  const int64_t delay = options().spot.restart_delay.count();
  bool interrupted = false;
  (void)Update([&](store::TrainingJobRecord& rec) {
    // A user's stop recorded meanwhile wins: the caller finishes the job as a stop.
    if (rec.status != JobStatus::kInProgress) return;
    rec.state.interruptions += 1;
    if (ran && training_start_millis_ > 0) {
      rec.state.billable_millis +=
          std::max<int64_t>(0, std::max(end_millis, training_start_millis_) - training_start_millis_);
    }
    rec.state.interrupt_requested.reset();
    rec.state.resume_after_millis = AddSaturating(now, delay);
    rec.state.hosts.clear();
    rec.state.allocations = json();
    SetPhase(rec, Phase::kQueued);
    RecordSecondaryStatus(rec, SecondaryStatus::kInterrupted, kMsgInterrupted, now);
    interrupted = true;
  });
  if (interrupted) {
    SayInLogs("interrupted; the job resumes from its checkpoints when capacity returns");
    KLOG(info, "training job interrupted", {{"job", name_}, {"ran", ran ? "true" : "false"}});
  }
  return interrupted;
}

void TrainingJobRun::Finish(bool ran) {
  if (stop_reason_ == StopReason::kInterruption && !stop_requested_.load()) {
    if (FinishInterrupted(ran)) {
      Cleanup();
      retrying_ = true;  // queued again (Run): it resumes when capacity returns
      return;
    }
    // The row says Stopping: a user's stop came while the hosts were being reclaimed.
    stop_requested_.store(true);
    stop_reason_ = StopReason::kUser;
  }
  if (ran) {
    // Wait for the pumps to read everything the instances wrote (the shims have exited).
    StopPumps(true);
  }
  for (auto& host : hosts_) {
    if (host->feeder) host->feeder->Stop();
  }
  if (ran) {
    SetSecondary(SecondaryStatus::kUploading, kMsgUploading);
    (void)Update([&](store::TrainingJobRecord& rec) { SetPhase(rec, Phase::kFinishing); });
  }
  JobFailure upload_error;
  for (auto& host : hosts_) {
    if (!host->checkpoints) continue;
    Status s = ran ? host->checkpoints->Final() : Status::Ok();
    host->checkpoints.reset();
    if (!s.ok()) upload_error = FailureFromStatus(Status::Internal(s.message()), "checkpoint upload failed: ");
  }
  for (auto& host : hosts_) {
    for (auto& sync : host->output_syncs) {
      Status s = ran ? sync->Final() : Status::Ok();
      if (!s.ok()) KLOG(warn, "final output sync failed", {{"job", name_}, {"error", s.ToString()}});
    }
    host->output_syncs.clear();
  }
  std::optional<std::string> model_artifacts, output_artifacts;
  if (ran) {
    std::vector<std::string> opt_ml_dirs;
    for (auto& host : hosts_) opt_ml_dirs.push_back(host->opt_ml);
    auto uploaded = agent::UploadJobArtifacts(*deps().object_store, opt_ml_dirs,
                                              request_.value("OutputDataConfig", json::object()), name_);
    if (uploaded.ok()) {
      model_artifacts = uploaded->model_artifacts;
      if (!uploaded->output_data.empty()) output_artifacts = uploaded->output_data;
      for (const auto& clash : uploaded->clashes) {
        KLOG(warn, "model file clash between hosts (lowest host kept)", {{"job", name_}, {"file", clash}});
      }
    } else if (!upload_error.failed()) {
      upload_error = FailureFromStatus(uploaded.status(), "uploading the model artifacts failed: ");
    }
  }

  const JobFailure failure = FailureReasonFromHosts();
  bool any_failed = false;
  for (auto& host : hosts_) any_failed |= host->exit_code != 0;
  if (stop_reason_ == StopReason::kNone || stop_reason_ == StopReason::kPeerFailure) {
    const JobFailure& why = any_failed ? failure : upload_error;
    if (why.failed() && RetryIfAllowed(why)) {
      Cleanup();
      return;
    }
  }
  int64_t now = Now();
  std::map<std::string, store::FinalMetric> final_metrics;
  {
    MutexLock lock(metrics_mutex_);
    final_metrics = final_metrics_;
  }
  int64_t end_millis = now;
  for (auto& host : hosts_) {
    auto status = deps().runtime->Inspect(host->instance_id);
    if (status.ok() && status->finished_millis > 0) end_millis = std::max<int64_t>(status->finished_millis, 0);
  }
  (void)Update([&](store::TrainingJobRecord& rec) {
    // The row's request (the API's or the MaxRuntime stop's) first, then what this run saw.
    const Outcome outcome = PlanOutcome({.row_request = rec.state.stop_requested,
                                         .run_reason = stop_reason_,
                                         .stop_requested = stop_requested_.load(),
                                         .any_failed = any_failed,
                                         .host_failure = failure.reason,
                                         .upload_error = upload_error.reason});
    SetPhase(rec, Phase::kDone);
    rec.state.final_metrics = final_metrics;
    rec.state.interrupt_requested.reset();  // one that came as the hosts ended on their own
    if (model_artifacts) rec.state.model_artifacts = model_artifacts;
    if (output_artifacts) rec.state.output_artifacts = output_artifacts;
    if (ran) {
      rec.training_end_millis = end_millis;
      rec.state.training_end_millis = end_millis;
      // BillableTimeInSeconds of a spot job: the running time of every attempt.
      if (training_start_millis_ > 0 && end_millis > training_start_millis_) {
        rec.state.billable_millis += end_millis - training_start_millis_;
      }
    }
    SetStatus(rec, outcome.status);
    EndWarmPool(rec, ran, now);
    if (outcome.failure_reason) rec.state.failure_reason = outcome.failure_reason;
    RecordSecondaryStatus(rec, outcome.secondary, outcome.message, now);
    if (!rec.state.transitions.empty()) rec.state.transitions.back().end_millis = now;
  });
  if (ran && hold_exit_seconds_ > 0 && stop_reason_ != StopReason::kUser && !shutting_down_.load()) {
    HoldAfterExit();
  }
  Cleanup();
}

// The hold after exit (training_hold.h): the job already has its terminal status; its hosts stay
// granted (the run has not finished) while a post-mortem instance per host runs over its /opt/ml,
// until the hold passes, it is released (the instance exits), or the server stops.
void TrainingJobRun::HoldAfterExit() {
  const std::vector<int> forwards = LoopbackForwards(options().endpoint_url);
  const std::string seconds = std::to_string(hold_exit_seconds_);
  auto say = [&](const Host& host, const std::string& line) {
    if (deps().log_store != nullptr && !host.log_stream.empty()) {
      // A program that printed nothing has no stream yet (the pump creates it with the first line).
      (void)deps().log_store->CreateGroup(kTrainingLogGroup);
      (void)deps().log_store->CreateStream(kTrainingLogGroup, host.log_stream);
      auto appended = deps().log_store->Append(kTrainingLogGroup, host.log_stream, {{Now(), "[kiln] " + line}});
      if (!appended.ok()) {
        KLOG(warn, "hold line not logged", {{"job", name_}, {"error", appended.status().ToString()}});
      }
    }
  };
  for (auto& host : hosts_) {
    if (!host->spec) continue;  // adopted from an earlier server: its launch spec is gone
    runtime::InstanceSpec spec = *host->spec;
    spec.instance_id = HeldInstanceId(host->instance_id);
    spec.argv = HoldAfterExitArgv(options().kiln_binary, hold_exit_seconds_);
    BindIfInTmp(options().kiln_binary, spec.extra_mounts);
    spec.network.reset();
    if (deps().networks != nullptr) {
      // A place of its own on the job's network (kept until Cleanup), isolated as the job was.
      auto attached = deps().networks->Attach(NetworkName(name_), spec.instance_id, forwards);
      if (!attached.ok()) {
        say(*host, "cannot hold " + host->host + " after exit: " + attached.status().message());
        continue;
      }
      spec.network = std::move(attached).value();
    }
    (void)deps().runtime->Remove(spec.instance_id);  // a leftover of a run that did not clean up
    if (Status launched = deps().runtime->Launch(spec); !launched.ok()) {
      say(*host, "cannot hold " + host->host + " after exit: " + launched.message());
      continue;
    }
    host->held_instance_id = spec.instance_id;
    say(*host, "the program exited; " + host->host + " is held for up to " + seconds +
                   " s: kiln connect training-job/" + name_ + "/" + host->host +
                   " (state Held); kiln release ends the hold");
    KLOG(info, "training host held after exit", {{"job", name_}, {"host", host->host}, {"seconds", seconds}});
  }
  while (!shutting_down_.load()) {
    Host* running = nullptr;
    for (auto& host : hosts_) {
      if (host->held_instance_id.empty()) continue;
      auto status = deps().runtime->Inspect(host->held_instance_id);
      if (status.ok() && status->state == runtime::InstanceState::kRunning) {
        running = host.get();
        break;
      }
    }
    if (running == nullptr) break;
    (void)deps().runtime->Wait(running->held_instance_id, std::chrono::milliseconds(500));
  }
  for (auto& host : hosts_) {
    if (host->held_instance_id.empty()) continue;
    // The server stopping ends the hold too: nothing adopts a post-mortem instance.
    (void)deps().runtime->Stop(host->held_instance_id, std::chrono::seconds(0));
    (void)deps().runtime->Wait(host->held_instance_id, std::chrono::seconds(5));
    (void)deps().runtime->Remove(host->held_instance_id);
    say(*host, "the hold of " + host->host + " after exit ended");
    host->held_instance_id.clear();
  }
}

void TrainingJobRun::Fail(const JobFailure& failure) {
  const std::string& why = failure.reason;
  if (RetryIfAllowed(failure)) {
    Cleanup();
    return;
  }
  int64_t now = Now();
  (void)Update([&](store::TrainingJobRecord& rec) {
    SetStatus(rec, JobStatus::kFailed);
    SetPhase(rec, Phase::kDone);
    EndWarmPool(rec, /*ran=*/false, now);
    rec.state.failure_reason = why;
    RecordSecondaryStatus(rec, SecondaryStatus::kFailed, why, now);
    rec.state.transitions.back().end_millis = now;
  });
  KLOG(info, "training job failed", {{"job", name_}, {"reason", why}});
  Cleanup();
}

void TrainingJobRun::EndWarmPool(store::TrainingJobRecord& rec, bool ran, int64_t now) {
  store::WarmPoolState& w = rec.state.warm_pool;
  const int64_t keep_alive = KeepAliveSeconds(rec.request);
  keep_pool_dir_.clear();
  if (!ran || keep_alive <= 0 || shutting_down_.load() || IsManagedSpot(rec.request)) {
    if (w.status == store::WarmPoolStatus::kInUse) {
      w.status = store::WarmPoolStatus::kTerminated;
      w.directory.clear();
    }
    return;
  }
  // A chain of reuses keeps the first pool's start (kMaxWarmPoolChainMillis).
  const int64_t chain =
      w.status == store::WarmPoolStatus::kInUse && w.chain_start_millis != 0 ? w.chain_start_millis : now;
  const int64_t expires = WarmPoolExpiry(now, keep_alive, chain);
  w = store::WarmPoolState{};
  w.chain_start_millis = chain;
  if (expires <= now) {
    w.status = store::WarmPoolStatus::kTerminated;  // handed on for as long as AWS allows
    return;
  }
  w.status = store::WarmPoolStatus::kAvailable;
  w.available_since_millis = now;
  w.expires_millis = expires;
  w.directory = options().work_dir + "/.warm-pools/" + name_;
  w.allocations = rec.state.allocations;
  keep_pool_dir_ = w.directory;
}

void TrainingJobRun::KeepHostDirectories() {
  std::error_code ec;
  fs::remove_all(keep_pool_dir_, ec);
  if (Status made = MakeDirs(keep_pool_dir_, 0700); !made.ok()) {
    KLOG(warn, "warm pool directory not made", {{"job", name_}, {"error", made.ToString()}});
    return;
  }
  for (auto& host : hosts_) {
    const std::string kept = keep_pool_dir_ + "/" + host->host;
    if (rename(host->root.c_str(), kept.c_str()) != 0) {
      KLOG(warn, "warm pool host not kept", {{"job", name_}, {"host", host->host}, {"errno", std::to_string(errno)}});
      continue;
    }
    // A pool keeps the staged inputs and the persistent cache; the rest of the volume is wiped.
    const fs::path opt_ml = fs::path(kept) / "opt_ml";
    const std::set<fs::path> keep = {opt_ml / "input" / "data", opt_ml / kWarmPoolCacheUnderOptMl,
                                     fs::path(kept) / kStagedInputs};
    std::vector<fs::path> doomed;
    for (auto it = fs::recursive_directory_iterator(kept, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      const fs::path& p = it->path();
      // No symlink the job left survives, kept subtrees included: the next job's Prepare and
      // staging move files out of here by path, and a link would make them reach elsewhere.
      if (it->is_symlink(ec)) {
        doomed.push_back(p);
        continue;
      }
      // What is kept (walked for links all the same), and a directory on the way to something
      // kept, stay; anything else goes.
      bool stays = false;
      for (const fs::path& k : keep) {
        auto [in_p, in_k] = std::mismatch(p.begin(), p.end(), k.begin(), k.end());
        stays |= in_k == k.end() || in_p == p.end();  // k contains p, or p leads to k
      }
      if (stays) continue;
      doomed.push_back(p);
      it.disable_recursion_pending();
    }
    for (const fs::path& p : doomed) fs::remove_all(p, ec);
    const std::string manifest = kept + "/" + kStagedInputs;
    if (fs::exists(manifest, ec)) (void)agent::RebaseStagedManifest(manifest, host->root, kept);
  }
}

void TrainingJobRun::Cleanup() {
  auto record = context_.jobs->Get(name_);
  if (record.ok() && record->state.credentials.is_object()) {
    deps().credentials->Revoke(record->state.credentials.value("access_key_id", ""));
  }
  for (auto& host : hosts_) {
    if (!host->instance_id.empty()) (void)deps().runtime->Remove(host->instance_id);
  }
  // The job's network (also an adopted job's, and before a retry, which makes a fresh one).
  if (deps().networks != nullptr) {
    if (Status removed = deps().networks->Remove(NetworkName(name_)); !removed.ok()) {
      KLOG(warn, "job network not removed", {{"job", name_}, {"error", removed.ToString()}});
    }
  }
  if (!keep_pool_dir_.empty()) KeepHostDirectories();
  // A pool this job took and did not get to stage from (it failed or was stopped first).
  if (!taken_pool_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(taken_pool_dir_, ec);
  }
  if (!options().keep_host_dirs && !job_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(job_dir_, ec);
  }
}

}  // namespace kiln::control
