#pragma once
// InstanceCatalog: the `ml.*` instance-type shapes (spec/limits.md §8) that size every instance.
//
// The catalog is data: data/instance-types.json is compiled into the binary (BuiltIn()), and an
// operator file of the same form extends or overrides it (FromJson with the built-in as base).
// Nothing else in Kiln hard-codes instance shapes.
//
// File form (a bare list of rows is accepted too):
//   {"instance_types": [
//      {"type": "ml.g5.12xlarge", "vcpus": 48, "memory_gib": 192, "gpus": 4,
//       "gpu_model": "NVIDIA A10G", "gpu_memory_gib": 24, "local_nvme": {"disks": 1, "disk_gb": 3800},
//       "training": true, "hosting": true, "transform": true, "processing": true}, ...]}
// Optional row fields: gpu_model, gpu_memory_gib, accelerators (text, e.g. "1 Trainium, 2
// NeuronCores"), interconnect (list of strings), local_nvme. Keys starting with '_' are comments.
//
// Thread-safety: an InstanceCatalog is an immutable value after construction; BuiltIn() is
// initialised once, thread-safely.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::control {

struct InstanceShape {
  std::string type;  // "ml.m5.large"
  int vcpus = 0;
  double memory_gib = 0;
  int gpus = 0;                           // NVIDIA GPUs; Trainium/Inferentia devices are not counted
  std::string gpu_model;                  // "NVIDIA A10G"; empty without GPUs
  int gpu_memory_gib = 0;                 // per GPU; 0 without GPUs
  std::string accelerators;               // other accelerators, as text; empty if none
  std::vector<std::string> interconnect;  // "NVLink", "NVSwitch", "EFA"
  int nvme_disks = 0;                     // local instance storage (AWS ignores VolumeSizeInGB for training)
  int nvme_disk_gb = 0;
  // Which API enums accept the type (the AWS model).
  bool training = false, hosting = false, transform = false, processing = false;

  uint64_t memory_bytes() const;
};

class InstanceCatalog {
 public:
  InstanceCatalog() = default;

  // The catalog compiled into the binary (data/instance-types.json). Crashes at first use if that
  // data does not parse: it is part of the build, and a unit test parses it.
  static const InstanceCatalog& BuiltIn();

  // Parses a catalog document. With `base`, the result is `base` extended by the document: a row
  // whose type exists in `base` overrides only the fields it names (e.g. {"type":
  // "ml.g5.xlarge", "memory_gib": 12}); a new type needs vcpus and memory_gib, and its API flags
  // default to true (validation still intersects with the AWS enums). InvalidArgument naming the
  // row and field for malformed input (wrong types, vcpus < 1, memory <= 0, gpus < 0, duplicate
  // types in one document, unknown fields).
  static Result<InstanceCatalog> FromJson(const nlohmann::json& doc, const InstanceCatalog* base = nullptr);

  // nullptr if the type is unknown to Kiln. The pointer lives as long as the catalog. Besides the
  // catalog's rows, Find knows the serverless shapes (ServerlessInstanceType), which no catalog
  // file can change: their size is the ServerlessConfig's, not an operator's choice.
  const InstanceShape* Find(std::string_view type) const;

  // Every shape, in document order (base rows first).
  const std::vector<InstanceShape>& shapes() const { return shapes_; }

 private:
  std::vector<InstanceShape> shapes_;
  std::map<std::string, size_t, std::less<>> by_type_;  // type -> index into shapes_
};

// The shape of a serverless variant's instance (serving-contract.md §12): MemorySizeInMB of
// memory and 1 vCPU per 1024 MB. "ml.serverless.<MemorySizeInMB>" for 1024, 2048, ..., 6144 (the
// values CreateEndpointConfig accepts); the name is Kiln's, never an API value (instances log it).
std::string ServerlessInstanceType(int64_t memory_mb);

// "48 vCPUs, 192 GiB, 4 GPUs" (GPUs omitted when 0). Used in scheduler messages.
std::string DescribeResources(int vcpus, uint64_t memory_bytes, int gpus, bool always_gpus = false);
// Bytes as GiB for messages: "8 GiB", "23.5 GiB".
std::string FormatGiB(uint64_t bytes);

}  // namespace kiln::control
