// Tests of the fake runtime itself (the controllers' tests rely on it keeping runtime.h's
// contract: statuses, errors, the output record format, /ping).
#include "runtime/test_util/fake_runtime.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>

#include "net/http_client.h"
#include "runtime/test_util/fake_clock.h"
#include "store/test_util/temp_database.h"

namespace kiln::runtime::testing {
namespace {

InstanceSpec Spec(const std::string& id) {
  InstanceSpec s;
  s.instance_id = id;
  s.argv = {"/bin/true", "train"};
  return s;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class FakeRuntimeTest : public ::testing::Test {
 protected:
  store::testing::TempDir dir_;
  FakeClock clock_{5000};
  FakeRuntime runtime_{dir_.path() + "/instances", &clock_};
};

TEST_F(FakeRuntimeTest, PrepareImageSucceedsUnlessScriptedAndIsRecorded) {
  ContainerImage image{.requested = "registry.local/a:1", .reference = "", .entrypoint = std::nullopt};
  EXPECT_TRUE(runtime_
                  .PrepareImage(
                      image, [](const std::string&) {}, [] { return false; })
                  .ok());
  runtime_.SetPrepareImage([](const ContainerImage& i, const std::function<void(const std::string&)>& progress,
                              const std::function<bool()>&) {
    progress("pulling " + i.requested);
    return Status::NotFound("no " + i.requested);
  });
  std::string seen;
  Status s = runtime_.PrepareImage(
      image, [&](const std::string& text) { seen = text; }, [] { return false; });
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(seen, "pulling registry.local/a:1");
  ASSERT_EQ(runtime_.prepared_images().size(), 2u);
  EXPECT_EQ(runtime_.prepared_images()[1].requested, "registry.local/a:1");
}

TEST_F(FakeRuntimeTest, OomKillsAndLossesCarryTheirDetail) {
  ASSERT_TRUE(runtime_.Launch(Spec("oom")).ok());
  ASSERT_TRUE(runtime_.Launch(Spec("lost")).ok());
  ASSERT_TRUE(runtime_.KillByOom("oom").ok());
  ASSERT_TRUE(runtime_.Lose("lost", "the engine forgot it").ok());
  auto oom = runtime_.Inspect("oom");
  ASSERT_TRUE(oom.ok());
  EXPECT_EQ(oom->state, InstanceState::kExited);
  EXPECT_EQ(oom->term_signal, SIGKILL);
  EXPECT_TRUE(oom->oom_killed);
  auto lost = runtime_.Inspect("lost");
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(lost->state, InstanceState::kLost);
  EXPECT_EQ(lost->lost_reason, "the engine forgot it");
  EXPECT_FALSE(lost->oom_killed);
}

TEST_F(FakeRuntimeTest, RunsUntilItExitsAndKeepsTheRuntimesErrors) {
  ASSERT_TRUE(runtime_.Launch(Spec("a")).ok());
  EXPECT_EQ(runtime_.Launch(Spec("a")).code(), StatusCode::kAlreadyExists);
  auto running = runtime_.Inspect("a");
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state, InstanceState::kRunning);
  EXPECT_EQ(running->started_millis, 5000);
  EXPECT_EQ(runtime_.Remove("a").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_.Inspect("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(runtime_.Wait("a", std::chrono::milliseconds(1))->state, InstanceState::kRunning);

  clock_.Advance(std::chrono::milliseconds(250));
  ASSERT_TRUE(runtime_.Exit("a", 4).ok());
  EXPECT_EQ(runtime_.Exit("a", 4).code(), StatusCode::kFailedPrecondition);
  auto exited = runtime_.Wait("a", std::chrono::seconds(5));
  ASSERT_TRUE(exited.ok());
  EXPECT_EQ(exited->state, InstanceState::kExited);
  EXPECT_EQ(exited->exit_code, 4);
  EXPECT_EQ(exited->term_signal, 0);
  EXPECT_EQ(exited->finished_millis, 5250);
  EXPECT_EQ(runtime_.Usage("a").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*runtime_.List(), std::vector<std::string>{"a"});
  ASSERT_TRUE(runtime_.Remove("a").ok());
  EXPECT_TRUE(runtime_.List()->empty());
  EXPECT_EQ(runtime_.removed(), std::vector<std::string>{"a"});
}

TEST_F(FakeRuntimeTest, KilledLostAndVanishedInstances) {
  for (const char* id : {"k", "l", "v"}) ASSERT_TRUE(runtime_.Launch(Spec(id)).ok());
  ASSERT_TRUE(runtime_.Kill("k", SIGKILL).ok());
  EXPECT_EQ(runtime_.Inspect("k")->exit_code, -1);
  EXPECT_EQ(runtime_.Inspect("k")->term_signal, SIGKILL);
  ASSERT_TRUE(runtime_.Lose("l").ok());
  EXPECT_EQ(runtime_.Inspect("l")->state, InstanceState::kLost);
  runtime_.Vanish("v");
  EXPECT_EQ(runtime_.Inspect("v").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(runtime_.launches(), (std::vector<std::string>{"k", "l", "v"}));
}

TEST_F(FakeRuntimeTest, StopIsRecordedAndEndsTheProgramBySigterm) {
  ASSERT_TRUE(runtime_.Launch(Spec("s")).ok());
  ASSERT_TRUE(runtime_.Stop("s", std::chrono::seconds(30)).ok());
  auto status = runtime_.Inspect("s");
  EXPECT_EQ(status->state, InstanceState::kExited);
  EXPECT_EQ(status->term_signal, SIGTERM);
  EXPECT_TRUE(status->stop_requested);
  ASSERT_TRUE(runtime_.Stop("s", std::chrono::seconds(1)).ok());  // idempotent, still recorded
  auto stops = runtime_.stops();
  ASSERT_EQ(stops.size(), 2u);
  EXPECT_EQ(stops[0].instance_id, "s");
  EXPECT_EQ(stops[0].grace, std::chrono::seconds(30));
}

TEST_F(FakeRuntimeTest, AHangingProgramOutlivesTheStopUntilTheGraceEnds) {
  FakeRuntime::Behavior hangs;
  hangs.hangs_on_stop = true;
  runtime_.AddRule(FakeRuntime::IdStartsWith("h"), hangs);
  ASSERT_TRUE(runtime_.Launch(Spec("h1")).ok());
  ASSERT_TRUE(runtime_.Launch(Spec("h2")).ok());
  ASSERT_TRUE(runtime_.Stop("h1", std::chrono::seconds(30)).ok());
  EXPECT_TRUE(runtime_.running("h1"));
  ASSERT_TRUE(runtime_.ExpireGrace("h1").ok());
  EXPECT_EQ(runtime_.Inspect("h1")->term_signal, SIGKILL);
  ASSERT_TRUE(runtime_.Stop("h2", std::chrono::seconds(0)).ok());  // grace 0: SIGKILL at once
  EXPECT_EQ(runtime_.Inspect("h2")->term_signal, SIGKILL);
  ASSERT_TRUE(runtime_.Signal(runtime_.launches()[0], SIGUSR1).code() == StatusCode::kFailedPrecondition);
}

TEST_F(FakeRuntimeTest, RulesChooseFailureOrImmediateExitAndTheNewestWins) {
  FakeRuntime::Behavior fail;
  fail.on_launch = FakeRuntime::Behavior::OnLaunch::kFailLaunch;
  fail.launch_error = "cannot execute /x: No such file or directory";
  FakeRuntime::Behavior exits;
  exits.on_launch = FakeRuntime::Behavior::OnLaunch::kExitAtOnce;
  exits.exit_code = 2;
  exits.output = {{'e', "oops"}};
  runtime_.AddRule(FakeRuntime::ProgramIs("/x"), fail);
  runtime_.AddRule(FakeRuntime::IdStartsWith("e"), exits);
  InstanceSpec bad = Spec("bad");
  bad.argv = {"/x"};
  Status launched = runtime_.Launch(bad);
  EXPECT_EQ(launched.message(), "cannot execute /x: No such file or directory");
  EXPECT_EQ(runtime_.Inspect("bad").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(runtime_.launch_attempts(), 1);
  EXPECT_TRUE(runtime_.launches().empty());
  ASSERT_TRUE(runtime_.Launch(Spec("e1")).ok());
  EXPECT_EQ(runtime_.Inspect("e1")->exit_code, 2);
  EXPECT_EQ(Slurp(runtime_.OutputPath("e1")), "5000 e oops\n");
}

TEST_F(FakeRuntimeTest, OutputRecordsAreInTheRuntimesFormat) {
  ASSERT_TRUE(runtime_.Launch(Spec("o")).ok());
  EXPECT_EQ(Slurp(runtime_.OutputPath("o")), "");  // exists from Launch on
  ASSERT_TRUE(runtime_.WriteOutput("o", 'o', "hello").ok());
  clock_.Advance(std::chrono::milliseconds(7));
  ASSERT_TRUE(runtime_.WriteOutput("o", 'e', "world").ok());
  EXPECT_EQ(Slurp(runtime_.OutputPath("o")), "5000 o hello\n5007 e world\n");
}

TEST_F(FakeRuntimeTest, WaitUntilWakesOnLaunch) {
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (void)runtime_.Launch(Spec("late"));
  });
  EXPECT_TRUE(runtime_.WaitForLaunch("late", std::chrono::seconds(10)));
  later.join();
  EXPECT_FALSE(runtime_.WaitForLaunch("never", std::chrono::milliseconds(30)));
  EXPECT_EQ(runtime_.WaitForLaunchNumber(1, std::chrono::milliseconds(1)), "late");
}

TEST_F(FakeRuntimeTest, ServesPingOnTheBindPortWhileItRuns) {
  // A free loopback port.
  int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t port = ntohs(addr.sin_port);
  ::close(probe);

  InstanceSpec spec = Spec("srv");
  spec.env["SAGEMAKER_BIND_TO_PORT"] = std::to_string(port);
  ASSERT_TRUE(runtime_.Launch(spec).ok());
  net::HttpClient client{net::HttpClientOptions{}};
  net::ClientRequest ping;
  ping.method = "GET";
  ping.target = "/ping";
  auto ok = client.Send("127.0.0.1", port, ping, {});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->status, 200);
  ASSERT_TRUE(runtime_.SetPingStatus("srv", 503).ok());
  auto sick = client.Send("127.0.0.1", port, ping, {});
  ASSERT_TRUE(sick.ok()) << sick.status().ToString();
  EXPECT_EQ(sick->status, 503);
  ASSERT_TRUE(runtime_.Exit("srv", 0).ok());
  EXPECT_FALSE(client.Send("127.0.0.1", port, ping, {}).ok());  // the port closed with it
}

TEST_F(FakeRuntimeTest, ServesPingOnTheNetworkAddressWhenTheSpecHasANetwork) {
  // A port free on 127.0.9.2 (any 127/8 address is loopback); both instances listen on it, each
  // on its own address, as two namespaced containers on 8080 do.
  int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ASSERT_EQ(::inet_pton(AF_INET, "127.0.9.2", &addr.sin_addr), 1);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t port = ntohs(addr.sin_port);
  ::close(probe);

  for (const char* id : {"a", "b"}) {
    InstanceSpec spec = Spec(id);
    spec.env["SAGEMAKER_BIND_TO_PORT"] = std::to_string(port);
    spec.network = NetworkAttachment{};
    spec.network->address = std::string("127.0.9.") + (id[0] == 'a' ? "2" : "3");
    ASSERT_TRUE(runtime_.Launch(spec).ok());
    ASSERT_TRUE(runtime_.running(id)) << "the fake could not bind " << spec.network->address;
  }
  ASSERT_TRUE(runtime_.SetPingStatus("b", 503).ok());
  net::HttpClient client{net::HttpClientOptions{}};
  net::ClientRequest ping;
  ping.method = "GET";
  ping.target = "/ping";
  auto a = client.Send("127.0.9.2", port, ping, {});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->status, 200);
  auto b = client.Send("127.0.9.3", port, ping, {});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->status, 503);
  ASSERT_TRUE(runtime_.Exit("a", 0).ok());
  EXPECT_FALSE(client.Send("127.0.9.2", port, ping, {}).ok());  // a's listener closed with it
  EXPECT_TRUE(client.Send("127.0.9.3", port, ping, {}).ok());   // b's did not
}

}  // namespace
}  // namespace kiln::runtime::testing
