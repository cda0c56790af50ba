#include "control/endpoint_controller.h"
#include "control/endpoint_states.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "control/test_util/controller_fixture.h"
#include "net/http_client.h"
#include "runtime/test_util/fake_networks.h"
#include "store/autoscaling_repository.h"
#include "store/training_job_repository.h"

// The endpoint controller over a fake runtime (control/test_util/controller_fixture.h): each
// fake instance answers GET /ping on the port the controller gives it, so creation, health
// replacement, updates, adoption and deletion run without processes or a server. The controller's
// own deadlines (replacement backoff, the capacity wait) and its stamps run on the fixture's fake
// clock, which the tests advance (then EndpointController::Wake); pings, startup and drain run in
// real time with short intervals.

namespace kiln::control {
namespace {

using nlohmann::json;
using runtime::testing::FakeRuntime;
using store::EndpointStatus;

constexpr std::chrono::seconds kStopGrace{9};  // distinct from the default, to see it passed on

class EndpointControllerTest : public testing::ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    MakeScheduler(testing::SmallHost(4, 16));  // fits two ml.m5.large
    routes_ = std::make_unique<serving::RoutingTable>();
    illegal_before_ = IllegalEndpointTransitions();
  }
  void TearDown() override {
    controller_.reset();
    // Every status and instance phase change the test caused was one endpoint_states.h allows.
    EXPECT_EQ(IllegalEndpointTransitions(), illegal_before_);
  }
  int64_t illegal_before_ = 0;

  void StartController() {
    EndpointControllerOptions options;
    options.work_dir = work_dir();
    options.endpoint_url = "http://127.0.0.1:1";
    // Below 32768 (Linux's ephemeral ports). Processes running these tests at once (ctest -j) have
    // nearby pids: the first block is scattered by a multiplicative hash of the pid, so that a
    // test using several blocks does not run into its neighbour's first one, as adjacent blocks
    // did (both saw the block free, one failed to bind: "exited with code 1 before it passed the
    // ping health check"). The controller skips a block it cannot bind anyway.
    const uint32_t scatter = static_cast<uint32_t>(::getpid()) * 2654435761u;
    options.port_range_begin = 20000 + static_cast<int>((scatter >> 16) % 90) * 100;
    options.port_range_end = 30000;
    options.stop_grace = kStopGrace;
    options.health_interval = std::chrono::milliseconds(20);
    options.unhealthy_threshold = 2;
    options.ping_timeout = std::chrono::milliseconds(1000);
    options.default_startup_timeout = std::chrono::seconds(10);
    options.drain_timeout = std::chrono::seconds(2);
    options.replacement_backoff = replacement_backoff_;
    options.remote_instances = remote_instances_;
    EndpointControllerDeps deps;
    deps.database = db_.get();
    deps.object_store = object_store_.get();
    deps.runtime = runtime_.get();
    deps.scheduler = scheduler_.get();
    deps.environments = environments_.get();
    deps.credentials = credentials_.get();
    deps.log_store = log_store_.get();
    deps.routes = routes_.get();
    deps.clock = &clock_;
    deps.networks = networks_.get();  // null (host mode) unless a test set UseNetworks()
    controller_ = std::make_unique<EndpointController>(options, deps);
    ASSERT_TRUE(controller_->Start().ok());
  }

  void RestartController() {
    controller_.reset();
    RenewServerState();
    routes_ = std::make_unique<serving::RoutingTable>();
    StartController();
  }

  // A deployment as the API builds it: one variant of `count` ml.m5.large running `image`.
  static store::Deployment Deployment(const std::string& config, const std::string& image, int count,
                                      int64_t deployed_millis, const json& variant_members = json::object()) {
    json variant = {{"VariantName", "main"},
                    {"ModelName", "model-" + config},
                    {"InstanceType", "ml.m5.large"},
                    {"InitialInstanceCount", count}};
    variant.merge_patch(variant_members);
    return {
        .config_name = config,
        .endpoint_config = {{"EndpointConfigName", config}, {"ProductionVariants", json::array({variant})}},
        .models = {{"model-" + config, {{"ModelName", "model-" + config}, {"PrimaryContainer", {{"Image", image}}}}}},
        .deployed_millis = deployed_millis};
  }
  static store::DesiredVariants Desired(int count) { return {{"main", {.weight = 1.0, .instance_count = count}}}; }

  // Namespaced mode: the controller gets FakeNetworks (kept across RestartController, as the
  // networks' state on disk is). Their addresses are 127.0.k.n by creation order k: networks
  // made first, a number of them scattered by the pid, move this process's endpoint networks
  // away from another test process's at once (ctest -j), since every instance listens on 8080.
  void UseNetworks() {
    networks_ = std::make_unique<runtime::FakeNetworks>();
    const uint32_t scatter = static_cast<uint32_t>(::getpid()) * 2654435761u;
    const int padding = static_cast<int>((scatter >> 8) % 200);
    for (int i = 0; i < padding; ++i) ASSERT_TRUE(networks_->Ensure("padding-" + std::to_string(i), false).ok());
  }

  // The calls of networks_ (UseNetworks) that name `network`, without the padding.
  std::vector<std::string> NetworkCalls(const std::string& network) const {
    std::vector<std::string> calls;
    for (const std::string& call : networks_->calls()) {
      if (call.find(" " + network) != std::string::npos) calls.push_back(call);
    }
    return calls;
  }

  // The routed instances' targets.
  std::vector<std::shared_ptr<const serving::InstanceTarget>> Targets(const std::string& name) const {
    std::vector<std::shared_ptr<const serving::InstanceTarget>> targets;
    auto route = routes_->Find(name);
    if (!route) return targets;
    for (const auto& v : route->variants) {
      for (const auto& i : v.instances) targets.push_back(i);
    }
    return targets;
  }

  // CreateEndpoint as the API does it; `model_members` are merged into the model.
  void Create(const std::string& name, const std::string& image = "local:/bin/true", int count = 1,
              const json& variant_members = json::object(), const json& model_members = json::object()) {
    store::EndpointRecord record;
    record.name = name;
    record.arn = "arn:aws:sagemaker:us-east-1:000000000000:endpoint/" + name;
    record.config_name = "cfg1";
    record.status = EndpointStatus::kCreating;
    record.creation_millis = NowMillis();
    record.last_modified_millis = record.creation_millis;
    record.request = {{"EndpointName", name}, {"EndpointConfigName", "cfg1"}};
    record.deployment = Deployment("cfg1", image, count, 1000, variant_members);
    record.deployment.models["model-cfg1"].merge_patch(model_members);
    record.desired = Desired(count);
    store::EndpointRepository endpoints(db_.get());
    ASSERT_TRUE(endpoints.Insert(record).ok());
    controller_->EndpointChanged(name);
  }

