// TrainingJobRun's work on its hosts: observing their exits, stopping them, their log pumps and
// metrics, the agents (Pipe feeders, checkpoint and output syncs), and the FailureReason inputs.
// The run's lifecycle (prepare, stage, launch, monitor, finish) is in training_job_run.cc.

#include <signal.h>

#include "agent/artifacts.h"
#include "agent/training_layout.h"
#include "agent/transfer.h"
#include "base/fs.h"
#include "base/log.h"
#include "control/training_job_run.h"
#include "control/training_job_run_host.h"
#include "control/training_plan.h"
#include "control/training_states.h"
#include "observe/metric_extractor.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::SecondaryStatus;
using store::StopRequest;
using JobStatus = store::TrainingJobStatus;
using namespace training;  // messages

constexpr char kMetricNamespace[] = "/aws/sagemaker/TrainingJobs";

}  // namespace

void TrainingJobRun::ObserveHosts() {
  std::string waiting;
  for (auto& host : hosts_) {
    if (host->exited) continue;
    auto status = deps().runtime->Inspect(host->instance_id);
    if (status.ok() && status->state == runtime::InstanceState::kRunning) {
      // Not started yet because the backend waits (Slurm's queue): the first host's reason.
      if (waiting.empty() && !status->waiting_reason.empty()) {
        waiting = hosts_.size() > 1 ? host->host + ": " + status->waiting_reason : status->waiting_reason;
      }
      continue;
    }
    host->exited = true;
    if (status.ok() && status->preempted) {
      // The cluster took the instance back: a managed spot job is interrupted (it resumes from its
      // checkpoints); any other job fails saying so.
      const std::string why = status->lost_reason.empty() ? "the cluster preempted it" : status->lost_reason;
      host->exit_code = -1;
      host->term_signal = 0;
      host->lost_reason = why;
      if (IsManagedSpot(request_) && !stop_requested_.load()) {
        stop_reason_ = StopReason::kInterruption;
        (void)InterruptSelf("spot capacity reclaimed: " + why);
      }
      continue;
    }
    if (status.ok() && status->state == runtime::InstanceState::kExited) {
      host->exit_code = status->exit_code;
      host->term_signal = status->term_signal;
      host->oom_killed = status->oom_killed;
      host->stopped_by_kiln = status->stop_requested;
    } else {
      host->exit_code = -1;  // lost: the shim (or container) vanished without recording an exit
      if (status.ok()) host->lost_reason = status->lost_reason;
    }
  }
  if (waiting != waiting_shown_) {
    // Every host's program runs only now (it waited in the cluster's queue): the attempt's
    // training time, and its MaxRuntimeInSeconds, count from here, not from the submission.
    const bool started_now = !waiting_shown_.empty() && waiting.empty();
    waiting_shown_ = waiting;
    const int64_t now = Now();
    if (started_now) training_start_millis_ = now;
    (void)Update([&](store::TrainingJobRecord& rec) {
      if (started_now && rec.status == JobStatus::kInProgress) {
        rec.state.attempt_start_millis = now;
        if (rec.state.interruptions == 0) rec.state.training_start_millis = now;
      }
      if (rec.status != JobStatus::kInProgress || rec.secondary_status != SecondaryStatus::kTraining) return;
      RecordSecondaryStatus(rec, SecondaryStatus::kTraining,
                            waiting.empty() ? kMsgTraining + allocation_note_ : waiting, now);
    });
  }
}

