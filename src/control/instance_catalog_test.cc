#include "control/instance_catalog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using ::testing::HasSubstr;

struct Row {
  const char* type;
  int vcpus;
  double memory_gib;
  int gpus;
  const char* gpu_model;
  bool training, hosting, transform, processing;
};

// spec/limits.md §8, every row, transcribed.
const Row kLimitsTable[] = {
    {"ml.t2.medium", 2, 4, 0, "", false, true, false, false},
    {"ml.t3.medium", 2, 4, 0, "", true, false, false, true},
    {"ml.m4.xlarge", 4, 16, 0, "", true, true, true, true},
    {"ml.m5.large", 2, 8, 0, "", true, true, true, true},
    {"ml.m5.xlarge", 4, 16, 0, "", true, true, true, true},
    {"ml.m5.2xlarge", 8, 32, 0, "", true, true, true, true},
    {"ml.m5.4xlarge", 16, 64, 0, "", true, true, true, true},
    {"ml.m5.12xlarge", 48, 192, 0, "", true, true, true, true},
    {"ml.m5.24xlarge", 96, 384, 0, "", true, true, true, true},
    {"ml.m5d.large", 2, 8, 0, "", false, true, false, false},
    {"ml.m5d.xlarge", 4, 16, 0, "", false, true, false, false},
    {"ml.m5d.2xlarge", 8, 32, 0, "", false, true, false, false},
    {"ml.m5d.4xlarge", 16, 64, 0, "", false, true, false, false},
    {"ml.m5d.12xlarge", 48, 192, 0, "", false, true, false, false},
    {"ml.m5d.24xlarge", 96, 384, 0, "", false, true, false, false},
    {"ml.c5.xlarge", 4, 8, 0, "", true, true, true, true},
    {"ml.c5.2xlarge", 8, 16, 0, "", true, true, true, true},
    {"ml.c5.4xlarge", 16, 32, 0, "", true, true, true, true},
    {"ml.c5.9xlarge", 36, 72, 0, "", true, true, true, true},
    {"ml.c5.18xlarge", 72, 144, 0, "", true, true, true, true},
    {"ml.c5d.xlarge", 4, 8, 0, "", false, true, false, false},
    {"ml.c5d.2xlarge", 8, 16, 0, "", false, true, false, false},
    {"ml.c5d.4xlarge", 16, 32, 0, "", false, true, false, false},
    {"ml.c5d.9xlarge", 36, 72, 0, "", false, true, false, false},
    {"ml.c5d.18xlarge", 72, 144, 0, "", false, true, false, false},
    {"ml.c5n.18xlarge", 72, 192, 0, "", true, false, false, false},
    {"ml.p2.xlarge", 4, 61, 1, "NVIDIA K80", true, true, true, true},
    {"ml.g4dn.xlarge", 4, 16, 1, "NVIDIA T4", true, true, true, true},
    {"ml.g4dn.2xlarge", 8, 32, 1, "NVIDIA T4", true, true, true, true},
    {"ml.g4dn.4xlarge", 16, 64, 1, "NVIDIA T4", true, true, true, true},
    {"ml.g4dn.8xlarge", 32, 128, 1, "NVIDIA T4", true, true, true, true},
    {"ml.g4dn.12xlarge", 48, 192, 4, "NVIDIA T4", true, true, true, true},
    {"ml.g4dn.16xlarge", 64, 256, 1, "NVIDIA T4", true, true, true, true},
    {"ml.g5.xlarge", 4, 16, 1, "NVIDIA A10G", true, true, true, true},
    {"ml.g5.2xlarge", 8, 32, 1, "NVIDIA A10G", true, true, true, true},
    {"ml.g5.4xlarge", 16, 64, 1, "NVIDIA A10G", true, true, true, true},
    {"ml.g5.8xlarge", 32, 128, 1, "NVIDIA A10G", true, true, true, true},
    {"ml.g5.12xlarge", 48, 192, 4, "NVIDIA A10G", true, true, true, true},
    {"ml.g5.16xlarge", 64, 256, 1, "NVIDIA A10G", true, true, true, true},
    {"ml.g5.24xlarge", 96, 384, 4, "NVIDIA A10G", true, true, true, true},
    {"ml.g5.48xlarge", 192, 768, 8, "NVIDIA A10G", true, true, true, true},
    {"ml.g6.xlarge", 4, 16, 1, "NVIDIA L4", true, true, true, true},
    {"ml.g6.12xlarge", 48, 192, 4, "NVIDIA L4", true, true, true, true},
    {"ml.g6.48xlarge", 192, 768, 8, "NVIDIA L4", true, true, true, true},
    {"ml.p3.2xlarge", 8, 61, 1, "NVIDIA V100", true, true, true, true},
    {"ml.p3.8xlarge", 32, 244, 4, "NVIDIA V100", true, true, true, true},
    {"ml.p3.16xlarge", 64, 488, 8, "NVIDIA V100", true, true, true, true},
    {"ml.p3dn.24xlarge", 96, 768, 8, "NVIDIA V100", true, false, false, false},
    {"ml.p4d.24xlarge", 96, 1152, 8, "NVIDIA A100", true, true, false, false},
    {"ml.p4de.24xlarge", 96, 1152, 8, "NVIDIA A100", true, true, false, false},
    {"ml.p5.48xlarge", 192, 2048, 8, "NVIDIA H100", true, true, false, false},
    {"ml.trn1.2xlarge", 8, 32, 0, "", true, true, true, false},
    {"ml.trn1.32xlarge", 128, 512, 0, "", true, true, true, false},
    {"ml.inf1.xlarge", 4, 8, 0, "", false, true, false, false},
};

