#pragma once
// How a processing host's program is started (training-contract.md §17 "Invocation",
// "Environment"): a pure function of the request, the image's resolution and what Kiln issued,
// so that every rule is unit-tested without running anything. The plan has the shape of a
// training host's (training_launch.h) and the run launches it the same way.
//
//   command     Container images (the engine runs the image): `docker run [--entrypoint E]
//               IMAGE [arguments]` — the image's own ENTRYPOINT and CMD when the request names
//               neither; ContainerEntrypoint replaces the ENTRYPOINT (and, as Docker does, drops
//               the image's CMD); ContainerArguments replace the CMD. Never a `train` argument.
//               `local:` images: the executable is the image's entrypoint: `<executable>
//               [arguments]`, or ContainerEntrypoint + arguments. Framework images run by an
//               environment (script mode, e.g. the SDK's SKLearnProcessor: ContainerEntrypoint
//               ["python3", "/opt/ml/processing/input/code/x.py"]): ContainerEntrypoint +
//               arguments, where a bare `python`/`python3` as the program is the environment's
//               interpreter (so the operator's virtualenv runs the script); without
//               ContainerEntrypoint the arguments alone are the command; with neither there is
//               nothing to run (the image's own entrypoint is not available on the process
//               runtime): ClientError saying so.
//   environment nothing inherited from the server: (not for container images) a base
//               PATH/HOME/LANG (script mode: PATH starts with agent::kProcessingShimDir, where
//               `python`, `python3`, `pip` run the environment's interpreter), then the environment table's variables,
//               Kiln's region and endpoint variables (§5.1), the request's Environment, and the credentials (winning
//               over the request). No TRAINING_JOB_* variables, no KILN_RSH_TOKEN. GPU variables per host come from
//               AddGpuEnvironment (training_launch.h).
//   binds       host paths under /tmp the program needs (BindIfInTmp); none for container images.

#include <string>

#include <nlohmann/json.hpp>

#include "aws/credentials.h"
#include "base/status.h"
#include "control/training_launch.h"
#include "runtime/environments.h"

namespace kiln::control {

struct ProcessingLaunchContext {
  std::string region;
  std::string endpoint_url;    // Kiln as the instances reach it
  aws::Credential credential;  // the job's instance credentials
};

// The same plan as a training host's (argv, working_dir, env, binds, container).
using ProcessingLaunchPlan = TrainingLaunchPlan;

// Errors: InvalidArgument "ClientError: ..." when there is no command (see above).
Result<ProcessingLaunchPlan> PlanProcessingLaunch(const nlohmann::json& request, const runtime::ImageResolution& image,
                                                  const ProcessingLaunchContext& context);

}  // namespace kiln::control