void TrainingJobRun::StopHosts(StopReason reason, bool record_stop) {
  stop_reason_ = reason;
  if (record_stop) {
    int64_t now = Now();
    (void)Update([&](store::TrainingJobRecord& rec) {
      SetStatus(rec, JobStatus::kStopping);
      rec.state.stop_requested =
          reason == StopReason::kMaxWaitTime ? StopRequest::kMaxWaitTime : StopRequest::kMaxRuntime;
      RecordSecondaryStatus(rec, SecondaryStatus::kStopping, kMsgStopping, now);
    });
  }
  if (reason == StopReason::kInterruption) {
    // The hosts get what a spot reclaim gives (SIGTERM, the stop grace, SIGKILL); the script may
    // save a checkpoint in its SIGTERM handler. Its streams say why.
    auto record = context_.jobs->Get(name_);
    const std::string why = record.ok() && record->state.interrupt_requested ? *record->state.interrupt_requested
                                                                             : std::string("spot capacity reclaimed");
    SayInLogs("spot interruption: " + why + "; stopping the instances (SIGTERM), then syncing checkpoints");
    KLOG(info, "spot interruption", {{"job", name_}, {"reason", why}});
  }
  // A host failing fails the job; the other hosts are stopped like a stop (§11).
  for (auto& host : hosts_) {
    if (!host->exited) (void)deps().runtime->Stop(host->instance_id, options().stop_grace);
  }
}

void TrainingJobRun::FlushMetrics() {
  MutexLock lock(metrics_mutex_);
  if (!metrics_dirty_) return;
  auto snapshot = final_metrics_;
  metrics_dirty_ = false;
  (void)Update([&](store::TrainingJobRecord& rec) { rec.state.final_metrics = snapshot; });
}

void TrainingJobRun::StartPump(Host& host, const json& metric_definitions, int64_t offset) {
  LogPump::Options pump;
  pump.output_path = deps().runtime->OutputPath(host.instance_id);
  pump.offset_path = host.root + "/log.offset";
  pump.start_offset = offset;
  pump.group = kTrainingLogGroup;
  pump.stream = host.log_stream;
  if (metric_definitions.is_array() && !metric_definitions.empty()) {
    auto created = observe::MetricExtractor::Create(MetricDefinitionsFromJson(metric_definitions));
    if (created.ok()) {
      pump.extractor = std::shared_ptr<const observe::MetricExtractor>(std::move(created).value());
    } else {
      KLOG(warn, "metric definitions rejected", {{"job", name_}, {"error", created.status().ToString()}});
    }
  }
  const std::string host_name = host.host;
  pump.on_metrics = [this, host_name](const std::vector<observe::MetricPoint>& points) {
    RecordMetrics(host_name, points);
  };
  host.pump = std::make_unique<LogPump>(std::move(pump), deps().log_store);
  host.pump->Start();
  // Instance metrics (§15) while the host runs (an exited one is dropped at its first sample).
  if (deps().instance_metrics != nullptr) {
    (void)deps().instance_metrics->Track(TrainingHostMetricsTarget(host.instance_id, name_, host.host, host.opt_ml));
  }
}

// Metric points of one batch of a host's lines: stored as time series (one transaction per
// batch, with TrainingJobName and Host dimensions, §15) and kept as the last value per metric.
void TrainingJobRun::RecordMetrics(const std::string& host, const std::vector<observe::MetricPoint>& points) {
  std::vector<observe::MetricDatum> batch;
  batch.reserve(points.size() * 2);
  const observe::Dimensions job_dims = {{"TrainingJobName", name_}};
  const observe::Dimensions host_dims = {{"Host", name_ + "/" + host}};
  for (const auto& p : points) {
    batch.push_back({.name = p.name,
                     .dimensions = job_dims,
                     .timestamp_millis = p.timestamp_millis,
                     .value = p.value,
                     .unit = "None"});
    batch.push_back({.name = p.name,
                     .dimensions = host_dims,
                     .timestamp_millis = p.timestamp_millis,
                     .value = p.value,
                     .unit = "None"});
  }
  if (deps().metric_store) {
    Status put = deps().metric_store->Put(kMetricNamespace, batch);
    if (!put.ok()) KLOG(warn, "metric points not stored", {{"job", name_}, {"error", put.ToString()}});
  }
  MutexLock lock(metrics_mutex_);
  for (const auto& p : points) final_metrics_[p.name] = {.value = p.value, .timestamp_millis = p.timestamp_millis};
  metrics_dirty_ = true;
}

void TrainingJobRun::StopPumps(bool drain) {
  for (auto& host : hosts_) {
    if (deps().instance_metrics != nullptr) deps().instance_metrics->Untrack(host->instance_id);
    if (host->pump) host->pump->Stop(drain);
  }
}

