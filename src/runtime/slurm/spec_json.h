#pragma once
// JSON forms of what crosses the Slurm node protocol (README.md, "Node protocol"): the
// InstanceSpec the node fetches (GET .../spec), the node's report (POST .../report) and the
// server's answer to it. Both ends use these functions, so the two sides cannot drift apart.
//
// Compatibility: decoders accept documents without any optional member (an older peer's) and
// ignore members they do not know (a newer peer's); only the members marked required below must
// be present. Encoders always write every member.
//
// Thread-safety: all functions are thread-safe (no shared state).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "runtime/instance_spec_json.h"
#include "runtime/runtime.h"

namespace kiln::runtime::slurm {

// The InstanceSpec itself: runtime/instance_spec_json.h (SpecToJson, SpecFromJson, EncodeSpec,
// DecodeSpec), shared with the process runtime's on-disk spec.

// POST /_kiln/node/v1/instances/<id>/report: what the node says about its local instance.
struct NodeReport {
  // "starting" (spec fetched, staging), "running" (the program was exec'd) or "exited" (the
  // exit sequence is done: output and files were pushed). Required.
  std::string state;
  std::string node;     // the node's hostname (Slurm's node name where it differs)
  std::string address;  // the node's IPv4 address as the server should reach it
  int64_t started_millis = 0;
  int64_t finished_millis = 0;
  int exit_code = -1;
  int term_signal = 0;
  bool oom_killed = false;
  // The local runtime's InstanceUsage while running; absent when it could not measure.
  std::optional<InstanceUsage> usage;
  // "exited" only, and only when the program never ran: why it could not start (e.g. "cannot
  // execute /usr/bin/pythn3: No such file or directory", a failed opt-ml download). Empty otherwise.
  std::string error;
};
nlohmann::json ReportToJson(const NodeReport& report);
// InvalidArgument("bad node report: ...") when state is missing or not one of the three.
Result<NodeReport> ReportFromJson(const nlohmann::json& j);

// The server's 200 answer to a report: what the node must do now.
struct NodeReportAnswer {
  // Set: stop the local instance with this grace (Runtime::Stop); repeated in every answer until
  // the node reports "exited", so the node can call Stop again (idempotent; a shorter grace wins).
  std::optional<int64_t> stop_grace_seconds;
  // Signals to send to the program (Runtime::Signal), each delivered in exactly one answer.
  std::vector<int> signals;
};
nlohmann::json AnswerToJson(const NodeReportAnswer& answer);
Result<NodeReportAnswer> AnswerFromJson(const nlohmann::json& j);

}  // namespace kiln::runtime::slurm
