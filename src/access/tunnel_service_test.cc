#include "access/tunnel_service.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "base/fs.h"
#include "base/strings.h"
#include "observe/log_store.h"
#include "runtime/test_util/fake_runtime.h"
#include "store/endpoint_repository.h"
#include "store/remote_connection_repository.h"
#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"

namespace kiln::access {
namespace {

using nlohmann::json;

constexpr char kKey[] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnEr6PSCbvMBCb1611/xbrSDUqTUUVMOTw/1NmnKQCX me@laptop";
constexpr char kPrincipal[] = "arn:aws:iam::000000000000:user/kiln";

// Reads from `fd` until `want` bytes came, EOF, or `timeout`.
std::string ReadFor(int fd, size_t want, std::chrono::milliseconds timeout) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (out.size() < want) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) break;
    char buffer[4096];
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

// True when the peer closed `fd` within `timeout` (reads until EOF).
bool ClosedWithin(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) return false;
    char buffer[4096];
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) return true;
  }
}

class TunnelServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    auto logs = observe::LogStore::Open({dir_.path() + "/logs", db_.get(), nullptr});
    ASSERT_TRUE(logs.ok()) << logs.status().ToString();
    log_store_ = std::move(logs).value();
    runtime_ = std::make_unique<runtime::testing::FakeRuntime>(dir_.path() + "/instances");
    // An "agent" that records its arguments and open descriptors, sends an SSH-like banner, reports
    // one exec event and then echoes what it reads on fd 3 back to fd 3.
    options_.agent_command = {"/usr/bin/python3", "-c", R"py(
import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG SIGTERM, as kiln agent does
d = sys.argv[1]
inherited = []
for fd in range(5, 1024):
    try:
        os.fstat(fd)
        inherited.append(str(fd))
    except OSError:
        pass
open(d + "/args", "w").write(" ".join(sys.argv[2:]) + "\n")
open(d + "/inherited", "w").write(" ".join(inherited))
os.write(3, b"SSH-2.0-fake\r\n")
os.write(4, b'{"event":"direct-tcpip","host":"localhost","port":6006}\n{"event":"exec","command":"true","exit_status":3}\n')
while True:
    data = os.read(3, 65536)
    if not data:
        break
    os.write(3, data)
)py",
                              dir_.path()};
    options_.host_key_path = dir_.path() + "/access/ssh_host_ed25519_key";
    options_.watch_interval = std::chrono::milliseconds(100);
    options_.kill_grace = std::chrono::milliseconds(500);
    options_.banner_timeout = std::chrono::milliseconds(5000);
  }
  void TearDown() override {
    if (service_) service_->Stop();
  }

  void MakeService() {
    auto made = TunnelService::Create(options_, {db_.get(), runtime_.get(), log_store_.get()});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    service_ = std::move(made).value();
    service_->Start();
  }

  // A training job `name` in `status` with `count` instances, remote access `enabled`, whose
  // algo-1 has been launched (and runs in the fake runtime) unless `launched` is false.
  void AddJob(const std::string& name, bool enabled, int count = 1, bool launched = true,
              store::TrainingJobStatus status = store::TrainingJobStatus::kInProgress, bool isolated = false) {
    store::TrainingJobRecord r;
    r.name = name;
    r.arn = "arn:aws:sagemaker:us-east-1:000000000000:training-job/" + name;
    r.request = {{"TrainingJobName", name},
                 {"ResourceConfig", {{"InstanceCount", count}}},
                 {"RemoteDebugConfig", {{"EnableRemoteDebug", enabled}}},
                 {"EnableNetworkIsolation", isolated}};
    r.status = status;
    r.secondary_status = launched ? store::SecondaryStatus::kTraining : store::SecondaryStatus::kStarting;
    if (launched) {
      store::TrainingHostState h;
      h.host = "algo-1";
      h.instance_id = "training-" + name + "-algo-1";
      h.log_stream = name + "/algo-1-1700000000";
      r.state.hosts.push_back(h);
      runtime::InstanceSpec spec;
      spec.instance_id = h.instance_id;
      spec.hostname = "algo-1";
      spec.argv = {"/bin/true"};
      ASSERT_TRUE(runtime_->Launch(spec).ok());
    }
    ASSERT_TRUE(store::TrainingJobRepository(db_.get()).Insert(r).ok());
  }

  // An InService endpoint `name` with variant v1 (EnableSSMAccess `enabled`) and one running
  // instance i-1 (runtime id endpoint-<name>-i-1), plus variant v2 without access and instance i-2.
  void AddEndpoint(const std::string& name, bool enabled) {
    store::EndpointRecord r;
    r.name = name;
    r.arn = "arn:aws:sagemaker:us-east-1:000000000000:endpoint/" + name;
    r.config_name = "cfg";
    r.status = store::EndpointStatus::kInService;
    r.deployment.config_name = "cfg";
    r.deployment.deployed_millis = 1;
    r.deployment.endpoint_config = {{"EndpointConfigName", "cfg"},
                                    {"ProductionVariants",
                                     {{{"VariantName", "v1"}, {"ModelName", "m"}, {"EnableSSMAccess", enabled}},
                                      {{"VariantName", "v2"}, {"ModelName", "m"}}}}};
    r.deployment.models = {{"m", {{"ModelName", "m"}}}};
    for (const std::string& variant : {std::string("v1"), std::string("v2")}) {
      store::InstanceRecord instance;
      instance.instance_id = variant == "v1" ? "i-1" : "i-2";
      instance.runtime_id = "endpoint-" + name + "-" + instance.instance_id;
      instance.variant = variant;
      instance.model_name = "m";
      instance.generation = 1;
      r.state.instances.push_back(instance);
      runtime::InstanceSpec spec;
      spec.instance_id = instance.runtime_id;
      spec.hostname = instance.instance_id;
      spec.argv = {"/bin/true"};
      ASSERT_TRUE(runtime_->Launch(spec).ok());
    }
    ASSERT_TRUE(store::EndpointRepository(db_.get()).Insert(r).ok());
  }

  void SetAccess(const std::string& name, bool enabled) {
    auto updated = store::TrainingJobRepository(db_.get()).Mutate(name, [&](store::TrainingJobRecord& r) {
      r.request["RemoteDebugConfig"]["EnableRemoteDebug"] = enabled;
      return Status::Ok();
    });
    ASSERT_TRUE(updated.ok());
  }

  ConnectRequest Request(const std::string& target) { return {target, kKey, kPrincipal, "127.0.0.1:40001"}; }

  // Prepares and runs a tunnel to `target`; returns the client's end of the "connection".
  UniqueFd Connect(const std::string& target, std::string buffered = "") {
    // Prepared on a thread that ends before Run, as a server worker may retire: the agent's
    // parent-death signal follows the thread that forked it, so that must be the tunnel's own.
    std::optional<Result<PreparedTunnel>> outcome;
    std::thread([&] { outcome.emplace(service_->Prepare(Request(target))); }).join();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Result<PreparedTunnel> prepared = std::move(*outcome);
    EXPECT_TRUE(prepared.ok()) << prepared.status().ToString();
    if (!prepared.ok()) return UniqueFd();
    EXPECT_EQ(prepared->canonical_target(), "training-job/j/algo-1");
    int pair[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    service_->Run(std::move(prepared).value(), UniqueFd(pair[0]), std::move(buffered));
    return UniqueFd(pair[1]);
  }

  // The audit rows once none is open and every tunnel has finished (its closing log line
  // written); waits up to 5 s.
  std::vector<store::RemoteConnectionRecord> ClosedAudit() {
    store::RemoteConnectionRepository repo(db_.get());
    for (int i = 0; i < 100; ++i) {
      auto rows = repo.List("", 100);
      if (rows.ok() && !rows->empty() && service_->open_tunnels() == 0 &&
          std::all_of(rows->begin(), rows->end(), [](const auto& r) { return r.end_millis.has_value(); })) {
        return *rows;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return {};
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::LogStore> log_store_;
  std::unique_ptr<runtime::testing::FakeRuntime> runtime_;
  TunnelServiceOptions options_;
  std::unique_ptr<TunnelService> service_;
};

TEST_F(TunnelServiceTest, RefusalsSayWhatToChange) {
  MakeService();
  AddJob("j", /*enabled=*/true, /*count=*/2);
  AddJob("off", /*enabled=*/false);
  AddJob("waiting", /*enabled=*/true, 1, /*launched=*/false);
  AddJob("done", /*enabled=*/true, 1, /*launched=*/false, store::TrainingJobStatus::kCompleted);
  auto code = [&](const ConnectRequest& request) { return service_->Prepare(request).status().code(); };
  auto message = [&](const ConnectRequest& request) { return service_->Prepare(request).status().message(); };

  EXPECT_EQ(code(Request("training-job/nope/algo-1")), StatusCode::kNotFound);
  EXPECT_EQ(code(Request("training-job/j/algo-x")), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Request("training-job/j/algo-3")), StatusCode::kInvalidArgument);
  EXPECT_NE(message(Request("training-job/j/algo-3")).find("algo-1 to algo-2"), std::string::npos);
  EXPECT_EQ(code(Request("off")), StatusCode::kPermissionDenied);
  EXPECT_NE(message(Request("off")).find("UpdateTrainingJob RemoteDebugConfig={EnableRemoteDebug=true}"),
            std::string::npos);
  EXPECT_EQ(code(Request("waiting")), StatusCode::kFailedPrecondition);
  EXPECT_NE(message(Request("waiting")).find("--wait"), std::string::npos);
  EXPECT_EQ(code(Request("done")), StatusCode::kInvalidArgument);
  EXPECT_NE(message(Request("done")).find("is Completed"), std::string::npos);
  // algo-2 of j is not launched yet.
  EXPECT_EQ(code(Request("training-job/j/algo-2")), StatusCode::kFailedPrecondition);

  ConnectRequest bad_key = Request("j");
  for (const std::string& key :
       std::vector<std::string>{"", "ssh-ed25519", "ssh-foo AAAA", "ssh-ed25519 !!!",
                                "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIKnEr6PSCbvMBCb1611/xbrSDUqTUUVMOTw/1NmnKQCX",
                                std::string(kKey) + "\nssh-ed25519 AAAA"}) {
    bad_key.public_key = key;
    EXPECT_EQ(code(bad_key), StatusCode::kInvalidArgument) << key;
  }
  // A job's instance that ended meanwhile is not ready (Pending until the job's status follows).
  ASSERT_TRUE(runtime_->Exit("training-j-algo-1", 0).ok());
  EXPECT_EQ(code(Request("j")), StatusCode::kFailedPrecondition);
}

TEST_F(TunnelServiceTest, OperatorSettingsRefuse) {
  options_.allowed_principals = {"arn:aws:iam::*:user/alice", "arn:aws:iam::*:role/dev-*"};
  options_.allow_network_isolated = false;
  MakeService();
  AddJob("j", true);
  AddJob("iso", true, 1, true, store::TrainingJobStatus::kInProgress, /*isolated=*/true);
  ConnectRequest r = Request("j");
  EXPECT_EQ(service_->Prepare(r).status().code(), StatusCode::kPermissionDenied);  // user/kiln
  r.principal_arn = "";
  EXPECT_EQ(service_->Prepare(r).status().code(), StatusCode::kPermissionDenied);  // anonymous
  r.principal_arn = "arn:aws:iam::000000000000:role/dev-team";
  r.target = "iso";
  Result<PreparedTunnel> isolated = service_->Prepare(r);
  EXPECT_EQ(isolated.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(isolated.status().message().find("allow_network_isolated"), std::string::npos);
  r.target = "j";
  EXPECT_TRUE(service_->Prepare(r).ok());
  service_->SetEnabled(false);
  Result<PreparedTunnel> off = service_->Prepare(r);
  EXPECT_EQ(off.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(off.status().message().find("remote_access.enabled"), std::string::npos);
}

TEST_F(TunnelServiceTest, SplicesBytesAndAuditsTheConnection) {
  MakeService();
  AddJob("j", true);
  UniqueFd client = Connect("sagemaker-training-job:j_algo-1", "early ");
  ASSERT_TRUE(client.valid());
  // The banner first, then the bytes the client sent before the 101, echoed.
  EXPECT_EQ(ReadFor(client.get(), 20, std::chrono::seconds(5)), "SSH-2.0-fake\r\nearly ");
  ASSERT_EQ(::write(client.get(), "hello", 5), 5);
  EXPECT_EQ(ReadFor(client.get(), 5, std::chrono::seconds(5)), "hello");
  EXPECT_EQ(service_->open_tunnels(), 1u);

  // The agent's command line and descriptors.
  std::string args = ReadFile(dir_.path() + "/args").value_or("");
  EXPECT_NE(args.find("--pid " + std::to_string(::getpid()) + " --socket-fd 3 --events-fd 4 --authorized-key " +
                      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnEr6PSCbvMBCb1611/xbrSDUqTUUVMOTw/1NmnKQCX --host-key " +
                      options_.host_key_path + " --working-directory /opt/ml/code --working-directory /opt/ml"),
            std::string::npos)
      << args;
  EXPECT_EQ(ReadFile(dir_.path() + "/inherited").value_or("?"), "") << "descriptors the agent inherited";

  client.Reset();
  std::vector<store::RemoteConnectionRecord> rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].target, "training-job/j/algo-1");
  EXPECT_EQ(rows[0].principal, kPrincipal);
  EXPECT_EQ(rows[0].source_address, "127.0.0.1:40001");
  EXPECT_EQ(rows[0].close_reason, "client disconnected");
  EXPECT_EQ(rows[0].bytes_in, 11u);                       // "early " + "hello"
  EXPECT_EQ(rows[0].bytes_out, 14u + 11u);                // banner + echo
  EXPECT_EQ(rows[0].exit_statuses, std::vector<int>{3});  // from the events fd
  EXPECT_EQ(rows[0].forwards, std::vector<std::string>{"direct-tcpip localhost:6006"});

  // The [kiln] lines in the instance's log stream.
  auto events = log_store_->GetEvents("/aws/sagemaker/TrainingJobs", "j/algo-1-1700000000", {});
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->events.size(), 2u);
  EXPECT_NE(events->events[0].message.find("[kiln] remote connection " + rows[0].id + " opened by " + kPrincipal +
                                           " from 127.0.0.1:40001 (target training-job/j/algo-1)"),
            std::string::npos);
  EXPECT_NE(events->events[1].message.find("closed after"), std::string::npos);
  EXPECT_NE(events->events[1].message.find("client disconnected, in 11 B, out 25 B"), std::string::npos);

  // The connections route.
  auto listed = service_->Connections("j", 10);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ((*listed)["Connections"].size(), 1u);
  const json& c = (*listed)["Connections"][0];
  EXPECT_EQ(c["ConnectionId"], rows[0].id);
  EXPECT_EQ(c["CloseReason"], "client disconnected");
  EXPECT_TRUE(c.contains("EndTime"));
  EXPECT_EQ(c["ExitStatuses"], json::array({3}));
  EXPECT_EQ((*service_->Connections("other", 10))["Connections"].size(), 0u);
  EXPECT_EQ(service_->Connections("", 0).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TunnelServiceTest, DisablingAccessClosesOpenTunnels) {
  MakeService();
  AddJob("j", true);
  UniqueFd client = Connect("j");
  ASSERT_TRUE(client.valid());
  EXPECT_EQ(ReadFor(client.get(), 14, std::chrono::seconds(5)), "SSH-2.0-fake\r\n");
  SetAccess("j", false);
  EXPECT_TRUE(ClosedWithin(client.get(), std::chrono::seconds(5)));
  // Recorded before the client saw the end: a client asking why at once is told.
  auto at_once = store::RemoteConnectionRepository(db_.get()).List("", 1);
  ASSERT_TRUE(at_once.ok());
  ASSERT_EQ(at_once->size(), 1u);
  EXPECT_EQ((*at_once)[0].close_reason, "access disabled");
  auto by_id = service_->Connections("", 1, (*at_once)[0].id);
  ASSERT_TRUE(by_id.ok()) << by_id.status().ToString();
  ASSERT_EQ((*by_id)["Connections"].size(), 1u);
  EXPECT_EQ((*by_id)["Connections"][0]["CloseReason"], "access disabled");
  EXPECT_EQ((*service_->Connections("other-job", 1, (*at_once)[0].id))["Connections"].size(), 0u);
  EXPECT_EQ(service_->Connections("", 1, "rc-unknown").status().code(), StatusCode::kNotFound);
  auto rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].close_reason, "access disabled");
}

