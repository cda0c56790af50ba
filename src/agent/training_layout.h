#pragma once
// The /opt/ml tree of a training host (training-contract.md §3, §4).
//
// `opt_ml` everywhere in this module is the HOST directory that the runtime binds at /opt/ml in
// that host's sandbox. The configuration files are written compactly (no whitespace), with
// members in the order of the contract's tables (§4.2, §4.3), each with mode 0444, atomically.
// Functions here are stateless and thread-safe.

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::agent {

inline constexpr std::string_view kOptMl = "/opt/ml";
inline constexpr std::string_view kHomogeneousCluster = "homogeneousCluster";

struct InstanceGroupLayout {
  std::string name;  // InstanceGroupName
  std::string instance_type;
  std::vector<std::string> hosts;  // any order; written sorted
};

// Where one host sits in the job's cluster (resourceconfig.json, §4.3).
struct HostLayout {
  std::string current_host;        // "algo-1"
  std::vector<std::string> hosts;  // all hosts of the job; any order, written sorted
  std::string instance_type;       // this host's instance type
  std::string current_group_name = std::string(kHomogeneousCluster);
  // Empty: one group `homogeneousCluster` with every host and `instance_type`.
  std::vector<InstanceGroupLayout> instance_groups;

  // Position of current_host in the lexicographically sorted `hosts` (the ShardedByS3Key
  // position, §6.4); -1 when absent.
  int ShardIndex() const;
};

// The layout of every host of a (validated) CreateTrainingJob request, from
// ResourceConfig.{InstanceCount, InstanceType} or ResourceConfig.InstanceGroups (hosts numbered
// across groups in group order, §4.3). Result index i is host "algo-<i+1>".
std::vector<HostLayout> HostLayoutsForRequest(const nlohmann::json& request);

// Creates the /opt/ml tree of §3 under `opt_ml` (input/config, input/data, code, model, output,
// output/data, checkpoints and CheckpointConfig.LocalPath) and writes hyperparameters.json,
// inputdataconfig.json, resourceconfig.json and, when the request carries them,
// debughookconfig.json / tensorboardoutputconfig.json / profilerconfig.json. Existing content
// is kept (a restart rewrites the config files only). Errors: InvalidArgument "ClientError: ..."
// for a LocalPath outside /opt/ml; file-system errors.
Status WriteTrainingLayout(const std::string& opt_ml, const nlohmann::json& request, const HostLayout& host);

// The file contents WriteTrainingLayout writes (exposed for tests and for an SM_* precompute).
std::string HyperparametersJson(const nlohmann::json& request);
std::string InputDataConfigJson(const nlohmann::json& request);
std::string ResourceConfigJson(const HostLayout& host);

// Input mode of channel `channel` (an InputDataConfig element): Channel.InputMode, else
// AlgorithmSpecification.TrainingInputMode, else "File".
std::string ChannelInputMode(const nlohmann::json& request, const nlohmann::json& channel);

// Maps an absolute sandbox path at or under /opt/ml (e.g. CheckpointConfig.LocalPath) to the host
// path under `opt_ml`, lexically normalised (no trailing '/'). Errors: InvalidArgument
// "ClientError: ..." when the path is relative or outside /opt/ml (also via "..").
Result<std::string> SandboxPathToHost(const std::string& opt_ml, std::string_view sandbox_path);

// CheckpointConfig.LocalPath with its default "/opt/ml/checkpoints".
std::string CheckpointLocalPath(const nlohmann::json& request);

}  // namespace kiln::agent
