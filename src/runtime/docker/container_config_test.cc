#include "runtime/docker/container_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln::runtime::docker {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Not;

InstanceSpec TrainingSpec() {
  InstanceSpec spec;
  spec.instance_id = "job-1-algo-1";
  spec.opt_ml_dir = "/var/lib/kiln/jobs/job-1/algo-1/opt_ml";
  spec.hostname = "algo-1";
  spec.argv = {"train"};
  spec.env = {{"SM_CURRENT_HOST", "algo-1"}, {"SM_HOSTS", "[\"algo-1\"]"}};
  spec.container =
      ContainerImage{"123456789012.dkr.ecr.us-east-1.amazonaws.com/byo:1", "localhost/byo:1", std::nullopt};
  return spec;
}

ContainerSettings Settings() {
  ContainerSettings settings;
  settings.server_label = "ab12cd34";
  return settings;
}

std::vector<std::string> Strings(const nlohmann::json& array) {
  std::vector<std::string> out;
  for (const auto& v : array) out.push_back(v.get<std::string>());
  return out;
}

TEST(BuildCreateBodyTest, ImageCommandAndTheImagesOwnEntrypoint) {
  nlohmann::json body = BuildCreateBody(TrainingSpec(), Settings(), "", "");
  EXPECT_EQ(body["Image"], "localhost/byo:1");
  EXPECT_EQ(Strings(body["Cmd"]), std::vector<std::string>{"train"});
  // No Entrypoint key at all: the image's ENTRYPOINT runs with "train" as its argument (an empty
  // list or null would be read differently by the engines).
  EXPECT_FALSE(body.contains("Entrypoint"));
  // WorkingDir only when set: the image's WORKDIR otherwise.
  EXPECT_FALSE(body.contains("WorkingDir"));
  EXPECT_EQ(body["Hostname"], "algo-1");
  EXPECT_EQ(body["StopSignal"], "SIGTERM");
  EXPECT_EQ(body["StopTimeout"], 30);
  EXPECT_EQ(body["HostConfig"]["Init"], false);
  EXPECT_EQ(body["HostConfig"]["RestartPolicy"]["Name"], "no");
}

TEST(BuildCreateBodyTest, EntrypointOverrideAndWorkingDir) {
  InstanceSpec spec = TrainingSpec();
  spec.container->entrypoint = std::vector<std::string>{"python3", "/opt/program/train.py"};
  spec.working_dir = "/opt/program";
  spec.argv = {"--epochs", "3"};
  nlohmann::json body = BuildCreateBody(spec, Settings(), "", "");
  EXPECT_EQ(Strings(body["Entrypoint"]), (std::vector<std::string>{"python3", "/opt/program/train.py"}));
  EXPECT_EQ(Strings(body["Cmd"]), (std::vector<std::string>{"--epochs", "3"}));
  EXPECT_EQ(body["WorkingDir"], "/opt/program");
}

TEST(BuildCreateBodyTest, AnEmptyEntrypointOverrideClearsTheImagesEntrypoint) {
  InstanceSpec spec = TrainingSpec();
  spec.container->entrypoint = std::vector<std::string>{};
  spec.argv = {"/usr/bin/python3", "-c", "print(1)"};
  nlohmann::json body = BuildCreateBody(spec, Settings(), "", "");
  EXPECT_EQ(Strings(body["Entrypoint"]), std::vector<std::string>{""});
}

TEST(BuildCreateBodyTest, EnvironmentAsKeyEqualsValue) {
  nlohmann::json body = BuildCreateBody(TrainingSpec(), Settings(), "", "");
  EXPECT_EQ(Strings(body["Env"]), (std::vector<std::string>{"SM_CURRENT_HOST=algo-1", "SM_HOSTS=[\"algo-1\"]"}));
}

TEST(BuildCreateBodyTest, CudaDevicesAreRenumberedNvidiaDevicesKept) {
  InstanceSpec spec = TrainingSpec();
  spec.gpus = {3, 5};
  spec.env["CUDA_VISIBLE_DEVICES"] = "3,5";
  spec.env["NVIDIA_VISIBLE_DEVICES"] = "GPU-aaa,GPU-bbb";
  nlohmann::json body = BuildCreateBody(spec, Settings(), "", "");
  std::vector<std::string> env = Strings(body["Env"]);
  EXPECT_THAT(env, Contains("CUDA_VISIBLE_DEVICES=0,1"));
  EXPECT_THAT(env, Not(Contains("CUDA_VISIBLE_DEVICES=3,5")));
  EXPECT_THAT(env, Contains("NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb"));
}

