#pragma once
// Warm pools (ResourceConfig.KeepAlivePeriodInSeconds; training-contract.md §19; issue 18): the
// rules a training job's kept hosts follow, as pure functions. The training controller keeps the
// pools (their grants, expiry, reuse); the run keeps and takes their directories.
//
// On Kiln a warm pool is the finished job's grant (CPUs, memory, GPUs: reserved for the next
// matching job, so it starts without waiting in line) and what its hosts staged: the input files
// (reused by the next job's staging for the same objects, by ETag and size) and the persistent
// cache directory /opt/ml/sagemaker/warmpoolcache (SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY),
// kept exactly as the job left it. Everything else of the hosts is wiped, as SageMaker wipes a
// pool's volume.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::control {

// Inside every instance of a job with a keep-alive period (AWS's path and variable).
inline constexpr char kWarmPoolCacheDirectory[] = "/opt/ml/sagemaker/warmpoolcache";
inline constexpr char kWarmPoolCacheVariable[] = "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY";
inline constexpr char kWarmPoolCacheUnderOptMl[] = "sagemaker/warmpoolcache";  // the same, under /opt/ml
// Beside a host's opt_ml: the staged-files manifest (agent::WriteStagedManifest) of its inputs.
inline constexpr char kStagedInputs[] = "staged-inputs.json";
// A pool may be handed from job to job for at most this long after the first of them kept it
// (AWS's maximum warm pool duration, 28 days; the spec's 7 days predates it).
inline constexpr int64_t kMaxWarmPoolChainMillis = 28LL * 24 * 3600 * 1000;

// ResourceConfig.KeepAlivePeriodInSeconds, or 0.
int64_t KeepAliveSeconds(const nlohmann::json& request);

// The scheduler id a kept pool's grant is held under (job names cannot contain '/').
std::string WarmPoolGrantId(const std::string& job);
// The job of a WarmPoolGrantId, or "" when `grant_id` is not a pool's.
std::string WarmPoolJobOfGrant(const std::string& grant_id);

// Whether a job asking `next` may take the pool kept by a job that asked `kept` (§19): RoleArn,
// InstanceCount, InstanceType, VolumeKmsKeyId, VolumeSizeInGB, VpcConfig,
// EnableInterContainerTrafficEncryption and EnableNetworkIsolation all equal (absent flags are
// false), and `next` asks for a keep-alive period itself, as AWS requires of a matching job.
bool WarmPoolMatches(const nlohmann::json& kept, const nlohmann::json& next);

// When a pool kept at `from_millis` for `keep_alive_seconds` ends: the period, cut at the chain's
// maximum (kMaxWarmPoolChainMillis after `chain_start_millis`).
int64_t WarmPoolExpiry(int64_t from_millis, int64_t keep_alive_seconds, int64_t chain_start_millis);

}  // namespace kiln::control
