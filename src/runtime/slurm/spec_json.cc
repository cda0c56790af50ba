#include "runtime/slurm/spec_json.h"

#include "base/json_parse.h"

namespace kiln::runtime::slurm {

using json = nlohmann::json;

namespace {

// Reads optional member `name` into `out` when present and not null; nlohmann's type errors
// (json::exception) are caught by the callers' try blocks.
template <typename T>
void Optional(const json& j, const char* name, T& out) {
  if (auto it = j.find(name); it != j.end() && !it->is_null()) out = it->get<T>();
}

json UsageToJson(const InstanceUsage& u) {
  return {{"cpu_usec", u.cpu_usec},
          {"memory_bytes", u.memory_bytes},
          {"memory_limit_bytes", u.memory_limit_bytes},
          {"gpus", u.gpus},
          {"source", u.source},
          {"process_count", u.process_count}};
}

InstanceUsage UsageFromJson(const json& j) {
  InstanceUsage u;
  Optional(j, "cpu_usec", u.cpu_usec);
  Optional(j, "memory_bytes", u.memory_bytes);
  Optional(j, "memory_limit_bytes", u.memory_limit_bytes);
  Optional(j, "gpus", u.gpus);
  Optional(j, "source", u.source);
  Optional(j, "process_count", u.process_count);
  return u;
}

}  // namespace

json ReportToJson(const NodeReport& r) {
  json j = {{"state", r.state},
            {"node", r.node},
            {"address", r.address},
            {"started_millis", r.started_millis},
            {"finished_millis", r.finished_millis},
            {"exit_code", r.exit_code},
            {"term_signal", r.term_signal},
            {"oom_killed", r.oom_killed},
            {"usage", nullptr},
            {"error", r.error}};
  if (r.usage) j["usage"] = UsageToJson(*r.usage);
  return j;
}

Result<NodeReport> ReportFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("bad node report: not a JSON object");
  try {
    NodeReport r;
    Optional(j, "state", r.state);
    if (r.state != "starting" && r.state != "running" && r.state != "exited") {
      return Status::InvalidArgument("bad node report: state must be starting, running or exited, not \"" + r.state +
                                     "\"");
    }
    Optional(j, "node", r.node);
    Optional(j, "address", r.address);
    Optional(j, "started_millis", r.started_millis);
    Optional(j, "finished_millis", r.finished_millis);
    Optional(j, "exit_code", r.exit_code);
    Optional(j, "term_signal", r.term_signal);
    Optional(j, "oom_killed", r.oom_killed);
    Optional(j, "error", r.error);
    if (auto it = j.find("usage"); it != j.end() && it->is_object()) r.usage = UsageFromJson(*it);
    return r;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("bad node report: ") + e.what());
  }
}

json AnswerToJson(const NodeReportAnswer& a) {
  json j = {{"stop_grace_seconds", nullptr}, {"signals", a.signals}};
  if (a.stop_grace_seconds) j["stop_grace_seconds"] = *a.stop_grace_seconds;
  return j;
}

Result<NodeReportAnswer> AnswerFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("bad report answer: not a JSON object");
  try {
    NodeReportAnswer a;
    if (auto it = j.find("stop_grace_seconds"); it != j.end() && !it->is_null()) {
      a.stop_grace_seconds = it->get<int64_t>();
    }
    Optional(j, "signals", a.signals);
    return a;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("bad report answer: ") + e.what());
  }
}

}  // namespace kiln::runtime::slurm
