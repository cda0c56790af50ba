#pragma once
// NodeService: the server end of the node protocol (README.md, "Node protocol"), the HTTP routes
// `kiln node` (node_agent.h) calls from inside a Slurm allocation. The front door hands it every
// request under /_kiln/node/ (api/front_door.h SetNodeService); it is not SigV4-signed: the
// credential is the Slurm job's token, sent as `Authorization: Bearer <token>` (or
// `X-Kiln-Node-Token: <token>`) and compared in constant time with the instance's.
//
//   GET  /_kiln/node/v1/instances/<id>/spec              200 the InstanceSpec (spec_json.h)
//   GET  /_kiln/node/v1/instances/<id>/opt-ml            200 application/x-tar of opt_ml_dir
//   POST /_kiln/node/v1/instances/<id>/output?offset=<n> 200 {"size": m} | 409 {"error":"Conflict","size": m}
//   POST /_kiln/node/v1/instances/<id>/files             200 {} (a tar of model/ output/ checkpoints/
//                                                        processing/ files)
//   POST /_kiln/node/v1/instances/<id>/report            200 NodeReportAnswer (spec_json.h)
//
// Errors are JSON {"error": <code>, "message": <text>}: 401 for a missing or wrong token, 404 for
// an unknown instance or route, 400 for a malformed request, 413 for an output chunk over 8 MiB,
// 500/503 otherwise. A report for an instance the server already wrote off (its Slurm job was
// cancelled, its node declared dead) is answered 200 with stop_grace_seconds 0: the node stops
// what it still runs.
//
// Thread-safety: Handle may be called from many threads at once.

#include <string_view>

#include "net/http_server.h"
#include "runtime/slurm/slurm_runtime.h"

namespace kiln::runtime::slurm {

inline constexpr std::string_view kNodePathPrefix = "/_kiln/node/";

class NodeService {
 public:
  // `runtime` is not owned and must outlive the service.
  explicit NodeService(SlurmRuntime* runtime) : runtime_(runtime) {}
  NodeService(const NodeService&) = delete;
  NodeService& operator=(const NodeService&) = delete;

  // Answers one request whose raw_path starts with kNodePathPrefix.
  void Handle(net::HttpRequest& request, net::ResponseWriter& response);

 private:
  SlurmRuntime* runtime_;
};

}  // namespace kiln::runtime::slurm
