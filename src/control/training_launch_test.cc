#include "control/training_launch.h"

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using nlohmann::json;
using Kind = runtime::ImageResolution::Kind;

runtime::ImageResolution Local(const std::string& exe) {
  runtime::ImageResolution r;
  r.kind = Kind::kLocalExecutable;
  r.executable = exe;
  return r;
}

runtime::ImageResolution Container(const std::string& uri) {
  runtime::ImageResolution r;
  r.kind = Kind::kContainerImage;
  r.environment_name = "container";
  r.image = uri;
  return r;
}

runtime::ImageResolution Script(const std::string& interpreter) {
  runtime::ImageResolution r;
  r.kind = Kind::kScriptMode;
  r.interpreter = interpreter;
  r.environment_name = "system";
  return r;
}

TrainingLaunchContext Context() {
  TrainingLaunchContext c;
  c.job_name = "job-1";
  c.job_arn = "arn:aws:sagemaker:us-east-1:000000000000:training-job/job-1";
  c.region = "us-east-1";
  c.endpoint_url = "http://127.0.0.1:5456";
  c.toolkit_script = "/srv/kiln/python/kiln_toolkit/train.py";
  c.credential.access_key_id = "ASIAKILN";
  c.credential.secret_access_key = "secret";
  c.credential.session_token = "token";
  return c;
}

json Request(const json& algorithm_extra = json::object()) {
  json algorithm = {{"TrainingImage", "x"}, {"TrainingInputMode", "File"}};
  for (auto it = algorithm_extra.begin(); it != algorithm_extra.end(); ++it) algorithm[it.key()] = it.value();
  return {{"AlgorithmSpecification", algorithm}};
}

using Argv = std::vector<std::string>;

TEST(PlanTrainingLaunchTest, LocalImagesRunLikeDockerRunImageTrain) {
  EXPECT_EQ(PlanTrainingLaunch(Request(), Local("/opt/prog"), Context()).argv, (Argv{"/opt/prog", "train"}));
  EXPECT_EQ(PlanTrainingLaunch(Request(), Local("/opt/prog"), Context()).working_dir, "/");
  // ContainerArguments replace `train`; ContainerEntrypoint replaces the executable (§2).
  EXPECT_EQ(
      PlanTrainingLaunch(Request({{"ContainerArguments", {"fit", "--fast"}}}), Local("/opt/prog"), Context()).argv,
      (Argv{"/opt/prog", "fit", "--fast"}));
  EXPECT_EQ(
      PlanTrainingLaunch(Request({{"ContainerEntrypoint", {"/bin/sh", "-c"}}}), Local("/opt/prog"), Context()).argv,
      (Argv{"/bin/sh", "-c"}));
  EXPECT_EQ(PlanTrainingLaunch(Request({{"ContainerEntrypoint", {"python3"}}, {"ContainerArguments", {"a.py"}}}),
                               Local("/opt/prog"), Context())
                .argv,
            (Argv{"python3", "a.py"}));
}

TEST(PlanTrainingLaunchTest, ContainerImagesRunTheirEntrypointWithTrain) {
  const std::string uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/byo:1";
  auto plan = PlanTrainingLaunch(Request(), Container(uri), Context());
  ASSERT_TRUE(plan.container.has_value());
  EXPECT_EQ(plan.container->requested, uri);
  EXPECT_EQ(plan.container->reference, "");  // the runtime maps it (ECR mirror)
  EXPECT_FALSE(plan.container->entrypoint.has_value());
  EXPECT_EQ(plan.argv, (Argv{"train"}));
  EXPECT_EQ(plan.working_dir, "");  // the image's WORKDIR
  EXPECT_TRUE(plan.binds.empty());
  // ContainerArguments replace `train` under the image's ENTRYPOINT (§2).
  plan = PlanTrainingLaunch(Request({{"ContainerArguments", {"fit", "--fast"}}}), Container(uri), Context());
  EXPECT_EQ(plan.argv, (Argv{"fit", "--fast"}));
  EXPECT_FALSE(plan.container->entrypoint.has_value());
  // ContainerEntrypoint alone: that entrypoint with no arguments.
  plan = PlanTrainingLaunch(Request({{"ContainerEntrypoint", {"/bin/sh", "-c", "exit 0"}}}), Container(uri), Context());
  ASSERT_TRUE(plan.container->entrypoint.has_value());
  EXPECT_EQ(*plan.container->entrypoint, (Argv{"/bin/sh", "-c", "exit 0"}));
  EXPECT_TRUE(plan.argv.empty());
  // Both: the given entrypoint with the given arguments.
  plan = PlanTrainingLaunch(Request({{"ContainerEntrypoint", {"python3"}}, {"ContainerArguments", {"a.py"}}}),
                            Container(uri), Context());
  EXPECT_EQ(*plan.container->entrypoint, (Argv{"python3"}));
  EXPECT_EQ(plan.argv, (Argv{"a.py"}));
  // Host programs (and paths under /tmp) are never bound into a container.
  plan = PlanTrainingLaunch(Request({{"ContainerEntrypoint", {"/tmp/x/prog"}}}), Container(uri), Context());
  EXPECT_TRUE(plan.binds.empty());
  // Other kinds carry no image.
  EXPECT_FALSE(PlanTrainingLaunch(Request(), Local("/opt/prog"), Context()).container.has_value());
  EXPECT_FALSE(PlanTrainingLaunch(Request(), Script("/usr/bin/python3"), Context()).container.has_value());
}

