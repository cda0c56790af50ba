#pragma once
// MultiModelFetcher: the disk tier's source for multi-model endpoints (serving/multi_model.h,
// spec/serving-contract.md §7.3 step 2) over the node's object store, so that serving/ stays free
// of objects/ and agent/ (DESIGN.md §3). One object, ModelDataUrl + TargetModel, a gzip tar,
// unpacked by agent::PrepareModelData exactly as a single-model endpoint's ModelDataUrl (member
// rules, archive cache by ETag under `cache_dir`, the unpack cap).
//
// Thread-safety: Fetch may be called concurrently (the manager runs one job per instance and
// model; archive cache entries are written temp-file + rename).

#include <string>

#include "agent/unpack_cap.h"
#include "objects/object_store.h"
#include "serving/multi_model.h"

namespace kiln::control {

class MultiModelFetcher final : public serving::ModelArtifactFetcher {
 public:
  // `store` must outlive the fetcher; `cache_dir` may be empty (no archive cache).
  MultiModelFetcher(objects::ObjectStore* store, std::string cache_dir, agent::UnpackCap cap = agent::UnpackCap())
      : store_(store), cache_dir_(std::move(cache_dir)), cap_(cap) {}

  // serving::ModelArtifactFetcher. NotFound when the bucket or the object does not exist (HEAD
  // first); InvalidArgument "ClientError: ..." for a bad URI or an unsafe archive; the store's
  // and the disk's errors otherwise. `dir` exists afterwards only on success.
  Status Fetch(const std::string& s3_uri, const std::string& dir) override;

 private:
  objects::ObjectStore* const store_;
  const std::string cache_dir_;
  const agent::UnpackCap cap_;
};

}  // namespace kiln::control