  // Writes the row as the API would (`change` on it), then tells the controller.
  void Change(const std::string& name, const std::function<void(store::EndpointRecord&)>& change) {
    store::EndpointRepository endpoints(db_.get());
    auto written = endpoints.Mutate(name, [&](store::EndpointRecord& r) {
      change(r);
      r.last_modified_millis = NowMillis();
      return Status::Ok();
    });
    ASSERT_TRUE(written.ok()) << written.status().ToString();
    controller_->EndpointChanged(name);
  }

  Result<store::EndpointRecord> Endpoint(const std::string& name) {
    store::EndpointRepository endpoints(db_.get());
    return endpoints.Get(name);
  }

  store::EndpointRecord WaitForStatus(const std::string& name, EndpointStatus status) {
    store::EndpointRecord last;
    bool reached = WaitFor([&] {
      auto r = Endpoint(name);
      if (r.ok()) last = *r;
      return r.ok() && r->status == status;
    });
    EXPECT_TRUE(reached) << name << " is " << store::ToString(last.status) << " (" << last.failure_reason << "), not "
                         << store::ToString(status);
    return last;
  }

  // The instance ids routed for the endpoint now.
  std::vector<std::string> Routed(const std::string& name) const {
    std::vector<std::string> ids;
    auto route = routes_->Find(name);
    if (!route) return ids;
    for (const auto& v : route->variants) {
      for (const auto& i : v.instances) ids.push_back(i->instance_id);
    }
    return ids;
  }

  // The runtime id of a routed instance id.
  static std::string RuntimeId(const std::string& endpoint, const std::string& instance_id) {
    return "endpoint-" + endpoint + "-" + instance_id;
  }

  // Moves the controller's clock a backoff at a time until `done()` holds: for tests about
  // replacement, not about its timing (ReplacementsWaitForABackoffThatDoubles is).
  bool AdvanceUntil(const std::function<bool()>& done) {
    const auto give_up = std::chrono::steady_clock::now() + kPatience;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      clock_.Advance(replacement_backoff_);
      controller_->Wake();
      runtime_->WaitUntil(done, std::chrono::milliseconds(10));
    }
    return true;
  }

  // Advances the clock `step` at a time (waking the controller) until the runtime saw launch
  // number `n`; returns the fake milliseconds that took.
  int64_t AdvanceUntilLaunch(size_t n, std::chrono::milliseconds step) {
    const int64_t start = clock_.NowMillis();
    const auto give_up = std::chrono::steady_clock::now() + kPatience;
    auto launched = [&] { return runtime_->launches().size() >= n; };
    while (!launched() && std::chrono::steady_clock::now() < give_up) {
      clock_.Advance(step);
      controller_->Wake();
      runtime_->WaitUntil(launched, std::chrono::milliseconds(10));
    }
    return clock_.NowMillis() - start;
  }

  std::chrono::milliseconds replacement_backoff_{20};
  bool remote_instances_ = false;                    // EndpointControllerOptions::remote_instances (a Slurm runtime)
  std::unique_ptr<runtime::FakeNetworks> networks_;  // UseNetworks()
  std::unique_ptr<serving::RoutingTable> routes_;
  std::unique_ptr<EndpointController> controller_;
};

TEST_F(EndpointControllerTest, CreateBringsTheEndpointInServiceAndRoutesItsInstance) {
  StartController();
  Create("ep");
  auto in_service = WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_EQ(runtime_->launches().size(), 1u);
  const std::string runtime_id = runtime_->launches()[0];
  auto spec = runtime_->spec(runtime_id);
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(spec->argv, (std::vector<std::string>{"/bin/true", "serve"}));
  EXPECT_EQ(spec->cpus.size(), 2u);
  EXPECT_TRUE(spec->env.count("SAGEMAKER_BIND_TO_PORT"));
  // Routed, and recorded in the row for a restarted server.
  auto routed = Routed("ep");
  ASSERT_EQ(routed.size(), 1u);
  EXPECT_EQ(RuntimeId("ep", routed[0]), runtime_id);
  ASSERT_EQ(in_service.state.instances.size(), 1u);
  EXPECT_EQ(in_service.state.instances[0].runtime_id, runtime_id);
  EXPECT_EQ(in_service.state.production_variants[0].current_instance_count, 1);
}

TEST_F(EndpointControllerTest, ALaunchFailureWhileCreatingFailsTheEndpointWithTheRuntimesMessage) {
  FakeRuntime::Behavior broken;
  broken.on_launch = FakeRuntime::Behavior::OnLaunch::kFailLaunch;
  broken.launch_error = "cannot execute /bin/true: Exec format error";
  runtime_->SetDefaultBehavior(broken);
  StartController();
  Create("ep");
  auto failed = WaitForStatus("ep", EndpointStatus::kFailed);
  EXPECT_EQ(failed.failure_reason,
            "ClientError: The container of production variant main could not start: cannot execute /bin/true: Exec "
            "format error");
  // Nothing holds capacity once the failed instance is gone.
  EXPECT_TRUE(WaitFor([&] { return scheduler_->Snapshot().granted.empty(); }));
}

TEST_F(EndpointControllerTest, AContainerThatExitsBeforeItIsHealthyFailsTheEndpoint) {
  FakeRuntime::Behavior crashes;
  crashes.on_launch = FakeRuntime::Behavior::OnLaunch::kExitAtOnce;
  crashes.exit_code = 3;
  crashes.output = {{'e', "ModuleNotFoundError: No module named 'flask'"}};
  runtime_->SetDefaultBehavior(crashes);
  StartController();
  Create("ep");
  auto failed = WaitForStatus("ep", EndpointStatus::kFailed);
  EXPECT_THAT(failed.failure_reason, ::testing::HasSubstr("exited with code 3 before it passed the ping health check"));
}

// How the runtime says an instance ended (issue 15): the OOM killer, a lost container's reason.
TEST_F(EndpointControllerTest, AnOomKillOrALossIsNamedInTheFailureReason) {
  FakeRuntime::Behavior silent;
  silent.serve_ping = false;  // never healthy: the exit is seen by the health gate
  runtime_->SetDefaultBehavior(silent);
  StartController();
  Create("oom");
  auto first = runtime_->WaitForLaunchNumber(1, kPatience);
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(runtime_->KillByOom(*first).ok());
  EXPECT_THAT(WaitForStatus("oom", EndpointStatus::kFailed).failure_reason,
              ::testing::HasSubstr("production variant main was killed for running out of memory before it passed "
                                   "the ping health check"));
  Create("lost");
  auto second = runtime_->WaitForLaunchNumber(2, kPatience);
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(runtime_->Lose(*second, "the container engine no longer knows container kiln-1-x.").ok());
  EXPECT_THAT(WaitForStatus("lost", EndpointStatus::kFailed).failure_reason,
              ::testing::HasSubstr("production variant main was lost: the container engine no longer knows container "
                                   "kiln-1-x before it passed"));
}

