// Tests of MakeRoutedRuntime over two fake runtimes: which backend each call reaches.
#include "runtime/routed_runtime.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "runtime/test_util/fake_runtime.h"
#include "store/test_util/temp_database.h"

namespace kiln::runtime {
namespace {

using testing::FakeRuntime;

InstanceSpec ProcessSpec(const std::string& id) {
  InstanceSpec s;
  s.instance_id = id;
  s.argv = {"/bin/true", "train"};
  return s;
}

InstanceSpec ContainerSpec(const std::string& id) {
  InstanceSpec s;
  s.instance_id = id;
  s.argv = {"train"};
  s.container = ContainerImage{.requested = "registry.local/byo:1", .reference = "", .entrypoint = std::nullopt};
  return s;
}

class RoutedRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto processes = std::make_unique<FakeRuntime>(dir_.path() + "/processes");
    auto containers = std::make_unique<FakeRuntime>(dir_.path() + "/containers");
    processes_ = processes.get();
    containers_ = containers.get();
    routed_ = MakeRoutedRuntime(std::move(processes), std::move(containers));
  }

  store::testing::TempDir dir_;
  FakeRuntime* processes_ = nullptr;
  FakeRuntime* containers_ = nullptr;
  std::unique_ptr<Runtime> routed_;
};

TEST_F(RoutedRuntimeTest, LaunchGoesToTheContainersOnlyWhenTheSpecCarriesAnImage) {
  ASSERT_TRUE(routed_->Launch(ProcessSpec("p")).ok());
  ASSERT_TRUE(routed_->Launch(ContainerSpec("c")).ok());
  EXPECT_EQ(processes_->launches(), std::vector<std::string>{"p"});
  EXPECT_EQ(containers_->launches(), std::vector<std::string>{"c"});
  ASSERT_TRUE(containers_->spec("c").has_value());
  EXPECT_EQ(containers_->spec("c")->container->requested, "registry.local/byo:1");
  // The backends' own errors come through unchanged.
  EXPECT_EQ(routed_->Launch(ContainerSpec("c")).code(), StatusCode::kAlreadyExists);
}

TEST_F(RoutedRuntimeTest, EveryOtherCallReachesTheBackendThatHasTheInstance) {
  ASSERT_TRUE(routed_->Launch(ProcessSpec("p")).ok());
  ASSERT_TRUE(routed_->Launch(ContainerSpec("c")).ok());

  EXPECT_EQ(routed_->OutputPath("p"), processes_->OutputPath("p"));
  EXPECT_EQ(routed_->OutputPath("c"), containers_->OutputPath("c"));
  EXPECT_NE(routed_->OutputPath("p"), containers_->OutputPath("p"));

  ASSERT_TRUE(routed_->Signal("c", SIGUSR1).ok());
  ASSERT_TRUE(routed_->Signal("p", SIGUSR2).ok());
  ASSERT_EQ(containers_->signals().size(), 1u);
  EXPECT_EQ(containers_->signals()[0].signal, SIGUSR1);
  ASSERT_EQ(processes_->signals().size(), 1u);
  EXPECT_EQ(processes_->signals()[0].signal, SIGUSR2);

  auto usage = routed_->Usage("c");
  ASSERT_TRUE(usage.ok()) << usage.status().ToString();
  EXPECT_EQ(usage->source, "fake");

  ASSERT_TRUE(routed_->Stop("c", std::chrono::seconds(7)).ok());
  ASSERT_EQ(containers_->stops().size(), 1u);
  EXPECT_EQ(containers_->stops()[0].grace, std::chrono::seconds(7));
  EXPECT_TRUE(processes_->stops().empty());
  auto waited = routed_->Wait("c", std::chrono::milliseconds(100));
  ASSERT_TRUE(waited.ok());
  EXPECT_EQ(waited->state, InstanceState::kExited);
  EXPECT_EQ(waited->term_signal, SIGTERM);
  auto running = routed_->Inspect("p");
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state, InstanceState::kRunning);

  ASSERT_TRUE(routed_->Remove("c").ok());
  EXPECT_EQ(containers_->removed(), std::vector<std::string>{"c"});
  EXPECT_TRUE(processes_->removed().empty());
  EXPECT_EQ(routed_->Inspect("c").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(routed_->Remove("nobody").code(), StatusCode::kNotFound);
}

