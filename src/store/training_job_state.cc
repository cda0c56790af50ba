#include "store/training_job_state.h"

#include <array>
#include <utility>

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

constexpr std::array<std::pair<StopRequest, std::string_view>, 3> kStopRequests = {{
    {StopRequest::kNone, ""},
    {StopRequest::kUser, "user"},
    {StopRequest::kMaxRuntime, "max_runtime"},
}};

// Readers of one member: Ok and `out` untouched when absent (or null); InvalidArgument naming
// `where` when present with the wrong type. No nlohmann exception escapes (types are checked).
Status Bad(const std::string& where, const char* expected) {
  return Status::InvalidArgument("training job state: " + where + " is not " + expected);
}

Status ReadInt64(const json& object, const char* member, const std::string& where, int64_t& out) {
  auto it = object.find(member);
  if (it == object.end() || it->is_null()) return Status::Ok();
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return Bad(where + member, "an int64");
    out = static_cast<int64_t>(it->get<uint64_t>());
    return Status::Ok();
  }
  if (!it->is_number_integer()) return Bad(where + member, "an integer");
  out = it->get<int64_t>();
  return Status::Ok();
}

Status ReadOptionalInt64(const json& object, const char* member, const std::string& where,
                         std::optional<int64_t>& out) {
  if (!object.contains(member) || object[member].is_null()) return Status::Ok();
  int64_t value = 0;
  RETURN_IF_ERROR(ReadInt64(object, member, where, value));
  out = value;
  return Status::Ok();
}

Status ReadString(const json& object, const char* member, const std::string& where, std::string& out) {
  auto it = object.find(member);
  if (it == object.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return Bad(where + member, "a string");
  out = it->get<std::string>();
  return Status::Ok();
}

Status ReadOptionalString(const json& object, const char* member, const std::string& where,
                          std::optional<std::string>& out) {
  if (!object.contains(member) || object[member].is_null()) return Status::Ok();
  std::string value;
  RETURN_IF_ERROR(ReadString(object, member, where, value));
  out = std::move(value);
  return Status::Ok();
}

Result<SecondaryStatusTransition> TransitionFromJson(const json& t, const std::string& where) {
  if (!t.is_object()) return Bad(where, "an object");
  SecondaryStatusTransition out;
  std::string status;
  RETURN_IF_ERROR(ReadString(t, "Status", where + ".", status));
  auto parsed = ParseSecondaryStatus(status);
  if (!parsed) return Bad(where + ".Status", "a SecondaryStatus");
  out.status = *parsed;
  RETURN_IF_ERROR(ReadInt64(t, "StartTime", where + ".", out.start_millis));
  RETURN_IF_ERROR(ReadOptionalInt64(t, "EndTime", where + ".", out.end_millis));
  RETURN_IF_ERROR(ReadString(t, "StatusMessage", where + ".", out.message));
  return out;
}

Result<TrainingHostState> HostFromJson(const json& h, const std::string& where) {
  if (!h.is_object()) return Bad(where, "an object");
  TrainingHostState out;
  const std::string prefix = where + ".";
  RETURN_IF_ERROR(ReadString(h, "host", prefix, out.host));
  int64_t shard = 0;
  RETURN_IF_ERROR(ReadInt64(h, "shard_index", prefix, shard));
  out.shard_index = static_cast<int>(shard);
  RETURN_IF_ERROR(ReadString(h, "instance_id", prefix, out.instance_id));
  RETURN_IF_ERROR(ReadString(h, "root", prefix, out.root));
  RETURN_IF_ERROR(ReadString(h, "log_stream", prefix, out.log_stream));
  RETURN_IF_ERROR(ReadInt64(h, "started_millis", prefix, out.started_millis));
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
                                           "output_artifacts"};
  for (const auto& [key, value] : document.items()) {
    bool known = false;
    for (const char* k : kKnown) known |= key == k;
    if (!known) state.extra[key] = value;
  }

  std::string phase;
  RETURN_IF_ERROR(ReadString(document, "phase", "", phase));
  if (!phase.empty()) {
    auto parsed = ParseTrainingPhase(phase);
    if (!parsed) return Bad("phase", "a phase");
    state.phase = *parsed;
  }
  if (auto it = document.find("transitions"); it != document.end() && !it->is_null()) {
    if (!it->is_array()) return Bad("transitions", "an array");
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(auto t, TransitionFromJson((*it)[i], "transitions[" + std::to_string(i) + "]"));
      state.transitions.push_back(std::move(t));
    }
  }
  RETURN_IF_ERROR(ReadString(document, "status_message", "", state.status_message));
  if (auto it = document.find("hosts"); it != document.end() && !it->is_null()) {
    if (!it->is_array()) return Bad("hosts", "an array");
    for (size_t i = 0; i < it->size(); ++i) {
      ASSIGN_OR_RETURN(auto h, HostFromJson((*it)[i], "hosts[" + std::to_string(i) + "]"));
      state.hosts.push_back(std::move(h));
    }
  }
  if (document.contains("allocations")) state.allocations = document["allocations"];
  if (document.contains("credentials")) state.credentials = document["credentials"];
  std::string stop;
  RETURN_IF_ERROR(ReadString(document, "stop_requested", "", stop));
  auto stop_request = ParseStopRequest(stop);
  if (!stop_request) return Bad("stop_requested", "a stop request");
  state.stop_requested = *stop_request;
  RETURN_IF_ERROR(ReadOptionalInt64(document, "training_start_millis", "", state.training_start_millis));
  RETURN_IF_ERROR(ReadOptionalInt64(document, "training_end_millis", "", state.training_end_millis));
  RETURN_IF_ERROR(ReadInt64(document, "last_stream_epoch", "", state.last_stream_epoch));
  int64_t retries = 0;
  RETURN_IF_ERROR(ReadInt64(document, "retries", "", retries));
  state.retries = static_cast<int>(retries);
  RETURN_IF_ERROR(ReadOptionalString(document, "last_failure", "", state.last_failure));
  RETURN_IF_ERROR(ReadOptionalString(document, "failure_reason", "", state.failure_reason));
  if (auto it = document.find("final_metrics"); it != document.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("final_metrics", "an object");
    for (const auto& [name, point] : it->items()) {
      const std::string where = "final_metrics." + name;
      if (!point.is_object()) return Bad(where, "an object");
      FinalMetric metric;
      if (point.contains("value") && !point["value"].is_null()) {
        if (!point["value"].is_number()) return Bad(where + ".value", "a number");
        metric.value = point["value"].get<double>();
      }
      RETURN_IF_ERROR(ReadInt64(point, "timestamp_millis", where + ".", metric.timestamp_millis));
      state.final_metrics[name] = metric;
    }
  }
  RETURN_IF_ERROR(ReadOptionalString(document, "model_artifacts", "", state.model_artifacts));
  RETURN_IF_ERROR(ReadOptionalString(document, "output_artifacts", "", state.output_artifacts));
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
  return out;
}

}  // namespace kiln::store