TEST_F(TunnelServiceTest, AnEndedInstanceOrJobClosesItsTunnels) {
  MakeService();
  AddJob("j", true);
  UniqueFd client = Connect("j");
  ASSERT_TRUE(client.valid());
  ASSERT_TRUE(runtime_->Exit("training-j-algo-1", 0).ok());
  EXPECT_TRUE(ClosedWithin(client.get(), std::chrono::seconds(5)));
  auto rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].close_reason, "instance gone");
}

TEST_F(TunnelServiceTest, IdleTimeoutAndServerStop) {
  options_.idle_timeout = std::chrono::seconds(1);
  MakeService();
  AddJob("j", true);
  UniqueFd idle = Connect("j");
  ASSERT_TRUE(idle.valid());
  EXPECT_TRUE(ClosedWithin(idle.get(), std::chrono::seconds(5)));
  auto rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].close_reason, "idle timeout");

  options_.idle_timeout = std::chrono::seconds(3600);
  service_->Stop();
  MakeService();
  UniqueFd open = Connect("j");
  ASSERT_TRUE(open.valid());
  service_->Stop();
  EXPECT_TRUE(ClosedWithin(open.get(), std::chrono::seconds(1)));
  rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].close_reason, "server stopping");
  EXPECT_EQ(service_->Prepare(Request("j")).status().code(), StatusCode::kUnavailable);
}

