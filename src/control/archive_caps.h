#pragma once
// Archive caps (issue 9): how much one model.tar.gz or sourcedir.tar.gz may unpack to on an
// instance, from the storage the instance would have on SageMaker (a gzip bomb otherwise fills
// the node's disk).
//
//   training job   ResourceConfig.VolumeSizeInGB; on an instance type with local NVMe storage
//                  (where SageMaker ignores VolumeSizeInGB and uses the NVMe), the NVMe total
//   endpoint       the production variant's VolumeSizeInGB when set; else the type's NVMe total;
//                  else ArchiveCapOptions::default_endpoint_volume_gib (AWS publishes no per-type
//                  default hosting volume for Kiln to copy)
//   operator       ArchiveCapOptions::max_unpacked_bytes (server config "archives":
//                  {"max_unpacked_mib": N}) replaces the derived cap for every archive when set
// Every archive is also bounded to max_entries members ("archives": {"max_entries": N}).
// GB in the API is read as GiB. Each cap carries the sentence that says where it came from and
// how to raise it, for the FailureReason (agent/unpack_cap.h).
//
// Thread-safety: free functions over values.

#include <cstdint>

#include <nlohmann/json.hpp>

#include "agent/unpack_cap.h"
#include "control/instance_catalog.h"

namespace kiln::control {

struct ArchiveCapOptions {
  // Operator-wide cap on unpacked bytes, replacing the volume-derived one; 0: derive it.
  uint64_t max_unpacked_bytes = 0;
  // Members per archive. Raising it lets an archive spend more inodes and time on tiny files.
  uint64_t max_entries = 1'000'000;
  // The volume assumed for an endpoint variant without VolumeSizeInGB on a type without NVMe.
  int default_endpoint_volume_gib = 30;
  // Where NVMe sizes come from; nullptr: InstanceCatalog::BuiltIn(). Must outlive the caller.
  const InstanceCatalog* catalog = nullptr;
};

// The cap for sagemaker_submit_directory of a training job (`request`: the stored
// CreateTrainingJob request).
agent::UnpackCap SourceDirCap(const nlohmann::json& request, const ArchiveCapOptions& options);

// The cap for the model data of one production variant (`variant`: its ProductionVariant as
// stored in the endpoint config).
agent::UnpackCap ModelDataCap(const nlohmann::json& variant, const ArchiveCapOptions& options);

}  // namespace kiln::control
