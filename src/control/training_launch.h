#pragma once
// How a training host's program is started: the command line, the working directory, the
// environment and the extra binds on the process runtime, or the image, entrypoint and command on
// the container engine (training-contract.md §2, §5.1, §13). Pure
// functions of the request, the image's resolution and what Kiln issued, so that every rule can
// be unit-tested without running anything.
//
//   command     `local:` images: `<executable> train` (the image's entrypoint with `train`, as
//               `docker run IMAGE train`); ContainerEntrypoint replaces the executable, and
//               ContainerArguments replace `train`. Script-mode images (no ENTRYPOINT, `train`
//               is the toolkit): `<interpreter> <toolkit>`; ContainerArguments alone become the
//               command, ContainerEntrypoint (+ arguments) replaces it. Container images (the
//               engine runs the image itself): the image's ENTRYPOINT (or ContainerEntrypoint,
//               then with no arguments unless ContainerArguments are given, §2) with `train` or
//               ContainerArguments as its command; the image's WORKDIR.
//   environment nothing inherited from the server: a base PATH/HOME/LANG, the environment
//               table's variables, Kiln's region and endpoint variables, the request's
//               Environment, then (winning over it) the credentials and TRAINING_JOB_*; GPU
//               variables per host (AddGpuEnvironment). KILN_RSH_TOKEN (RshToken) for the MPI
//               remote launch (python/kiln_toolkit/kiln_rsh.py) between the job's hosts.
//               Container images: the same without the base PATH/HOME/LANG (the image's own
//               apply), and no binds (nothing of the host is run).

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "aws/credentials.h"
#include "control/scheduler.h"
#include "runtime/environments.h"
#include "runtime/runtime.h"

namespace kiln::control {

struct TrainingLaunchContext {
  std::string job_name;
  std::string job_arn;
  std::string region;
  std::string endpoint_url;    // Kiln as the instances reach it
  std::string toolkit_script;  // python/kiln_toolkit/train.py
  aws::Credential credential;  // the job's instance credentials
};

struct TrainingLaunchPlan {
  // With `container`: the container's command (CMD), possibly empty (ContainerEntrypoint alone).
  std::vector<std::string> argv;
  std::string working_dir;  // empty with `container`: the image's WORKDIR
  std::map<std::string, std::string> env;
  // Read-only binds of host paths under /tmp the program needs (the sandbox's /tmp is private).
  std::vector<runtime::BindMount> binds;
  // Set for ImageResolution::Kind::kContainerImage: what InstanceSpec::container gets (the
  // requested URI, no reference: the runtime maps it, and ContainerEntrypoint when given).
  std::optional<runtime::ContainerImage> container;
};

TrainingLaunchPlan PlanTrainingLaunch(const nlohmann::json& request, const runtime::ImageResolution& image,
                                      const TrainingLaunchContext& context);

// The secret the hosts of one job share to authenticate the MPI remote launch (kiln_rsh.py on
// port 7022; DESIGN.md §6): 64 lower-case hex characters, HMAC-SHA256 of "kiln-rsh" under the
// job's credential secret, so it is the same on every host and after a restart (the credential is
// kept in the job's state), differs between jobs, and does not reveal the secret.
std::string RshToken(const aws::Credential& credential);

// The sandbox has a private /tmp: a host path under /tmp the program needs (a `local:`
// executable, the toolkit, the model server, an interpreter in a temporary venv) is bound in
// read-only, by its first directory under /tmp (so that files beside it come along). Other paths
// add nothing; a directory already bound is not bound twice.
void BindIfInTmp(const std::string& path, std::vector<runtime::BindMount>& binds);

// GPU variables of one host (§13, process runtime): CUDA_VISIBLE_DEVICES with the indices and
// NVIDIA_VISIBLE_DEVICES with the UUIDs (indices when unknown); "void" when it has none.
void AddGpuEnvironment(const Allocation& allocation, std::map<std::string, std::string>& env);

// /etc/hosts of a job's sandboxes on the process runtime: the hosts share the node's network, so
// every algo-N is 127.0.0.1.
std::vector<std::string> HostsFileLines(const std::vector<std::string>& hosts);

// /etc/hosts of namespaced instances (each has its own network and address): localhost, then one
// line "<address> <name>" per (name, address), e.g. {"algo-2", "10.213.12.3"}.
std::vector<std::string> NamespacedHostsFileLines(
    const std::vector<std::pair<std::string, std::string>>& names_and_addresses);

// The ports a namespaced instance must reach on the node's loopback: Kiln's own endpoint
// (`endpoint_url`, as the instances are told it) when it names 127.0.0.1, ::1 or localhost, so
// that AWS_ENDPOINT_URL works unchanged inside the namespace. Empty otherwise (an endpoint on a
// routable address is reached through the gateway).
std::vector<int> LoopbackForwards(const std::string& endpoint_url);

}  // namespace kiln::control
