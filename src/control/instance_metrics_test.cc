#include "control/instance_metrics.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "base/mutex.h"
#include "runtime/process/usage.h"
#include "store/test_util/temp_database.h"

namespace kiln::control {
namespace {

using observe::Dimensions;
using observe::SeriesPoint;

// A runtime whose only real method is Usage: per instance, CPU time grows at `cpu_rate` CPUs
// (0.5 = half a core) of real time since it was added, or is set by hand.
class FakeRuntime : public runtime::Runtime {
 public:
  struct Instance {
    double cpu_rate = 0;
    std::optional<uint64_t> fixed_cpu_usec{};
    uint64_t memory_bytes = 0;
    uint64_t memory_limit_bytes = 0;
    std::vector<int> gpus{};
    std::string source = "proc";
    bool running = true;
    std::chrono::steady_clock::time_point added = std::chrono::steady_clock::now();
  };
  void Set(const std::string& id, Instance instance) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    instances_[id] = std::move(instance);
  }
  template <typename F>
  void Edit(const std::string& id, F f) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    f(instances_.at(id));
  }
  int usage_calls() const { return usage_calls_.load(); }

  Result<runtime::InstanceUsage> Usage(const std::string& id) override EXCLUDES(mu_) {
    ++usage_calls_;
    MutexLock lock(mu_);
    auto it = instances_.find(id);
    if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
    const Instance& in = it->second;
    if (!in.running) return Status::FailedPrecondition("instance " + id + " is not running");
    runtime::InstanceUsage u;
    if (in.fixed_cpu_usec) {
      u.cpu_usec = *in.fixed_cpu_usec;
    } else {
      auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - in.added);
      u.cpu_usec = static_cast<uint64_t>(static_cast<double>(elapsed.count()) * in.cpu_rate);
    }
    u.memory_bytes = in.memory_bytes;
    u.memory_limit_bytes = in.memory_limit_bytes;
    u.gpus = in.gpus;
    u.source = in.source;
    return u;
  }

  Status Launch(const runtime::InstanceSpec&) override { return Status::Unimplemented("fake"); }
  Result<runtime::InstanceStatus> Inspect(const std::string&) override { return Status::Unimplemented("fake"); }
  Status Signal(const std::string&, int) override { return Status::Unimplemented("fake"); }
  Status Stop(const std::string&, std::chrono::seconds) override { return Status::Unimplemented("fake"); }
  Result<runtime::InstanceStatus> Wait(const std::string&, std::chrono::milliseconds) override {
    return Status::Unimplemented("fake");
  }
  std::string OutputPath(const std::string&) const override { return ""; }
  Result<std::vector<std::string>> List() override { return std::vector<std::string>{}; }
  Status Remove(const std::string&) override { return Status::Unimplemented("fake"); }

 private:
  mutable Mutex mu_;
  std::map<std::string, Instance> instances_ GUARDED_BY(mu_);
  std::atomic<int> usage_calls_{0};
};

constexpr uint64_t kMiB = 1024 * 1024;
constexpr char kTrainingNs[] = "/aws/sagemaker/TrainingJobs";
constexpr char kEndpointNs[] = "/aws/sagemaker/Endpoints";

class InstanceMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    store_ = std::make_unique<observe::MetricStore>(db_.get());
    options_.host_memory_bytes = 4096 * kMiB;
    options_.gpu_sampler = [this]() -> Result<std::vector<runtime::GpuUsage>> {
      ++gpu_calls_;
      if (!gpu_ok_) return Status::NotFound("nvidia-smi is not installed");
      std::vector<runtime::GpuUsage> gpus;
      for (int i = 0; i < 4; ++i) gpus.push_back({i, 10.0 * (i + 1), 5.0 * (i + 1)});
      gpus[2].utilization_percent.reset();  // [N/A]
      return gpus;
    };
  }
  std::unique_ptr<InstanceMetrics> Make() {
    return std::make_unique<InstanceMetrics>(options_, &runtime_, store_.get());
  }
  std::vector<SeriesPoint> Points(const char* ns, const std::string& name, const Dimensions& dims) {
    auto points = store_->Query(ns, name, dims, 0, INT64_MAX);
    EXPECT_TRUE(points.ok()) << points.status().ToString();
    return points.value_or(std::vector<SeriesPoint>{});
  }
  // What df says for `dir`.
  static double DfPercent(const std::string& dir) {
    struct statvfs st;
    EXPECT_EQ(statvfs(dir.c_str(), &st), 0);
    double used = static_cast<double>(st.f_blocks - st.f_bfree), avail = static_cast<double>(st.f_bavail);
    return used / (used + avail) * 100.0;
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> store_;
  FakeRuntime runtime_;
  InstanceMetricsOptions options_;
  std::atomic<int> gpu_calls_{0};
  std::atomic<bool> gpu_ok_{true};
};