TEST(PlanTrainingLaunchTest, ContainerImagesKeepTheirOwnPathHomeAndLang) {
  json request = Request();
  request["Environment"] = {{"MY_VAR", "1"}, {"AWS_SECRET_ACCESS_KEY", "mine"}};
  auto env = PlanTrainingLaunch(request, Container("registry.local/byo:1"), Context()).env;
  EXPECT_EQ(env.count("PATH"), 0u);
  EXPECT_EQ(env.count("HOME"), 0u);
  EXPECT_EQ(env.count("LANG"), 0u);
  EXPECT_EQ(env.count("KILN_PIP_TARGET"), 0u);
  EXPECT_EQ(env["MY_VAR"], "1");
  EXPECT_EQ(env["AWS_SECRET_ACCESS_KEY"], "secret");
  EXPECT_EQ(env["AWS_ENDPOINT_URL"], "http://127.0.0.1:5456");
  EXPECT_EQ(env["AWS_REGION"], "us-east-1");
  EXPECT_EQ(env["TRAINING_JOB_NAME"], "job-1");
  // The request may still set PATH itself (it wins over the image's, as `docker run -e`).
  request["Environment"]["PATH"] = "/opt/bin:/usr/bin";
  EXPECT_EQ(PlanTrainingLaunch(request, Container("registry.local/byo:1"), Context()).env["PATH"], "/opt/bin:/usr/bin");
  // Processes still get the base variables.
  EXPECT_EQ(PlanTrainingLaunch(Request(), Local("/opt/prog"), Context()).env["HOME"], "/root");
}

TEST(PlanTrainingLaunchTest, ScriptModeRunsTheToolkit) {
  auto plan = PlanTrainingLaunch(Request(), Script("/usr/bin/python3"), Context());
  EXPECT_EQ(plan.argv, (Argv{"/usr/bin/python3", "/srv/kiln/python/kiln_toolkit/train.py"}));
  EXPECT_EQ(plan.working_dir, "/opt/ml/code");
  // Framework images have no ENTRYPOINT: the arguments alone are the command.
  EXPECT_EQ(
      PlanTrainingLaunch(Request({{"ContainerArguments", {"python3", "x.py"}}}), Script("/usr/bin/python3"), Context())
          .argv,
      (Argv{"python3", "x.py"}));
}

TEST(PlanTrainingLaunchTest, EnvironmentPrecedence) {
  json request = Request();
  request["Environment"] = {{"AWS_REGION", "eu-west-1"},    // the request may override Kiln's region
                            {"AWS_ACCESS_KEY_ID", "mine"},  // but never the credentials
                            {"TRAINING_JOB_NAME", "other"},
                            {"MY_VAR", "1"}};
  auto image = Script("/opt/venvs/torch/bin/python");
  image.env = {{"OMP_NUM_THREADS", "4"}, {"MY_VAR", "from-image"}};
  auto env = PlanTrainingLaunch(request, image, Context()).env;
  EXPECT_EQ(env["AWS_REGION"], "eu-west-1");
  EXPECT_EQ(env["AWS_DEFAULT_REGION"], "us-east-1");
  EXPECT_EQ(env["AWS_ACCESS_KEY_ID"], "ASIAKILN");
  EXPECT_EQ(env["AWS_SESSION_TOKEN"], "token");
  EXPECT_EQ(env["TRAINING_JOB_NAME"], "job-1");
  EXPECT_EQ(env["TRAINING_JOB_ARN"], "arn:aws:sagemaker:us-east-1:000000000000:training-job/job-1");
  EXPECT_EQ(env["MY_VAR"], "1");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(env["AWS_ENDPOINT_URL"], "http://127.0.0.1:5456");
  EXPECT_EQ(env["S3_ENDPOINT_URL"], "http://127.0.0.1:5456");
  EXPECT_EQ(env.count("KILN_PIP_TARGET"), 0u);  // a venv installs into itself
  for (const auto& [k, v] : env) EXPECT_NE(k.rfind("SM_", 0), 0u) << k << " (the toolkit computes SM_*)";
  EXPECT_EQ(PlanTrainingLaunch(Request(), Script("/usr/bin/python3"), Context()).env["KILN_PIP_TARGET"],
            "/opt/ml/.kiln/site-packages");
}