// ---- Container images (issue 15): the engine runs the model's image itself ----

TEST_F(EndpointControllerTest, AContainerImageIsPreparedThenServedByItsOwnEntrypoint) {
  environments_->SetContainerImages({"registry.local/*"});
  std::atomic<bool> release{false};
  runtime_->SetPrepareImage([&](const runtime::ContainerImage& image,
                                const std::function<void(const std::string&)>& progress,
                                const std::function<bool()>& cancelled) {
    progress("pulling " + image.requested + ": 30%");
    const auto give_up = std::chrono::steady_clock::now() + kPatience;
    while (!release.load() && !cancelled() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return Status::Ok();
  });
  StartController();
  // No model server is configured (options.model_server is empty): a container image needs none.
  Create("byo", "registry.local/byo-serve:1", 1, json::object(),
         {{"PrimaryContainer", {{"Environment", {{"MODEL_MODE", "fast"}}}}}});
  // While it pulls, the variant says so, and nothing is reserved yet.
  std::string waiting;
  EXPECT_TRUE(WaitFor([&] {
    auto r = Endpoint("byo");
    if (!r.ok() || r->state.production_variants.empty()) return false;
    const auto& status = r->state.production_variants[0].variant_status;
    waiting = status.empty() ? "" : status[0].status_message;
    return waiting.find("30%") != std::string::npos;
  })) << waiting;
  EXPECT_EQ(waiting,
            "Downloading the image registry.local/byo-serve:1 of model model-cfg1: pulling registry.local/byo-serve:1: "
            "30%");
  EXPECT_TRUE(scheduler_->Snapshot().granted.empty());
  release = true;
  WaitForStatus("byo", EndpointStatus::kInService);
  ASSERT_EQ(runtime_->launches().size(), 1u);
  auto spec = runtime_->spec(runtime_->launches()[0]);
  ASSERT_TRUE(spec.has_value() && spec->container.has_value());
  EXPECT_EQ(spec->container->requested, "registry.local/byo-serve:1");
  EXPECT_FALSE(spec->container->entrypoint.has_value());
  EXPECT_EQ(spec->argv, (std::vector<std::string>{"serve"}));
  EXPECT_EQ(spec->env.count("PATH"), 0u);
  EXPECT_EQ(spec->env.count("KILN_MODEL_SERVER_WORKER"), 0u);
  EXPECT_EQ(spec->env.at("MODEL_MODE"), "fast");
  EXPECT_TRUE(spec->env.count("SAGEMAKER_BIND_TO_PORT"));
  EXPECT_TRUE(spec->extra_mounts.empty());
  ASSERT_EQ(runtime_->prepared_images().size(), 1u);
  // The variant no longer shows the pull.
  auto r = Endpoint("byo");
  ASSERT_TRUE(r.ok());
  for (const auto& v : r->state.production_variants) {
    for (const auto& s : v.variant_status) EXPECT_EQ(s.status_message.find("Downloading the image"), std::string::npos);
  }
}

TEST_F(EndpointControllerTest, AMissingContainerImageFailsTheEndpointNamingImageAndModel) {
  environments_->SetContainerImages({"registry.local/*"});
  runtime_->SetPrepareImage([](const runtime::ContainerImage& image, const std::function<void(const std::string&)>&,
                               const std::function<bool()>&) {
    return Status::NotFound("image " + image.requested + " was not found locally and registry.local has no such tag");
  });
  StartController();
  Create("nope", "registry.local/gone:3");
  EXPECT_EQ(WaitForStatus("nope", EndpointStatus::kFailed).failure_reason,
            "ClientError: Image registry.local/gone:3 of model model-cfg1: image registry.local/gone:3 was not found "
            "locally and registry.local has no such tag");
  EXPECT_EQ(runtime_->launch_attempts(), 0);
  EXPECT_TRUE(WaitFor([&] { return scheduler_->Snapshot().granted.empty(); }));
}

TEST_F(EndpointControllerTest, AnUnreachableEngineFailsTheEndpointAsKilnsSide) {
  environments_->SetContainerImages({"registry.local/*"});
  runtime_->SetPrepareImage(
      [](const runtime::ContainerImage&, const std::function<void(const std::string&)>&, const std::function<bool()>&) {
        return Status::Unavailable("the container engine at unix:///run/podman/podman.sock is unreachable");
      });
  StartController();
  Create("down", "registry.local/byo-serve:1");
  EXPECT_THAT(WaitForStatus("down", EndpointStatus::kFailed).failure_reason,
              ::testing::StartsWith("InternalServerError: Image registry.local/byo-serve:1 of model model-cfg1: the "
                                    "container engine at unix:///run/podman/podman.sock is unreachable"));
  EXPECT_EQ(runtime_->launch_attempts(), 0);
}

TEST_F(EndpointControllerTest, AnInstanceThatDoesNotFitWaitsThenFailsWithTheCapacityReason) {
  // Something else holds 2 of the 4 CPUs; an ml.m5.xlarge needs all 4 (strict shapes).
  ASSERT_TRUE(scheduler_->AllocateNow({"hog", 0, "ml.m5.large", 1}).ok());
  StartController();
  Create("ep", "local:/bin/true", 1,
         {{"InstanceType", "ml.m5.xlarge"}, {"VariantInstanceProvisionTimeoutInSeconds", 1}});
  // While it waits, the variant says what for; it waits on the controller's clock.
  std::string waiting;
  ASSERT_TRUE(WaitFor([&] {
    auto r = Endpoint("ep");
    if (!r.ok() || r->state.production_variants.empty()) return false;
    const auto& status = r->state.production_variants[0].variant_status;
    if (status.empty()) return false;
    waiting = status[0].status_message;
    return waiting.starts_with("Waiting for compute capacity");
  }));
  EXPECT_THAT(waiting, ::testing::HasSubstr("ml.m5.xlarge needs 4 vCPUs"));
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kCreating);
  clock_.Advance(std::chrono::milliseconds(999));
  controller_->Wake();
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kCreating);  // the budget is not spent yet
  clock_.Advance(std::chrono::milliseconds(1));
  controller_->Wake();
  auto failed = WaitForStatus("ep", EndpointStatus::kFailed);
  EXPECT_THAT(failed.failure_reason,
              ::testing::StartsWith("Unable to provision requested ML compute capacity. Please retry using a "
                                    "different ML instance type. Kiln: production variant main waited 1 s"));
  EXPECT_EQ(runtime_->launch_attempts(), 0);
}