TEST_F(InstanceMetricsTest, TrainingHostGetsCpuMemoryAndDiskUnderItsHost) {
  runtime_.Set("job-1-algo-1", {.cpu_rate = 1.5, .memory_bytes = 256 * kMiB, .memory_limit_bytes = 1024 * kMiB});
  auto metrics = Make();
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("job-1-algo-1", "job-1", "algo-1", dir_.path())).ok());
  const Dimensions host = {{"Host", "job-1/algo-1"}};

  // First sample: a CPU baseline only, so memory and disk.
  EXPECT_EQ(metrics->TEST_SampleOnce(), 2u);
  EXPECT_TRUE(Points(kTrainingNs, "CPUUtilization", host).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(metrics->TEST_SampleOnce(), 3u);

  std::vector<SeriesPoint> cpu = Points(kTrainingNs, "CPUUtilization", host);
  ASSERT_EQ(cpu.size(), 1u);
  // 1.5 CPUs busy = 150 %, unless this host has fewer CPUs than that (then capped at 100 × CPUs).
  double expected = std::min(150.0, 100.0 * std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_NEAR(cpu[0].value, expected, 8.0);
  std::vector<SeriesPoint> memory = Points(kTrainingNs, "MemoryUtilization", host);
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_DOUBLE_EQ(memory[1].value, 25.0);
  std::vector<SeriesPoint> disk = Points(kTrainingNs, "DiskUtilization", host);
  ASSERT_EQ(disk.size(), 2u);
  EXPECT_NEAR(disk[1].value, DfPercent(dir_.path()), 1.0);
  EXPECT_GT(disk[1].value, 0.0);
  // Nothing under other dimension sets, no GPU metrics for a host without GPUs.
  EXPECT_TRUE(Points(kTrainingNs, "CPUUtilization", {{"TrainingJobName", "job-1"}}).empty());
  EXPECT_TRUE(Points(kTrainingNs, "GPUUtilization", host).empty());
  EXPECT_EQ(gpu_calls_.load(), 0);  // nvidia-smi is not run when no instance has GPUs
  // The points' timestamps are the sampling times.
  EXPECT_GE(memory[1].timestamp_millis - memory[0].timestamp_millis, 250);
}

TEST_F(InstanceMetricsTest, EndpointVariantSeriesAggregatesItsInstancesAndHostIsPerInstance) {
  runtime_.Set("endpoint-ep-a", {.cpu_rate = 0.25, .memory_bytes = 1024 * kMiB});  // no limit: host memory
  runtime_.Set("endpoint-ep-b", {.cpu_rate = 0.75, .memory_bytes = 2048 * kMiB});
  auto metrics = Make();
  ASSERT_TRUE(
      metrics->Track(EndpointInstanceMetricsTarget("endpoint-ep-a", "ep", "AllTraffic", "i-a", dir_.path())).ok());
  ASSERT_TRUE(metrics->Track(EndpointInstanceMetricsTarget("endpoint-ep-b", "ep", "AllTraffic", "i-b", "")).ok());
  metrics->TEST_SampleOnce();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  metrics->TEST_SampleOnce();

  const Dimensions variant = {{"EndpointName", "ep"}, {"VariantName", "AllTraffic"}};
  std::vector<SeriesPoint> cpu = Points(kEndpointNs, "CPUUtilization", variant);
  ASSERT_EQ(cpu.size(), 2u);  // one point per instance per round
  std::vector<double> values = {cpu[0].value, cpu[1].value};
  std::sort(values.begin(), values.end());
  EXPECT_NEAR(values[0], 25.0, 6.0);
  EXPECT_NEAR(values[1], 75.0, 6.0);
  std::vector<SeriesPoint> memory = Points(kEndpointNs, "MemoryUtilization", variant);
  ASSERT_EQ(memory.size(), 4u);
  std::vector<SeriesPoint> host_a = Points(kEndpointNs, "MemoryUtilization", {{"Host", "ep/AllTraffic/i-a"}});
  ASSERT_EQ(host_a.size(), 2u);
  EXPECT_DOUBLE_EQ(host_a[0].value, 25.0);  // 1 GiB of the 4 GiB host
  EXPECT_NEAR(Points(kEndpointNs, "CPUUtilization", {{"Host", "ep/AllTraffic/i-b"}}).at(0).value, 75.0, 6.0);
  // Disk only where /opt/ml is known.
  EXPECT_EQ(Points(kEndpointNs, "DiskUtilization", {{"Host", "ep/AllTraffic/i-a"}}).size(), 2u);
  EXPECT_TRUE(Points(kEndpointNs, "DiskUtilization", {{"Host", "ep/AllTraffic/i-b"}}).empty());
  EXPECT_EQ(Points(kEndpointNs, "DiskUtilization", variant).size(), 2u);
  // Nothing in the training namespace.
  EXPECT_TRUE(Points(kTrainingNs, "CPUUtilization", {{"Host", "ep/AllTraffic/i-a"}}).empty());
}

TEST_F(InstanceMetricsTest, GpuMetricsSumTheInstancesGpus) {
  runtime_.Set("gpu", {.memory_bytes = kMiB, .gpus = {1, 2, 3}});
  runtime_.Set("cpu-only", {.memory_bytes = kMiB});
  auto metrics = Make();
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("gpu", "j", "algo-1", "")).ok());
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("cpu-only", "j", "algo-2", "")).ok());
  metrics->TEST_SampleOnce();
  EXPECT_EQ(gpu_calls_.load(), 1);  // once per round, for all instances
  // GPUs 1, 2, 3: utilization 20 + [N/A] + 40; memory 10 + 15 + 20.
  std::vector<SeriesPoint> util = Points(kTrainingNs, "GPUUtilization", {{"Host", "j/algo-1"}});
  ASSERT_EQ(util.size(), 1u);
  EXPECT_DOUBLE_EQ(util[0].value, 60.0);
  std::vector<SeriesPoint> mem = Points(kTrainingNs, "GPUMemoryUtilization", {{"Host", "j/algo-1"}});
  ASSERT_EQ(mem.size(), 1u);
  EXPECT_DOUBLE_EQ(mem[0].value, 45.0);
  EXPECT_TRUE(Points(kTrainingNs, "GPUUtilization", {{"Host", "j/algo-2"}}).empty());

  // No nvidia-smi: the other metrics go on, GPU ones are skipped.
  gpu_ok_ = false;
  metrics->TEST_SampleOnce();
  EXPECT_EQ(Points(kTrainingNs, "GPUUtilization", {{"Host", "j/algo-1"}}).size(), 1u);
  EXPECT_EQ(Points(kTrainingNs, "MemoryUtilization", {{"Host", "j/algo-1"}}).size(), 2u);
  EXPECT_EQ(Points(kTrainingNs, "CPUUtilization", {{"Host", "j/algo-1"}}).size(), 1u);
}

