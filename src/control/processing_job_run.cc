#include "control/processing_job_run.h"

#include <algorithm>
#include <filesystem>

#include "agent/artifacts.h"
#include "agent/checkpoints.h"
#include "agent/errors.h"
#include "agent/pipe_feeder.h"
#include "agent/processing_inputs.h"
#include "agent/processing_layout.h"
#include "agent/training_layout.h"
#include "base/fs.h"
#include "base/log.h"
#include "control/instance_placement.h"
#include "control/log_pump.h"
#include "control/processing_launch.h"
#include "control/training_launch.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::ProcessingJobRecord;
using store::ProcessingJobStatus;
using training::FailureKind;
using training::JobFailure;
namespace fs = std::filesystem;

// The job's network (DESIGN.md §6): one per job, named after it.
std::string NetworkName(const std::string& job) { return "processing-" + job; }

bool NetworkIsolation(const json& request) {
  const json config = request.value("NetworkConfig", json::object());
  return config.is_object() && config.contains("EnableNetworkIsolation") &&
         config["EnableNetworkIsolation"].is_boolean() && config["EnableNetworkIsolation"].get<bool>();
}

// The same advice as a training job's network failure (training_job_run.cc).
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

const json& Array(const json& holder, const char* member) {
  static const json kEmpty = json::array();
  if (!holder.is_object() || !holder.contains(member) || !holder[member].is_array()) return kEmpty;
  return holder[member];
}

const json& Inputs(const json& request) { return Array(request, "ProcessingInputs"); }
const json& Outputs(const json& request) {
  static const json kEmpty = json::object();
  return Array(request.contains("ProcessingOutputConfig") ? request["ProcessingOutputConfig"] : kEmpty, "Outputs");
}

// An input's S3Input when Kiln fills its LocalPath (AppManaged inputs are the program's own).
const json* StagedS3Input(const json& input) {
  if (!input.is_object() || !input.contains("S3Input") || !input["S3Input"].is_object()) return nullptr;
  if (input.value("AppManaged", false) == true) return nullptr;
  const json& s3 = input["S3Input"];
  if (!s3.contains("LocalPath") || !s3["LocalPath"].is_string()) return nullptr;
  return &s3;
}

// training_plan.h's FailureReason speaks of "the training program"; here it is a processing one.
std::string ForProcessing(std::string reason) {
  static constexpr std::string_view kTraining = "the training program";
  for (size_t at = reason.find(kTraining); at != std::string::npos; at = reason.find(kTraining, at)) {
    reason.replace(at, kTraining.size(), "the processing program");
  }
  return reason;
}

}  // namespace

struct ProcessingJobRun::Host {
  std::string host;     // algo-<n>
  int shard_index = 0;  // position in the sorted hosts list (ShardedByS3Key)
  std::string instance_id;
  std::string root;    // <work_dir>/<job>/algo-<n>
  std::string opt_ml;  // root/opt_ml
  std::string log_stream;
  bool exited = false;
  int exit_code = -1;
  int term_signal = 0;
  bool oom_killed = false;
  bool stopped_by_kiln = false;
  std::string lost_reason;
  std::unique_ptr<LogPump> pump;
  std::vector<std::unique_ptr<agent::PipeFeeder>> feeders;         // one per Pipe input
  std::vector<std::unique_ptr<agent::CheckpointSync>> continuous;  // Continuous outputs
};

ProcessingJobRun::ProcessingJobRun(Context context, std::string name, std::vector<Allocation> allocations, bool adopt)
    : context_(std::move(context)), name_(std::move(name)), allocations_(std::move(allocations)), adopt_(adopt) {}

ProcessingJobRun::~ProcessingJobRun() = default;

void ProcessingJobRun::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ProcessingJobRun::RequestStop() {
  stop_requested_.store(true);
  cancel_.Cancel();
}

void ProcessingJobRun::Shutdown() {
  shutting_down_.store(true);
  cancel_.Cancel();
}

void ProcessingJobRun::Join() {
  if (thread_.joinable()) thread_.join();
}

int64_t ProcessingJobRun::Now() const { return deps().clock ? deps().clock->NowMillis() : Clock::System().NowMillis(); }

