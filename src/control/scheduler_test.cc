#include "control/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

namespace kiln::control {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = 1ull << 30;

HostCapacity Host(int cpus, double memory_gib, int gpus = 0) {
  HostCapacity h;
  for (int i = 0; i < cpus; ++i) h.cpus.push_back(i);
  h.memory_bytes = static_cast<uint64_t>(memory_gib * static_cast<double>(kGiB));
  for (int i = 0; i < gpus; ++i) {
    h.gpus.push_back({i, "GPU-uuid-" + std::to_string(i), "NVIDIA A10G", 24 * kGiB, "", i});
  }
  return h;
}

SchedulerOptions Options(HostCapacity capacity, ShapePolicy policy = ShapePolicy::kStrict, bool fallback = false) {
  SchedulerOptions o;
  o.capacity = std::move(capacity);
  o.policy = policy;
  o.allow_cpu_fallback = fallback;
  return o;
}

const InstanceCatalog* Catalog() { return &InstanceCatalog::BuiltIn(); }

std::vector<std::string> Ids(const std::vector<Grant>& grants) {
  std::vector<std::string> ids;
  for (const Grant& g : grants) ids.push_back(g.id);
  return ids;
}

TEST(SchedulerTest, TwentyJobsOnAHostThatFitsTwoStartInOrderTwoAtATime) {
  Scheduler s(Options(Host(4, 16)), Catalog());
  // Enqueue out of order; seq decides.
  std::vector<int> order;
  for (int i = 0; i < 20; ++i) order.push_back((i * 7) % 20);
  for (int i : order) {
    ASSERT_TRUE(s.Enqueue({"job-" + std::to_string(i), i, "ml.m5.large", 1}).ok());
  }
  std::vector<std::string> started;
  std::vector<std::string> running;
  for (const Grant& g : s.Schedule()) {
    started.push_back(g.id);
    running.push_back(g.id);
  }
  EXPECT_THAT(running, ElementsAre("job-0", "job-1"));
  while (!running.empty()) {
    EXPECT_LE(running.size(), 2u);
    s.Release(running.front());
    running.erase(running.begin());
    for (const Grant& g : s.Schedule()) {
      started.push_back(g.id);
      running.push_back(g.id);
    }
  }
  ASSERT_EQ(started.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(started[i], "job-" + std::to_string(i));
  EXPECT_TRUE(s.Snapshot().queue.empty());
  EXPECT_EQ(s.Snapshot().free_cpus.size(), 4u);
  EXPECT_EQ(s.Snapshot().free_memory_bytes, 16 * kGiB);
}

TEST(SchedulerTest, HeadOfLineBlocksSmallerLaterRequests) {
  Scheduler s(Options(Host(6, 64)), Catalog());
  ASSERT_TRUE(s.Enqueue({"a", 1, "ml.m5.xlarge", 1}).ok());  // 4 vCPUs
  ASSERT_TRUE(s.Enqueue({"b", 2, "ml.m5.xlarge", 1}).ok());  // 4 vCPUs: does not fit next to a
  ASSERT_TRUE(s.Enqueue({"c", 3, "ml.m5.large", 1}).ok());   // 2 vCPUs: would fit, but waits for b
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("a"));
  EXPECT_TRUE(s.Schedule().empty());
  EXPECT_TRUE(s.IsQueued("c"));
  EXPECT_EQ(s.WaitingMessage("c"),
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; that much is free, but requests "
            "submitted earlier start first (1 job ahead)");
  EXPECT_EQ(s.WaitingMessage("b"),
            "Waiting for compute capacity: ml.m5.xlarge needs 4 vCPUs and 16 GiB; 2 of 6 vCPUs free (next in line)");
  s.Release("a");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("b", "c"));
  EXPECT_EQ(s.WaitingMessage("c"), "");
}

TEST(SchedulerTest, AllocateNowGoesAheadOfTheQueueOnlyWhenItFits) {
  Scheduler s(Options(Host(6, 64)), Catalog());
  ASSERT_TRUE(s.Enqueue({"a", 1, "ml.m5.xlarge", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"b", 2, "ml.m5.xlarge", 1}).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("a"));  // 2 vCPUs left; b waits at the head
  auto endpoint = s.AllocateNow({"ep-1", 0, "ml.m5.large", 1});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  ASSERT_EQ(endpoint->size(), 1u);
  EXPECT_EQ((*endpoint)[0].cpus.size(), 2u);
  auto full = s.AllocateNow({"ep-2", 0, "ml.m5.large", 1});
  EXPECT_EQ(full.status().code(), StatusCode::kUnavailable);  // fits the host, not what is free now
  EXPECT_EQ(full.status().message(), "ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 6 vCPUs free");
  EXPECT_TRUE(full.status().Is(ErrorReason::kDoesNotFitNow));  // what EndpointController waits on
  EXPECT_FALSE(s.Granted("ep-2").has_value());                 // nothing held after a refusal
  EXPECT_EQ(s.AllocateNow({"ep-1", 0, "ml.m5.large", 1}).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.AllocateNow({"b", 0, "ml.m5.large", 1}).status().code(), StatusCode::kAlreadyExists);  // queued
  EXPECT_EQ(s.AllocateNow({"ep-3", 0, "ml.nope", 1}).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.AllocateNow({"ep-3", 0, "ml.nope", 1}).status().reason(), ErrorReason::kNone);  // never fits
  s.Release("ep-1");
  s.Release("a");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("b"));
}

// The owner of the queue learns of capacity freed by another user of the scheduler (an endpoint
// instance released while a training job waits): otherwise nothing re-runs Schedule().
TEST(SchedulerTest, ReleaseListenerHearsOfFreedGrantsOnly) {
  Scheduler s(Options(Host(2, 64)), Catalog());
  std::atomic<int> heard{0};
  s.SetReleaseListener([&] { heard++; });
  ASSERT_TRUE(s.AllocateNow({"ep-1", 0, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"job", 1, "ml.m5.large", 1}).ok());
  EXPECT_TRUE(s.Schedule().empty());
  s.Release("unknown");  // frees nothing: not heard
  EXPECT_EQ(heard.load(), 0);
  s.Release("ep-1");
  EXPECT_EQ(heard.load(), 1);
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("job"));
  s.SetReleaseListener({});
  s.Release("job");
  EXPECT_EQ(heard.load(), 1);  // removed: not heard
}

