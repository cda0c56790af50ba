#include "control/archive_caps.h"

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using nlohmann::json;

constexpr uint64_t kGiB = 1ull << 30;

json TrainingRequest(const std::string& type, int volume_gb) {
  return {{"ResourceConfig", {{"InstanceType", type}, {"InstanceCount", 1}, {"VolumeSizeInGB", volume_gb}}}};
}

TEST(ArchiveCapsTest, SourceDirFromVolumeSize) {
  agent::UnpackCap cap = SourceDirCap(TrainingRequest("ml.m5.large", 10), ArchiveCapOptions());
  EXPECT_EQ(cap.max_bytes, 10 * kGiB);
  EXPECT_EQ(cap.max_entries, 1'000'000u);
  EXPECT_EQ(cap.bytes_origin,
            "(the cap from ResourceConfig.VolumeSizeInGB 10); please raise VolumeSizeInGB or make the source "
            "directory smaller");
  EXPECT_NE(cap.entries_origin.find("archives.max_entries"), std::string::npos);
}

TEST(ArchiveCapsTest, SourceDirOnNvmeUsesTheInstanceStorage) {
  // SageMaker ignores VolumeSizeInGB on types with local NVMe storage (ml.g4dn.xlarge: 125 GB).
  agent::UnpackCap cap = SourceDirCap(TrainingRequest("ml.g4dn.xlarge", 1), ArchiveCapOptions());
  EXPECT_EQ(cap.max_bytes, 125 * kGiB);
  EXPECT_NE(cap.bytes_origin.find("125 GB of local NVMe storage of ml.g4dn.xlarge"), std::string::npos)
      << cap.bytes_origin;
  // An operator catalog that gives the type no NVMe falls back to the volume.
  auto catalog = InstanceCatalog::FromJson(
      json{{"instance_types", {{{"type", "ml.g4dn.xlarge"}, {"local_nvme", nullptr}}}}}, &InstanceCatalog::BuiltIn());
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
  ArchiveCapOptions options;
  options.catalog = &*catalog;
  EXPECT_EQ(SourceDirCap(TrainingRequest("ml.g4dn.xlarge", 3), options).max_bytes, 3 * kGiB);
}

TEST(ArchiveCapsTest, SourceDirOfInstanceGroups) {
  json request = {
      {"ResourceConfig",
       {{"VolumeSizeInGB", 7},
        {"InstanceGroups", {{{"InstanceType", "ml.m5.xlarge"}, {"InstanceCount", 1}, {"InstanceGroupName", "a"}}}}}}};
  EXPECT_EQ(SourceDirCap(request, ArchiveCapOptions()).max_bytes, 7 * kGiB);
  // Nothing to derive from: no byte cap, the entry cap stays.
  agent::UnpackCap none = SourceDirCap(json::object(), ArchiveCapOptions());
  EXPECT_EQ(none.max_bytes, 0u);
  EXPECT_EQ(none.max_entries, 1'000'000u);
}

TEST(ArchiveCapsTest, ModelDataFromVariantVolumeNvmeOrDefault) {
  json variant = {{"VariantName", "AllTraffic"}, {"InstanceType", "ml.m5.large"}, {"VolumeSizeInGB", 10}};
  agent::UnpackCap cap = ModelDataCap(variant, ArchiveCapOptions());
  EXPECT_EQ(cap.max_bytes, 10 * kGiB);
  EXPECT_EQ(cap.bytes_origin,
            "(the cap from the variant's VolumeSizeInGB 10); please raise VolumeSizeInGB of production variant "
            "AllTraffic (at most 512) or make the model archive smaller");
  variant.erase("VolumeSizeInGB");
  cap = ModelDataCap(variant, ArchiveCapOptions());
  EXPECT_EQ(cap.max_bytes, 30 * kGiB);
  EXPECT_EQ(cap.bytes_origin,
            "(Kiln's default cap for production variant AllTraffic on ml.m5.large without VolumeSizeInGB, 30 GB); "
            "please set VolumeSizeInGB on the production variant (at most 512) or make the model archive smaller");
  ArchiveCapOptions small_default;
  small_default.default_endpoint_volume_gib = 4;
  EXPECT_EQ(ModelDataCap(variant, small_default).max_bytes, 4 * kGiB);
  variant["InstanceType"] = "ml.m5d.4xlarge";  // 2 x 300 GB NVMe
  cap = ModelDataCap(variant, ArchiveCapOptions());
  EXPECT_EQ(cap.max_bytes, 600 * kGiB);
  EXPECT_NE(cap.bytes_origin.find("600 GB of local NVMe storage of ml.m5d.4xlarge"), std::string::npos);
  // A variant's own VolumeSizeInGB wins over the NVMe size.
  variant["VolumeSizeInGB"] = 20;
  EXPECT_EQ(ModelDataCap(variant, ArchiveCapOptions()).max_bytes, 20 * kGiB);
}

TEST(ArchiveCapsTest, OperatorCapReplacesTheDerivedOne) {
  ArchiveCapOptions options;
  options.max_unpacked_bytes = 8 << 20;
  options.max_entries = 50;
  json variant = {{"VariantName", "v"}, {"InstanceType", "ml.m5.large"}, {"VolumeSizeInGB", 10}};
  for (const agent::UnpackCap& cap :
       {ModelDataCap(variant, options), SourceDirCap(TrainingRequest("ml.m5.large", 10), options)}) {
    EXPECT_EQ(cap.max_bytes, 8u << 20);
    EXPECT_EQ(cap.max_entries, 50u);
    EXPECT_NE(cap.bytes_origin.find("archives.max_unpacked_mib"), std::string::npos) << cap.bytes_origin;
  }
}

}  // namespace
}  // namespace kiln::control