TEST_F(InstanceMetricsTest, CpuGoingBackwardsGivesNoPointAndKeepsTheBaseline) {
  runtime_.Set("x", {.fixed_cpu_usec = 1'000'000, .memory_bytes = kMiB});
  auto metrics = Make();
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("x", "j", "algo-1", "")).ok());
  metrics->TEST_SampleOnce();
  runtime_.Edit("x", [](auto& in) { in.fixed_cpu_usec = 900'000; });
  metrics->TEST_SampleOnce();
  EXPECT_TRUE(Points(kTrainingNs, "CPUUtilization", {{"Host", "j/algo-1"}}).empty());
  runtime_.Edit("x", [](auto& in) { in.fixed_cpu_usec = 1'000'000; });
  metrics->TEST_SampleOnce();
  std::vector<SeriesPoint> cpu = Points(kTrainingNs, "CPUUtilization", {{"Host", "j/algo-1"}});
  ASSERT_EQ(cpu.size(), 1u);
  EXPECT_DOUBLE_EQ(cpu[0].value, 0.0);  // against the first baseline, not the dip
  // A change of source (a cgroup appeared) restarts the baseline: no point from mixed sources.
  runtime_.Edit("x", [](auto& in) {
    in.fixed_cpu_usec = 50'000'000;
    in.source = "cgroup";
  });
  metrics->TEST_SampleOnce();
  EXPECT_EQ(Points(kTrainingNs, "CPUUtilization", {{"Host", "j/algo-1"}}).size(), 1u);
}

TEST_F(InstanceMetricsTest, AZeroMemoryReadingAtAnInstancesEdgeIsNoPoint) {
  runtime_.Set("x", {.memory_bytes = 0, .memory_limit_bytes = 1024 * kMiB});
  auto metrics = Make();
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("x", "j", "algo-1", "")).ok());
  metrics->TEST_SampleOnce();
  EXPECT_TRUE(Points(kTrainingNs, "MemoryUtilization", {{"Host", "j/algo-1"}}).empty());
  runtime_.Edit("x", [](auto& in) { in.memory_bytes = 512 * kMiB; });
  metrics->TEST_SampleOnce();
  std::vector<SeriesPoint> memory = Points(kTrainingNs, "MemoryUtilization", {{"Host", "j/algo-1"}});
  ASSERT_EQ(memory.size(), 1u);
  EXPECT_DOUBLE_EQ(memory[0].value, 50.0);
}

