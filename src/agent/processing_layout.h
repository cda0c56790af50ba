#pragma once
// The /opt/ml tree of a processing host (training-contract.md §17).
//
//   /opt/ml/config/processingjobconfig.json   the stored CreateProcessingJob request with
//                                             ProcessingJobArn; the members of §17 always present
//                                             (explicit nulls when absent), then any others
//   /opt/ml/config/resourceconfig.json        {"current_host": "algo-1", "hosts": [...sorted]}
//   /opt/ml/output/                           where the program may write `message` / `failure`
//   every S3Input.LocalPath and S3Output.LocalPath (under /opt/ml/processing/), created empty
//   /opt/ml/.kiln/bin/                        (script-mode images only, WriteInterpreterShims)
//                                             python, python3, pip, pip3 running the
//                                             environment's interpreter
//
// `opt_ml` is the HOST directory bound at /opt/ml (as in training_layout.h). Config files are
// written compactly, mode 0444, atomically. Functions are stateless and thread-safe.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::agent {

// processingjobconfig.json's content: ProcessingJobArn, ProcessingJobName, AppSpecification,
// Environment, NetworkConfig, ProcessingInputs, ProcessingOutputConfig, ProcessingResources,
// RoleArn, StoppingCondition (in that order; null when the request lacks one), then the request's
// other members in name order (ExperimentConfig, ...).
std::string ProcessingJobConfigJson(const nlohmann::json& request, const std::string& job_arn);

// resourceconfig.json's content: current_host and the hosts sorted as the ShardedByS3Key
// positions count them.
std::string ProcessingResourceConfigJson(const std::string& current_host, std::vector<std::string> hosts);

// Creates config/ and output/ under `opt_ml`, every input and output LocalPath, and writes both
// config files. Existing content is kept (a restart rewrites the config files only). Errors:
// InvalidArgument "ClientError: ..." for a LocalPath outside /opt/ml; file-system errors.
Status WriteProcessingLayout(const std::string& opt_ml, const nlohmann::json& request, const std::string& job_arn,
                             const std::string& current_host, const std::vector<std::string>& hosts);

// Where WriteInterpreterShims puts its commands inside the sandbox; a script-mode host's PATH
// starts with it (processing_launch.h).
inline constexpr std::string_view kProcessingShimDir = "/opt/ml/.kiln/bin";

// A framework image has `python`, `python3` and `pip` on its PATH, and the SDK's processors call
// them by name: the FrameworkProcessor family's runproc.sh runs `python <script>` under /bin/bash.
// A script-mode host (an environment's interpreter instead of the image) gets the same: small
// /bin/sh scripts in <opt_ml>/.kiln/bin exec'ing `interpreter` ("pip"/"pip3": `interpreter -m
// pip`). Scripts rather than symlinks, so that a virtualenv's interpreter still finds its
// pyvenv.cfg. `interpreter` must be absolute (InvalidArgument otherwise). Existing shims are
// replaced; file-system errors are returned as they are.
Status WriteInterpreterShims(const std::string& opt_ml, const std::string& interpreter);

// ExitMessage (§17): the hosts' /opt/ml/output/message files (host paths of /opt/ml, lowest host
// first; a missing file counts as empty) concatenated, then cut to its first 1024 bytes (never
// inside a UTF-8 sequence). "" when no host wrote one. A message that is not valid UTF-8 is the
// program's fault: InvalidArgument "ClientError: ..." naming the host's file (`host_names[i]`
// names opt_ml_dirs[i]; may be shorter).
Result<std::string> ReadExitMessage(const std::vector<std::string>& opt_ml_dirs,
                                    const std::vector<std::string>& host_names = {});

}  // namespace kiln::agent