TEST(SchedulerTest, AllocationsAreConcreteAndDisjoint) {
  Scheduler s(Options(Host(8, 64)), Catalog());
  ASSERT_TRUE(s.Enqueue({"two-hosts", 1, "ml.m5.large", 2}).ok());
  ASSERT_TRUE(s.Enqueue({"one", 2, "ml.m5.xlarge", 1}).ok());
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 2u);
  ASSERT_EQ(grants[0].allocations.size(), 2u);
  EXPECT_THAT(grants[0].allocations[0].cpus, ElementsAre(0, 1));
  EXPECT_THAT(grants[0].allocations[1].cpus, ElementsAre(2, 3));
  EXPECT_EQ(grants[0].allocations[0].memory_bytes, 8 * kGiB);
  EXPECT_EQ(grants[0].allocations[0].note, "");
  EXPECT_THAT(grants[1].allocations[0].cpus, ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(s.Snapshot().free_memory_bytes, 64 * kGiB - 32 * kGiB);
  // Released CPUs are reused.
  s.Release("two-hosts");
  ASSERT_TRUE(s.Enqueue({"next", 3, "ml.m5.xlarge", 1}).ok());
  std::vector<Grant> next = s.Schedule();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_THAT(next[0].allocations[0].cpus, ElementsAre(0, 1, 2, 3));
}

// Gang scheduling (issue 14): a job's hosts are granted all at once or not at all, on disjoint
// CPUs and GPUs.
TEST(SchedulerTest, AMultiHostJobGetsAllItsHostsAtOnceOrNone) {
  Scheduler s(Options(Host(64, 512, 4)), Catalog());
  ASSERT_TRUE(s.Enqueue({"single", 1, "ml.g5.xlarge", 1}).ok());
  ASSERT_TRUE(s.Schedule().size() == 1u);
  // Four hosts of one GPU each, with three GPUs free: nothing is granted (no half-started job).
  ASSERT_TRUE(s.Enqueue({"gang", 2, "ml.g5.xlarge", 4}).ok());
  EXPECT_TRUE(s.Schedule().empty());
  EXPECT_FALSE(s.Granted("gang").has_value());
  EXPECT_EQ(s.Snapshot().free_gpus.size(), 3u);
  s.Release("single");
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  ASSERT_EQ(grants[0].allocations.size(), 4u);
  std::set<int> cpus, gpus;
  for (const Allocation& a : grants[0].allocations) {
    EXPECT_EQ(a.cpus.size(), 4u);
    ASSERT_EQ(a.gpus.size(), 1u);
    for (int cpu : a.cpus) EXPECT_TRUE(cpus.insert(cpu).second) << "CPU " << cpu << " given to two hosts";
    EXPECT_TRUE(gpus.insert(a.gpus[0]).second) << "GPU " << a.gpus[0] << " given to two hosts";
  }
  EXPECT_EQ(gpus, (std::set<int>{0, 1, 2, 3}));
}