TEST_F(InstanceMetricsTest, InstancesThatEndAreDroppedAndTrackingIsBounded) {
  options_.max_instances = 2;
  runtime_.Set("a", {.memory_bytes = kMiB});
  runtime_.Set("b", {.memory_bytes = kMiB});
  auto metrics = Make();
  EXPECT_EQ(metrics->Track({"", kTrainingNs, {{{"Host", "x"}}}, ""}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(metrics->Track({"a", kTrainingNs, {}, ""}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("a", "j", "algo-1", "")).ok());
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("b", "j", "algo-2", "")).ok());
  EXPECT_EQ(metrics->Track(TrainingHostMetricsTarget("c", "j", "algo-3", "")).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(metrics->Track(TrainingHostMetricsTarget("b", "j", "algo-2", "")).ok());  // re-track: same slot
  EXPECT_EQ(metrics->TEST_Tracked(), 2u);

  runtime_.Edit("a", [](auto& in) { in.running = false; });
  metrics->TEST_SampleOnce();
  EXPECT_EQ(metrics->TEST_Tracked(), 1u);
  EXPECT_TRUE(Points(kTrainingNs, "MemoryUtilization", {{"Host", "j/algo-1"}}).empty());
  metrics->Untrack("b");
  metrics->Untrack("unknown");
  EXPECT_EQ(metrics->TEST_Tracked(), 0u);
  const int calls = runtime_.usage_calls();
  EXPECT_EQ(metrics->TEST_SampleOnce(), 0u);
  EXPECT_EQ(runtime_.usage_calls(), calls);
}

TEST_F(InstanceMetricsTest, ThreadSamplesANewInstanceAtOnceThenEveryInterval) {
  options_.interval = std::chrono::milliseconds(200);
  runtime_.Set("t", {.cpu_rate = 0.5, .memory_bytes = 512 * kMiB, .memory_limit_bytes = 1024 * kMiB});
  auto metrics = Make();
  metrics->Start();
  // Tracked 150 ms into an interval: the first sample comes at once, not at the next tick.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_TRUE(metrics->Track(TrainingHostMetricsTarget("t", "j", "algo-1", "")).ok());
  const Dimensions host = {{"Host", "j/algo-1"}};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Points(kTrainingNs, "MemoryUtilization", host).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(Points(kTrainingNs, "MemoryUtilization", host).empty());
  while (Points(kTrainingNs, "CPUUtilization", host).size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  metrics->Stop();
  std::vector<SeriesPoint> cpu = Points(kTrainingNs, "CPUUtilization", host);
  ASSERT_GE(cpu.size(), 3u);
  for (const SeriesPoint& p : cpu) EXPECT_NEAR(p.value, 50.0, 10.0);
  // Stopped: no more points.
  size_t n = Points(kTrainingNs, "MemoryUtilization", host).size();
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  EXPECT_EQ(Points(kTrainingNs, "MemoryUtilization", host).size(), n);
}

// The sampler over real /proc numbers: a child process burning CPU (a runtime whose Usage is the
// process runtime's /proc path over that child's tree).
class ProcTreeRuntime : public FakeRuntime {
 public:
  explicit ProcTreeRuntime(pid_t pid) : pid_(pid) {}
  Result<runtime::InstanceUsage> Usage(const std::string&) override {
    ASSIGN_OR_RETURN(runtime::process_usage::TreeUsage tree, runtime::process_usage::SampleProcessTree(pid_, getpid()));
    runtime::InstanceUsage u;
    u.cpu_usec = tree.cpu_usec;
    u.memory_bytes = tree.memory_bytes;
    u.source = "proc";
    return u;
  }

 private:
  pid_t pid_;
};

TEST_F(InstanceMetricsTest, RealChildBurningCpuShowsCpuUtilization) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    while (true) {
    }
  }
  ProcTreeRuntime proc_runtime(child);
  InstanceMetrics metrics(options_, &proc_runtime, store_.get());
  ASSERT_TRUE(metrics.Track(TrainingHostMetricsTarget("burn", "j", "algo-1", dir_.path())).ok());
  metrics.TEST_SampleOnce();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  metrics.TEST_SampleOnce();
  kill(child, SIGKILL);
  int st;
  waitpid(child, &st, 0);
  std::vector<SeriesPoint> cpu = Points(kTrainingNs, "CPUUtilization", {{"Host", "j/algo-1"}});
  ASSERT_EQ(cpu.size(), 1u);
  EXPECT_GT(cpu[0].value, 10.0);  // a busy loop: near 100 % on an idle core
  EXPECT_LE(cpu[0].value, 110.0);
  std::vector<SeriesPoint> memory = Points(kTrainingNs, "MemoryUtilization", {{"Host", "j/algo-1"}});
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_GT(memory[1].value, 0.0);
  // The child is gone: the next round drops it.
  metrics.TEST_SampleOnce();
  EXPECT_EQ(metrics.TEST_Tracked(), 0u);
}

