#include "store/training_job_state.h"

#include <array>
#include <utility>

#include "store/json_member.h"

namespace kiln::store {
namespace {

using nlohmann::json;

template <typename E, size_t N>
std::optional<E> ParseFrom(const std::array<std::pair<E, std::string_view>, N>& table, std::string_view text) {
  for (const auto& [value, name] : table) {
    if (name == text) return value;
  }
  return std::nullopt;
}

template <typename E, size_t N>
std::string_view NameIn(const std::array<std::pair<E, std::string_view>, N>& table, E value) {
  for (const auto& [v, name] : table) {
    if (v == value) return name;
  }
  return "";
}

constexpr std::array<std::pair<TrainingPhase, std::string_view>, 5> kPhases = {{
    {TrainingPhase::kQueued, "queued"},
    {TrainingPhase::kStaging, "staging"},
    {TrainingPhase::kRunning, "running"},
    {TrainingPhase::kFinishing, "finishing"},
    {TrainingPhase::kDone, "done"},
}};

constexpr std::array<std::pair<TrainingJobStatus, std::string_view>, 5> kStatuses = {{
    {TrainingJobStatus::kInProgress, "InProgress"},
    {TrainingJobStatus::kCompleted, "Completed"},
    {TrainingJobStatus::kFailed, "Failed"},
    {TrainingJobStatus::kStopping, "Stopping"},
    {TrainingJobStatus::kStopped, "Stopped"},
}};

constexpr std::array<std::pair<SecondaryStatus, std::string_view>, 17> kSecondaryStatuses = {{
    {SecondaryStatus::kStarting, "Starting"},
    {SecondaryStatus::kPending, "Pending"},
    {SecondaryStatus::kLaunchingMLInstances, "LaunchingMLInstances"},
    {SecondaryStatus::kPreparingTrainingStack, "PreparingTrainingStack"},
    {SecondaryStatus::kDownloading, "Downloading"},
    {SecondaryStatus::kDownloadingTrainingImage, "DownloadingTrainingImage"},
    {SecondaryStatus::kTraining, "Training"},
    {SecondaryStatus::kUploading, "Uploading"},
    {SecondaryStatus::kStopping, "Stopping"},
    {SecondaryStatus::kStopped, "Stopped"},
    {SecondaryStatus::kMaxRuntimeExceeded, "MaxRuntimeExceeded"},
    {SecondaryStatus::kMaxWaitTimeExceeded, "MaxWaitTimeExceeded"},
    {SecondaryStatus::kCompleted, "Completed"},
    {SecondaryStatus::kFailed, "Failed"},
    {SecondaryStatus::kInterrupted, "Interrupted"},
    {SecondaryStatus::kUpdating, "Updating"},
    {SecondaryStatus::kRestarting, "Restarting"},
}};

constexpr std::array<std::pair<StopRequest, std::string_view>, 4> kStopRequests = {{
    {StopRequest::kNone, ""},
    {StopRequest::kUser, "user"},
    {StopRequest::kMaxRuntime, "max_runtime"},
    {StopRequest::kMaxWaitTime, "max_wait_time"},
}};
constexpr std::array<std::pair<WarmPoolStatus, std::string_view>, 5> kWarmPoolStatuses = {{
    {WarmPoolStatus::kNone, ""},
    {WarmPoolStatus::kAvailable, "Available"},
    {WarmPoolStatus::kInUse, "InUse"},
    {WarmPoolStatus::kReused, "Reused"},
    {WarmPoolStatus::kTerminated, "Terminated"},
}};

// The wording of this document's errors: "training job state: <path> is not <expected>".
Status Bad(std::string_view path, std::string_view expected) {
  return Status::InvalidArgument("training job state: " + std::string(path) + " is not " + std::string(expected));
}

Result<SecondaryStatusTransition> TransitionFromJson(const json& t, const std::string& where) {
  if (!t.is_object()) return Bad(where, "an object");
  SecondaryStatusTransition out;
  std::string status;
  RETURN_IF_ERROR(json_member::ReadString(t, "Status", where + ".", Bad, status));
  auto parsed = ParseSecondaryStatus(status);
  if (!parsed) return Bad(where + ".Status", "a SecondaryStatus");
  out.status = *parsed;
  RETURN_IF_ERROR(json_member::ReadInt64(t, "StartTime", where + ".", Bad, out.start_millis));
  RETURN_IF_ERROR(json_member::ReadOptional(t, "EndTime", where + ".", Bad, out.end_millis));
  RETURN_IF_ERROR(json_member::ReadString(t, "StatusMessage", where + ".", Bad, out.message));
  return out;
}

Result<TrainingHostState> HostFromJson(const json& h, const std::string& where) {
  if (!h.is_object()) return Bad(where, "an object");
  TrainingHostState out;
  const std::string prefix = where + ".";
  RETURN_IF_ERROR(json_member::ReadString(h, "host", prefix, Bad, out.host));
  int64_t shard = 0;
  RETURN_IF_ERROR(json_member::ReadInt64(h, "shard_index", prefix, Bad, shard));
  out.shard_index = static_cast<int>(shard);
  RETURN_IF_ERROR(json_member::ReadString(h, "instance_id", prefix, Bad, out.instance_id));
  RETURN_IF_ERROR(json_member::ReadString(h, "root", prefix, Bad, out.root));
  RETURN_IF_ERROR(json_member::ReadString(h, "log_stream", prefix, Bad, out.log_stream));
  RETURN_IF_ERROR(json_member::ReadInt64(h, "started_millis", prefix, Bad, out.started_millis));
  return out;
}

}  // namespace

std::string_view ToString(TrainingPhase phase) { return NameIn(kPhases, phase); }
std::string_view ToString(TrainingJobStatus status) { return NameIn(kStatuses, status); }
std::string_view ToString(SecondaryStatus status) { return NameIn(kSecondaryStatuses, status); }
std::string_view ToString(StopRequest request) { return NameIn(kStopRequests, request); }
std::optional<TrainingPhase> ParseTrainingPhase(std::string_view text) { return ParseFrom(kPhases, text); }
std::optional<TrainingJobStatus> ParseTrainingJobStatus(std::string_view text) { return ParseFrom(kStatuses, text); }
std::optional<SecondaryStatus> ParseSecondaryStatus(std::string_view text) {
  return ParseFrom(kSecondaryStatuses, text);
}
std::optional<StopRequest> ParseStopRequest(std::string_view text) { return ParseFrom(kStopRequests, text); }
std::string_view ToString(WarmPoolStatus status) { return NameIn(kWarmPoolStatuses, status); }
std::optional<WarmPoolStatus> ParseWarmPoolStatus(std::string_view text) { return ParseFrom(kWarmPoolStatuses, text); }

Result<TrainingJobState> TrainingJobStateFromJson(const json& document) {
  TrainingJobState state;
  if (document.is_null()) return state;
  if (!document.is_object()) return Bad("the document", "an object");
  static constexpr const char* kKnown[] = {"phase",
                                           "transitions",
                                           "status_message",
                                           "hosts",
                                           "allocations",
                                           "credentials",
                                           "stop_requested",
                                           "training_start_millis",
                                           "training_end_millis",
                                           "last_stream_epoch",
                                           "retries",
                                           "last_failure",
                                           "failure_reason",
                                           "final_metrics",
                                           "model_artifacts",
                                           "output_artifacts",
                                           "interruptions",
                                           "billable_millis",
                                           "interrupt_requested",
                                           "resume_after_millis",
                                           "attempt_start_millis",
                                           "warm_pool"};
  for (const auto& [key, value] : document.items()) {
    bool known = false;
    for (const char* k : kKnown) known |= key == k;
    if (!known) state.extra[key] = value;
  }

  std::string phase;
  RETURN_IF_ERROR(json_member::ReadString(document, "phase", "", Bad, phase));
  if (!phase.empty()) {
    auto parsed = ParseTrainingPhase(phase);
    if (!parsed) return Bad("phase", "a phase");
    state.phase = *parsed;
  }
  ASSIGN_OR_RETURN(const json* transitions, json_member::ArrayMember(document, "transitions", "", Bad));
  for (size_t i = 0; i < transitions->size(); ++i) {
    ASSIGN_OR_RETURN(auto t, TransitionFromJson((*transitions)[i], "transitions[" + std::to_string(i) + "]"));
    state.transitions.push_back(std::move(t));
  }
  RETURN_IF_ERROR(json_member::ReadString(document, "status_message", "", Bad, state.status_message));
  ASSIGN_OR_RETURN(const json* hosts, json_member::ArrayMember(document, "hosts", "", Bad));
  for (size_t i = 0; i < hosts->size(); ++i) {
    ASSIGN_OR_RETURN(auto h, HostFromJson((*hosts)[i], "hosts[" + std::to_string(i) + "]"));
    state.hosts.push_back(std::move(h));
  }
  if (document.contains("allocations")) state.allocations = document["allocations"];
  if (document.contains("credentials")) state.credentials = document["credentials"];
  std::string stop;
  RETURN_IF_ERROR(json_member::ReadString(document, "stop_requested", "", Bad, stop));
  auto stop_request = ParseStopRequest(stop);
  if (!stop_request) return Bad("stop_requested", "a stop request");
  state.stop_requested = *stop_request;
  RETURN_IF_ERROR(json_member::ReadOptional(document, "training_start_millis", "", Bad, state.training_start_millis));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "training_end_millis", "", Bad, state.training_end_millis));
  RETURN_IF_ERROR(json_member::ReadInt64(document, "last_stream_epoch", "", Bad, state.last_stream_epoch));
  int64_t retries = 0;
  RETURN_IF_ERROR(json_member::ReadInt64(document, "retries", "", Bad, retries));
  state.retries = static_cast<int>(retries);
  RETURN_IF_ERROR(json_member::ReadOptional(document, "last_failure", "", Bad, state.last_failure));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "failure_reason", "", Bad, state.failure_reason));
  if (auto it = document.find("final_metrics"); it != document.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("final_metrics", "an object");
    for (const auto& [name, point] : it->items()) {
      const std::string where = "final_metrics." + name;
      if (!point.is_object()) return Bad(where, "an object");
      FinalMetric metric;
      RETURN_IF_ERROR(json_member::ReadDouble(point, "value", where + ".", Bad, metric.value));
      RETURN_IF_ERROR(json_member::ReadInt64(point, "timestamp_millis", where + ".", Bad, metric.timestamp_millis));
      state.final_metrics[name] = metric;
    }
  }
  RETURN_IF_ERROR(json_member::ReadOptional(document, "model_artifacts", "", Bad, state.model_artifacts));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "output_artifacts", "", Bad, state.output_artifacts));
  int64_t interruptions = 0;
  RETURN_IF_ERROR(json_member::ReadInt64(document, "interruptions", "", Bad, interruptions));
  state.interruptions = static_cast<int>(interruptions);
  RETURN_IF_ERROR(json_member::ReadInt64(document, "billable_millis", "", Bad, state.billable_millis));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "interrupt_requested", "", Bad, state.interrupt_requested));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "resume_after_millis", "", Bad, state.resume_after_millis));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "attempt_start_millis", "", Bad, state.attempt_start_millis));
  if (auto it = document.find("warm_pool"); it != document.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("warm_pool", "an object");
    const json& pool = *it;
    WarmPoolState& w = state.warm_pool;
    std::string status;
    RETURN_IF_ERROR(json_member::ReadString(pool, "status", "warm_pool.", Bad, status));
    auto parsed = ParseWarmPoolStatus(status);
    if (!parsed) return Bad("warm_pool.status", "a warm pool status");
    w.status = *parsed;
    RETURN_IF_ERROR(
        json_member::ReadInt64(pool, "available_since_millis", "warm_pool.", Bad, w.available_since_millis));
    RETURN_IF_ERROR(json_member::ReadInt64(pool, "expires_millis", "warm_pool.", Bad, w.expires_millis));
    RETURN_IF_ERROR(json_member::ReadInt64(pool, "retained_millis", "warm_pool.", Bad, w.retained_millis));
    RETURN_IF_ERROR(json_member::ReadString(pool, "reused_by_job", "warm_pool.", Bad, w.reused_by_job));
    RETURN_IF_ERROR(json_member::ReadString(pool, "reused_from_job", "warm_pool.", Bad, w.reused_from_job));
    RETURN_IF_ERROR(json_member::ReadInt64(pool, "chain_start_millis", "warm_pool.", Bad, w.chain_start_millis));
    RETURN_IF_ERROR(json_member::ReadString(pool, "directory", "warm_pool.", Bad, w.directory));
    if (pool.contains("allocations")) w.allocations = pool["allocations"];
  }
  return state;
}