TEST_F(RoutedRuntimeTest, AccessReachesTheBackendThatHasTheInstance) {
  FakeRuntime::Behavior in_container;
  in_container.access_pid = 4242;
  containers_->SetDefaultBehavior(in_container);
  FakeRuntime::Behavior in_process;
  in_process.access_pid = 1717;
  processes_->SetDefaultBehavior(in_process);
  InstanceSpec p = ProcessSpec("p");
  p.hostname = "algo-1";
  InstanceSpec c = ContainerSpec("c");
  c.hostname = "algo-2";
  ASSERT_TRUE(routed_->Launch(p).ok());
  ASSERT_TRUE(routed_->Launch(c).ok());
  Result<AccessPoint> to_c = routed_->Access("c");
  ASSERT_TRUE(to_c.ok()) << to_c.status().ToString();
  EXPECT_EQ(to_c->host_pid, 4242);
  EXPECT_EQ(to_c->hostname, "algo-2");
  Result<AccessPoint> to_p = routed_->Access("p");
  ASSERT_TRUE(to_p.ok()) << to_p.status().ToString();
  EXPECT_EQ(to_p->host_pid, 1717);
  EXPECT_EQ(to_p->hostname, "algo-1");
  EXPECT_EQ(routed_->Access("nobody").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(routed_->Stop("c", std::chrono::seconds(0)).ok());
  EXPECT_EQ(routed_->Access("c").status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RoutedRuntimeTest, FindsInstancesItDidNotLaunchItselfAsAfterARestart) {
  // A previous server launched them: nothing was remembered here.
  ASSERT_TRUE(containers_->Launch(ContainerSpec("old-c")).ok());
  ASSERT_TRUE(processes_->Launch(ProcessSpec("old-p")).ok());
  ASSERT_TRUE(routed_->Stop("old-c", std::chrono::seconds(3)).ok());
  ASSERT_TRUE(routed_->Stop("old-p", std::chrono::seconds(4)).ok());
  ASSERT_EQ(containers_->stops().size(), 1u);
  EXPECT_EQ(containers_->stops()[0].instance_id, "old-c");
  ASSERT_EQ(processes_->stops().size(), 1u);
  EXPECT_EQ(processes_->stops()[0].instance_id, "old-p");
}

TEST_F(RoutedRuntimeTest, AnIdTheContainersForgotGoesToTheProcessesAgain) {
  ASSERT_TRUE(routed_->Launch(ContainerSpec("x")).ok());
  ASSERT_TRUE(routed_->Inspect("x").ok());
  containers_->Vanish("x");
  EXPECT_EQ(routed_->Inspect("x").status().code(), StatusCode::kNotFound);
  // The same id launched as a process (a retry on the process runtime) is the process's.
  ASSERT_TRUE(routed_->Launch(ProcessSpec("x")).ok());
  ASSERT_TRUE(routed_->Stop("x", std::chrono::seconds(1)).ok());
  ASSERT_EQ(processes_->stops().size(), 1u);
  EXPECT_TRUE(containers_->stops().empty());
}

TEST_F(RoutedRuntimeTest, LostAndOomStatusesOfContainersComeThrough) {
  ASSERT_TRUE(routed_->Launch(ContainerSpec("a")).ok());
  ASSERT_TRUE(routed_->Launch(ContainerSpec("b")).ok());
  ASSERT_TRUE(containers_->KillByOom("a").ok());
  ASSERT_TRUE(containers_->Lose("b", "the container engine no longer knows container kiln-x-b").ok());
  auto a = routed_->Inspect("a");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->oom_killed);
  EXPECT_EQ(a->term_signal, SIGKILL);
  auto b = routed_->Inspect("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->state, InstanceState::kLost);
  EXPECT_EQ(b->lost_reason, "the container engine no longer knows container kiln-x-b");
}

TEST_F(RoutedRuntimeTest, ListIsTheUnion) {
  ASSERT_TRUE(routed_->Launch(ProcessSpec("p1")).ok());
  ASSERT_TRUE(routed_->Launch(ContainerSpec("c1")).ok());
  ASSERT_TRUE(routed_->Launch(ProcessSpec("p2")).ok());
  auto ids = routed_->List();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::string>{"c1", "p1", "p2"}));
}

