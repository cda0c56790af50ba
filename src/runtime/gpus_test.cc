#include "runtime/gpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace kiln::runtime {
namespace {

TEST(ParseNvidiaSmiCsvTest, ParsesQueryOutput) {
  // nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv,noheader,nounits
  const char* text =
      "1, GPU-7b2f1c9e-0000-1111-2222-333344445555, NVIDIA A10G, 23028, 00000000:00:1C.0\n"
      "0, GPU-8c6d45a1-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA A10G, 23028, 00000000:00:1B.0\n";
  std::vector<GpuInfo> gpus = ParseNvidiaSmiCsv(text);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].uuid, "GPU-8c6d45a1-aaaa-bbbb-cccc-ddddeeeeffff");
  EXPECT_EQ(gpus[0].name, "NVIDIA A10G");
  EXPECT_EQ(gpus[0].memory_bytes, 23028ull * 1024 * 1024);
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:00:1b.0");
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].uuid, "GPU-7b2f1c9e-0000-1111-2222-333344445555");
}

TEST(ParseNvidiaSmiCsvTest, RealH200Output) {
  // Captured on an H200 host with the exact query DiscoverGpus runs.
  std::vector<GpuInfo> gpus =
      ParseNvidiaSmiCsv("0, GPU-c4d2d59e-faa2-dd7d-004b-07edf6f41891, NVIDIA H200, 143771, 00000000:00:06.0\n");
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].uuid, "GPU-c4d2d59e-faa2-dd7d-004b-07edf6f41891");
  EXPECT_EQ(gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(gpus[0].memory_bytes, 150754820096u);
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:00:06.0");
}

TEST(ParseNvidiaSmiCsvTest, FourColumnsAndJunk) {
  // The minimal query (no bus id), a CRLF line, an N/A memory and lines that must be skipped.
  const char* text =
      "0, GPU-aaaa, NVIDIA H200, 143771\r\n"
      "\n"
      "No devices were found\n"
      "x, GPU-bbbb, Tesla T4, 15360\n"
      "2, GPU-cccc, NVIDIA L4, [N/A]\n";
  std::vector<GpuInfo> gpus = ParseNvidiaSmiCsv(text);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(gpus[0].memory_bytes, 143771ull << 20);
  EXPECT_TRUE(gpus[0].pci_bus_id.empty());
  EXPECT_EQ(gpus[0].minor, -1);
  EXPECT_EQ(gpus[1].index, 2);
  EXPECT_EQ(gpus[1].memory_bytes, 0u);
  EXPECT_TRUE(ParseNvidiaSmiCsv("").empty());
}

constexpr const char* kProcInfo =
    "Model: \t\t NVIDIA H100 80GB HBM3\n"
    "IRQ:   \t\t 156\n"
    "GPU UUID: \t GPU-4f3e2d1c-0000-1111-2222-333344445555\n"
    "Video BIOS: \t 96.00.99.00.01\n"
    "Bus Type: \t PCIe\n"
    "DMA Size: \t 52 bits\n"
    "DMA Mask: \t 0xfffffffffffff\n"
    "Bus Location: \t 0000:53:00.0\n"
    "Device Minor: \t 3\n"
    "GPU Excluded:\t No\n";

TEST(ProcGpuTest, ParsesRealH200InformationFile) {
  // /proc/driver/nvidia/gpus/0000:00:06.0/information on the same H200 host (driver 580).
  const char* text =
      "Model: \t\t NVIDIA H200\nIRQ:   \t\t 41\nGPU UUID: \t GPU-c4d2d59e-faa2-dd7d-004b-07edf6f41891\n"
      "Video BIOS: \t 96.00.a5.00.1a\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
      "Bus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n";
  GpuInfo gpu;
  ASSERT_TRUE(ParseProcGpuInformation(text, &gpu));
  EXPECT_EQ(gpu.name, "NVIDIA H200");
  EXPECT_EQ(gpu.uuid, "GPU-c4d2d59e-faa2-dd7d-004b-07edf6f41891");
  EXPECT_EQ(gpu.pci_bus_id, "0000:00:06.0");
  EXPECT_EQ(gpu.minor, 0);
}

TEST(ProcGpuTest, ParsesInformationFile) {
  GpuInfo gpu;
  ASSERT_TRUE(ParseProcGpuInformation(kProcInfo, &gpu));
  EXPECT_EQ(gpu.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpu.uuid, "GPU-4f3e2d1c-0000-1111-2222-333344445555");
  EXPECT_EQ(gpu.pci_bus_id, "0000:53:00.0");
  EXPECT_EQ(gpu.minor, 3);
  EXPECT_FALSE(ParseProcGpuInformation("IRQ: 5\n", &gpu));
}