void ProcessingJobRun::Run() {
  RunSteps();
  context_.on_finished(name_);
}

void ProcessingJobRun::RunSteps() {
  auto loaded = context_.jobs->Get(name_);
  if (!loaded.ok()) {
    KLOG(error, "processing job vanished before it ran", {{"job", name_}, {"error", loaded.status().ToString()}});
    return;
  }
  const ProcessingJobRecord record = std::move(loaded).value();
  // Stopped while its grant was on the way (RequestStop found no run yet): nothing to do.
  if (!store::IsActive(record.status)) return;
  request_ = record.request;
  arn_ = record.arn;
  job_dir_ = options().work_dir + "/" + record.name;
  if (record.status == ProcessingJobStatus::kStopping) stop_requested_.store(true);

  if (adopt_) {
    Adopt(record);
    Monitor();
  } else {
    if (!RecordGrant()) return;
    Status prepared = Prepare(record);
    if (prepared.ok() && !stop_requested_.load() && !shutting_down_.load()) prepared = Stage();
    if (shutting_down_.load()) {
      // The next server stages the job again from the start.
      StopAgents();
      return;
    }
    const bool stopped_while_staging = prepared.code() == StatusCode::kAborted && stop_requested_.load();
    if (!prepared.ok() && !stopped_while_staging) {
      StopAgents();
      Fail(training::FailureFromStatus(prepared));
      return;
    }
    if (stop_requested_.load()) {
      StopAgents();
      Finish(/*ran=*/false);
      return;
    }
    if (Status launched = Launch(record); !launched.ok()) {
      StopAgents();
      Fail(training::FailureFromStatus(launched));
      return;
    }
    Monitor();
  }
  if (shutting_down_.load()) {
    // Instances keep running; the next server adopts them and resumes the pumps and feeders.
    StopPumps(/*drain=*/false);
    StopAgents();
    return;
  }
  Finish(/*ran=*/true);
}