TEST(SchedulerTest, GpusAreExclusiveAndNamedByIndexAndUuid) {
  Scheduler s(Options(Host(64, 512, 4)), Catalog());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s.Enqueue({"g" + std::to_string(i), i, "ml.g5.xlarge", 1}).ok());
  }
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 4u);
  std::set<int> seen;
  for (const Grant& g : grants) {
    ASSERT_EQ(g.allocations[0].gpus.size(), 1u);
    int gpu = g.allocations[0].gpus[0];
    EXPECT_TRUE(seen.insert(gpu).second) << "GPU " << gpu << " granted twice";
    EXPECT_THAT(g.allocations[0].gpu_uuids, ElementsAre("GPU-uuid-" + std::to_string(gpu)));
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(
      s.WaitingMessage("g4"),
      "Waiting for compute capacity: ml.g5.xlarge needs 4 vCPUs, 16 GiB and 1 GPU; 0 of 4 GPUs free (next in line)");
  s.Release("g2");
  std::vector<Grant> next = s.Schedule();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_THAT(next[0].allocations[0].gpus, ElementsAre(2));

  // A 4-GPU type needs all four free at once.
  Scheduler big(Options(Host(64, 512, 4)), Catalog());
  ASSERT_TRUE(big.Enqueue({"small", 1, "ml.g5.xlarge", 1}).ok());
  ASSERT_TRUE(big.Enqueue({"large", 2, "ml.g5.12xlarge", 1}).ok());
  EXPECT_THAT(Ids(big.Schedule()), ElementsAre("small"));
  big.Release("small");
  std::vector<Grant> large = big.Schedule();
  ASSERT_EQ(large.size(), 1u);
  EXPECT_THAT(large[0].allocations[0].gpus, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(large[0].allocations[0].cpus.size(), 48u);
}

TEST(SchedulerTest, GpuIndicesComeFromTheHost) {
  // Only GPUs 2 and 3 are given to Kiln (e.g. config "gpus": [2, 3]).
  HostCapacity h = Host(16, 128, 4);
  h.gpus.erase(h.gpus.begin(), h.gpus.begin() + 2);
  Scheduler s(Options(h), Catalog());
  ASSERT_TRUE(s.Enqueue({"a", 1, "ml.g5.xlarge", 2}).ok());
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_THAT(grants[0].allocations[0].gpus, ElementsAre(2));
  EXPECT_THAT(grants[0].allocations[1].gpus, ElementsAre(3));
  EXPECT_THAT(grants[0].allocations[1].gpu_uuids, ElementsAre("GPU-uuid-3"));
  EXPECT_FALSE(s.CheckFeasible("ml.g5.xlarge", 3).ok());
}

TEST(SchedulerTest, StrictRejectsWhatCanNeverFit) {
  Scheduler s(Options(Host(2, 4)), Catalog());
  Status unknown = s.CheckFeasible("ml.m5.huge", 1);
  EXPECT_EQ(unknown.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(unknown.message(), HasSubstr("no capacity for ml.m5.huge"));

  Status big = s.CheckFeasible("ml.m5.large", 1);
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(big.message(),
            "no capacity for ml.m5.large on this host: it needs 2 vCPUs and 8 GiB but the host has 2 vCPUs and "
            "4 GiB for instances (short by 4 GiB); the scheduler policy is \"strict\", set \"policy\": \"shrink\" "
            "in the scheduler section of the Kiln config to run instances on what the host has");

  Status many = s.CheckFeasible("ml.t3.medium", 3);
  EXPECT_THAT(many.message(), HasSubstr("3 x ml.t3.medium"));
  EXPECT_THAT(many.message(), HasSubstr("short by 4 vCPUs, 8 GiB"));
  EXPECT_TRUE(s.CheckFeasible("ml.t3.medium", 1).ok());

  Status gpu = s.CheckFeasible("ml.g5.xlarge", 1);
  EXPECT_EQ(gpu.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(
      gpu.message(),
      "ml.g5.xlarge needs 1 GPU (NVIDIA A10G) per instance, but this host has no GPUs; set "
      "\"allow_cpu_fallback\": true in the scheduler section of the Kiln config to run GPU instance types on CPU");

  EXPECT_EQ(s.CheckFeasible("ml.m5.large", 0).code(), StatusCode::kInvalidArgument);
  // Enqueue refuses the same, and queues nothing.
  EXPECT_FALSE(s.Enqueue({"x", 1, "ml.m5.large", 1}).ok());
  EXPECT_FALSE(s.IsQueued("x"));

  // Fewer GPUs than the type has: strict says how many are missing.
  Scheduler one_gpu(Options(Host(64, 512, 1)), Catalog());
  EXPECT_THAT(one_gpu.CheckFeasible("ml.g5.12xlarge", 1).message(), HasSubstr("short by 3 GPUs"));
}

TEST(SchedulerTest, ShrinkGivesWhatTheHostHas) {
  Scheduler s(Options(Host(2, 23), ShapePolicy::kShrink, /*fallback=*/true), Catalog());
  ASSERT_TRUE(s.CheckFeasible("ml.g5.12xlarge", 1).ok());
  ASSERT_TRUE(s.Enqueue({"big", 1, "ml.g5.12xlarge", 1}).ok());
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  const Allocation& a = grants[0].allocations[0];
  EXPECT_THAT(a.cpus, ElementsAre(0, 1));
  EXPECT_EQ(a.memory_bytes, 23 * kGiB);
  EXPECT_TRUE(a.gpus.empty());
  EXPECT_EQ(a.note,
            "shrunk ml.g5.12xlarge (48 vCPUs, 192 GiB, 4 GPUs) to 2 vCPUs, 23 GiB, 0 GPUs (scheduler policy shrink; "
            "no GPU for it on this host, allow_cpu_fallback)");

  // Types that fit keep their shape and get no note.
  Scheduler fits(Options(Host(8, 64), ShapePolicy::kShrink), Catalog());
  ASSERT_TRUE(fits.Enqueue({"m", 1, "ml.m5.large", 1}).ok());
  EXPECT_EQ(fits.Schedule()[0].allocations[0].note, "");

  // Several instances share the host.
  Scheduler shared(Options(Host(4, 16), ShapePolicy::kShrink), Catalog());
  ASSERT_TRUE(shared.Enqueue({"two", 1, "ml.m5.4xlarge", 2}).ok());
  std::vector<Grant> two = shared.Schedule();
  ASSERT_EQ(two.size(), 1u);
  ASSERT_EQ(two[0].allocations.size(), 2u);
  EXPECT_THAT(two[0].allocations[0].cpus, ElementsAre(0, 1));
  EXPECT_THAT(two[0].allocations[1].cpus, ElementsAre(2, 3));
  EXPECT_EQ(two[0].allocations[1].memory_bytes, 8 * kGiB);
  EXPECT_EQ(two[0].allocations[0].note,
            "shrunk ml.m5.4xlarge (16 vCPUs, 64 GiB) to 2 vCPUs, 8 GiB (scheduler policy shrink)");
  EXPECT_THAT(shared.CheckFeasible("ml.m5.large", 5).message(), HasSubstr("even shrunk"));
}

TEST(SchedulerTest, ShrinkStillNeedsCpuFallbackForGpuTypes) {
  Scheduler s(Options(Host(2, 8), ShapePolicy::kShrink, /*fallback=*/false), Catalog());
  Status st = s.CheckFeasible("ml.p4d.24xlarge", 1);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("no GPUs"));
  EXPECT_THAT(st.message(), HasSubstr("allow_cpu_fallback"));

  // A GPU host shrinks the GPU count too.
  Scheduler gpu(Options(Host(16, 64, 2), ShapePolicy::kShrink), Catalog());
  ASSERT_TRUE(gpu.Enqueue({"p4d", 1, "ml.p4d.24xlarge", 1}).ok());
  std::vector<Grant> grants = gpu.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_THAT(grants[0].allocations[0].gpus, ElementsAre(0, 1));
  EXPECT_EQ(
      grants[0].allocations[0].note,
      "shrunk ml.p4d.24xlarge (96 vCPUs, 1152 GiB, 8 GPUs) to 16 vCPUs, 64 GiB, 2 GPUs (scheduler policy shrink)");
  // Three instances cannot each have one of two GPUs.
  EXPECT_THAT(gpu.CheckFeasible("ml.g5.xlarge", 3).message(), HasSubstr("at least 1 GPU each"));
}

TEST(SchedulerTest, StrictCpuFallback) {
  Scheduler s(Options(Host(8, 32), ShapePolicy::kStrict, /*fallback=*/true), Catalog());
  ASSERT_TRUE(s.CheckFeasible("ml.g5.xlarge", 1).ok());
  ASSERT_TRUE(s.Enqueue({"g", 1, "ml.g5.xlarge", 1}).ok());
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  const Allocation& a = grants[0].allocations[0];
  EXPECT_EQ(a.cpus.size(), 4u);
  EXPECT_EQ(a.memory_bytes, 16 * kGiB);
  EXPECT_TRUE(a.gpus.empty());
  EXPECT_EQ(
      a.note,
      "ml.g5.xlarge runs without its 1 GPU (NVIDIA A10G): this host has none (scheduler option allow_cpu_fallback)");
  // Fallback does not lift strict sizes.
  EXPECT_THAT(s.CheckFeasible("ml.g5.12xlarge", 1).message(), HasSubstr("short by 40 vCPUs"));
}

TEST(SchedulerTest, GpuClassesLimitWhichCardsServeAModel) {
  SchedulerOptions o = Options(Host(32, 256, 0));
  o.capacity.gpus.push_back({0, "GPU-h200", "NVIDIA H200", 141 * kGiB, "", 0});
  o.gpu_classes["NVIDIA A10G"] = {"*A10*", "*RTX 4090*"};
  Scheduler s(o, Catalog());
  Status st = s.CheckFeasible("ml.g5.xlarge", 1);
  EXPECT_THAT(st.message(), HasSubstr("no GPUs of that class"));
  EXPECT_TRUE(s.CheckFeasible("ml.p3.2xlarge", 1).ok());  // V100 has no class entry: any GPU serves
}

TEST(SchedulerTest, WaitingMessageNamesWhatIsMissingAndThePlaceInLine) {
  Scheduler s(Options(Host(2, 32)), Catalog());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Enqueue({"j" + std::to_string(i), i, "ml.m5.large", 1}).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("j0"));
  EXPECT_EQ(s.WaitingMessage("j3"),
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free (2 jobs ahead)");
  EXPECT_EQ(s.WaitingMessage("j1"),
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free (next in line)");
  EXPECT_EQ(s.WaitingMessage("j0"), "");  // granted
  EXPECT_EQ(s.WaitingMessage("nobody"), "");

  Scheduler mem(Options(Host(8, 12)), Catalog());
  ASSERT_TRUE(mem.Enqueue({"a", 1, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(mem.Enqueue({"b", 2, "ml.m5.large", 1}).ok());
  mem.Schedule();
  EXPECT_EQ(mem.WaitingMessage("b"),
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 4 GiB of 12 GiB free (next in line)");

  Scheduler multi(Options(Host(4, 64)), Catalog());
  ASSERT_TRUE(multi.Enqueue({"a", 1, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(multi.Enqueue({"b", 2, "ml.m5.large", 2}).ok());
  multi.Schedule();
  EXPECT_EQ(multi.WaitingMessage("b"),
            "Waiting for compute capacity: 2 x ml.m5.large need 4 vCPUs and 16 GiB; 2 of 4 vCPUs free (next in line)");
}

TEST(SchedulerTest, WaitingReasonIsTheMessageWithoutThePlaceInLine) {
  Scheduler s(Options(Host(2, 32)), Catalog());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Enqueue({"j" + std::to_string(i), i, "ml.m5.large", 1}).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("j0"));
  EXPECT_EQ(s.WaitingReason("j2"),
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free");
  EXPECT_EQ(s.WaitingReason("j1"), s.WaitingReason("j2"));  // the same wherever in line
  EXPECT_EQ(s.WaitingReason("j0"), "");                     // granted
  EXPECT_EQ(s.WaitingReason("nobody"), "");
}

TEST(SchedulerTest, ThePlaceInLineCountsTiesInEnqueueOrderAndFollowsCancels) {
  Scheduler s(Options(Host(2, 32)), Catalog());
  ASSERT_TRUE(s.Enqueue({"head", 1, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"t1", 5, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"t2", 5, "ml.m5.large", 1}).ok());  // same seq: behind t1
  ASSERT_TRUE(s.Enqueue({"t0", 3, "ml.m5.large", 1}).ok());  // lower seq: ahead of both
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("head"));
  EXPECT_THAT(s.WaitingMessage("t0"), EndsWith("(next in line)"));
  EXPECT_THAT(s.WaitingMessage("t1"), EndsWith("(1 job ahead)"));
  EXPECT_THAT(s.WaitingMessage("t2"), EndsWith("(2 jobs ahead)"));
  s.Cancel("t1");
  EXPECT_FALSE(s.IsQueued("t1"));
  EXPECT_EQ(s.WaitingMessage("t1"), "");
  EXPECT_THAT(s.WaitingMessage("t2"), EndsWith("(1 job ahead)"));
  EXPECT_TRUE(s.Adopt("t2", {}).IsAlreadyExists());
  ASSERT_TRUE(s.Enqueue({"t1", 5, "ml.m5.large", 1}).ok());  // back in, behind t2 now
  EXPECT_THAT(s.WaitingMessage("t1"), EndsWith("(2 jobs ahead)"));
  ASSERT_TRUE(s.Enqueue({"t1", 5, "ml.m5.large", 1}).ok());  // idempotent while queued
  EXPECT_EQ(s.Snapshot().queue.size(), 3u);
}

TEST(SchedulerTest, ALongQueueDrainsInOrderFromTheFront) {
  // Grants take from the front of the queue (a deque): 2,000 requests, two at a time, in order.
  Scheduler s(Options(Host(4, 64)), Catalog());
  const int n = 2000;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(s.Enqueue({"j" + std::to_string(i), i, "ml.m5.large", 1}).ok());
  std::vector<std::string> order;
  for (int round = 0; round < n / 2; ++round) {
    std::vector<Grant> grants = s.Schedule();
    ASSERT_EQ(grants.size(), 2u) << round;
    for (const Grant& g : grants) {
      order.push_back(g.id);
      s.Release(g.id);
    }
  }
  ASSERT_EQ(order.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(order[i], "j" + std::to_string(i));
  EXPECT_TRUE(s.Snapshot().queue.empty());
}

TEST(SchedulerTest, CancelLeavesTheQueue) {
  Scheduler s(Options(Host(2, 16)), Catalog());
  ASSERT_TRUE(s.Enqueue({"a", 1, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"b", 2, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"c", 3, "ml.m5.large", 1}).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("a"));
  s.Cancel("b");
  EXPECT_FALSE(s.IsQueued("b"));
  EXPECT_THAT(s.WaitingMessage("c"), HasSubstr("(next in line)"));
  s.Cancel("a");  // granted: Cancel does not free it
  EXPECT_TRUE(s.Granted("a").has_value());
  EXPECT_TRUE(s.Schedule().empty());
  s.Release("a");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("c"));
  s.Release("unknown");  // no-op
}

TEST(SchedulerTest, EnqueueIsIdempotentWhileQueued) {
  Scheduler s(Options(Host(2, 16)), Catalog());
  ASSERT_TRUE(s.Enqueue({"a", 1, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"b", 2, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"b", 2, "ml.m5.large", 1}).ok());
  EXPECT_EQ(s.Snapshot().queue.size(), 2u);
  s.Schedule();
  EXPECT_EQ(s.Enqueue({"a", 1, "ml.m5.large", 1}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.Enqueue({"", 3, "ml.m5.large", 1}).code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, AdoptReReservesExactly) {
  Scheduler s(Options(Host(4, 16, 2)), Catalog());
  Allocation running;
  running.cpus = {1, 2};
  running.memory_bytes = 8 * kGiB;
  running.gpus = {1};
  running.gpu_uuids = {"GPU-uuid-1"};
  ASSERT_TRUE(s.Adopt("old-job", {running}).ok());
  EXPECT_EQ(s.Granted("old-job"), std::vector<Allocation>{running});

  ASSERT_TRUE(s.Enqueue({"new", 1, "ml.m5.large", 1}).ok());
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_THAT(grants[0].allocations[0].cpus, ElementsAre(0, 3));

  Allocation conflict;
  conflict.cpus = {2};
  Status st = s.Adopt("other", {conflict});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("CPU 2 is already held by old-job"));
  EXPECT_FALSE(s.Granted("other").has_value());

  Allocation gpu_conflict;
  gpu_conflict.gpus = {1};
  EXPECT_THAT(s.Adopt("other", {gpu_conflict}).message(), HasSubstr("GPU 1 is already held by old-job"));
  Allocation no_such_gpu;
  no_such_gpu.gpus = {7};
  EXPECT_THAT(s.Adopt("other", {no_such_gpu}).message(), HasSubstr("GPU 7 is not on this host"));
  Allocation swapped;
  swapped.gpus = {0};
  swapped.gpu_uuids = {"GPU-uuid-9"};
  EXPECT_THAT(s.Adopt("other", {swapped}).message(), HasSubstr("GPU 0 is now GPU-uuid-0"));
  Allocation memory_hog;
  memory_hog.memory_bytes = 1 * kGiB;
  EXPECT_THAT(s.Adopt("other", {memory_hog}).message(), HasSubstr("only 0 GiB is free"));
  Allocation not_ours;
  not_ours.cpus = {9};
  EXPECT_THAT(s.Adopt("other", {not_ours}).message(), HasSubstr("CPU 9 is not one the scheduler may give out"));
  EXPECT_EQ(s.Adopt("old-job", {}).code(), StatusCode::kAlreadyExists);

  // Nothing partial stayed behind from the failed adoptions.
  SchedulerSnapshot snap = s.Snapshot();
  EXPECT_TRUE(snap.free_cpus.empty());
  EXPECT_THAT(snap.free_gpus, ElementsAre(0));
  s.Release("old-job");
  EXPECT_THAT(s.Snapshot().free_cpus, ElementsAre(1, 2));
  EXPECT_THAT(s.Snapshot().free_gpus, ElementsAre(0, 1));
}

TEST(SchedulerTest, ReservedCpusAndMemoryAreNeverGranted) {
  SchedulerOptions o = Options(Host(4, 20));
  o.reserved_cpus = 1;
  o.reserved_memory_bytes = 4 * kGiB;
  Scheduler s(o, Catalog());
  EXPECT_THAT(s.Snapshot().cpus, ElementsAre(1, 2, 3));
  EXPECT_EQ(s.Snapshot().memory_bytes, 16 * kGiB);
  EXPECT_THAT(s.CheckFeasible("ml.m5.xlarge", 1).message(), HasSubstr("short by 1 vCPU)"));
  ASSERT_TRUE(s.Enqueue({"a", 1, "ml.m5.large", 1}).ok());
  std::vector<Grant> grants = s.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_THAT(grants[0].allocations[0].cpus, ElementsAre(1, 2));
  Allocation on_reserved;
  on_reserved.cpus = {0};
  EXPECT_FALSE(s.Adopt("x", {on_reserved}).ok());
}

// A managed-spot request (ScheduleRequest::preemptible).
ScheduleRequest Spot(std::string id, int64_t seq, std::string instance_type, int instance_count = 1) {
  ScheduleRequest r{std::move(id), seq, std::move(instance_type), instance_count};
  r.preemptible = true;
  return r;
}

// "spot-id for queued-id", one per preemption: readable in a failed expectation.
std::vector<std::string> Named(const std::vector<Preemption>& preemptions) {
  std::vector<std::string> named;
  for (const Preemption& p : preemptions) named.push_back(p.id + " for " + p.for_id);
  return named;
}

std::vector<std::string> QueueIds(const SchedulerSnapshot& snap) {
  std::vector<std::string> ids;
  for (const auto& q : snap.queue) ids.push_back(q.id);
  return ids;
}

TEST(SchedulerTest, OnDemandRequestsStartBeforeSpotOnesSubmittedEarlier) {
  Scheduler s(Options(Host(4, 64)), Catalog());
  ASSERT_TRUE(s.AllocateNow({"ep", 0, "ml.m5.xlarge", 1}).ok());  // the host is full
  ASSERT_TRUE(s.Enqueue(Spot("s1", 1, "ml.m5.large")).ok());
  ASSERT_TRUE(s.Enqueue({"d3", 3, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"d4", 4, "ml.m5.xlarge", 1}).ok());
  ASSERT_TRUE(s.Enqueue(Spot("s2", 2, "ml.m5.large")).ok());
  SchedulerSnapshot snap = s.Snapshot();
  EXPECT_THAT(QueueIds(snap), ElementsAre("d3", "d4", "s1", "s2"));
  EXPECT_FALSE(snap.queue[1].preemptible);
  EXPECT_TRUE(snap.queue[2].preemptible);
  EXPECT_EQ(nlohmann::json(snap)["queue"][2]["preemptible"], true);
  EXPECT_THAT(s.WaitingMessage("d3"), EndsWith("(next in line)"));
  EXPECT_THAT(s.WaitingMessage("s1"), EndsWith("(2 jobs ahead)"));
  EXPECT_THAT(s.WaitingMessage("s2"), EndsWith("(3 jobs ahead)"));

  s.Release("ep");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("d3"));  // d4 does not fit next to d3; s1 would, but waits
  EXPECT_EQ(s.WaitingMessage("s1"),
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; that much is free, but on-demand "
            "requests and spot requests submitted earlier start first (1 job ahead)");
  s.Release("d3");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("d4"));
  s.Release("d4");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("s1", "s2"));
}

TEST(SchedulerTest, PreemptionsNameASpotGrantOnceAndTheOnDemandJobStartsWhenItIsReleased) {
  Scheduler s(Options(Host(2, 16)), Catalog());
  ASSERT_TRUE(s.Enqueue(Spot("spot", 1, "ml.m5.large")).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("spot"));
  EXPECT_TRUE(s.Preemptions().empty());  // nothing queued
  ASSERT_TRUE(s.Enqueue({"demand", 2, "ml.m5.large", 1}).ok());
  EXPECT_TRUE(s.Schedule().empty());

  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("spot for demand"));
  EXPECT_TRUE(s.Preemptions().empty());  // named once
  EXPECT_THAT(s.Snapshot().being_preempted, ElementsAre("spot"));
  EXPECT_TRUE(s.Schedule().empty());  // the spot grant holds its resources until Release
  EXPECT_TRUE(s.Granted("spot").has_value());

  s.Release("spot");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("demand"));
  EXPECT_TRUE(s.Snapshot().being_preempted.empty());

  // The interrupted job queues again and runs again; once granted anew it may be named again.
  ASSERT_TRUE(s.Enqueue(Spot("spot", 1, "ml.m5.large")).ok());
  s.Release("demand");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("spot"));
  ASSERT_TRUE(s.Enqueue({"demand-2", 3, "ml.m5.large", 1}).ok());
  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("spot for demand-2"));
}

TEST(SchedulerTest, PreemptionsTakeTheNewestSpotGrantsAndOnlyAsManyAsNeeded) {
  Scheduler s(Options(Host(8, 64)), Catalog());
  ASSERT_TRUE(s.Enqueue(Spot("a", 1, "ml.m5.large")).ok());
  ASSERT_TRUE(s.Enqueue(Spot("b", 2, "ml.m5.large")).ok());
  ASSERT_TRUE(s.Enqueue(Spot("c", 3, "ml.m5.large")).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("a", "b", "c"));
  ASSERT_TRUE(s.Enqueue(Spot("late", 0, "ml.m5.large")).ok());  // lowest seq, but granted last
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("late"));
  EXPECT_TRUE(s.Snapshot().free_cpus.empty());

  ASSERT_TRUE(s.Enqueue({"big", 10, "ml.m5.xlarge", 1}).ok());  // 4 vCPUs: two spot grants' worth
  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("late for big", "c for big"));
  EXPECT_TRUE(s.Preemptions().empty());  // the two being freed suffice
  s.Release("late");
  EXPECT_TRUE(s.Preemptions().empty());  // c is still on its way out
  EXPECT_TRUE(s.Schedule().empty());

  // A larger head than the grants being freed make room for: more are named, newest first.
  s.Cancel("big");
  ASSERT_TRUE(s.Enqueue({"bigger", 11, "ml.m5.2xlarge", 1}).ok());  // 8 vCPUs
  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("b for bigger", "a for bigger"));
  EXPECT_TRUE(s.Preemptions().empty());
  s.Release("c");
  s.Release("b");
  EXPECT_TRUE(s.Schedule().empty());
  s.Release("a");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("bigger"));
}