TEST(PlanTrainingLaunchTest, EveryHostGetsTheJobsRshTokenWhichTheRequestCannotSet) {
  json request = Request();
  request["Environment"] = {{"KILN_RSH_TOKEN", "guessable"}};
  auto env = PlanTrainingLaunch(request, Local("/opt/prog"), Context()).env;
  // HMAC-SHA256(key "secret", "kiln-rsh"), as Python's hmac computes it.
  EXPECT_EQ(env["KILN_RSH_TOKEN"], "51cd779b81e348cdaac9307482eb29838e2e4ce392af9e2b744437a30fbf43ff");
  EXPECT_EQ(PlanTrainingLaunch(Request(), Script("/usr/bin/python3"), Context()).env["KILN_RSH_TOKEN"],
            env["KILN_RSH_TOKEN"]);
  TrainingLaunchContext other = Context();
  other.credential.secret_access_key = "another job's secret";
  EXPECT_NE(RshToken(other.credential), env["KILN_RSH_TOKEN"]);
  EXPECT_EQ(RshToken(other.credential).size(), 64u);
}

TEST(PlanTrainingLaunchTest, HostPathsUnderTmpAreBoundReadOnly) {
  auto plan = PlanTrainingLaunch(Request(), Local("/tmp/work/bin/prog"), Context());
  ASSERT_EQ(plan.binds.size(), 1u);
  EXPECT_EQ(plan.binds[0].host_path, "/tmp/work");
  EXPECT_EQ(plan.binds[0].sandbox_path, "/tmp/work");
  EXPECT_TRUE(plan.binds[0].read_only);
  EXPECT_TRUE(PlanTrainingLaunch(Request(), Local("/opt/prog"), Context()).binds.empty());
}

TEST(TrainingLaunchTest, GpuEnvironmentAndHostsFile) {
  std::map<std::string, std::string> env = {{"CUDA_VISIBLE_DEVICES", "stale"}};
  AddGpuEnvironment(Allocation{}, env);
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "void");
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  Allocation gpus;
  gpus.gpus = {2, 3};
  gpus.gpu_uuids = {"GPU-a", "GPU-b"};
  AddGpuEnvironment(gpus, env);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "2,3");
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
  auto lines = HostsFileLines({"algo-1", "algo-2"});
  EXPECT_EQ(lines.back(), "127.0.0.1 algo-1 algo-2");
}

TEST(TrainingLaunchTest, LoopbackForwardsNameKilnsLoopbackPort) {
  EXPECT_EQ(LoopbackForwards("http://127.0.0.1:5456"), std::vector<int>({5456}));
  EXPECT_EQ(LoopbackForwards("http://localhost:7000/"), std::vector<int>({7000}));
  EXPECT_EQ(LoopbackForwards("http://[::1]:9000"), std::vector<int>({9000}));
  EXPECT_EQ(LoopbackForwards("http://127.0.0.1"), std::vector<int>({80}));
  EXPECT_TRUE(LoopbackForwards("http://10.0.0.5:5456").empty());
  EXPECT_TRUE(LoopbackForwards("http://127.0.0.1:99999").empty());
}

TEST(TrainingLaunchTest, NamespacedHostsFileMapsEachHostToItsAddress) {
  auto lines = NamespacedHostsFileLines({{"algo-1", "10.213.1.2"}, {"algo-2", "10.213.1.3"}});
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "127.0.0.1 localhost");
  EXPECT_EQ(lines[2], "10.213.1.2 algo-1");
  EXPECT_EQ(lines[3], "10.213.1.3 algo-2");
}

}  // namespace
}  // namespace kiln::control
