#pragma once
// Image references, registry mirrors and credentials, and making an image present in the engine
// (runtime/docker/, Runtime::PrepareImage).
//
// References follow Docker's grammar: [registry[:port]/]repository[:tag][@digest]; a first path
// component is a registry when it contains '.' or ':' or is "localhost". No registry means Docker
// Hub ("docker.io", library/ for single names), as the engines do.
//
// ECR-style URIs (<account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repo>[:tag]) cannot be pulled
// without AWS credentials for that registry; Kiln maps them to the operator's mirror:
//   mirror "registry.local:5000/ecr"  ->  registry.local:5000/ecr/<repo>[:tag]
// and, when the mirror is not set, uses the URI as it is (present locally, or the pull fails and
// says to set container_engine.ecr_mirror).
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "runtime/docker/engine.h"
#include "runtime/runtime.h"

namespace kiln::runtime::docker {

struct ImageReference {
  std::string registry;    // "docker.io", "localhost", "registry.local:5000", "123.dkr.ecr..."
  std::string repository;  // "library/ubuntu", "byo/train"
  std::string tag;         // "latest" when neither tag nor digest was given
  std::string digest;      // "sha256:..." or ""
  // The canonical text: registry/repository:tag or registry/repository@digest.
  std::string ToString() const;
  bool ecr() const;
};

// InvalidArgument with what is wrong for malformed references (empty, upper case repository,
// bad tag, spaces).
Result<ImageReference> ParseImageReference(const std::string& text);

struct RegistryCredential {
  std::string username;
  std::string password;  // or an identity token
};

struct ImageSettings {
  std::string ecr_mirror;                                // "" = none
  std::map<std::string, RegistryCredential> registries;  // by registry host[:port]
};

// The reference the engine runs for a request's image URI (mirror applied); its InvalidArgument
// says what is wrong with the URI.
Result<std::string> EngineReference(const std::string& image_uri, const ImageSettings& settings);

// X-Registry-Auth for `registry`: base64url of {"username","password","serveraddress"}; "" when no
// credential is configured for it.
std::string RegistryAuthHeader(const std::string& registry, const ImageSettings& settings);

// Present already (InspectImage): OK at once, no progress. Else PullImage with the registry's
// credentials, reporting `progress` texts (layers done of total, bytes, at most every 500 ms).
// Errors name the requested URI, the reference tried and the engine's answer, e.g.
//   NotFound "image 123.dkr.ecr.us-east-1.amazonaws.com/byo:1 is not in the container engine
//   (unix:///run/podman/podman.sock) and pulling registry.local:5000/ecr/byo:1 failed: manifest
//   unknown. Build or load the image on this node (podman build -t ...), or push it to the mirror."
Status EnsureImage(Engine& engine, const ContainerImage& image, const ImageSettings& settings,
                   const std::function<void(const std::string&)>& progress, const std::function<bool()>& cancelled);

}  // namespace kiln::runtime::docker