TEST(SchedulerTest, ASpotGrantWhoseReleaseWouldNotHelpIsLeftAlone) {
  Scheduler s(Options(Host(16, 128, 1)), Catalog());
  ASSERT_TRUE(s.Enqueue(Spot("gpu-spot", 1, "ml.g5.xlarge")).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("gpu-spot"));
  ASSERT_TRUE(s.Enqueue(Spot("cpu-spot", 2, "ml.m5.large")).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("cpu-spot"));
  ASSERT_TRUE(s.Enqueue({"gpu-demand", 3, "ml.g5.xlarge", 1}).ok());  // short of the one GPU only
  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("gpu-spot for gpu-demand"));
  EXPECT_THAT(s.Snapshot().being_preempted, ElementsAre("gpu-spot"));
}

TEST(SchedulerTest, NoPreemptionsWhenTheyWouldNotHelpOrAreNotWanted) {
  // Releasing every spot grant would not make room: the newer on-demand grant is never reclaimed.
  Scheduler not_enough(Options(Host(4, 64)), Catalog());
  ASSERT_TRUE(not_enough.Enqueue(Spot("spot", 1, "ml.m5.large")).ok());
  EXPECT_THAT(Ids(not_enough.Schedule()), ElementsAre("spot"));
  ASSERT_TRUE(not_enough.AllocateNow({"ep", 0, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(not_enough.Enqueue({"big", 2, "ml.m5.xlarge", 1}).ok());
  EXPECT_TRUE(not_enough.Preemptions().empty());
  EXPECT_TRUE(not_enough.Snapshot().being_preempted.empty());  // nothing half-chosen stays behind
  not_enough.Release("ep");
  EXPECT_THAT(Named(not_enough.Preemptions()), ElementsAre("spot for big"));  // now it would

  // The head of the queue is a spot request: spot does not preempt spot.
  Scheduler spot_head(Options(Host(2, 16)), Catalog());
  ASSERT_TRUE(spot_head.Enqueue(Spot("running", 1, "ml.m5.large")).ok());
  EXPECT_THAT(Ids(spot_head.Schedule()), ElementsAre("running"));
  ASSERT_TRUE(spot_head.Enqueue(Spot("waiting", 2, "ml.m5.large")).ok());
  EXPECT_TRUE(spot_head.Preemptions().empty());

  // The operator turned preemption off.
  EXPECT_TRUE(SchedulerOptions{}.preempt_for_on_demand);
  SchedulerOptions o = Options(Host(2, 16));
  o.preempt_for_on_demand = false;
  Scheduler off(o, Catalog());
  ASSERT_TRUE(off.Enqueue(Spot("spot", 1, "ml.m5.large")).ok());
  EXPECT_THAT(Ids(off.Schedule()), ElementsAre("spot"));
  ASSERT_TRUE(off.Enqueue({"demand", 2, "ml.m5.large", 1}).ok());
  EXPECT_TRUE(off.Preemptions().empty());
  EXPECT_THAT(off.WaitingMessage("demand"), EndsWith("(next in line)"));
}

// Warm pools (training-contract.md §19): a grant moves between ids unchanged; a reclaimable one is
// named for any head (spot too, and whatever preempt_for_on_demand says), before spot grants and
// oldest first.
TEST(SchedulerTest, TransferMovesAGrantAndReclaimableGrantsGiveWayToAnyHead) {
  SchedulerOptions options = Options(Host(4, 32));
  options.preempt_for_on_demand = false;
  Scheduler s(options, Catalog());
  ASSERT_TRUE(s.Enqueue({"old", 1, "ml.m5.large", 1}).ok());
  ASSERT_TRUE(s.Enqueue({"new", 2, "ml.m5.large", 1}).ok());
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("old", "new"));
  const auto old_grant = *s.Granted("old");
  ASSERT_TRUE(s.Transfer("old", "warm-pool/old").ok());
  EXPECT_FALSE(s.Granted("old").has_value());
  EXPECT_EQ(*s.Granted("warm-pool/old"), old_grant);
  EXPECT_EQ(s.Transfer("old", "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(s.Transfer("warm-pool/old", "new").code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(s.Transfer("new", "warm-pool/new").ok());
  ASSERT_TRUE(s.SetReclaimable("warm-pool/old", true).ok());
  ASSERT_TRUE(s.SetReclaimable("warm-pool/new", true).ok());
  EXPECT_EQ(s.SetReclaimable("none", true).code(), StatusCode::kNotFound);

  // A spot request that does not fit: the oldest pool is named (spot grants never would be here).
  ASSERT_TRUE(s.Enqueue(Spot("spot", 3, "ml.m5.large")).ok());
  ASSERT_TRUE(s.Enqueue(Spot("spot-2", 4, "ml.m5.large")).ok());
  EXPECT_TRUE(s.Schedule().empty());
  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("warm-pool/old for spot"));
  EXPECT_TRUE(s.Preemptions().empty());  // named once; one pool is enough for the head
  s.Release("warm-pool/old");
  EXPECT_THAT(Ids(s.Schedule()), ElementsAre("spot"));
  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("warm-pool/new for spot-2"));
  // Handed to a job, a grant is no longer a pool's: it is not named.
  ASSERT_TRUE(s.Transfer("warm-pool/new", "taker").ok());
  ASSERT_TRUE(s.SetReclaimable("taker", false).ok());
  EXPECT_TRUE(s.Preemptions().empty());
}

TEST(SchedulerTest, AnAdoptedSpotGrantStaysPreemptible) {
  Scheduler s(Options(Host(4, 32)), Catalog());
  Allocation spot;
  spot.cpus = {0, 1};
  spot.memory_bytes = 8 * kGiB;
  Allocation on_demand;
  on_demand.cpus = {2, 3};
  on_demand.memory_bytes = 8 * kGiB;
  ASSERT_TRUE(s.Adopt("spot", {spot}, /*preemptible=*/true).ok());
  ASSERT_TRUE(s.Adopt("on-demand", {on_demand}).ok());  // adopted last: the newest grant
  EXPECT_THAT(s.Snapshot().preemptible, ElementsAre("spot"));
  ASSERT_TRUE(s.Enqueue({"next", 1, "ml.m5.large", 1}).ok());
  EXPECT_THAT(Named(s.Preemptions()), ElementsAre("spot for next"));
}

TEST(SchedulerTest, AllocationJsonRoundTrip) {
  Allocation a;
  a.cpus = {4, 5};
  a.memory_bytes = 8 * kGiB;
  a.gpus = {1};
  a.gpu_uuids = {"GPU-abc"};
  a.note = "shrunk";
  nlohmann::json j = a;
  EXPECT_EQ(j.dump(), R"({"cpus":[4,5],"gpu_uuids":["GPU-abc"],"gpus":[1],"memory_bytes":8589934592,"note":"shrunk"})");
  EXPECT_EQ(nlohmann::json::parse(j.dump()).get<Allocation>(), a);
  EXPECT_EQ(nlohmann::json::parse(R"({"cpus":[1]})").get<Allocation>().cpus, std::vector<int>{1});
  std::vector<Allocation> list = nlohmann::json::parse(nlohmann::json(std::vector<Allocation>{a, a}).dump());
  EXPECT_EQ(list.size(), 2u);
}

TEST(SchedulerOptionsTest, FromJson) {
  HostCapacity discovered = Host(8, 64, 2);
  Result<SchedulerOptions> defaults = SchedulerOptionsFromJson(nullptr, discovered);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->policy, ShapePolicy::kStrict);
  EXPECT_FALSE(defaults->allow_cpu_fallback);
  EXPECT_EQ(defaults->capacity.cpus.size(), 8u);

  auto section = nlohmann::json::parse(R"({"policy": "shrink", "allow_cpu_fallback": true, "cpus": 4,
      "memory_gib": 15.5, "gpus": [1], "reserved_cpus": 1, "reserved_memory_gib": 0.5,
      "gpu_classes": {"NVIDIA A10G": ["*A10*"]}})");
  Result<SchedulerOptions> o = SchedulerOptionsFromJson(section, discovered);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->policy, ShapePolicy::kShrink);
  EXPECT_TRUE(o->allow_cpu_fallback);
  EXPECT_THAT(o->capacity.cpus, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(o->capacity.memory_bytes, 15 * kGiB + kGiB / 2);
  ASSERT_EQ(o->capacity.gpus.size(), 1u);
  EXPECT_EQ(o->capacity.gpus[0].index, 1);
  EXPECT_EQ(o->capacity.gpus[0].uuid, "GPU-uuid-1");
  EXPECT_EQ(o->reserved_cpus, 1);
  EXPECT_EQ(o->reserved_memory_bytes, kGiB / 2);
  EXPECT_THAT(o->gpu_classes.at("NVIDIA A10G"), ElementsAre("*A10*"));

  Result<SchedulerOptions> listed = SchedulerOptionsFromJson(
      nlohmann::json::parse(R"({"cpus": [6, 2], "gpus": [{"index": 3, "uuid": "GPU-x", "name": "NVIDIA L4"}]})"),
      discovered);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_THAT(listed->capacity.cpus, ElementsAre(2, 6));
  ASSERT_EQ(listed->capacity.gpus.size(), 1u);
  EXPECT_EQ(listed->capacity.gpus[0].name, "NVIDIA L4");
  Result<SchedulerOptions> no_gpus = SchedulerOptionsFromJson(nlohmann::json::parse(R"({"gpus": []})"), discovered);
  ASSERT_TRUE(no_gpus.ok());
  EXPECT_TRUE(no_gpus->capacity.gpus.empty());

  auto error = [&](const char* text) {
    Result<SchedulerOptions> r = SchedulerOptionsFromJson(nlohmann::json::parse(text), discovered);
    EXPECT_FALSE(r.ok()) << text;
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_THAT(error(R"({"policy": "lenient"})"), HasSubstr("scheduler.policy"));
  EXPECT_THAT(error(R"({"allow_cpu_fallbak": true})"), HasSubstr("unknown key \"allow_cpu_fallbak\""));
  EXPECT_THAT(error(R"({"cpus": 9})"), HasSubstr("more than the 8 CPUs"));
  EXPECT_THAT(error(R"({"cpus": [12]})"), HasSubstr("CPU 12"));
  EXPECT_THAT(error(R"({"gpus": [5]})"), HasSubstr("GPU 5 was not found"));
  EXPECT_THAT(error(R"({"memory_gib": 0})"), HasSubstr("memory_gib"));
  EXPECT_THAT(error(R"({"reserved_cpus": 8})"), HasSubstr("leaves none"));
  EXPECT_THAT(error(R"({"allow_cpu_fallback": "yes"})"), HasSubstr("allow_cpu_fallback"));
}

// Checks, on one consistent snapshot, that every CPU and GPU is either free or held by exactly one
// instance, and that memory adds up.
bool Consistent(const SchedulerSnapshot& snap) {
  std::multiset<int> cpus(snap.free_cpus.begin(), snap.free_cpus.end());
  std::multiset<int> gpus(snap.free_gpus.begin(), snap.free_gpus.end());
  uint64_t memory = snap.free_memory_bytes;
  for (const auto& [id, allocations] : snap.granted) {
    for (const Allocation& a : allocations) {
      cpus.insert(a.cpus.begin(), a.cpus.end());
      gpus.insert(a.gpus.begin(), a.gpus.end());
      memory += a.memory_bytes;
    }
  }
  return cpus == std::multiset<int>(snap.cpus.begin(), snap.cpus.end()) &&
         gpus == std::multiset<int>(snap.gpus.begin(), snap.gpus.end()) && memory == snap.memory_bytes;
}

TEST(SchedulerTest, ConcurrentUseNeverDoubleBooks) {
  Scheduler s(Options(Host(8, 64, 4)), Catalog());
  std::atomic<int64_t> seq{0};
  std::atomic<bool> inconsistent{false};
  std::atomic<int> granted{0};
  auto worker = [&](int t) {
    std::vector<std::string> mine;
    for (int i = 0; i < 300; ++i) {
      std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
      if (!s.Enqueue({id, seq++, i % 2 ? "ml.g5.xlarge" : "ml.m5.large", 1}).ok()) inconsistent = true;
      mine.push_back(id);
      granted += static_cast<int>(s.Schedule().size());
      if (!Consistent(s.Snapshot())) inconsistent = true;
      // Release this thread's granted requests, oldest first, now and then.
      if (i % 3 == 2) {
        for (auto it = mine.begin(); it != mine.end();) {
          if (s.Granted(*it)) {
            s.Release(*it);
            it = mine.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    while (!mine.empty()) {
      s.Schedule();
      for (auto it = mine.begin(); it != mine.end();) {
        if (s.Granted(*it)) {
          s.Release(*it);
          it = mine.erase(it);
        } else {
          ++it;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_FALSE(inconsistent.load());
  SchedulerSnapshot end = s.Snapshot();
  EXPECT_TRUE(end.queue.empty());
  EXPECT_TRUE(end.granted.empty());
  EXPECT_EQ(end.free_cpus.size(), 8u);
  EXPECT_EQ(end.free_gpus.size(), 4u);
}

}  // namespace
}  // namespace kiln::control