TEST(BuildCreateBodyTest, WithoutGpusNoDevicesAndVariablesAsGiven) {
  InstanceSpec spec = TrainingSpec();
  spec.env["NVIDIA_VISIBLE_DEVICES"] = "void";
  spec.env["CUDA_VISIBLE_DEVICES"] = "";
  nlohmann::json body = BuildCreateBody(spec, Settings(), "", "");
  EXPECT_THAT(Strings(body["Env"]), Contains("NVIDIA_VISIBLE_DEVICES=void"));
  EXPECT_THAT(Strings(body["Env"]), Contains("CUDA_VISIBLE_DEVICES="));
  EXPECT_FALSE(body["HostConfig"].contains("DeviceRequests"));
  EXPECT_FALSE(body["HostConfig"].contains("Devices"));
}

TEST(BuildCreateBodyTest, GpusAsDockerDeviceRequests) {
  InstanceSpec spec = TrainingSpec();
  spec.gpus = {2, 7};
  nlohmann::json body = BuildCreateBody(spec, Settings(), "", "");
  const nlohmann::json& requests = body["HostConfig"]["DeviceRequests"];
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0]["Driver"], "nvidia");
  EXPECT_EQ(Strings(requests[0]["DeviceIDs"]), (std::vector<std::string>{"2", "7"}));
  EXPECT_EQ(requests[0]["Capabilities"], nlohmann::json::parse(R"([["gpu"]])"));
  EXPECT_FALSE(requests[0].contains("Count"));  // Count and DeviceIDs together are refused
}

TEST(BuildCreateBodyTest, GpusAsCdiDevices) {
  InstanceSpec spec = TrainingSpec();
  spec.gpus = {1};
  ContainerSettings settings = Settings();
  settings.gpu_mode = GpuRequestMode::kCdi;
  nlohmann::json body = BuildCreateBody(spec, settings, "", "");
  const nlohmann::json& requests = body["HostConfig"]["DeviceRequests"];
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0]["Driver"], "cdi");
  EXPECT_EQ(Strings(requests[0]["DeviceIDs"]), std::vector<std::string>{"nvidia.com/gpu=1"});
  // Not HostConfig.Devices: Podman's compat API cannot read a CDI name there (measured).
  EXPECT_FALSE(body["HostConfig"].contains("Devices"));
}

TEST(BuildCreateBodyTest, GpusAsDeviceNodes) {
  InstanceSpec spec = TrainingSpec();
  spec.gpus = {3, 5};
  ContainerSettings settings = Settings();
  settings.gpu_mode = GpuRequestMode::kDevices;
  settings.gpu_control_devices = {"/dev/nvidiactl", "/dev/nvidia-uvm"};
  nlohmann::json body = BuildCreateBody(spec, settings, "", "");
  const nlohmann::json& devices = body["HostConfig"]["Devices"];
  ASSERT_EQ(devices.size(), 4u);
  std::vector<std::string> paths;
  for (const auto& d : devices) {
    EXPECT_EQ(d["PathOnHost"], d["PathInContainer"]);
    EXPECT_EQ(d["CgroupPermissions"], "rwm");
    paths.push_back(d["PathOnHost"].get<std::string>());
  }
  // Only the instance's GPUs, never another /dev/nvidia<N>.
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/nvidia3", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm"}));
  EXPECT_FALSE(body["HostConfig"].contains("DeviceRequests"));
}

TEST(BuildCreateBodyTest, NoGpusNoDevices) {
  ContainerSettings settings = Settings();
  settings.gpu_mode = GpuRequestMode::kDevices;
  settings.gpu_control_devices = {"/dev/nvidiactl"};
  nlohmann::json body = BuildCreateBody(TrainingSpec(), settings, "", "");
  EXPECT_FALSE(body["HostConfig"].contains("Devices"));
  EXPECT_FALSE(body["HostConfig"].contains("DeviceRequests"));
}

TEST(BuildCreateBodyTest, LabelsNameInstanceAndServer) {
  nlohmann::json body = BuildCreateBody(TrainingSpec(), Settings(), "", "");
  EXPECT_EQ(body["Labels"], nlohmann::json({{"kiln.instance", "job-1-algo-1"}, {"kiln.server", "ab12cd34"}}));
}

