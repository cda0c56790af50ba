#pragma once
// How an endpoint instance's container is started: the command line, the environment and the
// extra binds on the process runtime, or the image and command on the container engine
// (serving-contract.md §2, §4.1). A pure function of the model's
// container definition, the image's resolution and what Kiln issued, so every rule is
// unit-tested without running anything.
//
//   command     `local:` images: `<executable> serve` (as `docker run IMAGE serve`). Framework
//               images (script mode): Kiln's model server, `<model_server> serve`, whose Python
//               workers run the user's inference.py with the environment's interpreter
//               (src/modelserver/README.md). Container images (the engine runs the image
//               itself): the image's ENTRYPOINT with `serve` (`docker run IMAGE serve`).
//   environment nothing inherited from the server: a base PATH/HOME/LANG, the environment table's
//               variables, the model server's KILN_MODEL_SERVER_* (framework images), Kiln's region
//               and endpoint variables, the container's Environment, then (winning over it) the
//               instance credentials and the bind port and safe port range. GPU variables are
//               added per instance by the caller (AddGpuEnvironment). Container images: the same
//               without the base PATH/HOME/LANG (the image's own apply), and no binds.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aws/credentials.h"
#include "runtime/environments.h"
#include "runtime/runtime.h"

namespace kiln::control {

struct ServingLaunchContext {
  std::string region;
  std::string endpoint_url;  // Kiln as the instances reach it
  aws::Credential credential;
  // SAGEMAKER_BIND_TO_PORT; the rest of the block is SAGEMAKER_SAFE_PORT_RANGE. Host mode: the
  // instances share the node's network, so each gets a block of its own. Namespaced (a network
  // namespace per instance): 8080 for every instance, the range 8081-8179 inside its namespace.
  int port = 8080;
  int port_block = 100;
  std::string model_server;  // the kiln-model-server binary
  std::string serve_worker;  // python/kiln_toolkit/serve_worker.py
};

struct ServingLaunchPlan {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  // Read-only binds of host paths under /tmp the program needs (the sandbox's /tmp is private).
  std::vector<runtime::BindMount> binds;
  // Set for ImageResolution::Kind::kContainerImage: what InstanceSpec::container gets (the
  // requested URI; no reference: the runtime maps it; the image's own ENTRYPOINT).
  std::optional<runtime::ContainerImage> container;
};

// The CPUs container `index` of `count` on one instance gets (serving-contract.md §2 Resources:
// equal shares): a contiguous slice of `cpus`, the first `cpus.size() % count` slices one longer;
// all of `cpus` when there are fewer CPUs than containers (they then share them) or one container.
std::vector<int> MultiContainerCpus(const std::vector<int>& cpus, size_t index, size_t count);

// `container` is the model's ContainerDefinition (Image, Environment, ...); `image` its resolution.
ServingLaunchPlan PlanServingLaunch(const nlohmann::json& container, const runtime::ImageResolution& image,
                                    const ServingLaunchContext& context);

}  // namespace kiln::control
