#pragma once
// Remote-access target names (spec remote-access.md R-13; /work/notes/issue16-design.md "Targets").
// The server parses them; the CLI passes the user's text through unchanged.
//
// A target names one instance a connection enters. Accepted forms:
//   training-job/<job>/algo-<n>          canonical
//   training-job/<job>                   algo-1
//   sagemaker-training-job:<job>_algo-<n> AWS's SSM target alias
//   algo-<n>.<job>.training.kiln         the `ProxyCommand ... %h` host form
//   <job>                                algo-1 of the training job <job> (or, when no such job
//                                        exists, the endpoint <job>: `bare` is set)
//   arn:aws:sagemaker:<r>:<a>:training-job/<job>   algo-1
//   endpoint/<ep>/<variant>/<instance-id>
//   endpoint/<ep>/<variant>              the variant's first InService instance
//   endpoint/<ep>                        the endpoint's first InService instance
//   arn:aws:sagemaker:<r>:<a>:endpoint/<ep>
// Job, endpoint and variant names follow SageMaker's pattern ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}
// (so '_', '.' and '/' never occur inside one and the forms above are unambiguous); host numbers
// are 1..9999 without leading zeros; instance ids are [A-Za-z0-9._-]{1,128}.
//
// A resource (the targets and connections routes) is a training job or endpoint: `<name>`,
// `training-job/<job>`, `endpoint/<ep>`, or its ARN.
//
// Pure functions; thread-safe.

#include <string>
#include <string_view>

#include "base/status.h"

namespace kiln::access {

enum class ResourceKind { kTrainingJob, kEndpoint };

struct ResourceRef {
  ResourceKind kind = ResourceKind::kTrainingJob;
  std::string name;
  // Named by a bare name: resolve as a training job first, then as an endpoint.
  bool bare = false;
};

struct Target {
  ResourceRef resource;
  // Training jobs: the host number n of algo-<n> (1 when the text named none).
  int host = 1;
  // Endpoints: empty when the text named none (the first InService instance is meant).
  std::string variant;
  std::string instance_id;

  // training-job/<job>/algo-<n>, endpoint/<ep>/<variant>/<instance-id> (as far as known).
  std::string Canonical() const;
  // AWS's alias (sagemaker-training-job:<job>_algo-<n>); endpoints: the canonical form.
  std::string Alias() const;
  // algo-<n> for a training host; the instance id for an endpoint instance.
  std::string HostName() const;
};

// InvalidArgument (message says which forms are accepted) for anything else.
Result<Target> ParseTarget(std::string_view text);
// InvalidArgument for anything that names no training job or endpoint.
Result<ResourceRef> ParseResource(std::string_view text);

// SageMaker's resource-name pattern ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}.
bool IsResourceName(std::string_view name);

}  // namespace kiln::access
