#include "store/processing_job_state.h"

#include <array>
#include <limits>
#include <utility>

#include "store/json_member.h"

namespace kiln::store {
namespace {

using nlohmann::json;

constexpr std::array<std::pair<ProcessingJobStatus, std::string_view>, 5> kStatuses = {{
    {ProcessingJobStatus::kInProgress, "InProgress"},
    {ProcessingJobStatus::kCompleted, "Completed"},
    {ProcessingJobStatus::kFailed, "Failed"},
    {ProcessingJobStatus::kStopping, "Stopping"},
    {ProcessingJobStatus::kStopped, "Stopped"},
}};

// The wording of this document's errors: "processing job state: <path> is not <expected>".
Status Bad(std::string_view path, std::string_view expected) {
  return Status::InvalidArgument("processing job state: " + std::string(path) + " is not " + std::string(expected));
}

Result<int> ToInt(int64_t value, const std::string& path) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return Bad(path, "a 32-bit integer");
  }
  return static_cast<int>(value);
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

constexpr std::array<std::string_view, 6> kStateMembers = {"start_millis", "failure_reason", "exit_message",
                                                           "stop_reason",  "hosts",          "allocation_ids"};

json HostToJson(const ProcessingHostState& host) {
  json out = json::object();
  out["runtime_id"] = host.runtime_id;
  out["log_stream"] = host.log_stream;
  out["log_offset"] = host.log_offset;
  if (host.exit_code) out["exit_code"] = *host.exit_code;
  out["oom_killed"] = host.oom_killed;
  return out;
}

Result<ProcessingHostState> HostFromJson(const json& h, const std::string& where) {
  RETURN_IF_ERROR(json_member::RequireObject(h, where, Bad));
  ProcessingHostState out;
  const std::string prefix = where + ".";
  RETURN_IF_ERROR(json_member::ReadString(h, "runtime_id", prefix, Bad, out.runtime_id));
  RETURN_IF_ERROR(json_member::ReadString(h, "log_stream", prefix, Bad, out.log_stream));
  RETURN_IF_ERROR(json_member::ReadInt64(h, "log_offset", prefix, Bad, out.log_offset));
  std::optional<int64_t> exit_code;
  RETURN_IF_ERROR(json_member::ReadOptional(h, "exit_code", prefix, Bad, exit_code));
  if (exit_code) {
    ASSIGN_OR_RETURN(int code, ToInt(*exit_code, prefix + "exit_code"));
    out.exit_code = code;
  }
  RETURN_IF_ERROR(json_member::ReadBool(h, "oom_killed", prefix, Bad, out.oom_killed));
  return out;
}

}  // namespace

std::string_view ProcessingJobStatusName(ProcessingJobStatus status) {
  for (const auto& [value, name] : kStatuses) {
    if (value == status) return name;
  }
  return "";
}

std::optional<ProcessingJobStatus> ParseProcessingJobStatus(std::string_view text) {
  for (const auto& [value, name] : kStatuses) {
    if (name == text) return value;
  }
  return std::nullopt;
}

bool IsTerminal(ProcessingJobStatus status) {
  return status == ProcessingJobStatus::kCompleted || status == ProcessingJobStatus::kFailed ||
         status == ProcessingJobStatus::kStopped;
}

json ProcessingJobStateToJson(const ProcessingJobState& state) {
  // Unknown members first, so the typed ones always win over a stale copy in `extra`.
  json out = json::object();
  if (state.extra.is_object()) {
    for (const auto& [key, value] : state.extra.items()) {
      bool is_typed = false;
      for (std::string_view k : kStateMembers) is_typed |= key == k;
      if (!is_typed) out[key] = value;
    }
  }
  if (state.start_millis) out["start_millis"] = *state.start_millis;
  out["failure_reason"] = state.failure_reason;
  out["exit_message"] = state.exit_message;
  out["stop_reason"] = state.stop_reason;
  json hosts = json::array();
  for (const auto& host : state.hosts) hosts.push_back(HostToJson(host));
  out["hosts"] = std::move(hosts);
  out["allocation_ids"] = state.allocation_ids;
  return out;
}

Result<ProcessingJobState> ProcessingJobStateFromJson(const json& document) {
  ProcessingJobState state;
  if (document.is_null()) return state;
  RETURN_IF_ERROR(json_member::RequireObject(document, "the document", Bad));
  state.extra = Unknown(document, kStateMembers);
  RETURN_IF_ERROR(json_member::ReadOptional(document, "start_millis", "", Bad, state.start_millis));
  RETURN_IF_ERROR(json_member::ReadString(document, "failure_reason", "", Bad, state.failure_reason));
  RETURN_IF_ERROR(json_member::ReadString(document, "exit_message", "", Bad, state.exit_message));
  RETURN_IF_ERROR(json_member::ReadString(document, "stop_reason", "", Bad, state.stop_reason));
  ASSIGN_OR_RETURN(const json* hosts, json_member::ArrayMember(document, "hosts", "", Bad));
  state.hosts.reserve(hosts->size());
  for (size_t i = 0; i < hosts->size(); ++i) {
    ASSIGN_OR_RETURN(auto host, HostFromJson((*hosts)[i], "hosts[" + std::to_string(i) + "]"));
    state.hosts.push_back(std::move(host));
  }
  ASSIGN_OR_RETURN(const json* allocation_ids, json_member::ArrayMember(document, "allocation_ids", "", Bad));
  for (size_t i = 0; i < allocation_ids->size(); ++i) {
    const json& id = (*allocation_ids)[i];
    if (!id.is_string()) return Bad("allocation_ids[" + std::to_string(i) + "]", "a string");
    state.allocation_ids.push_back(id.get<std::string>());
  }
  return state;
}

}  // namespace kiln::store