TEST_F(TunnelServiceTest, AnAgentThatCannotEnterIsAnErrorWithItsReason) {
  options_.agent_command = {"/bin/sh", "-c", "echo 'kiln agent: cannot enter pid 42: No such process' >&2; exit 3",
                            "fake-agent"};
  MakeService();
  AddJob("j", true);
  Result<PreparedTunnel> prepared = service_->Prepare(Request("j"));
  EXPECT_EQ(prepared.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(prepared.status().message().find("cannot enter pid 42: No such process"), std::string::npos)
      << prepared.status().ToString();

  service_->Stop();
  options_.agent_command = {"/bin/sh", "-c", "exit 2", "fake-agent"};
  MakeService();
  EXPECT_EQ(service_->Prepare(Request("j")).status().code(), StatusCode::kInternal);

  service_->Stop();
  options_.agent_command = {"/bin/sh", "-c", "exec sleep 30", "fake-agent"};
  options_.banner_timeout = std::chrono::milliseconds(300);
  MakeService();
  Result<PreparedTunnel> silent = service_->Prepare(Request("j"));
  EXPECT_EQ(silent.status().code(), StatusCode::kInternal);
  EXPECT_NE(silent.status().message().find("did not answer"), std::string::npos);
}

TEST_F(TunnelServiceTest, TargetsListEveryHostWithItsState) {
  MakeService();
  AddJob("j", true, /*count=*/2);
  AddJob("done", false, 1, false, store::TrainingJobStatus::kCompleted);
  auto t = service_->Targets("j");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)["ResourceArn"], "arn:aws:sagemaker:us-east-1:000000000000:training-job/j");
  EXPECT_EQ((*t)["ResourceStatus"], "InProgress");
  EXPECT_EQ((*t)["SecondaryStatus"], "Training");
  EXPECT_EQ((*t)["AccessEnabled"], true);
  ASSERT_EQ((*t)["Targets"].size(), 2u);
  EXPECT_EQ((*t)["Targets"][0]["Target"], "training-job/j/algo-1");
  EXPECT_EQ((*t)["Targets"][0]["Alias"], "sagemaker-training-job:j_algo-1");
  EXPECT_EQ((*t)["Targets"][0]["InstanceId"], "training-j-algo-1");
  EXPECT_EQ((*t)["Targets"][0]["Hostname"], "algo-1");
  EXPECT_EQ((*t)["Targets"][0]["State"], "Ready");
  EXPECT_EQ((*t)["Targets"][1]["State"], "Pending");
  ASSERT_TRUE(runtime_->Exit("training-j-algo-1", 0).ok());
  EXPECT_EQ((*service_->Targets("training-job/j"))["Targets"][0]["State"], "Gone");

  auto done = service_->Targets("arn:aws:sagemaker:us-east-1:000000000000:training-job/done");
  ASSERT_TRUE(done.ok());
  EXPECT_EQ((*done)["AccessEnabled"], false);
  EXPECT_EQ((*done)["Targets"][0]["State"], "Gone");
  EXPECT_EQ(service_->Targets("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->Targets("a/b/c").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TunnelServiceTest, EndpointInstancesAreTargetsOfTheirVariant) {
  MakeService();
  AddEndpoint("ep", true);
  AddEndpoint("closed", false);
  // endpoint/<ep>: the first instance access is on for; a bare name that is no job's: the same.
  for (const std::string& text : {std::string("endpoint/ep"), std::string("ep"), std::string("endpoint/ep/v1"),
                                  std::string("endpoint/ep/v1/i-1")}) {
    Result<PreparedTunnel> prepared = service_->Prepare(Request(text));
    ASSERT_TRUE(prepared.ok()) << text << ": " << prepared.status().ToString();
    EXPECT_EQ(prepared->canonical_target(), "endpoint/ep/v1/i-1") << text;
  }
  Result<PreparedTunnel> off_variant = service_->Prepare(Request("endpoint/ep/v2/i-2"));
  EXPECT_EQ(off_variant.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(off_variant.status().message().find("EnableSSMAccess=true"), std::string::npos);
  EXPECT_EQ(service_->Prepare(Request("endpoint/closed")).status().code(), StatusCode::kPermissionDenied);
  Result<PreparedTunnel> missing = service_->Prepare(Request("endpoint/ep/v1/i-9"));
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("v1/i-1, v2/i-2"), std::string::npos) << missing.status().message();
  EXPECT_EQ(service_->Prepare(Request("endpoint/none")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->Prepare(Request("none")).status().code(), StatusCode::kNotFound);

  // The tunnel: serving working directories, the instance's stream in the endpoint's group.
  Result<PreparedTunnel> prepared = service_->Prepare(Request("endpoint/ep"));
  ASSERT_TRUE(prepared.ok());
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  service_->Run(std::move(prepared).value(), UniqueFd(pair[0]), "");
  UniqueFd client(pair[1]);
  EXPECT_EQ(ReadFor(client.get(), 14, std::chrono::seconds(5)), "SSH-2.0-fake\r\n");
  EXPECT_NE(ReadFile(dir_.path() + "/args")
                .value_or("")
                .find("--working-directory /opt/ml/model/code --working-directory /opt/ml/model"),
            std::string::npos);
  ASSERT_TRUE(runtime_->Exit("endpoint-ep-i-1", 0).ok());
  EXPECT_TRUE(ClosedWithin(client.get(), std::chrono::seconds(5)));
  auto rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].resource_arn, "arn:aws:sagemaker:us-east-1:000000000000:endpoint/ep");
  EXPECT_EQ(rows[0].close_reason, "instance gone");
  auto events = log_store_->GetEvents("/aws/sagemaker/Endpoints/ep", "v1/i-1", {});
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  EXPECT_EQ(events->events.size(), 2u);
  auto listed = service_->Connections("endpoint/ep", 10);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ((*listed)["Connections"].size(), 1u);

  auto targets = service_->Targets("ep");
  ASSERT_TRUE(targets.ok()) << targets.status().ToString();
  EXPECT_EQ((*targets)["ResourceStatus"], "InService");
  EXPECT_EQ((*targets)["AccessEnabled"], true);
  ASSERT_EQ((*targets)["Targets"].size(), 2u);
  EXPECT_EQ((*targets)["Targets"][0]["Target"], "endpoint/ep/v1/i-1");
  EXPECT_EQ((*targets)["Targets"][0]["State"], "Gone");
  EXPECT_EQ((*targets)["Targets"][1]["Target"], "endpoint/ep/v2/i-2");
  EXPECT_EQ((*targets)["Targets"][1]["State"], "Ready");
  EXPECT_EQ((*targets)["Targets"][1]["AccessEnabled"], false);
  EXPECT_EQ((*service_->Targets("endpoint/closed"))["AccessEnabled"], false);
}

