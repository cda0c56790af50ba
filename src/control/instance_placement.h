#pragma once
// What controllers put into runtime::InstanceSpec for backends that allocate instances on other
// machines (the Slurm runtime, runtime/slurm/): scheduler hints from a resource's tags and the
// wall-clock limit from its StoppingCondition. Backends running on this machine ignore both.
//
// Thread-safety: pure functions.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/training_job_repository.h"

namespace kiln::control {

// The tags that steer placement on a Slurm cluster, and the InstanceSpec::placement key each sets.
inline constexpr char kSlurmPartitionTag[] = "kiln:slurm-partition";  // -> "partition"
inline constexpr char kSlurmQosTag[] = "kiln:slurm-qos";              // -> "qos"
inline constexpr char kSlurmAccountTag[] = "kiln:slurm-account";      // -> "account"

// InstanceSpec::placement from `tags` (keys compared exactly; empty values ignored). The runtime
// fills what is absent from its configured defaults.
std::map<std::string, std::string> PlacementFromTags(const std::vector<store::Tag>& tags);

// InstanceSpec::time_limit_seconds for a request with StoppingCondition.MaxRuntimeInSeconds (AWS's
// default 86400 when absent): that, plus the stop grace, plus `margin` for what the node does
// outside the program (downloading /opt/ml, the final push of model/ and output/). Kiln's own
// MaxRuntime stop, which counts from the launch, always comes first; the backend's limit is the
// backstop that frees the allocation if Kiln cannot.
int64_t InstanceTimeLimitSeconds(const nlohmann::json& request, std::chrono::seconds stop_grace,
                                 std::chrono::seconds margin = std::chrono::seconds(300));

}  // namespace kiln::control