void TrainingJobRun::StopAgents() {
  for (auto& host : hosts_) {
    if (host->feeder) host->feeder->Stop();
    host->checkpoints.reset();  // stops its background sync (no final sync)
    host->output_syncs.clear();
  }
}

// DebugHookConfig, TensorBoardOutputConfig and ProfilerConfig name an S3OutputPath that their
// LocalPath is synced to every 30 s and once more at the end (training-contract.md §4.4, §8).
Result<std::vector<std::unique_ptr<agent::CheckpointSync>>> TrainingJobRun::MakeOutputSyncs(const Host& host) {
  struct OutputConfig {
    const char* member;
    const char* default_local_path;
  };
  static constexpr OutputConfig kConfigs[] = {{"DebugHookConfig", "/opt/ml/output/tensors"},
                                              {"TensorBoardOutputConfig", "/opt/ml/output/tensorboard"},
                                              {"ProfilerConfig", "/opt/ml/output/profiler"}};
  std::vector<std::unique_ptr<agent::CheckpointSync>> syncs;
  for (const OutputConfig& c : kConfigs) {
    const json config = request_.value(c.member, json());
    if (!config.is_object() || !config.contains("S3OutputPath") || !config["S3OutputPath"].is_string()) continue;
    ASSIGN_OR_RETURN(std::string local_dir,
                     agent::SandboxPathToHost(host.opt_ml, config.value("LocalPath", c.default_local_path)));
    agent::CheckpointSync::Options sync_options;
    sync_options.scan_interval = std::chrono::seconds(30);
    sync_options.quiet_period = options().checkpoint_quiet_period;
    std::string job = name_;
    std::string what = c.member;
    sync_options.on_error = [job, what](const Status& error) {
      KLOG(warn, "output sync failed", {{"job", job}, {"config", what}, {"error", error.ToString()}});
    };
    // Each host writes under its own name so that hosts never overwrite each other.
    std::string uri = config["S3OutputPath"].get<std::string>();
    if (request_.value("ResourceConfig", json::object()).value("InstanceCount", 1) > 1) {
      uri = agent::JoinKey(uri, host.host);
    }
    ASSIGN_OR_RETURN(auto sync, agent::CheckpointSync::Create(*deps().object_store, uri, local_dir, sync_options));
    RETURN_IF_ERROR(MakeDirs(local_dir, 0755));
    syncs.push_back(std::move(sync));
  }
  return syncs;
}

Result<std::unique_ptr<agent::CheckpointSync>> TrainingJobRun::MakeCheckpointSync(const Host& host) {
  const json& config = request_["CheckpointConfig"];
  ASSIGN_OR_RETURN(std::string local_dir, agent::SandboxPathToHost(host.opt_ml, agent::CheckpointLocalPath(request_)));
  agent::CheckpointSync::Options sync_options;
  sync_options.scan_interval = options().checkpoint_scan_interval;
  sync_options.quiet_period = options().checkpoint_quiet_period;
  std::string job = name_;
  sync_options.on_error = [job](const Status& error) {
    KLOG(warn, "checkpoint sync failed", {{"job", job}, {"error", error.ToString()}});
  };
  return agent::CheckpointSync::Create(*deps().object_store, config.value("S3Uri", ""), local_dir, sync_options);
}

// Gathers how each host ended (its failure file, its last stderr line) for FailureReason.
training::JobFailure TrainingJobRun::FailureReasonFromHosts() {
  std::vector<HostExit> exits;
  for (const auto& host : hosts_) {
    HostExit exit{.host = host->host,
                  .exit_code = host->exit_code,
                  .term_signal = host->term_signal,
                  .oom_killed = host->oom_killed,
                  .lost_reason = host->lost_reason,
                  .stopped_by_kiln = host->stopped_by_kiln,
                  .failure_file = host->exit_code != 0 ? agent::ReadFailureReason(host->opt_ml) : "",
                  .last_stderr_line = host->exit_code != 0 && host->pump ? host->pump->last_stderr_line() : ""};
    exits.push_back(std::move(exit));
  }
  return FailureReason(exits);
}

}  // namespace kiln::control