TEST(BuildCreateBodyTest, BindsOptMlExtraMountsAndHostsFile) {
  InstanceSpec spec = TrainingSpec();
  spec.extra_mounts = {{"/data/train", "/opt/ml/input/data/train", true}, {"/scratch/x", "/scratch", false}};
  nlohmann::json body = BuildCreateBody(spec, Settings(), "", "/var/lib/kiln/containers/job-1-algo-1/hosts");
  EXPECT_EQ(Strings(body["HostConfig"]["Binds"]),
            (std::vector<std::string>{"/var/lib/kiln/jobs/job-1/algo-1/opt_ml:/opt/ml",
                                      "/data/train:/opt/ml/input/data/train:ro", "/scratch/x:/scratch",
                                      "/var/lib/kiln/containers/job-1-algo-1/hosts:/etc/hosts:ro"}));
}

TEST(BuildCreateBodyTest, NoHostsFileNoHostsBind) {
  nlohmann::json body = BuildCreateBody(TrainingSpec(), Settings(), "", "");
  EXPECT_THAT(Strings(body["HostConfig"]["Binds"]), ElementsAre("/var/lib/kiln/jobs/job-1/algo-1/opt_ml:/opt/ml"));
}

TEST(BuildCreateBodyTest, NetworkModeJoinsANamespaceOrTheNodes) {
  EXPECT_EQ(BuildCreateBody(TrainingSpec(), Settings(), "", "")["HostConfig"]["NetworkMode"], "host");
  EXPECT_EQ(BuildCreateBody(TrainingSpec(), Settings(), "/proc/4242/ns/net", "")["HostConfig"]["NetworkMode"],
            "ns:/proc/4242/ns/net");
}

TEST(BuildCreateBodyTest, CpusMemoryAndNoSwap) {
  InstanceSpec spec = TrainingSpec();
  spec.cpus = {0, 1, 5};
  spec.memory_limit_bytes = 4ull << 30;
  nlohmann::json host = BuildCreateBody(spec, Settings(), "", "")["HostConfig"];
  EXPECT_EQ(host["CpusetCpus"], "0,1,5");
  EXPECT_EQ(host["Memory"], 4ull << 30);
  EXPECT_EQ(host["MemorySwap"], 4ull << 30);
}

TEST(BuildCreateBodyTest, NoCpusNoMemoryLeaveThemUnset) {
  nlohmann::json host = BuildCreateBody(TrainingSpec(), Settings(), "", "")["HostConfig"];
  EXPECT_FALSE(host.contains("CpusetCpus"));
  EXPECT_FALSE(host.contains("Memory"));
  EXPECT_FALSE(host.contains("MemorySwap"));
}

TEST(BuildCreateBodyTest, ShmIsAFractionOfMemoryOrTheDefaultAndAtLeast64MiB) {
  InstanceSpec spec = TrainingSpec();
  ContainerSettings settings = Settings();
  // No memory limit: the default.
  EXPECT_EQ(BuildCreateBody(spec, settings, "", "")["HostConfig"]["ShmSize"], 1ull << 30);
  // Half of 8 GiB.
  spec.memory_limit_bytes = 8ull << 30;
  EXPECT_EQ(BuildCreateBody(spec, settings, "", "")["HostConfig"]["ShmSize"], 4ull << 30);
  settings.shm_fraction = 0.25;
  EXPECT_EQ(BuildCreateBody(spec, settings, "", "")["HostConfig"]["ShmSize"], 2ull << 30);
  // A tiny instance still gets 64 MiB.
  spec.memory_limit_bytes = 100ull << 20;
  EXPECT_EQ(BuildCreateBody(spec, settings, "", "")["HostConfig"]["ShmSize"], 64ull << 20);
  spec.memory_limit_bytes = 0;
  settings.shm_default_bytes = 1 << 20;
  EXPECT_EQ(BuildCreateBody(spec, settings, "", "")["HostConfig"]["ShmSize"], 64ull << 20);
}