// A backend that places instances elsewhere (the Slurm runtime, issue 21): the instance is not
// pinged until the runtime says where it runs; its waiting reason is the variant's message, and
// the wait does not spend the startup budget (10 s here).
TEST_F(EndpointControllerTest, ARemoteInstanceIsPingedOnlyOnceTheRuntimeSaysWhereItRuns) {
  remote_instances_ = true;
  StartController();
  ASSERT_TRUE(store::TagRepository(db_.get())
                  .Add("arn:aws:sagemaker:us-east-1:000000000000:endpoint/ep", {{"kiln:slurm-partition", "serve"}})
                  .ok());
  Create("ep");
  ASSERT_TRUE(WaitFor([&] { return runtime_->launches().size() == 1; }));
  const std::string runtime_id = runtime_->launches()[0];
  EXPECT_EQ(runtime_->spec(runtime_id)->instance_type, "ml.m5.large");
  EXPECT_EQ(runtime_->spec(runtime_id)->shape_vcpus, 2);
  EXPECT_EQ(runtime_->spec(runtime_id)->placement, (std::map<std::string, std::string>{{"partition", "serve"}}));
  ASSERT_TRUE(runtime_->SetWaiting(runtime_id, "Slurm job 4 is pending: Priority").ok());
  ASSERT_TRUE(WaitFor([&] {
    auto r = Endpoint("ep");
    if (!r.ok() || r->state.production_variants.empty()) return false;
    const auto& status = r->state.production_variants[0].variant_status;
    return !status.empty() && status[0].status_message == "Slurm job 4 is pending: Priority";
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kCreating);
  ASSERT_TRUE(runtime_->SetWaiting(runtime_id, "", "127.0.0.1").ok());
  WaitForStatus("ep", EndpointStatus::kInService);
  EXPECT_EQ(Routed("ep").size(), 1u);
}

TEST_F(EndpointControllerTest, AnInstanceThatDiesIsReplaced) {
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string first = runtime_->launches().at(0);
  ASSERT_TRUE(runtime_->Exit(first, 137).ok());
  ASSERT_TRUE(AdvanceUntil([&] { return runtime_->launches().size() >= 2; }));
  auto second = runtime_->WaitForLaunchNumber(2, kPatience);
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(*second, first);
  // The replacement is routed, the dead one is not, and the endpoint stayed InService.
  ASSERT_TRUE(WaitFor([&] {
    auto routed = Routed("ep");
    return routed.size() == 1 && RuntimeId("ep", routed[0]) == *second;
  }));
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kInService);
  EXPECT_TRUE(WaitFor([&] {
    auto removed = runtime_->removed();
    return std::find(removed.begin(), removed.end(), first) != removed.end();
  }));
}

TEST_F(EndpointControllerTest, AnInstanceThatFailsItsHealthChecksIsStoppedAndReplaced) {
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string first = runtime_->launches().at(0);
  ASSERT_TRUE(runtime_->SetPingStatus(first, 500).ok());
  ASSERT_TRUE(AdvanceUntil([&] { return runtime_->launches().size() >= 2; }));
  auto second = runtime_->WaitForLaunchNumber(2, kPatience);
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(WaitFor([&] { return !runtime_->running(first); }));
  auto stops = runtime_->stops();
  ASSERT_FALSE(stops.empty());
  EXPECT_EQ(stops[0].instance_id, first);
  EXPECT_EQ(stops[0].grace, kStopGrace);
  ASSERT_TRUE(WaitFor([&] {
    auto routed = Routed("ep");
    return routed.size() == 1 && RuntimeId("ep", routed[0]) == *second;
  }));
}

TEST_F(EndpointControllerTest, ReplacementsWaitForABackoffThatDoubles) {
  replacement_backoff_ = std::chrono::milliseconds(150);
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  // From now on every new instance dies at once.
  FakeRuntime::Behavior crashes;
  crashes.on_launch = FakeRuntime::Behavior::OnLaunch::kExitAtOnce;
  crashes.exit_code = 1;
  runtime_->SetDefaultBehavior(crashes);
  // The fake clock moves 50 ms at a time until the next launch: a launch is seen no earlier than
  // the clock passed its backoff (it may be seen later, never earlier).
  ASSERT_TRUE(runtime_->Exit(runtime_->launches().at(0), 1).ok());
  const int64_t first_wait = AdvanceUntilLaunch(2, std::chrono::milliseconds(50));
  ASSERT_EQ(runtime_->launches().size(), 2u);
  const int64_t second_wait = AdvanceUntilLaunch(3, std::chrono::milliseconds(50));
  ASSERT_EQ(runtime_->launches().size(), 3u);
  EXPECT_GE(first_wait, 150);
  EXPECT_GE(second_wait, 300);
  // Failing replacements never fail an endpoint that is InService.
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kInService);
}

TEST_F(EndpointControllerTest, DeleteStopsTheInstancesAndRemovesTheEndpoint) {
  StartController();
  Create("ep", "local:/bin/true", 2);
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_EQ(runtime_->launches().size(), 2u);
  ASSERT_EQ(Routed("ep").size(), 2u);
  Change("ep", [](store::EndpointRecord& r) { r.status = EndpointStatus::kDeleting; });
  ASSERT_TRUE(WaitFor([&] { return Endpoint("ep").status().IsNotFound(); }));
  EXPECT_EQ(routes_->Find("ep"), nullptr);
  EXPECT_TRUE(runtime_->running_ids().empty());
  auto stops = runtime_->stops();
  ASSERT_EQ(stops.size(), 2u);
  for (const auto& stop : stops) EXPECT_EQ(stop.grace, kStopGrace);
  EXPECT_TRUE(scheduler_->Snapshot().granted.empty());
}

TEST_F(EndpointControllerTest, CountChangesLaunchAndDrainInstances) {
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  clock_.Advance(std::chrono::seconds(1));  // the second instance is launched later (LaunchedMillis)
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.desired = Desired(2);
  });
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 2; }));
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.desired = Desired(1);
  });
  // Scale in drops the newest.
  const std::string newest = runtime_->launches().at(1);
  ASSERT_TRUE(WaitFor([&] { return !runtime_->running(newest); }));
  WaitForStatus("ep", EndpointStatus::kInService);
  EXPECT_EQ(Routed("ep"),
            std::vector<std::string>{runtime_->launches().at(0).substr(std::string("endpoint-ep-").size())});
}

TEST_F(EndpointControllerTest, AWeightChangeIsPublishedWithoutRelaunching) {
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.desired["main"].weight = 0.25;
  });
  auto updated = WaitForStatus("ep", EndpointStatus::kInService);
  EXPECT_EQ(updated.state.production_variants[0].current_weight, 0.25);
  auto route = routes_->Find("ep");
  ASSERT_NE(route, nullptr);
  ASSERT_EQ(route->variants.size(), 1u);
  EXPECT_EQ(route->variants[0].weight, 0.25);
  EXPECT_EQ(route->variants[0].instances.size(), 1u);
  EXPECT_EQ(runtime_->launches().size(), 1u);
}