TEST_F(TunnelServiceTest, AClientThatLeavesBecauseTheJobEndedIsAuditedAsJobEnded) {
  options_.watch_interval = std::chrono::hours(1);  // only the close itself looks
  MakeService();
  AddJob("j", true);
  UniqueFd client = Connect("j");
  ASSERT_TRUE(client.valid());
  EXPECT_EQ(ReadFor(client.get(), 14, std::chrono::seconds(5)), "SSH-2.0-fake\r\n");
  auto stopped = store::TrainingJobRepository(db_.get()).Mutate("j", [](store::TrainingJobRecord& r) {
    r.status = store::TrainingJobStatus::kStopping;
    return Status::Ok();
  });
  ASSERT_TRUE(stopped.ok());
  client.Reset();  // ssh exits as the job's processes die, before the watcher would look
  auto rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].close_reason, "job ended");
}

TEST_F(TunnelServiceTest, HeldHostsAreTargetsAndHoldsAreReleased) {
  options_.held_instance_id = [](const std::string& id) { return id + "-held"; };
  bool holding_before_start = false;
  options_.is_holding_before_start = [&](int) { return holding_before_start; };
  MakeService();
  AddJob("j", true);
  // Not held: nothing to release.
  Result<json> none = service_->Release(Request("j"));
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("not held"), std::string::npos);
  // Held before start: SIGUSR1 to the instance's PID 1.
  holding_before_start = true;
  Result<json> before = service_->Release(Request("j"));
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_EQ((*before)["Released"], "hold before start");
  ASSERT_FALSE(runtime_->signals().empty());
  EXPECT_EQ(runtime_->signals().back().instance_id, "training-j-algo-1");
  EXPECT_EQ(runtime_->signals().back().signal, SIGUSR1);
  holding_before_start = false;

  // The job fails; its host is held after exit: the same target reaches the post-mortem instance.
  ASSERT_TRUE(runtime_->Exit("training-j-algo-1", 1).ok());
  auto failed = store::TrainingJobRepository(db_.get()).Mutate("j", [](store::TrainingJobRecord& r) {
    r.status = store::TrainingJobStatus::kFailed;
    r.state.failure_reason = "loss is NaN";
    return Status::Ok();
  });
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ((*service_->Targets("j"))["Targets"][0]["State"], "Gone");
  EXPECT_EQ(service_->Prepare(Request("j")).status().code(), StatusCode::kInvalidArgument);
  runtime::InstanceSpec held;
  held.instance_id = "training-j-algo-1-held";
  held.hostname = "algo-1";
  held.argv = {"/bin/true"};
  ASSERT_TRUE(runtime_->Launch(held).ok());
  auto t = service_->Targets("j");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)["ResourceStatus"], "Failed");
  EXPECT_EQ((*t)["FailureReason"], "loss is NaN");
  EXPECT_EQ((*t)["Targets"][0]["State"], "Held");
  UniqueFd client = Connect("j");
  ASSERT_TRUE(client.valid());
  EXPECT_EQ(ReadFor(client.get(), 14, std::chrono::seconds(5)), "SSH-2.0-fake\r\n");
  Result<json> after = service_->Release(Request("training-job/j/algo-1"));
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ((*after)["Released"], "hold after exit");
  EXPECT_EQ(runtime_->signals().back().instance_id, "training-j-algo-1-held");
  // The hold ends (the post-mortem instance exits): its tunnel closes as the job's end.
  ASSERT_TRUE(runtime_->Exit("training-j-algo-1-held", 0).ok());
  EXPECT_TRUE(ClosedWithin(client.get(), std::chrono::seconds(5)));
  auto rows = ClosedAudit();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].close_reason, "job ended");
  EXPECT_EQ((*service_->Targets("j"))["Targets"][0]["State"], "Gone");
}

}  // namespace
}  // namespace kiln::access