TEST(BuildCreateBodyTest, LogDriverOnlyWhenSet) {
  EXPECT_FALSE(BuildCreateBody(TrainingSpec(), Settings(), "", "")["HostConfig"].contains("LogConfig"));
  ContainerSettings settings = Settings();
  settings.log_driver = "k8s-file";
  settings.stop_timeout_seconds = 5;
  nlohmann::json body = BuildCreateBody(TrainingSpec(), settings, "", "");
  EXPECT_EQ(body["HostConfig"]["LogConfig"]["Type"], "k8s-file");
  EXPECT_EQ(body["StopTimeout"], 5);
}

std::map<std::string, std::pair<int64_t, int64_t>> UlimitsOf(const nlohmann::json& body) {
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (const auto& u : body["HostConfig"]["Ulimits"]) {
    out[u["Name"].get<std::string>()] = {u["Soft"].get<int64_t>(), u["Hard"].get<int64_t>()};
  }
  return out;
}

TEST(DefaultUlimitsTest, TheServersOwnLimitsForTheFourThatMatter) {
  std::vector<Ulimit> limits = DefaultUlimits();
  std::vector<std::string> names;
  for (const Ulimit& u : limits) names.push_back(u.name);
  EXPECT_THAT(names, ElementsAre("nofile", "nproc", "memlock", "stack"));
  rlimit nofile{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  EXPECT_EQ(limits[0].hard, nofile.rlim_max == RLIM_INFINITY ? -1 : static_cast<int64_t>(nofile.rlim_max));
  EXPECT_EQ(limits[0].soft, nofile.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(nofile.rlim_cur));
  rlimit stack{};
  ASSERT_EQ(getrlimit(RLIMIT_STACK, &stack), 0);
  EXPECT_EQ(limits[3].hard, stack.rlim_max == RLIM_INFINITY ? -1 : static_cast<int64_t>(stack.rlim_max));
  for (const Ulimit& u : limits) {
    EXPECT_TRUE(u.hard == -1 || (u.soft != -1 && u.soft <= u.hard)) << u.name;
  }
}

TEST(DefaultUlimitsTest, InfiniteIsMinusOne) {
  // RLIMIT_STACK's hard limit is unlimited on most hosts; where it is, -1 must be sent.
  rlimit stack{};
  ASSERT_EQ(getrlimit(RLIMIT_STACK, &stack), 0);
  if (stack.rlim_max != RLIM_INFINITY) GTEST_SKIP() << "the stack hard limit is finite here";
  EXPECT_EQ(DefaultUlimits()[3].hard, -1);
}

TEST(BuildCreateBodyTest, UlimitsAreAlwaysTheWholeList) {
  // Nothing configured: the defaults, all four (Podman replaces its own list with what is sent).
  auto defaults = UlimitsOf(BuildCreateBody(TrainingSpec(), Settings(), "", ""));
  EXPECT_EQ(defaults.size(), 4u);
  for (const Ulimit& u : DefaultUlimits()) EXPECT_EQ(defaults[u.name], std::make_pair(u.soft, u.hard)) << u.name;

  // A configured nofile replaces the default one; nproc, memlock and stack stay; extras are added.
  ContainerSettings settings = Settings();
  settings.ulimits = {{"nofile", 1024, 4096}, {"core", 0, 0}};
  auto configured = UlimitsOf(BuildCreateBody(TrainingSpec(), settings, "", ""));
  EXPECT_EQ(configured.size(), 5u);
  EXPECT_EQ(configured["nofile"], std::make_pair(int64_t{1024}, int64_t{4096}));
  EXPECT_EQ(configured["core"], std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(configured["nproc"], defaults["nproc"]);
  EXPECT_EQ(configured["stack"], defaults["stack"]);
  EXPECT_EQ(configured["memlock"], defaults["memlock"]);
}

TEST(ContainerNameTest, LabelAndInstanceId) {
  EXPECT_EQ(ContainerName("ab12cd34", "job-1-algo-1"), "kiln-ab12cd34-job-1-algo-1");
  EXPECT_EQ(ContainerName("ab12cd34", "ep.v1_2"), "kiln-ab12cd34-ep.v1_2");
}

TEST(ContainerNameTest, CharactersDockerRefusesBecomeDashes) {
  EXPECT_EQ(ContainerName("ab12cd34", "a b/c:d@e"), "kiln-ab12cd34-a-b-c-d-e");
  EXPECT_EQ(ContainerName("x y", "é"), "kiln-x-y---");  // each byte of a UTF-8 letter
}

}  // namespace
}  // namespace kiln::runtime::docker