TEST_F(EndpointControllerTest, UpdateEndpointMovesTrafficOnceTheNewFleetIsHealthy) {
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string old_id = runtime_->launches().at(0);
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.pending = Deployment("cfg2", "local:/bin/cat", 1, 2000);
  });
  auto updated = WaitForStatus("ep", EndpointStatus::kInService);
  EXPECT_EQ(updated.config_name, "cfg2");
  EXPECT_FALSE(updated.pending.has_value());
  ASSERT_EQ(runtime_->launches().size(), 2u);
  const std::string new_id = runtime_->launches().at(1);
  EXPECT_EQ(runtime_->spec(new_id)->argv[0], "/bin/cat");
  ASSERT_TRUE(WaitFor([&] { return !runtime_->running(old_id); }));
  auto routed = Routed("ep");
  ASSERT_EQ(routed.size(), 1u);
  EXPECT_EQ(RuntimeId("ep", routed[0]), new_id);
}

TEST_F(EndpointControllerTest, AFailedUpdateRollsBackAndKeepsTheOldFleet) {
  FakeRuntime::Behavior broken;
  broken.on_launch = FakeRuntime::Behavior::OnLaunch::kFailLaunch;
  broken.launch_error = "cannot execute /bin/cat: Permission denied";
  runtime_->AddRule(FakeRuntime::ProgramIs("/bin/cat"), broken);
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string old_id = runtime_->launches().at(0);
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.pending = Deployment("cfg2", "local:/bin/cat", 1, 2000);
  });
  store::EndpointRecord rolled_back;
  ASSERT_TRUE(WaitFor([&] {
    auto r = Endpoint("ep");
    if (r.ok()) rolled_back = *r;
    return r.ok() && r->status == EndpointStatus::kInService && !r->failure_reason.empty();
  }));
  EXPECT_THAT(rolled_back.failure_reason,
              ::testing::StartsWith("UpdateEndpoint rolled back to cfg1: ClientError: The container of production "
                                    "variant main could not start: cannot execute /bin/cat: Permission denied"));
  EXPECT_FALSE(rolled_back.pending.has_value());
  EXPECT_EQ(rolled_back.config_name, "cfg1");
  EXPECT_TRUE(runtime_->running(old_id));
  auto routed = Routed("ep");
  ASSERT_EQ(routed.size(), 1u);
  EXPECT_EQ(RuntimeId("ep", routed[0]), old_id);
}

TEST_F(EndpointControllerTest, ARestartedControllerAdoptsLiveInstancesAndReplacesVanishedOnes) {
  StartController();
  Create("ep", "local:/bin/true", 2);
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 2; }));
  const std::string kept = runtime_->launches().at(0);
  const std::string vanished = runtime_->launches().at(1);

  controller_.reset();  // the instances keep running
  EXPECT_TRUE(runtime_->running(kept));
  runtime_->Vanish(vanished);  // e.g. the node lost it while no server ran
  RestartController();

  // The live one is pinged and routed again, not relaunched; the vanished one is replaced.
  auto replacement = runtime_->WaitForLaunchNumber(3, kPatience);
  ASSERT_TRUE(replacement.has_value());
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 2; }));
  auto routed = Routed("ep");
  std::vector<std::string> runtime_ids;
  for (const auto& id : routed) runtime_ids.push_back(RuntimeId("ep", id));
  std::sort(runtime_ids.begin(), runtime_ids.end());
  std::vector<std::string> expected = {kept, *replacement};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(runtime_ids, expected);
  EXPECT_EQ(runtime_->launches().size(), 3u);
  EXPECT_TRUE(runtime_->stops().empty());
  EXPECT_TRUE(scheduler_->Granted(kept).has_value());  // its resources re-reserved
}

TEST_F(EndpointControllerTest, DeleteWhileCreatingStopsTheInstanceThatIsStillStarting) {
  FakeRuntime::Behavior slow;
  slow.ping_status = 503;  // never passes the ping gate
  runtime_->SetDefaultBehavior(slow);
  StartController();
  Create("ep");
  auto launched = runtime_->WaitForLaunchNumber(1, kPatience);
  ASSERT_TRUE(launched.has_value());
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kCreating);
  EXPECT_TRUE(Routed("ep").empty());
  Change("ep", [](store::EndpointRecord& r) { r.status = EndpointStatus::kDeleting; });
  ASSERT_TRUE(WaitFor([&] { return Endpoint("ep").status().IsNotFound(); }));
  EXPECT_FALSE(runtime_->running(*launched));
  EXPECT_EQ(runtime_->launches().size(), 1u);  // never replaced
  EXPECT_EQ(routes_->Find("ep"), nullptr);
  EXPECT_TRUE(scheduler_->Snapshot().granted.empty());
}

TEST_F(EndpointControllerTest, ARestartDuringAnUpdateAdoptsBothFleetsAndFinishesTheUpdate) {
  FakeRuntime::Behavior slow;
  slow.ping_status = 503;  // the new fleet is not healthy until the test says so
  runtime_->AddRule(FakeRuntime::ProgramIs("/bin/cat"), slow);
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string old_id = runtime_->launches().at(0);
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.pending = Deployment("cfg2", "local:/bin/cat", 1, 2000);
  });
  auto new_id = runtime_->WaitForLaunchNumber(2, kPatience);
  ASSERT_TRUE(new_id.has_value());
  // Both fleets are recorded for the next server before it stops.
  ASSERT_TRUE(WaitFor([&] {
    auto r = Endpoint("ep");
    return r.ok() && r->state.instances.size() == 2;
  }));

  controller_.reset();  // both keep running
  RestartController();
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 1; }));
  EXPECT_EQ(RuntimeId("ep", Routed("ep")[0]), old_id);  // the old fleet still serves
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kUpdating);

  ASSERT_TRUE(runtime_->SetPingStatus(*new_id, 200).ok());
  auto updated = WaitForStatus("ep", EndpointStatus::kInService);
  EXPECT_EQ(updated.config_name, "cfg2");
  EXPECT_FALSE(updated.pending.has_value());
  ASSERT_TRUE(WaitFor([&] { return !runtime_->running(old_id); }));
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 1 && RuntimeId("ep", Routed("ep")[0]) == *new_id; }));
  EXPECT_EQ(runtime_->launches().size(), 2u);  // adopted, never relaunched
}