json TrainingJobStateToJson(const TrainingJobState& state) {
  json out = state.extra.is_object() ? state.extra : json::object();
  out["phase"] = ToString(state.phase);
  if (!state.transitions.empty()) {
    json transitions = json::array();
    for (const auto& t : state.transitions) {
      json entry = {{"Status", ToString(t.status)}, {"StartTime", t.start_millis}, {"StatusMessage", t.message}};
      if (t.end_millis) entry["EndTime"] = *t.end_millis;
      transitions.push_back(std::move(entry));
    }
    out["transitions"] = std::move(transitions);
  }
  if (!state.status_message.empty()) out["status_message"] = state.status_message;
  if (!state.hosts.empty()) {
    json hosts = json::array();
    for (const auto& h : state.hosts) {
      hosts.push_back({{"host", h.host},
                       {"shard_index", h.shard_index},
                       {"instance_id", h.instance_id},
                       {"root", h.root},
                       {"log_stream", h.log_stream},
                       {"started_millis", h.started_millis}});
    }
    out["hosts"] = std::move(hosts);
  }
  if (!state.allocations.is_null()) out["allocations"] = state.allocations;
  if (!state.credentials.is_null()) out["credentials"] = state.credentials;
  if (state.stop_requested != StopRequest::kNone) out["stop_requested"] = ToString(state.stop_requested);
  if (state.training_start_millis) out["training_start_millis"] = *state.training_start_millis;
  if (state.training_end_millis) out["training_end_millis"] = *state.training_end_millis;
  if (state.last_stream_epoch != 0) out["last_stream_epoch"] = state.last_stream_epoch;
  if (state.retries != 0) out["retries"] = state.retries;
  if (state.last_failure) out["last_failure"] = *state.last_failure;
  if (state.failure_reason) out["failure_reason"] = *state.failure_reason;
  if (!state.final_metrics.empty()) {
    json metrics = json::object();
    for (const auto& [name, m] : state.final_metrics) {
      metrics[name] = {{"value", m.value}, {"timestamp_millis", m.timestamp_millis}};
    }
    out["final_metrics"] = std::move(metrics);
  }
  if (state.model_artifacts) out["model_artifacts"] = *state.model_artifacts;
  if (state.output_artifacts) out["output_artifacts"] = *state.output_artifacts;
  if (state.interruptions != 0) out["interruptions"] = state.interruptions;
  if (state.billable_millis != 0) out["billable_millis"] = state.billable_millis;
  if (state.interrupt_requested) out["interrupt_requested"] = *state.interrupt_requested;
  if (state.resume_after_millis) out["resume_after_millis"] = *state.resume_after_millis;
  if (state.attempt_start_millis) out["attempt_start_millis"] = *state.attempt_start_millis;
  if (state.warm_pool.status != WarmPoolStatus::kNone) {
    const WarmPoolState& w = state.warm_pool;
    json pool = {{"status", ToString(w.status)}};
    if (w.available_since_millis != 0) pool["available_since_millis"] = w.available_since_millis;
    if (w.expires_millis != 0) pool["expires_millis"] = w.expires_millis;
    if (w.retained_millis != 0) pool["retained_millis"] = w.retained_millis;
    if (!w.reused_by_job.empty()) pool["reused_by_job"] = w.reused_by_job;
    if (!w.reused_from_job.empty()) pool["reused_from_job"] = w.reused_from_job;
    if (w.chain_start_millis != 0) pool["chain_start_millis"] = w.chain_start_millis;
    if (!w.directory.empty()) pool["directory"] = w.directory;
    if (!w.allocations.is_null()) pool["allocations"] = w.allocations;
    out["warm_pool"] = std::move(pool);
  }
  return out;
}

}  // namespace kiln::store
