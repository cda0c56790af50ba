#pragma once
// Model data for an endpoint instance (spec/serving-contract.md §3): fills the instance's
// /opt/ml/model from a ContainerDefinition before the container starts.
//
//   ModelDataUrl "s3://b/k.tar.gz"                          gzip tar, extracted into model_dir
//   ModelDataSource.S3DataSource {S3DataType S3Object,
//                                 CompressionType Gzip}     same
//   ModelDataSource.S3DataSource {S3DataType S3Prefix,
//                                 CompressionType None}     every object under the prefix (which
//                                                           ends with "/") copied to
//                                                           model_dir/<key relative to it>
//   neither                                                 model_dir exists and stays empty
//
// Safety: no member may land outside model_dir. Leading '/'s of member names are dropped as GNU
// tar and Python's tarfile do (the SDK's repack_model writes a root member "/" and
// "/code/inference.py"). An archive containing a ".." component, a symlink whose target is
// absolute or resolves outside model_dir, a hard link whose target resolves outside it, or a
// device/FIFO member is refused as a whole: the call fails with InvalidArgument
// "ClientError: ..." naming the object and the offending member, and model_dir is left empty
// (extraction goes to a staging directory beside it that is renamed into place only on
// success). Prefix keys are confined the same way.
//
// Cache: archives are kept under cache_dir by bucket/key/ETag, so a second instance of the same
// model (or a replacement) extracts from the local copy without reading the store again. Entries
// are written temp-file + rename; concurrent callers for the same object are safe.
//
// Cap: an archive (either gzip form) is bounded by `cap` (unpack_cap.h): one that unpacks to more
// fails with InvalidArgument "ClientError: ModelDataUrl s3://b/k unpacks to more than 10 GiB
// <cap.bytes_origin>. ..." as soon as the next write would pass the cap, and model_dir stays
// empty (the staging directory is removed). Prefix and single-object sources are what is stored
// and are not capped.
//
// Errors: InvalidArgument "ClientError: ..." (missing object, unsafe or unreadable archive, bad
// URI, over the cap); DeadlineExceeded when `cancel` was raised (the caller's
// ModelDataDownloadTimeout); ResourceExhausted when the disk is full.
//
// Thread-safety: free functions; concurrent calls for different model_dirs are safe.

#include <string>

#include <nlohmann/json.hpp>

#include "agent/transfer.h"
#include "agent/unpack_cap.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

struct ModelDataResult {
  uint64_t files = 0;      // regular files written under model_dir
  uint64_t bytes = 0;      // their total size
  bool cache_hit = false;  // the archive came from cache_dir
};

// `container`: one ContainerDefinition of a CreateModel request (PrimaryContainer or an entry of
// Containers), as stored. `model_dir` must not exist yet or be empty. `cache_dir` may be empty
// (no caching). `cancel` may be null. `cap` bounds archives (default: unbounded).
Result<ModelDataResult> PrepareModelData(objects::ObjectStore& store, const nlohmann::json& container,
                                         const std::string& model_dir, const std::string& cache_dir,
                                         const CancelFlag* cancel, const UnpackCap& cap = UnpackCap());

}  // namespace kiln::agent