bool ProcessingJobRun::RecordGrant() {
  json allocations = json::array();
  for (const auto& a : allocations_) allocations.push_back(a);
  bool active = false;
  const int64_t now = Now();
  auto r = context_.jobs->Mutate(name_, [&](ProcessingJobRecord& rec) {
    active = store::IsActive(rec.status);
    if (!active) return Status::Ok();
    rec.state.allocation_ids = {ProcessingGrantId(name_)};
    rec.state.extra["allocations"] = allocations;
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  if (!r.ok()) {
    Fail(training::FailureFromStatus(r.status(), "recording the job's capacity failed: "));
    return false;
  }
  return active;
}

Status ProcessingJobRun::Prepare(const ProcessingJobRecord& record) {
  if (deps().networks != nullptr) {
    // A previous server's network goes first: its leases belong to instances that are gone, and
    // a fresh network gives algo-1..N the first addresses in order.
    const std::string network = NetworkName(record.name);
    if (Status removed = deps().networks->Remove(network); !removed.ok()) {
      KLOG(warn, "stale processing network not removed", {{"job", name_}, {"error", removed.ToString()}});
    }
    if (auto ensured = deps().networks->Ensure(network, NetworkIsolation(request_)); !ensured.ok()) {
      return NetworkFailure("the job's network " + network + " could not be created", ensured.status());
    }
  }
  std::error_code ec;
  fs::remove_all(job_dir_, ec);
  const json cluster = request_.value("ProcessingResources", json::object()).value("ClusterConfig", json::object());
  const int count = std::max(1, cluster.value("InstanceCount", 1));
  std::vector<std::string> names;
  for (int i = 1; i <= count; ++i) names.push_back("algo-" + std::to_string(i));
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  for (const std::string& name : names) {
    auto host = std::make_unique<Host>();
    host->host = name;
    host->shard_index = static_cast<int>(std::find(sorted.begin(), sorted.end(), name) - sorted.begin());
    host->root = job_dir_ + "/" + name;
    host->opt_ml = host->root + "/opt_ml";
    host->instance_id = "processing-" + record.name + "-" + name;
    // A previous server (one that died while launching) may have left an instance behind.
    if (deps().runtime->Inspect(host->instance_id).ok()) {
      (void)deps().runtime->Stop(host->instance_id, std::chrono::seconds(0));
      (void)deps().runtime->Wait(host->instance_id, std::chrono::seconds(5));
      (void)deps().runtime->Remove(host->instance_id);
    }
    if (Status made = MakeDirs(host->root, 0755); !made.ok()) {
      return agent::InternalServerError("cannot create the host directory: " + made.message(), made.code());
    }
    RETURN_IF_ERROR(agent::WriteProcessingLayout(host->opt_ml, request_, record.arn, name, names));
    hosts_.push_back(std::move(host));
  }
  return Status::Ok();
}

Status ProcessingJobRun::Stage() {
  // The image first: one Kiln cannot run fails the job before its inputs are downloaded.
  const std::string image = request_.value("AppSpecification", json::object()).value("ImageUri", "");
  auto resolved = deps().environments->Resolve(image);
  if (!resolved.ok()) return agent::ClientError(resolved.status().message());
  image_ = *resolved;
  if (resolved->kind == runtime::ImageResolution::Kind::kScriptMode) {
    // The SDK's FrameworkProcessor runs `python <script>` from its runproc.sh: the names the
    // framework image would have on PATH (processing_launch.h).
    for (auto& host : hosts_) {
      if (Status shims = agent::WriteInterpreterShims(host->opt_ml, resolved->interpreter); !shims.ok()) {
        return agent::InternalServerError("cannot prepare the interpreter commands: " + shims.message(), shims.code());
      }
    }
  }
  if (resolved->kind == runtime::ImageResolution::Kind::kContainerImage) {
    const Status prepared = deps().runtime->PrepareImage(
        runtime::ContainerImage{.requested = resolved->image, .reference = "", .entrypoint = std::nullopt},
        [](const std::string&) {}, [this] { return cancel_.cancelled(); });
    RETURN_IF_ERROR(training::ImagePreparationError(prepared));
  }
  const std::string role_arn = request_.value("RoleArn", "");
  const int host_count = static_cast<int>(hosts_.size());
  agent::StageOptions stage_options;
  stage_options.parallelism = options().staging_parallelism;
  for (auto& host : hosts_) {
    for (const json& input : Inputs(request_)) {
      const json* s3 = StagedS3Input(input);
      if (s3 == nullptr || s3->value("S3InputMode", "File") != "File") continue;
      ASSIGN_OR_RETURN(std::string local_dir,
                       agent::SandboxPathToHost(host->opt_ml, (*s3)["LocalPath"].get<std::string>()));
      ASSIGN_OR_RETURN(agent::InputStagingReport report,
                       agent::StageProcessingInput(*deps().object_store, input, role_arn, host->shard_index, host_count,
                                                   local_dir, cancel_, stage_options));
      KLOG(info, "staged processing input",
           {{"job", name_},
            {"host", host->host},
            {"input", input.value("InputName", "")},
            {"objects", std::to_string(report.objects)},
            {"bytes", std::to_string(report.bytes)}});
    }
    RETURN_IF_ERROR(StartFeeder(*host, /*resume=*/false));
    ASSIGN_OR_RETURN(host->continuous, MakeOutputSyncs(*host, "Continuous"));
  }
  return Status::Ok();
}

// Pipe inputs: PipeFeeder makes its FIFOs at <opt_ml>/input/data/<channel>_<epoch>. A feeder of
// its own per input is given the directory <root>/pipe/<i> (outside the sandbox; its progress
// records live there too), whose input/data is a symlink to the host directory holding LocalPath,
// and the channel is named after LocalPath's last component: the FIFOs are then
// <LocalPath>_<epoch> (§17), and the feeder is used unchanged.
Status ProcessingJobRun::StartFeeder(Host& host, bool resume) {
  const json& inputs = Inputs(request_);
  const std::string role_arn = request_.value("RoleArn", "");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const json* s3 = StagedS3Input(inputs[i]);
    if (s3 == nullptr || s3->value("S3InputMode", "File") != "Pipe") continue;
    ASSIGN_OR_RETURN(std::string local, agent::SandboxPathToHost(host.opt_ml, (*s3)["LocalPath"].get<std::string>()));
    const fs::path local_path(local);
    const std::string feeder_root = host.root + "/pipe/" + std::to_string(i);
    const std::string link = feeder_root + "/input/data";
    if (!resume) {
      RETURN_IF_ERROR(MakeDirs(feeder_root + "/input"));
      RETURN_IF_ERROR(MakeDirs(local_path.parent_path().string()));
      std::error_code ec;
      fs::remove(link, ec);
      fs::create_directory_symlink(local_path.parent_path(), link, ec);
      if (ec) return agent::InternalServerError("cannot prepare the Pipe input " + link + ": " + ec.message());
    }
    const json feeder_request = {
        {"RoleArn", role_arn},
        {"InputDataConfig", json::array({agent::ProcessingInputChannel(inputs[i], local_path.filename().string())})}};
    agent::PipeFeeder::Options feeder_options;
    feeder_options.resume = resume;
    const std::string job = name_;
    const std::string input_name = inputs[i].value("InputName", "");
    feeder_options.on_error = [job, input_name](const std::string&, const Status& error) {
      KLOG(warn, "processing pipe input failed", {{"job", job}, {"input", input_name}, {"error", error.ToString()}});
    };
    auto feeder = std::make_unique<agent::PipeFeeder>(*deps().object_store, feeder_request, host.shard_index,
                                                      static_cast<int>(hosts_.size()), feeder_root, feeder_options);
    RETURN_IF_ERROR(feeder->Start());
    host.feeders.push_back(std::move(feeder));
  }
  return Status::Ok();
}

// One sync per output of `mode` (S3UploadMode) with an S3Output: LocalPath's files, individually,
// to S3Uri/<relative path>; symlinks are not followed (agent/checkpoints.h). Every host writes
// into the same prefix (§17).
Result<std::vector<std::unique_ptr<agent::CheckpointSync>>> ProcessingJobRun::MakeOutputSyncs(const Host& host,
                                                                                              const std::string& mode) {
  std::vector<std::unique_ptr<agent::CheckpointSync>> syncs;
  for (const json& output : Outputs(request_)) {
    if (!output.is_object() || !output.contains("S3Output") || !output["S3Output"].is_object()) continue;
    const json& s3 = output["S3Output"];
    if (s3.value("S3UploadMode", "EndOfJob") != mode) continue;
    if (!s3.contains("LocalPath") || !s3["LocalPath"].is_string()) continue;
    ASSIGN_OR_RETURN(std::string local_dir, agent::SandboxPathToHost(host.opt_ml, s3["LocalPath"].get<std::string>()));
    agent::CheckpointSync::Options sync_options;
    sync_options.scan_interval = options().continuous_scan_interval;
    sync_options.quiet_period = options().continuous_quiet_period;
    const std::string job = name_;
    const std::string output_name = output.value("OutputName", "");
    sync_options.on_error = [job, output_name](const Status& error) {
      KLOG(warn, "processing output upload failed",
           {{"job", job}, {"output", output_name}, {"error", error.ToString()}});
    };
    ASSIGN_OR_RETURN(
        auto sync, agent::CheckpointSync::Create(*deps().object_store, s3.value("S3Uri", ""), local_dir, sync_options));
    syncs.push_back(std::move(sync));
  }
  return syncs;
}

Status ProcessingJobRun::Launch(const ProcessingJobRecord& record) {
  if (!image_) return agent::InternalServerError("the image was not resolved before launch");
  aws::Credential credential = record.state.extra.contains("credentials")
                                   ? CredentialFromJson(record.state.extra["credentials"])
                                   : deps().credentials->Issue(request_.value("RoleArn", ""), record.name);
  deps().credentials->Register(credential);
  ASSIGN_OR_RETURN(ProcessingLaunchPlan plan,
                   PlanProcessingLaunch(
                       request_, *image_,
                       {.region = options().region, .endpoint_url = options().endpoint_url, .credential = credential}));

  // Namespaced hosts: an address each on the job's network (algo-1, algo-2, ... in order) and
  // /etc/hosts naming them all; otherwise they share the node's network (every name 127.0.0.1).
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
    std::vector<std::string> names;
    for (const auto& h : hosts_) names.push_back(h->host);
    hosts_lines = HostsFileLines(names);
  }

  const int64_t previous_epoch = record.state.extra.value("last_stream_epoch", int64_t{0});
  int64_t last_stream_epoch = previous_epoch;
  std::vector<store::ProcessingHostState> hosts_state;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    Host& host = *hosts_[i];
    runtime::InstanceSpec spec;
    spec.instance_id = host.instance_id;
    spec.opt_ml_dir = host.opt_ml;
    spec.extra_mounts = plan.binds;
    spec.hostname = host.host;
    spec.hosts_file_lines = hosts_lines;
    spec.argv = plan.argv;
    spec.env = plan.env;
    if (!allocations_.empty()) {
      const Allocation& allocation = allocations_.at(std::min(i, allocations_.size() - 1));
      AddGpuEnvironment(allocation, spec.env);
      spec.cpus = allocation.cpus;
      spec.memory_limit_bytes = allocation.memory_bytes;
      spec.gpus = allocation.gpus;
      spec.shape_vcpus = static_cast<int>(allocation.cpus.size());
      spec.shape_memory_bytes = allocation.memory_bytes;
      spec.shape_gpus = static_cast<int>(allocation.gpus.size());
    }
    // One allocation for all hosts where the backend allocates (Slurm: one job of N nodes).
    spec.group = record.name;
    spec.group_size = static_cast<int>(hosts_.size());
    spec.group_index = static_cast<int>(i);
    spec.instance_type = request_.value("ProcessingResources", json::object())
                             .value("ClusterConfig", json::object())
                             .value("InstanceType", "");
    spec.time_limit_seconds = InstanceTimeLimitSeconds(request_, options().stop_grace);
    spec.working_dir = plan.working_dir;
    spec.network = attachments[i];
    spec.container = plan.container;
    // The start time is taken before the launch: from the moment the program runs, the clock may
    // move on, and MaxRuntimeInSeconds must not count from a later time than the program's start.
    const int64_t started = Now();
    Status launched = deps().runtime->Launch(spec);
    if (!launched.ok()) {
      // Nothing of this job may keep running.
      for (size_t j = 0; j < i; ++j) (void)deps().runtime->Stop(hosts_[j]->instance_id, std::chrono::seconds(0));
      const std::string what =
          "the processing program could not be started on " + host.host + ": " + launched.message();
      if (launched.code() == StatusCode::kUnavailable) return agent::InternalServerError(what);
      return agent::ClientError(what +
                                ". Check AppSpecification.ImageUri (and ContainerEntrypoint, "
                                "ContainerArguments).");
    }
    if (i == 0) start_millis_ = started;
    // A job started again (a restart before it launched) gets new streams even within a second.
    const int64_t epoch = std::max<int64_t>(started / 1000, previous_epoch + 1);
    last_stream_epoch = std::max(last_stream_epoch, epoch);
    host.log_stream = record.name + "/" + host.host + "-" + std::to_string(epoch);
    store::ProcessingHostState state;
    state.runtime_id = host.instance_id;
    state.log_stream = host.log_stream;
    hosts_state.push_back(std::move(state));
  }
  const json credential_state = CredentialToJson(credential);
  const int64_t now = Now();
  auto written = context_.jobs->Mutate(name_, [&](ProcessingJobRecord& rec) {
    rec.state.hosts = hosts_state;
    rec.state.start_millis = start_millis_;
    rec.state.extra["credentials"] = credential_state;
    rec.state.extra["last_stream_epoch"] = last_stream_epoch;
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  if (!written.ok()) {
    for (auto& host : hosts_) (void)deps().runtime->Stop(host->instance_id, std::chrono::seconds(0));
    return written.status();
  }
  for (auto& host : hosts_) {
    StartPump(*host, 0);
    for (auto& sync : host->continuous) sync->Start();
  }
  KLOG(info, "processing job launched", {{"job", name_}, {"hosts", std::to_string(hosts_.size())}});
  return Status::Ok();
}

void ProcessingJobRun::Adopt(const ProcessingJobRecord& record) {
  start_millis_ = record.state.start_millis.value_or(Now());
  if (record.state.extra.contains("credentials")) {
    deps().credentials->Register(CredentialFromJson(record.state.extra["credentials"]));
  }
  job_dir_ = options().work_dir + "/" + record.name;
  const int count = static_cast<int>(record.state.hosts.size());
  std::vector<std::string> sorted;
  for (int i = 1; i <= count; ++i) sorted.push_back("algo-" + std::to_string(i));
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < count; ++i) {
    const store::ProcessingHostState& h = record.state.hosts[i];
    auto host = std::make_unique<Host>();
    host->host = "algo-" + std::to_string(i + 1);
    host->shard_index = static_cast<int>(std::find(sorted.begin(), sorted.end(), host->host) - sorted.begin());
    host->instance_id = h.runtime_id;
    host->root = job_dir_ + "/" + host->host;
    host->opt_ml = host->root + "/opt_ml";
    host->log_stream = h.log_stream;
    hosts_.push_back(std::move(host));
  }
  for (auto& host : hosts_) {
    auto status = host->instance_id.empty() ? Result<runtime::InstanceStatus>(Status::NotFound("never launched"))
                                            : deps().runtime->Inspect(host->instance_id);
    if (!status.ok()) {
      // Gone with the old server (the node rebooted, or someone removed it): a lost host.
      host->exited = true;
      host->exit_code = -1;
      host->lost_reason = "Kiln restarted while the job ran and its instance is gone";
      continue;
    }
    const bool running = status->state == runtime::InstanceState::kRunning;
    StartPump(*host, LogPump::ReadOffset(host->root + "/log.offset"));
    if (!running) continue;  // Monitor records the exit; Finish uploads
    if (Status fed = StartFeeder(*host, /*resume=*/true); !fed.ok()) {
      KLOG(warn, "processing pipe inputs not resumed", {{"job", name_}, {"error", fed.ToString()}});
    }
    if (auto syncs = MakeOutputSyncs(*host, "Continuous"); syncs.ok()) {
      host->continuous = std::move(syncs).value();
      for (auto& sync : host->continuous) sync->Start();
    }
  }
  KLOG(info, "adopted processing job", {{"job", name_}, {"hosts", std::to_string(hosts_.size())}});
}

