#include "store/tuning_job_state.h"

#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "store/json_member.h"
#include "store/training_job_state.h"

namespace kiln::store {
namespace {

using nlohmann::json;

constexpr std::array<std::pair<TuningJobStatus, std::string_view>, 7> kStatuses = {{
    {TuningJobStatus::kInProgress, "InProgress"},
    {TuningJobStatus::kCompleted, "Completed"},
    {TuningJobStatus::kFailed, "Failed"},
    {TuningJobStatus::kStopping, "Stopping"},
    {TuningJobStatus::kStopped, "Stopped"},
    {TuningJobStatus::kDeleting, "Deleting"},
    {TuningJobStatus::kDeleteFailed, "DeleteFailed"},
}};

// The wording of this document's errors: "tuning job state: <path> is not <expected>".
Status Bad(std::string_view path, std::string_view expected) {
  return Status::InvalidArgument("tuning job state: " + std::string(path) + " is not " + std::string(expected));
}

// JSON has no NaN or infinities (nlohmann writes them as null, which would then not read back as
// a number): they travel as these strings.
json NumberToJson(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

Result<double> NumberFromJson(const json& value, const std::string& path) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (text == "Infinity") return std::numeric_limits<double>::infinity();
    if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  return Bad(path, "a number");
}

// An int member (absent or null: `out` untouched).
Status ReadInt(const json& object, const char* member, const std::string& prefix, int& out) {
  int64_t value = out;
  RETURN_IF_ERROR(json_member::ReadInt64(object, member, prefix, Bad, value));
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return Bad(prefix + member, "a 32-bit integer");
  }
  out = static_cast<int>(value);
  return Status::Ok();
}

// Members of `object` not in `known`, for `extra`.
template <size_t N>
json Unknown(const json& object, const std::array<std::string_view, N>& known) {
  json extra = json::object();
  for (const auto& [key, value] : object.items()) {
    bool is_known = false;
    for (std::string_view k : known) is_known |= key == k;
    if (!is_known) extra[key] = value;
  }
  return extra;
}

constexpr std::array<std::string_view, 14> kTrialMembers = {
    "seq",       "name",  "definition_name", "tuned",       "creation_millis", "status",       "failure_reason",
    "objective", "curve", "bracket",         "judged_rung", "early_stopped",   "start_millis", "end_millis",
};

Result<TuningTrial> TrialFromJson(const json& t, const std::string& where) {
  if (!t.is_object()) return Bad(where, "an object");
  TuningTrial out;
  const std::string prefix = where + ".";
  out.extra = Unknown(t, kTrialMembers);
  RETURN_IF_ERROR(ReadInt(t, "seq", prefix, out.seq));
  RETURN_IF_ERROR(json_member::ReadString(t, "name", prefix, Bad, out.name));
  RETURN_IF_ERROR(json_member::ReadString(t, "definition_name", prefix, Bad, out.definition_name));
  if (auto it = t.find("tuned"); it != t.end() && !it->is_null()) {
    if (!it->is_object()) return Bad(prefix + "tuned", "an object");
    for (const auto& [key, value] : it->items()) {
      if (!value.is_string()) return Bad(prefix + "tuned." + key, "a string");
      out.tuned[key] = value.get<std::string>();
    }
  }
  RETURN_IF_ERROR(json_member::ReadInt64(t, "creation_millis", prefix, Bad, out.creation_millis));
  RETURN_IF_ERROR(json_member::ReadString(t, "status", prefix, Bad, out.status));
  if (!ParseTrainingJobStatus(out.status)) return Bad(prefix + "status", "a TrainingJobStatus");
  RETURN_IF_ERROR(json_member::ReadOptional(t, "failure_reason", prefix, Bad, out.failure_reason));
  if (auto it = t.find("objective"); it != t.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(double objective, NumberFromJson(*it, prefix + "objective"));
    out.objective = objective;
  }
  ASSIGN_OR_RETURN(const json* curve, json_member::ArrayMember(t, "curve", prefix, Bad));
  out.curve.reserve(curve->size());
  for (size_t i = 0; i < curve->size(); ++i) {
    ASSIGN_OR_RETURN(double value, NumberFromJson((*curve)[i], prefix + "curve[" + std::to_string(i) + "]"));
    out.curve.push_back(value);
  }
  RETURN_IF_ERROR(ReadInt(t, "bracket", prefix, out.bracket));
  RETURN_IF_ERROR(ReadInt(t, "judged_rung", prefix, out.judged_rung));
  RETURN_IF_ERROR(json_member::ReadOptional(t, "early_stopped", prefix, Bad, out.early_stopped));
  RETURN_IF_ERROR(json_member::ReadOptional(t, "start_millis", prefix, Bad, out.start_millis));
  RETURN_IF_ERROR(json_member::ReadOptional(t, "end_millis", prefix, Bad, out.end_millis));
  return out;
}

json TrialToJson(const TuningTrial& trial) {
  json out = trial.extra.is_object() ? trial.extra : json::object();
  out["seq"] = trial.seq;
  out["name"] = trial.name;
  out["definition_name"] = trial.definition_name;
  out["tuned"] = trial.tuned;  // std::map → object
  out["creation_millis"] = trial.creation_millis;
  out["status"] = trial.status;
  if (trial.failure_reason) out["failure_reason"] = *trial.failure_reason;
  if (trial.objective) out["objective"] = NumberToJson(*trial.objective);
  json curve = json::array();
  for (double value : trial.curve) curve.push_back(NumberToJson(value));
  out["curve"] = std::move(curve);
  out["bracket"] = trial.bracket;
  out["judged_rung"] = trial.judged_rung;
  if (trial.early_stopped) out["early_stopped"] = *trial.early_stopped;
  if (trial.start_millis) out["start_millis"] = *trial.start_millis;
  if (trial.end_millis) out["end_millis"] = *trial.end_millis;
  return out;
}

constexpr std::array<std::string_view, 8> kStateMembers = {
    "trials",         "failure_reason", "stop_reason",         "not_improving", "convergence_detected_millis",
    "stop_requested", "end_millis",     "runtime_ms_consumed",
};

}  // namespace