TEST_F(RoutedRuntimeTest, PrepareImageGoesToTheContainersWithItsProgressAndCancellation) {
  containers_->SetPrepareImage([](const ContainerImage& image, const std::function<void(const std::string&)>& progress,
                                  const std::function<bool()>& cancelled) {
    progress("pulling " + image.requested + ": 50%");
    if (cancelled()) return Status::Aborted("cancelled");
    return Status::NotFound("no registry has " + image.requested);
  });
  std::vector<std::string> seen;
  ContainerImage image{.requested = "registry.local/byo:2", .reference = "", .entrypoint = std::nullopt};
  Status s = routed_->PrepareImage(
      image, [&](const std::string& text) { seen.push_back(text); }, [] { return false; });
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no registry has registry.local/byo:2");
  EXPECT_EQ(seen, std::vector<std::string>{"pulling registry.local/byo:2: 50%"});
  EXPECT_EQ(routed_
                ->PrepareImage(
                    image, [](const std::string&) {}, [] { return true; })
                .code(),
            StatusCode::kAborted);
  EXPECT_EQ(containers_->prepared_images().size(), 2u);
  EXPECT_TRUE(processes_->prepared_images().empty());
}

class RoutedRuntimeWithoutEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto processes = std::make_unique<FakeRuntime>(dir_.path() + "/processes");
    processes_ = processes.get();
    routed_ = MakeRoutedRuntime(std::move(processes), nullptr);
  }

  store::testing::TempDir dir_;
  FakeRuntime* processes_ = nullptr;
  std::unique_ptr<Runtime> routed_;
};

TEST_F(RoutedRuntimeWithoutEngineTest, ContainerImagesFailNamingTheSettingAndProcessesRunAsBefore) {
  Status launched = routed_->Launch(ContainerSpec("c"));
  EXPECT_EQ(launched.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(launched.message().find("registry.local/byo:1"), std::string::npos) << launched.message();
  EXPECT_NE(launched.message().find("container_engine.socket"), std::string::npos) << launched.message();
  EXPECT_EQ(processes_->launch_attempts(), 0);

  Status prepared = routed_->PrepareImage(
      ContainerImage{.requested = "registry.local/byo:1", .reference = "", .entrypoint = std::nullopt},
      [](const std::string&) {}, [] { return false; });
  EXPECT_EQ(prepared.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(prepared.message().find("container_engine.socket"), std::string::npos) << prepared.message();
  EXPECT_TRUE(processes_->prepared_images().empty());

  ASSERT_TRUE(routed_->Launch(ProcessSpec("p")).ok());
  EXPECT_EQ(routed_->OutputPath("p"), processes_->OutputPath("p"));
  ASSERT_TRUE(processes_->Exit("p", 3).ok());
  auto status = routed_->Inspect("p");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state, InstanceState::kExited);
  EXPECT_EQ(status->exit_code, 3);
  auto ids = routed_->List();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<std::string>{"p"});
  ASSERT_TRUE(routed_->Remove("p").ok());
  EXPECT_EQ(processes_->removed(), std::vector<std::string>{"p"});
}

}  // namespace
}  // namespace kiln::runtime