void ProcessingJobRun::ObserveHosts() {
  for (auto& host : hosts_) {
    if (host->exited) continue;
    auto status = deps().runtime->Inspect(host->instance_id);
    if (status.ok() && status->state == runtime::InstanceState::kRunning) continue;
    host->exited = true;
    if (status.ok() && status->state == runtime::InstanceState::kExited) {
      host->exit_code = status->exit_code;
      host->term_signal = status->term_signal;
      host->oom_killed = status->oom_killed;
      host->stopped_by_kiln = status->stop_requested;
    } else {
      host->exit_code = -1;  // lost: the supervisor (or container) vanished without an exit
      if (status.ok()) host->lost_reason = status->lost_reason;
    }
  }
}

void ProcessingJobRun::StopHosts() {
  for (auto& host : hosts_) {
    if (!host->exited) (void)deps().runtime->Stop(host->instance_id, options().stop_grace);
  }
}

// Until every host has exited or the server shuts down: a stop (the API's, or MaxRuntimeInSeconds)
// or a failed host stops the hosts still running, once.
void ProcessingJobRun::Monitor() {
  const int64_t deadline = training::AddSaturating(
      start_millis_, training::SecondsToMillisSaturating(training::MaxRuntimeSeconds(request_)));
  bool stop_sent = false;
  while (!shutting_down_.load()) {
    ObserveHosts();
    bool all_exited = true;
    bool any_failed = false;
    for (const auto& host : hosts_) {
      all_exited &= host->exited;
      any_failed |= host->exited && host->exit_code != 0;
    }
    if (all_exited) break;
    if (!stop_sent && !stop_requested_.load() && Now() >= deadline) {
      // Recorded before the hosts are stopped: a restart meanwhile still ends the job Stopped.
      const int64_t now = Now();
      bool recorded = false;
      (void)context_.jobs->Mutate(name_, [&](ProcessingJobRecord& rec) {
        if (rec.status != ProcessingJobStatus::kInProgress) return Status::Ok();
        rec.status = ProcessingJobStatus::kStopping;
        rec.state.stop_reason = std::string(store::kProcessingMaxRuntimeExceeded);
        rec.last_modified_millis = now;
        recorded = true;
        return Status::Ok();
      });
      if (recorded) KLOG(info, "processing job reached MaxRuntimeInSeconds", {{"job", name_}});
      stop_requested_.store(true);
    }
    if (!stop_sent && (stop_requested_.load() || any_failed)) {
      StopHosts();
      stop_sent = true;
    }
    // Wait on the first running host: returns as soon as it exits.
    for (auto& host : hosts_) {
      if (!host->exited) {
        (void)deps().runtime->Wait(host->instance_id, std::chrono::milliseconds(250));
        break;
      }
    }
  }
}