TEST(ProcGpuTest, ReadsDirectoryInBusOrder) {
  std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "kiln_proc_gpus";
  std::filesystem::remove_all(dir);
  auto write = [&](const std::string& bus, const std::string& uuid, int minor) {
    std::filesystem::create_directories(dir / bus);
    std::ofstream(dir / bus / "information") << "Model: \t NVIDIA A100-SXM4-40GB\nGPU UUID: \t " << uuid
                                             << "\nBus Location: \t " << bus << "\nDevice Minor: \t " << minor << "\n";
  };
  write("0000:90:00.0", "GPU-second", 0);  // minors need not follow bus order
  write("0000:10:00.0", "GPU-first", 1);
  std::vector<GpuInfo> gpus = ReadProcGpus(dir.string());
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].uuid, "GPU-first");
  EXPECT_EQ(gpus[0].minor, 1);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].uuid, "GPU-second");
  EXPECT_TRUE(ReadProcGpus((dir / "missing").string()).empty());
  std::filesystem::remove_all(dir);
}

TEST(PciBusIdTest, Normalizes) {
  EXPECT_EQ(NormalizePciBusId("00000000:19:00.0"), "0000:19:00.0");
  EXPECT_EQ(NormalizePciBusId("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(NormalizePciBusId(" 00000001:02:00.0 "), "0001:02:00.0");
}

TEST(DiscoverGpusTest, NeverFailsAndIndicesAreUnique) {
  // Whatever this host has (often nothing): the call returns, and indices/uuids are distinct.
  std::vector<GpuInfo> gpus = DiscoverGpus(std::chrono::seconds(10));
  std::set<int> indices;
  for (const GpuInfo& gpu : gpus) {
    EXPECT_TRUE(indices.insert(gpu.index).second);
    EXPECT_FALSE(gpu.uuid.empty());
  }
}

TEST(ParseNvidiaSmiUsageCsvTest, ParsesTheUsageQuery) {
  // nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits
  // as captured on an 8-GPU host (two GPUs busy, one reporting [N/A] for utilization).
  const char* text =
      "0, 97, 71234, 81559\n"
      "1, 0, 4, 81559\n"
      "3, [N/A], 40779, 81559\n"
      "2, 45, 0, 81559\n"
      "garbage line\n"
      "4, 12, [N/A], [N/A]\n";
  std::vector<GpuUsage> gpus = ParseNvidiaSmiUsageCsv(text);
  ASSERT_EQ(gpus.size(), 5u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_DOUBLE_EQ(*gpus[0].utilization_percent, 97);
  EXPECT_NEAR(*gpus[0].memory_percent, 71234.0 / 81559.0 * 100.0, 1e-9);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_DOUBLE_EQ(*gpus[1].utilization_percent, 0);
  EXPECT_EQ(gpus[2].index, 2);
  EXPECT_DOUBLE_EQ(*gpus[2].memory_percent, 0);
  EXPECT_EQ(gpus[3].index, 3);
  EXPECT_FALSE(gpus[3].utilization_percent.has_value());
  EXPECT_NEAR(*gpus[3].memory_percent, 50.0, 0.01);
  EXPECT_EQ(gpus[4].index, 4);
  EXPECT_DOUBLE_EQ(*gpus[4].utilization_percent, 12);
  EXPECT_FALSE(gpus[4].memory_percent.has_value());
}

TEST(ParseNvidiaSmiUsageCsvTest, RefusesNegativeAndOutOfRangeValues) {
  std::vector<GpuUsage> gpus = ParseNvidiaSmiUsageCsv("-1, 5, 1, 2\n0, -5, 3, 0\n1, 250, 90, 80\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_FALSE(gpus[0].utilization_percent.has_value());
  EXPECT_FALSE(gpus[0].memory_percent.has_value());  // total 0
  EXPECT_DOUBLE_EQ(*gpus[1].utilization_percent, 100);
  EXPECT_DOUBLE_EQ(*gpus[1].memory_percent, 100);
}

TEST(SampleGpuUsageTest, RunsTheConfiguredCommand) {
  Result<std::vector<GpuUsage>> gpus =
      SampleGpuUsage({"/bin/sh", "-c", "printf '0, 37, 1024, 4096\\n1, 5, 0, 4096\\n'"});
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_DOUBLE_EQ(*(*gpus)[0].utilization_percent, 37);
  EXPECT_DOUBLE_EQ(*(*gpus)[0].memory_percent, 25);
}

TEST(SampleGpuUsageTest, MissingFailingAndHangingCommands) {
  EXPECT_EQ(SampleGpuUsage({"kiln-no-such-nvidia-smi"}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(SampleGpuUsage({"/nonexistent/nvidia-smi"}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(SampleGpuUsage({"/bin/sh", "-c", "exit 9"}).status().code(), StatusCode::kUnavailable);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(SampleGpuUsage({"/bin/sh", "-c", "exec sleep 30"}, std::chrono::milliseconds(200)).status().code(),
            StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace kiln::runtime