TEST(InstanceCatalogTest, BuiltInHasEveryRowOfTheSpecTable) {
  const InstanceCatalog& catalog = InstanceCatalog::BuiltIn();
  EXPECT_EQ(catalog.shapes().size(), std::size(kLimitsTable));
  for (const Row& row : kLimitsTable) {
    const InstanceShape* shape = catalog.Find(row.type);
    ASSERT_NE(shape, nullptr) << row.type;
    EXPECT_EQ(shape->type, row.type);
    EXPECT_EQ(shape->vcpus, row.vcpus) << row.type;
    EXPECT_DOUBLE_EQ(shape->memory_gib, row.memory_gib) << row.type;
    EXPECT_EQ(shape->gpus, row.gpus) << row.type;
    EXPECT_EQ(shape->gpu_model, row.gpu_model) << row.type;
    EXPECT_EQ(shape->training, row.training) << row.type;
    EXPECT_EQ(shape->hosting, row.hosting) << row.type;
    EXPECT_EQ(shape->transform, row.transform) << row.type;
    EXPECT_EQ(shape->processing, row.processing) << row.type;
  }
}

TEST(InstanceCatalogTest, SpotChecks) {
  const InstanceCatalog& catalog = InstanceCatalog::BuiltIn();
  const InstanceShape* p4d = catalog.Find("ml.p4d.24xlarge");
  ASSERT_NE(p4d, nullptr);
  EXPECT_EQ(p4d->vcpus, 96);
  EXPECT_EQ(p4d->memory_gib, 1152);
  EXPECT_EQ(p4d->gpus, 8);
  EXPECT_EQ(p4d->gpu_model, "NVIDIA A100");
  EXPECT_EQ(p4d->gpu_memory_gib, 40);
  EXPECT_EQ(p4d->nvme_disks, 8);
  EXPECT_EQ(p4d->nvme_disk_gb, 1000);
  EXPECT_THAT(p4d->interconnect, ::testing::ElementsAre("NVSwitch", "EFA"));
  EXPECT_TRUE(p4d->training);
  EXPECT_TRUE(p4d->hosting);
  EXPECT_FALSE(p4d->transform);
  EXPECT_FALSE(p4d->processing);

  const InstanceShape* g5 = catalog.Find("ml.g5.12xlarge");
  ASSERT_NE(g5, nullptr);
  EXPECT_EQ(g5->vcpus, 48);
  EXPECT_EQ(g5->memory_bytes(), 192ull << 30);
  EXPECT_EQ(g5->gpus, 4);
  EXPECT_EQ(g5->gpu_model, "NVIDIA A10G");
  EXPECT_EQ(g5->gpu_memory_gib, 24);
  EXPECT_EQ(g5->nvme_disks, 1);
  EXPECT_EQ(g5->nvme_disk_gb, 3800);

  const InstanceShape* t2 = catalog.Find("ml.t2.medium");
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(t2->vcpus, 2);
  EXPECT_EQ(t2->memory_gib, 4);
  EXPECT_FALSE(t2->training);
  EXPECT_TRUE(t2->hosting);

  const InstanceShape* m5 = catalog.Find("ml.m5.large");
  ASSERT_NE(m5, nullptr);
  EXPECT_EQ(m5->vcpus, 2);
  EXPECT_EQ(m5->memory_bytes(), 8ull << 30);
  EXPECT_EQ(m5->gpus, 0);

  const InstanceShape* trn = catalog.Find("ml.trn1.2xlarge");
  ASSERT_NE(trn, nullptr);
  EXPECT_EQ(trn->gpus, 0);
  EXPECT_EQ(trn->accelerators, "1 Trainium, 2 NeuronCores");
  EXPECT_FALSE(trn->processing);

  const InstanceShape* p3 = catalog.Find("ml.p3.2xlarge");
  ASSERT_NE(p3, nullptr);
  EXPECT_EQ(p3->memory_gib, 61);
  EXPECT_EQ(p3->gpu_model, "NVIDIA V100");

  EXPECT_EQ(catalog.Find("ml.m5.huge"), nullptr);
  EXPECT_EQ(catalog.Find(""), nullptr);
}