void ProcessingJobRun::StartPump(Host& host, int64_t offset) {
  LogPump::Options pump;
  pump.output_path = deps().runtime->OutputPath(host.instance_id);
  pump.offset_path = host.root + "/log.offset";
  pump.start_offset = offset;
  pump.group = kProcessingLogGroup;
  pump.stream = host.log_stream;
  host.pump = std::make_unique<LogPump>(std::move(pump), deps().log_store);
  host.pump->Start();
  if (deps().instance_metrics != nullptr) {
    (void)deps().instance_metrics->Track({.instance_id = host.instance_id,
                                          .ns = kProcessingLogGroup,
                                          .dimension_sets = {{{"Host", name_ + "/" + host.host}}},
                                          .opt_ml_dir = host.opt_ml});
  }
}

void ProcessingJobRun::StopPumps(bool drain) {
  for (auto& host : hosts_) {
    if (deps().instance_metrics != nullptr) deps().instance_metrics->Untrack(host->instance_id);
    if (host->pump) host->pump->Stop(drain);
  }
}

void ProcessingJobRun::StopAgents() {
  for (auto& host : hosts_) {
    for (auto& feeder : host->feeders) feeder->Stop();
    host->feeders.clear();
    host->continuous.clear();  // stops the background syncs (no final pass)
  }
}