std::string_view ToString(TuningJobStatus status) {
  for (const auto& [value, name] : kStatuses) {
    if (value == status) return name;
  }
  return "";
}

Result<TuningJobStatus> ParseTuningJobStatus(std::string_view text) {
  for (const auto& [value, name] : kStatuses) {
    if (name == text) return value;
  }
  return Status::InvalidArgument("'" + std::string(text) + "' is not a HyperParameterTuningJobStatus");
}

bool IsTerminal(TuningJobStatus status) {
  return status == TuningJobStatus::kCompleted || status == TuningJobStatus::kFailed ||
         status == TuningJobStatus::kStopped || status == TuningJobStatus::kDeleteFailed;
}

json ToJson(const TuningJobState& state) {
  json out = state.extra.is_object() ? state.extra : json::object();
  json trials = json::array();
  for (const auto& trial : state.trials) trials.push_back(TrialToJson(trial));
  out["trials"] = std::move(trials);
  if (state.failure_reason) out["failure_reason"] = *state.failure_reason;
  if (state.stop_reason) out["stop_reason"] = *state.stop_reason;
  out["not_improving"] = state.not_improving;
  if (state.convergence_detected_millis) out["convergence_detected_millis"] = *state.convergence_detected_millis;
  out["stop_requested"] = state.stop_requested;
  if (state.end_millis) out["end_millis"] = *state.end_millis;
  out["runtime_ms_consumed"] = state.runtime_ms_consumed;
  return out;
}

Result<TuningJobState> TuningJobStateFromJson(const json& document) {
  TuningJobState state;
  if (document.is_null()) return state;
  if (!document.is_object()) return Bad("the document", "an object");
  state.extra = Unknown(document, kStateMembers);
  ASSIGN_OR_RETURN(const json* trials, json_member::ArrayMember(document, "trials", "", Bad));
  state.trials.reserve(trials->size());
  for (size_t i = 0; i < trials->size(); ++i) {
    ASSIGN_OR_RETURN(auto trial, TrialFromJson((*trials)[i], "trials[" + std::to_string(i) + "]"));
    state.trials.push_back(std::move(trial));
  }
  RETURN_IF_ERROR(json_member::ReadOptional(document, "failure_reason", "", Bad, state.failure_reason));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "stop_reason", "", Bad, state.stop_reason));
  RETURN_IF_ERROR(ReadInt(document, "not_improving", "", state.not_improving));
  RETURN_IF_ERROR(
      json_member::ReadOptional(document, "convergence_detected_millis", "", Bad, state.convergence_detected_millis));
  RETURN_IF_ERROR(json_member::ReadBool(document, "stop_requested", "", Bad, state.stop_requested));
  RETURN_IF_ERROR(json_member::ReadOptional(document, "end_millis", "", Bad, state.end_millis));
  RETURN_IF_ERROR(json_member::ReadInt64(document, "runtime_ms_consumed", "", Bad, state.runtime_ms_consumed));
  return state;
}

}  // namespace kiln::store