// Deployment guardrails (serving-contract §9): a LINEAR update shifts half the traffic and bakes;
// the recorded step survives a restart (the new server routes both fleets with the same share);
// its alarm in ALARM sends all traffic back to the old fleet (RollingBack, then InService on the
// old configuration with the alarm in FailureReason) and the new fleet goes.
TEST_F(EndpointControllerTest, AGuardedUpdateShiftsBakesSurvivesARestartAndRollsBackOnItsAlarm) {
  store::AutoscalingRecord alarm;
  alarm.kind = store::AutoscalingKind::kAlarm;
  alarm.service_namespace = "cloudwatch";
  alarm.name = "errors";
  alarm.state = {{"state", "OK"}};
  ASSERT_TRUE(store::AutoscalingRepository(db_.get()).Put(alarm).ok());
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string old_id = runtime_->launches().at(0);
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.pending = Deployment("cfg2", "local:/bin/cat", 1, 2000);
    r.request["DeploymentConfig"] = json::parse(R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
        "Type": "LINEAR", "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 50}, "WaitIntervalInSeconds": 60}},
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "errors"}]}})");
  });
  auto shifted = [&] {
    auto route = routes_->Find("ep");
    return route != nullptr && route->new_fleet_fraction == 0.5 && route->new_variants.size() == 1 &&
           route->new_variants[0].instances.size() == 1 && route->variants.size() == 1 &&
           route->variants[0].instances.size() == 1;
  };
  ASSERT_TRUE(WaitFor(shifted));
  const std::string new_id = runtime_->launches().at(1);
  EXPECT_EQ(RuntimeId("ep", routes_->Find("ep")->new_variants[0].instances[0]->instance_id), new_id);
  store::RolloutState recorded;
  ASSERT_TRUE(WaitFor([&] {
    auto r = Endpoint("ep");
    if (r.ok() && r->state.rollout) recorded = *r->state.rollout;
    return r.ok() && r->state.rollout.has_value();
  }));
  EXPECT_EQ(recorded.phase, store::RolloutState::Phase::kBaking);
  EXPECT_EQ(recorded.step, 1);
  EXPECT_EQ(recorded.generation, 2000);
  EXPECT_EQ(recorded.until_millis, recorded.started_millis + 60000);
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kUpdating);

  controller_.reset();  // both fleets keep running
  RestartController();
  ASSERT_TRUE(WaitFor(shifted));  // the same share, from the row
  EXPECT_EQ(*Endpoint("ep")->state.rollout, recorded);
  EXPECT_EQ(runtime_->launches().size(), 2u);

  auto stored =
      store::AutoscalingRepository(db_.get()).Get(store::AutoscalingKind::kAlarm, "cloudwatch", "", "", "errors");
  ASSERT_TRUE(stored.ok());
  ASSERT_TRUE(store::AutoscalingRepository(db_.get()).SetState(*stored, {{"state", "ALARM"}}).ok());
  // The bake polls the alarms every 500 ms of the (fake, stopped) clock: Wake stands in for it.
  ASSERT_TRUE(WaitFor([&] {
    controller_->Wake();
    auto route = routes_->Find("ep");
    return route != nullptr && route->new_variants.empty() && route->variants[0].instances.size() == 1;
  }));
  auto rolled_back = WaitForStatus("ep", EndpointStatus::kInService);
  EXPECT_THAT(rolled_back.failure_reason,
              ::testing::StartsWith("UpdateEndpoint rolled back to cfg1: CloudWatch alarm errors went into ALARM"));
  EXPECT_EQ(rolled_back.config_name, "cfg1");
  EXPECT_FALSE(rolled_back.pending.has_value());
  EXPECT_FALSE(rolled_back.state.rollout.has_value());
  ASSERT_TRUE(WaitFor([&] { return !runtime_->running(new_id); }));
  EXPECT_TRUE(runtime_->running(old_id));
  EXPECT_EQ(RuntimeId("ep", Routed("ep").at(0)), old_id);
}

TEST_F(EndpointControllerTest, OrphanedEndpointInstancesAreStoppedAtStart) {
  runtime::InstanceSpec orphan;
  orphan.instance_id = "endpoint-gone-i-0123456789abcdef0";
  ASSERT_TRUE(runtime_->Launch(orphan).ok());
  runtime::InstanceSpec training;
  training.instance_id = "training-job-algo-1";  // not the endpoint controller's
  ASSERT_TRUE(runtime_->Launch(training).ok());
  StartController();
  EXPECT_FALSE(runtime_->Inspect(orphan.instance_id).ok());
  EXPECT_TRUE(runtime_->running(training.instance_id));
}

// ---- Namespaced mode (EndpointControllerDeps::networks) --------------------------------------

TEST_F(EndpointControllerTest, NamespacedInstancesListenOn8080AtTheirOwnAddressesAndAreRouted) {
  UseNetworks();
  StartController();
  Create("ep", "local:/bin/true", 2);
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 2; }));
  ASSERT_EQ(runtime_->launches().size(), 2u);
  std::set<std::string> addresses;
  for (const std::string& id : runtime_->launches()) {
    auto spec = runtime_->spec(id);
    ASSERT_TRUE(spec.has_value() && spec->network.has_value()) << id;
    EXPECT_EQ(spec->network->network, "endpoint-ep");
    EXPECT_FALSE(spec->network->isolated);
    EXPECT_EQ(spec->network->loopback_forwards, std::vector<int>{1});  // Kiln at http://127.0.0.1:1
    EXPECT_EQ(spec->env.at("SAGEMAKER_BIND_TO_PORT"), "8080");
    EXPECT_EQ(spec->env.at("SAGEMAKER_SAFE_PORT_RANGE"), "8081-8179");
    EXPECT_EQ(spec->env.at("AWS_ENDPOINT_URL"), "http://127.0.0.1:1");
    EXPECT_THAT(spec->hosts_file_lines, ::testing::Contains(spec->network->address + " " + spec->hostname));
    addresses.insert(spec->network->address);
  }
  EXPECT_EQ(addresses.size(), 2u);
  // The router goes to <address>:8080 of each, and each really answers there.
  net::HttpClient client{net::HttpClientOptions{}};
  net::ClientRequest ping;
  ping.method = "GET";
  ping.target = "/ping";
  std::set<std::string> routed_addresses;
  for (const auto& target : Targets("ep")) {
    EXPECT_EQ(target->port, 8080);
    routed_addresses.insert(target->host);
    auto answer = client.Send(target->host, target->port, ping, {});
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    EXPECT_EQ(answer->status, 200);
  }
  EXPECT_EQ(routed_addresses, addresses);
  // The network was ensured once, then each instance leased an address (by its runtime id; the
  // instances' threads launch in either order).
  auto calls = NetworkCalls("endpoint-ep");
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0], "ensure endpoint-ep");
  EXPECT_THAT(std::vector<std::string>(calls.begin() + 1, calls.end()),
              ::testing::UnorderedElementsAre("attach endpoint-ep " + runtime_->launches()[0],
                                              "attach endpoint-ep " + runtime_->launches()[1]));
  // No port block of the node's range is recorded.
  const auto endpoint = Endpoint("ep");  // the range-for below must not iterate a temporary's member
  ASSERT_TRUE(endpoint.ok());
  for (const auto& instance : endpoint->state.instances) EXPECT_EQ(instance.port_base, 0);
}

