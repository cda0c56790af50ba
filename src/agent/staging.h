#pragma once
// Input channel selection and File / FastFile staging (training-contract.md §6.1, §6.2, §6.4).
//
// Selection (shared with Pipe mode, pipe_feeder.h):
//   S3Prefix      every object whose key starts with the prefix, except folder markers (keys
//                 ending in '/'); local path = PrefixRelativePath(key, prefix): the key minus
//                 the prefix, then minus any leading '/', so "s3://b/data/train" and
//                 "s3://b/data/train/" give the same layout (§6.2, the rule of SageMaker Local
//                 Mode's download_folder; Session.upload_data returns prefixes without the '/').
//   ManifestFile  the object is a JSON array [{"prefix": "s3://b/p/"}, "rel/1", ...]; entry
//                 "rel/1" is object prefix+"rel/1" stored at <channel>/rel/1.
//   ShardedByS3Key  entries sorted by key; entry i goes to the host at position i mod N of the
//                 sorted hosts list. An empty share is allowed (warned), an empty selection is
//                 not: "ClientError: No S3 objects found under S3 URL ..." (AWS wording).
// Every local path is confined to the channel directory: keys whose relative part contains a
// ".." component (or is empty) fail with "ClientError: ...".
//
// File mode downloads every selected object to <opt_ml>/input/data/<channel>/<rel> through a
// pool of `parallelism` workers, each streaming one object at a time through a fixed buffer into
// a temp file renamed into place once its size is verified.
//
// FastFile on the process runtime: Kiln has no FUSE file system here, so a FastFile channel is
// staged exactly like File, then every staged file is made read-only (chmod a-w), which is what a
// container sees of FastFile's read-only mount. The channel is complete before the program
// starts (no lazy fetching).
//
// Pipe channels, FileSystemDataSource channels and channels restricted by InstanceGroupNames
// to other groups are skipped here and listed in the report.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/transfer.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

// One object selected for a channel.
struct SelectedObject {
  std::string bucket;
  std::string key;
  std::string rel_path;  // confined, normalised path under the channel directory
  // Size from the listing; nullopt for manifest entries (known when the object is opened).
  std::optional<uint64_t> size;
  // ETag from the listing (empty for manifest entries): with the size, what makes a file kept by a
  // warm pool reusable for the same object.
  std::string etag;
};

// The objects of `channel` (an InputDataConfig element with an S3DataSource), in key order,
// before sharding. `role_arn` only appears in error messages.
// Errors: InvalidArgument "ClientError: ..." (bad URI, empty selection, missing bucket, bad or
// missing manifest, unsafe key); the store's errors as "InternalServerError: ...".
Result<std::vector<SelectedObject>> SelectChannelObjects(objects::ObjectStore& store, const nlohmann::json& channel,
                                                         const std::string& role_arn);

// The local path of object `key` selected by S3Prefix `prefix` (key starts with prefix), before
// confinement: the key minus the prefix, then minus any leading '/'s; a key equal to the prefix
// (the prefix names one object) gives its base name. Examples with prefix "data/train":
//   "data/train/a/1.csv" -> "a/1.csv"    "data/train" -> "train"    "data/train.lst" -> ".lst"
std::string_view PrefixRelativePath(std::string_view key, std::string_view prefix);

// The share of `objects` (already in the wanted order) that host `host_index` of `host_count`
// gets under `distribution` ("FullyReplicated" or "ShardedByS3Key").
std::vector<SelectedObject> ShardObjects(const std::vector<SelectedObject>& objects, const std::string& distribution,
                                         int host_index, int host_count);

struct StageOptions {
  // Objects downloaded at the same time. More helps remote stores with many small objects.
  int parallelism = 8;
  // Copy buffer per worker.
  size_t buffer_size = 1 << 20;
  // This host's instance group; channels whose S3DataSource.InstanceGroupNames does not list
  // it are skipped. Empty: no restriction is applied.
  std::string instance_group;
  // A warm pool's kept input files (training-contract.md §19): the staged-files manifest of the
  // job that kept the host (WriteStagedManifest). An object listed there with the same bucket,
  // key, ETag and size, whose file is still the one staged (a regular file with the recorded
  // size, inode, modification and change times: the job did not change it) and lies under the
  // manifest's directory, is moved into place (mode 0644) instead of downloaded. Empty, or a missing
  // or unreadable manifest: everything is downloaded.
  std::string reuse_manifest;
};

// A file StageChannels put in place for an object with an ETag (listed, not manifest-named).
struct StagedFile {
  std::string bucket;
  std::string key;
  std::string etag;
  uint64_t size = 0;
  std::string path;  // absolute, under <opt_ml>/input/data/<channel>/
  // The file as staged (after FastFile's chmod): a kept file is reused only when all three still
  // hold. The inode change time cannot be set from user space, so an edit whose mtime was put
  // back is still seen.
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
};

struct ChannelReport {
  std::string name;
  std::string mode;     // File / FastFile / Pipe / skipped reason
  bool staged = false;  // false: skipped (Pipe, FileSystemDataSource, other group)
  uint64_t objects = 0;
  uint64_t bytes = 0;
};

struct StagingReport {
  std::vector<ChannelReport> channels;
  uint64_t objects = 0;
  uint64_t bytes = 0;
  uint64_t reused_objects = 0;  // of `objects`: moved from StageOptions::reuse_manifest
  uint64_t reused_bytes = 0;    // of `bytes`
  std::vector<StagedFile> files;
  double elapsed_seconds = 0;
  double BytesPerSecond() const { return elapsed_seconds > 0 ? static_cast<double>(bytes) / elapsed_seconds : 0; }
};

// Stages every File and FastFile channel of `request` for host `host_index` (position in the
// sorted hosts list) of `host_count` into <opt_ml>/input/data/<channel>/. Blocks until done.
// On error the first failure is returned (other workers stop) and partial files may remain in
// the channel directories (never a torn file under its final name). `cancel` stops the work:
// Aborted. Thread-safe with respect to other calls (no shared state).
// Writes `files` as a staged-files manifest (JSON, temp file + rename) for StageOptions::reuse_manifest.
Status WriteStagedManifest(const std::string& path, const std::vector<StagedFile>& files);
// Moves a kept manifest's files (and the manifest) under `to`: every path that starts with
// `from` + "/" is rewritten to start with `to`. Used when a warm pool's directory moves.
Status RebaseStagedManifest(const std::string& manifest_path, const std::string& from, const std::string& to);

Result<StagingReport> StageChannels(objects::ObjectStore& store, const nlohmann::json& request, int host_index,
                                    int host_count, const std::string& opt_ml, const CancelFlag& cancel,
                                    const StageOptions& options = {});

}  // namespace kiln::agent