Status ProcessingJobRun::UploadOutputs() {
  Status first;
  for (auto& host : hosts_) {
    std::vector<std::unique_ptr<agent::CheckpointSync>> syncs = std::move(host->continuous);
    host->continuous.clear();
    auto end_of_job = MakeOutputSyncs(*host, "EndOfJob");
    if (!end_of_job.ok()) {
      if (first.ok()) first = end_of_job.status();
    } else {
      for (auto& sync : *end_of_job) syncs.push_back(std::move(sync));
    }
    // Final(): stops a Continuous sync's background scans, then one full pass without a quiet
    // period (everything written until the exit); for EndOfJob it is the only pass.
    for (auto& sync : syncs) {
      Status s = sync->Final();
      if (!s.ok() && first.ok()) first = s;
    }
  }
  return first;
}

void ProcessingJobRun::Finish(bool ran) {
  if (ran) StopPumps(/*drain=*/true);  // the instances have exited: read all they wrote
  for (auto& host : hosts_) {
    for (auto& feeder : host->feeders) feeder->Stop();
    host->feeders.clear();
  }
  JobFailure output_failure;
  std::string exit_message;
  if (ran) {
    // EndOfJob outputs are uploaded whatever the outcome (§17), Continuous ones get their last pass.
    if (Status uploaded = UploadOutputs(); !uploaded.ok()) {
      output_failure = training::FailureFromStatus(uploaded, "uploading the outputs failed: ");
    }
    std::vector<std::string> opt_mls, names;
    for (const auto& host : hosts_) {
      opt_mls.push_back(host->opt_ml);
      names.push_back(host->host);
    }
    auto message = agent::ReadExitMessage(opt_mls, names);
    if (message.ok()) {
      exit_message = *message;
    } else if (!output_failure.failed()) {
      output_failure = training::FailureFromStatus(message.status());
    }
  }
  std::vector<training::HostExit> exits;
  bool any_failed = false;
  for (const auto& host : hosts_) {
    any_failed |= host->exit_code != 0;
    exits.push_back({.host = host->host,
                     .exit_code = host->exit_code,
                     .term_signal = host->term_signal,
                     .oom_killed = host->oom_killed,
                     .lost_reason = host->lost_reason,
                     .stopped_by_kiln = host->stopped_by_kiln,
                     .failure_file = host->exit_code != 0 ? agent::ReadFailureReason(host->opt_ml) : "",
                     .last_stderr_line = host->exit_code != 0 && host->pump ? host->pump->last_stderr_line() : ""});
  }
  const JobFailure host_failure = training::FailureReason(exits);
  const int64_t now = Now();
  auto r = context_.jobs->Mutate(name_, [&](ProcessingJobRecord& rec) {
    if (!store::IsActive(rec.status)) return Status::Ok();
    // A stop recorded in the row (the API's, or this run's MaxRuntime) wins over how hosts ended:
    // a SIGTERMed program's non-zero exit is the stop's doing.
    const bool stopped = rec.status == ProcessingJobStatus::kStopping || stop_requested_.load();
    if (stopped) {
      rec.status = ProcessingJobStatus::kStopped;
      if (rec.state.stop_reason.empty()) rec.state.stop_reason = std::string(store::kProcessingStopRequested);
    } else if (any_failed && host_failure.failed()) {
      rec.status = ProcessingJobStatus::kFailed;
      rec.state.failure_reason = ForProcessing(host_failure.reason);
    } else if (output_failure.failed()) {
      rec.status = ProcessingJobStatus::kFailed;
      rec.state.failure_reason = output_failure.reason;
    } else {
      rec.status = ProcessingJobStatus::kCompleted;
    }
    rec.state.exit_message = exit_message;
    for (size_t i = 0; i < hosts_.size() && i < rec.state.hosts.size(); ++i) {
      if (hosts_[i]->exited) rec.state.hosts[i].exit_code = hosts_[i]->exit_code;
      rec.state.hosts[i].oom_killed = hosts_[i]->oom_killed;
      if (hosts_[i]->pump == nullptr) continue;
      rec.state.hosts[i].log_offset = LogPump::ReadOffset(hosts_[i]->root + "/log.offset");
    }
    if (!rec.state.start_millis && ran) rec.state.start_millis = start_millis_;
    rec.end_millis = now;
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  if (!r.ok()) {
    KLOG(error, "processing job's end not recorded", {{"job", name_}, {"error", r.status().ToString()}});
  } else {
    KLOG(info, "processing job ended",
         {{"job", name_},
          {"status", std::string(store::ProcessingJobStatusName(r->status))},
          {"reason", r->state.failure_reason}});
  }
  Cleanup();
}

void ProcessingJobRun::Fail(const JobFailure& failure) {
  const int64_t now = Now();
  auto r = context_.jobs->Mutate(name_, [&](ProcessingJobRecord& rec) {
    if (!store::IsActive(rec.status)) return Status::Ok();
    rec.status = ProcessingJobStatus::kFailed;
    rec.state.failure_reason = failure.reason;
    rec.end_millis = now;
    rec.last_modified_millis = now;
    return Status::Ok();
  });
  if (!r.ok()) KLOG(error, "processing job's failure not recorded", {{"job", name_}, {"error", r.status().ToString()}});
  KLOG(info, "processing job failed", {{"job", name_}, {"reason", failure.reason}});
  Cleanup();
}

void ProcessingJobRun::Cleanup() {
  auto record = context_.jobs->Get(name_);
  if (record.ok() && record->state.extra.contains("credentials")) {
    deps().credentials->Revoke(record->state.extra["credentials"].value("access_key_id", ""));
  }
  for (auto& host : hosts_) {
    if (host->instance_id.empty()) continue;
    // A host stopped after a failed launch of another may still be on its way out.
    if (!host->exited) (void)deps().runtime->Wait(host->instance_id, std::chrono::seconds(5));
    (void)deps().runtime->Remove(host->instance_id);
  }
  if (deps().networks != nullptr) {
    if (Status removed = deps().networks->Remove(NetworkName(name_)); !removed.ok()) {
      KLOG(warn, "processing network not removed", {{"job", name_}, {"error", removed.ToString()}});
    }
  }
  if (!options().keep_host_dirs && !job_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(job_dir_, ec);
  }
}

}  // namespace kiln::control