// A multi-container instance (serving-contract.md §15.3): the other containers' CPU and memory
// count as the instance's; one measured another way is left out.
TEST_F(InstanceMetricsTest, AMultiContainerInstanceSumsItsContainers) {
  runtime_.Set("endpoint-ep-i", {.fixed_cpu_usec = 1000, .memory_bytes = 100 * kMiB, .memory_limit_bytes = 512 * kMiB});
  runtime_.Set("endpoint-ep-i-c2",
               {.fixed_cpu_usec = 3000, .memory_bytes = 156 * kMiB, .memory_limit_bytes = 512 * kMiB});
  runtime_.Set("endpoint-ep-i-c3", {.fixed_cpu_usec = 0, .memory_bytes = 999 * kMiB, .source = "cgroup"});
  auto metrics = Make();
  InstanceMetricsTarget target = EndpointInstanceMetricsTarget("endpoint-ep-i", "ep", "AllTraffic", "i-i", "");
  target.more_instance_ids = {"endpoint-ep-i-c2", "endpoint-ep-i-c3"};
  ASSERT_TRUE(metrics->Track(target).ok());
  const Dimensions host = {{"Host", "ep/AllTraffic/i-i"}};
  EXPECT_EQ(metrics->TEST_SampleOnce(), 2u);  // memory under both dimension sets
  std::vector<SeriesPoint> memory = Points(kEndpointNs, "MemoryUtilization", host);
  ASSERT_EQ(memory.size(), 1u);
  EXPECT_DOUBLE_EQ(memory[0].value, 25.0);  // (100 + 156) MiB of 1024 MiB
  runtime_.Edit("endpoint-ep-i-c2", [](FakeRuntime::Instance& in) { in.fixed_cpu_usec = 3000 + 50000; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  metrics->TEST_SampleOnce();
  std::vector<SeriesPoint> cpu = Points(kEndpointNs, "CPUUtilization", host);
  ASSERT_EQ(cpu.size(), 1u);
  EXPECT_GT(cpu[0].value, 5.0);  // the second container's 50 ms of CPU over ~0.1 s
}

}  // namespace
}  // namespace kiln::control