TEST(InstanceCatalogTest, OperatorFileExtendsAndOverrides) {
  auto doc = nlohmann::json::parse(R"({
    "_comment": "lab boxes",
    "instance_types": [
      {"type": "ml.g5.xlarge", "memory_gib": 12, "gpu_model": "NVIDIA RTX 4090"},
      {"type": "ml.lab.gpu", "vcpus": 6, "memory_gib": 30.5, "gpus": 2, "gpu_model": "NVIDIA L40S",
       "training": true, "hosting": false}
    ]})");
  Result<InstanceCatalog> catalog = InstanceCatalog::FromJson(doc, &InstanceCatalog::BuiltIn());
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
  EXPECT_EQ(catalog->shapes().size(), std::size(kLimitsTable) + 1);
  const InstanceShape* g5 = catalog->Find("ml.g5.xlarge");
  ASSERT_NE(g5, nullptr);
  EXPECT_EQ(g5->memory_gib, 12);  // overridden
  EXPECT_EQ(g5->vcpus, 4);        // kept from the built-in row
  EXPECT_EQ(g5->gpus, 1);
  EXPECT_EQ(g5->gpu_model, "NVIDIA RTX 4090");
  const InstanceShape* lab = catalog->Find("ml.lab.gpu");
  ASSERT_NE(lab, nullptr);
  EXPECT_EQ(lab->memory_gib, 30.5);
  EXPECT_EQ(lab->memory_bytes(), static_cast<uint64_t>(30.5 * (1ull << 30)));
  EXPECT_TRUE(lab->training);
  EXPECT_FALSE(lab->hosting);
  EXPECT_TRUE(lab->transform);  // unnamed flags of a new type default to true
  // The built-in catalog itself is unchanged.
  EXPECT_EQ(InstanceCatalog::BuiltIn().Find("ml.g5.xlarge")->memory_gib, 16);
  EXPECT_EQ(InstanceCatalog::BuiltIn().Find("ml.lab.gpu"), nullptr);
}

TEST(InstanceCatalogTest, RejectsMalformedRows) {
  auto error = [](const char* text) {
    Result<InstanceCatalog> c = InstanceCatalog::FromJson(nlohmann::json::parse(text), &InstanceCatalog::BuiltIn());
    EXPECT_FALSE(c.ok()) << text;
    return c.ok() ? std::string() : c.status().message();
  };
  EXPECT_THAT(error(R"([{"type": "ml.new", "memory_gib": 4}])"), HasSubstr("vcpus: is required"));
  EXPECT_THAT(error(R"([{"type": "ml.new", "vcpus": 0, "memory_gib": 4}])"), HasSubstr("vcpus: must be at least 1"));
  EXPECT_THAT(error(R"([{"type": "ml.new", "vcpus": 2, "memory_gib": -1}])"), HasSubstr("memory_gib"));
  EXPECT_THAT(error(R"([{"type": "ml.m5.large", "gpus": "one"}])"), HasSubstr("(ml.m5.large).gpus"));
  EXPECT_THAT(error(R"([{"type": "ml.m5.large", "vcpu": 2}])"), HasSubstr("unknown field \"vcpu\""));
  EXPECT_THAT(error(R"([{"vcpus": 2}])"), HasSubstr("type"));
  EXPECT_THAT(
      error(R"([{"type": "ml.x", "vcpus": 1, "memory_gib": 1}, {"type": "ml.x", "vcpus": 1, "memory_gib": 1}])"),
      HasSubstr("duplicate"));
  EXPECT_THAT(error(R"({"types": []})"), HasSubstr("instance_types"));
}

TEST(InstanceCatalogTest, Formatting) {
  EXPECT_EQ(FormatGiB(8ull << 30), "8 GiB");
  EXPECT_EQ(FormatGiB((23ull << 30) + (1ull << 29)), "23.5 GiB");
  EXPECT_EQ(DescribeResources(48, 192ull << 30, 4), "48 vCPUs, 192 GiB, 4 GPUs");
  EXPECT_EQ(DescribeResources(1, 4ull << 30, 0), "1 vCPU, 4 GiB");
  EXPECT_EQ(DescribeResources(2, 4ull << 30, 0, true), "2 vCPUs, 4 GiB, 0 GPUs");
}

}  // namespace
}  // namespace kiln::control
