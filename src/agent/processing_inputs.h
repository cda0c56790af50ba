#pragma once
// Processing job inputs (training-contract.md §17 "Inputs"): one ProcessingInput's S3Input staged
// into its LocalPath (File mode), and the same input in the shape of a training channel, so that
// the channel machinery (staging.h's selection and sharding, pipe_feeder.h's FIFOs) serves it
// unchanged.
//
//   selection     S3Prefix / ManifestFile exactly as a training channel (staging.h): the local
//                 layout under LocalPath is the channel layout of §6.2.
//   distribution  FullyReplicated / ShardedByS3Key as §6.4 (host_index = position in the sorted
//                 hosts list).
//   compression   S3CompressionType Gzip: AWS allows it with Pipe only (the API says so); should
//                 a File input carry it, each object is decompressed while it is downloaded and
//                 stored under its own relative path (no suffix is stripped), as Pipe streams it.
//
// Functions are thread-safe (no shared state).

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/staging.h"
#include "agent/transfer.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

// The ProcessingInput `input` (with an S3Input) as an InputDataConfig element named
// `channel_name`: {"ChannelName", "InputMode" (S3InputMode, default File), "CompressionType"
// (S3CompressionType, default None), "DataSource": {"S3DataSource": {"S3DataType", "S3Uri",
// "S3DataDistributionType"}}}. An input without an S3Input gives a channel without DataSource
// (selection then fails with "ClientError: ...").
nlohmann::json ProcessingInputChannel(const nlohmann::json& input, const std::string& channel_name);

struct InputStagingReport {
  uint64_t objects = 0;
  uint64_t bytes = 0;  // bytes written (decompressed bytes for Gzip)
};

// Downloads this host's share of `input`'s S3Input (File mode) into `local_dir` (the host path of
// its LocalPath; created when missing) through `options.parallelism` workers. `role_arn` only
// appears in error messages. Errors: the selection's ("ClientError: No S3 objects found ..."),
// ObjectError's for an object, DataLoss-turned-"ClientError: ..." for a corrupt gzip object,
// file-system errors; Aborted when `cancel` is set. Partial files may remain (never a torn file
// under its final name).
Result<InputStagingReport> StageProcessingInput(objects::ObjectStore& store, const nlohmann::json& input,
                                                const std::string& role_arn, int host_index, int host_count,
                                                const std::string& local_dir, const CancelFlag& cancel,
                                                const StageOptions& options = {});

}  // namespace kiln::agent