TEST_F(EndpointControllerTest, NamespacedScaleInDetachesTheInstanceAndDeleteRemovesTheNetwork) {
  UseNetworks();
  StartController();
  Create("ep", "local:/bin/true", 2);
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_EQ(networks_->Leases("endpoint-ep").size(), 2u);
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.desired = Desired(1);
  });
  // Either one goes (both were launched at the same time): the other keeps its lease.
  ASSERT_TRUE(WaitFor([&] { return networks_->Leases("endpoint-ep").size() == 1; }));
  const std::string kept = networks_->Leases("endpoint-ep").begin()->first;
  const std::string dropped =
      runtime_->launches().at(0) == kept ? runtime_->launches().at(1) : runtime_->launches().at(0);
  ASSERT_TRUE(kept == runtime_->launches().at(0) || kept == runtime_->launches().at(1)) << kept;
  EXPECT_FALSE(runtime_->running(dropped));
  EXPECT_TRUE(runtime_->running(kept));
  EXPECT_THAT(NetworkCalls("endpoint-ep"), ::testing::Contains("detach endpoint-ep " + dropped));
  WaitForStatus("ep", EndpointStatus::kInService);
  EXPECT_TRUE(networks_->Exists("endpoint-ep"));

  Change("ep", [](store::EndpointRecord& r) { r.status = EndpointStatus::kDeleting; });
  ASSERT_TRUE(WaitFor([&] { return Endpoint("ep").status().IsNotFound(); }));
  EXPECT_FALSE(networks_->Exists("endpoint-ep"));
  auto calls = NetworkCalls("endpoint-ep");
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[calls.size() - 2], "detach endpoint-ep " + kept);  // the last instance went first
  EXPECT_EQ(calls.back(), "remove endpoint-ep");
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "ensure endpoint-ep"), 1);
}

TEST_F(EndpointControllerTest, AnIsolatedModelGetsAnIsolatedNetworkWithoutForwards) {
  UseNetworks();
  StartController();
  Create("ep", "local:/bin/true", 1, json::object(), {{"EnableNetworkIsolation", true}});
  WaitForStatus("ep", EndpointStatus::kInService);
  auto spec = runtime_->spec(runtime_->launches().at(0));
  ASSERT_TRUE(spec.has_value() && spec->network.has_value());
  EXPECT_TRUE(spec->network->isolated);
  EXPECT_TRUE(spec->network->loopback_forwards.empty());
  // Ensure(isolated=true): the network exists with that setting (the other one is refused).
  EXPECT_FALSE(networks_->Ensure("endpoint-ep", false).ok());
  EXPECT_TRUE(networks_->Ensure("endpoint-ep", true).ok());
  ASSERT_EQ(Routed("ep").size(), 1u);
}

TEST_F(EndpointControllerTest, AnUpdateThatChangesNetworkIsolationRollsBackSayingWhy) {
  UseNetworks();
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string old_id = runtime_->launches().at(0);
  Change("ep", [](store::EndpointRecord& r) {
    r.status = EndpointStatus::kUpdating;
    r.pending = Deployment("cfg2", "local:/bin/cat", 1, 2000);
    r.pending->models["model-cfg2"]["EnableNetworkIsolation"] = true;
  });
  store::EndpointRecord rolled_back;
  ASSERT_TRUE(WaitFor([&] {
    auto r = Endpoint("ep");
    if (r.ok()) rolled_back = *r;
    return r.ok() && r->status == EndpointStatus::kInService && !r->failure_reason.empty();
  }));
  EXPECT_THAT(rolled_back.failure_reason,
              ::testing::HasSubstr("Kiln cannot change EnableNetworkIsolation (to true) of endpoint ep while it has "
                                   "instances"));
  EXPECT_TRUE(runtime_->running(old_id));
  EXPECT_EQ(runtime_->launches().size(), 1u);
}

TEST_F(EndpointControllerTest, ARestartedControllerFindsANamespacedInstanceAtItsAddressAgain) {
  UseNetworks();
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_EQ(Targets("ep").size(), 1u);
  const std::string address = Targets("ep")[0]->host;
  const std::string id = runtime_->launches().at(0);

  controller_.reset();  // the instance keeps running, its lease stays
  RestartController();
  ASSERT_TRUE(WaitFor([&] { return Targets("ep").size() == 1; }));
  EXPECT_EQ(Targets("ep")[0]->host, address);
  EXPECT_EQ(Targets("ep")[0]->port, 8080);
  EXPECT_EQ(runtime_->launches().size(), 1u);  // adopted, not relaunched
  EXPECT_TRUE(runtime_->stops().empty());
  EXPECT_EQ(networks_->Leases("endpoint-ep").size(), 1u);
  EXPECT_EQ(networks_->Leases("endpoint-ep").count(id), 1u);
}

TEST_F(EndpointControllerTest, ANamespacedInstanceIsReplacedWhenTheRestartedServerHasNoNetworks) {
  UseNetworks();
  StartController();
  Create("ep");
  WaitForStatus("ep", EndpointStatus::kInService);
  const std::string namespaced = runtime_->launches().at(0);

  controller_.reset();
  networks_.reset();  // e.g. network.mode changed to host: its address cannot be found any more
  RestartController();
  auto replacement = runtime_->WaitForLaunchNumber(2, kPatience);
  ASSERT_TRUE(replacement.has_value());
  EXPECT_FALSE(runtime_->running(namespaced));  // stopped at start: it could not be routed
  EXPECT_FALSE(runtime_->spec(*replacement)->network.has_value());
  ASSERT_TRUE(WaitFor([&] { return Targets("ep").size() == 1; }));
  EXPECT_EQ(Targets("ep")[0]->host, "127.0.0.1");
  EXPECT_EQ(Endpoint("ep")->status, EndpointStatus::kInService);
}

TEST_F(EndpointControllerTest, ANamespacedInstanceThatNeverAnswersSaysWhichPortItMustServe) {
  UseNetworks();
  FakeRuntime::Behavior silent;
  silent.serve_ping = false;
  runtime_->SetDefaultBehavior(silent);
  StartController();
  Create("ep", "local:/bin/true", 1, {{"ContainerStartupHealthCheckTimeoutInSeconds", 1}});
  auto failed = WaitForStatus("ep", EndpointStatus::kFailed);
  EXPECT_THAT(failed.failure_reason, ::testing::HasSubstr("must answer GET /ping on port 8080"));
  EXPECT_THAT(failed.failure_reason, ::testing::Not(::testing::HasSubstr("its own port")));
  // Its lease went with it, and the Failed endpoint's network too.
  EXPECT_TRUE(WaitFor([&] { return !networks_->Exists("endpoint-ep"); }));
}

TEST_F(EndpointControllerTest, ANetworkThatCannotBeCreatedFailsTheEndpointWithTheReason) {
  UseNetworks();
  networks_->FailNext(Status::ResourceExhausted("no free subnet in 10.213.0.0/16; widen network.cidr"));
  StartController();
  Create("ep");
  auto failed = WaitForStatus("ep", EndpointStatus::kFailed);
  EXPECT_EQ(failed.failure_reason,
            "InternalServerError: The network of endpoint ep could not be created: no free subnet in 10.213.0.0/16; "
            "widen network.cidr");
  EXPECT_EQ(runtime_->launch_attempts(), 0);
}

TEST_F(EndpointControllerTest, InHostModeEachInstanceHasItsOwnPortOnTheNodesLoopback) {
  StartController();
  Create("ep", "local:/bin/true", 2);
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 2; }));
  std::set<uint16_t> ports;
  for (const auto& target : Targets("ep")) {
    EXPECT_EQ(target->host, "127.0.0.1");
    ports.insert(target->port);
  }
  EXPECT_EQ(ports.size(), 2u);
  for (const std::string& id : runtime_->launches()) {
    auto spec = runtime_->spec(id);
    ASSERT_TRUE(spec.has_value());
    EXPECT_FALSE(spec->network.has_value());
    EXPECT_TRUE(ports.count(static_cast<uint16_t>(std::stoi(spec->env.at("SAGEMAKER_BIND_TO_PORT")))));
  }
}

// Multi-container models (serving-contract.md §2, §8), host mode: every container on every
// instance, each its own runtime instance (<id>, <id>-c2), port block, /opt/ml and log stream;
// the route carries the containers and the mode; a restarted controller adopts all of them, and
// one container exiting fails (and replaces) the whole instance.
TEST_F(EndpointControllerTest, EveryContainerOfAMultiContainerModelRunsOnTheInstance) {
  StartController();
  json model = {{"PrimaryContainer", nullptr},
                {"InferenceExecutionConfig", {{"Mode", "Direct"}}},
                {"Containers", json::array({json{{"Image", "local:/bin/true"}, {"ContainerHostname", "pre"}},
                                            json{{"Image", "local:/bin/true"}, {"ContainerHostname", "model"}}})}};
  Create("ep", "local:/bin/true", 1, json::object(), model);
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 1; }));
  ASSERT_EQ(runtime_->launches().size(), 2u);
  const std::string first = runtime_->launches()[0];
  EXPECT_EQ(runtime_->launches()[1], first + "-c2");
  auto spec1 = runtime_->spec(first);
  auto spec2 = runtime_->spec(first + "-c2");
  ASSERT_TRUE(spec1 && spec2);
  const int port1 = std::stoi(spec1->env.at("SAGEMAKER_BIND_TO_PORT"));
  EXPECT_EQ(std::stoi(spec2->env.at("SAGEMAKER_BIND_TO_PORT")), port1 + 100);
  EXPECT_EQ(spec2->env.at("SAGEMAKER_SAFE_PORT_RANGE"),
            std::to_string(port1 + 101) + "-" + std::to_string(port1 + 199));
  EXPECT_EQ(spec1->hostname, "pre");
  EXPECT_EQ(spec2->hostname, "model");
  EXPECT_NE(spec1->opt_ml_dir, spec2->opt_ml_dir);
  auto route = routes_->Find("ep");
  ASSERT_TRUE(route);
  EXPECT_TRUE(route->direct);
  EXPECT_FALSE(route->pipeline);  // Direct: one call, on the event loop
  ASSERT_EQ(route->variants.size(), 1u);
  EXPECT_EQ(route->variants[0].container_mode, serving::ContainerMode::kDirect);
  auto targets = Targets("ep");
  ASSERT_EQ(targets.size(), 1u);
  ASSERT_EQ(targets[0]->containers.size(), 2u);
  EXPECT_EQ(targets[0]->containers[0].hostname, "pre");
  EXPECT_EQ(targets[0]->containers[1].hostname, "model");
  EXPECT_EQ(targets[0]->containers[1].port, port1 + 100);
  EXPECT_EQ(targets[0]->containers[1].log_stream, "main/" + targets[0]->instance_id + "/model");
  const std::string instance_id = targets[0]->instance_id;
  targets.clear();
  route.reset();

  // Adopted after a restart: both containers found again, nothing relaunched.
  controller_.reset();
  RestartController();
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 1; }));
  EXPECT_EQ(Routed("ep")[0], instance_id);
  EXPECT_EQ(runtime_->launches().size(), 2u);
  ASSERT_EQ(Targets("ep").at(0)->containers.size(), 2u);

  // The second container dies: the instance fails and is replaced with both containers.
  ASSERT_TRUE(runtime_->Lose(first + "-c2", "gone").ok());
  ASSERT_TRUE(AdvanceUntil([&] { return runtime_->launches().size() >= 4; }));
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 1 && Routed("ep")[0] != instance_id; }));
  EXPECT_FALSE(runtime_->running(first));
}

// Namespaced mode: the second container joins the first's network namespace (its Access pid),
// both at the instance's one address, on 8080 and 8180.
TEST_F(EndpointControllerTest, NamespacedContainersShareTheFirstContainersNamespace) {
  UseNetworks();
  StartController();
  json model = {{"PrimaryContainer", nullptr},
                {"Containers", json::array({json{{"Image", "local:/bin/true"}}, json{{"Image", "local:/bin/true"}}})}};
  Create("ep", "local:/bin/true", 1, json::object(), model);
  WaitForStatus("ep", EndpointStatus::kInService);
  ASSERT_TRUE(WaitFor([&] { return Routed("ep").size() == 1; }));
  const std::string first = runtime_->launches().at(0);
  auto spec1 = runtime_->spec(first);
  auto spec2 = runtime_->spec(first + "-c2");
  ASSERT_TRUE(spec1 && spec2);
  ASSERT_TRUE(spec1->network.has_value());
  EXPECT_TRUE(spec1->network_namespace.empty());
  EXPECT_FALSE(spec2->network.has_value());
  EXPECT_EQ(spec2->network_namespace, "/proc/" + std::to_string(getpid()) + "/ns/net");
  EXPECT_EQ(spec1->env.at("SAGEMAKER_BIND_TO_PORT"), "8080");
  EXPECT_EQ(spec2->env.at("SAGEMAKER_BIND_TO_PORT"), "8180");
  EXPECT_EQ(spec2->env.at("SAGEMAKER_SAFE_PORT_RANGE"), "8181-8279");
  auto targets = Targets("ep");
  ASSERT_EQ(targets.size(), 1u);
  ASSERT_EQ(targets[0]->containers.size(), 2u);
  EXPECT_EQ(targets[0]->containers[0].hostname, "container-1");
  EXPECT_EQ(targets[0]->containers[1].hostname, "container-2");
  EXPECT_EQ(targets[0]->containers[1].host, spec1->network->address);
  EXPECT_EQ(targets[0]->containers[1].port, 8180);
  auto route = routes_->Find("ep");
  ASSERT_TRUE(route);
  EXPECT_FALSE(route->direct);
  EXPECT_EQ(route->variants.at(0).container_mode, serving::ContainerMode::kSerial);
}

}  // namespace
}  // namespace kiln::control
