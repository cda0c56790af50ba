#include "control/serving_launch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using json = nlohmann::json;
using Kind = runtime::ImageResolution::Kind;

ServingLaunchContext Context() {
  ServingLaunchContext c;
  c.region = "eu-west-1";
  c.endpoint_url = "http://127.0.0.1:5456";
  c.credential.access_key_id = "AKID";
  c.credential.secret_access_key = "SECRET";
  c.credential.session_token = "TOKEN";
  c.port = 20100;
  c.model_server = "/usr/lib/kiln/kiln-model-server";
  c.serve_worker = "/usr/lib/kiln/python/kiln_toolkit/serve_worker.py";
  return c;
}

runtime::ImageResolution Framework(std::string interpreter = "/usr/bin/python3") {
  runtime::ImageResolution r;
  r.kind = Kind::kScriptMode;
  r.environment_name = "system";
  r.interpreter = std::move(interpreter);
  r.env = {{"OMP_NUM_THREADS", "2"}};
  return r;
}

TEST(ServingLaunchTest, FrameworkImagesRunTheModelServerWithTheEnvironmentsInterpreter) {
  json container = {{"Image", "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:1.13-cpu-py39"},
                    {"Environment", {{"SAGEMAKER_PROGRAM", "inference.py"}}}};
  ServingLaunchPlan plan = PlanServingLaunch(container, Framework(), Context());
  EXPECT_EQ(plan.argv, (std::vector<std::string>{"/usr/lib/kiln/kiln-model-server", "serve"}));
  EXPECT_EQ(plan.env["KILN_MODEL_SERVER_PYTHON"], "/usr/bin/python3");
  EXPECT_EQ(plan.env["KILN_MODEL_SERVER_WORKER"], "/usr/lib/kiln/python/kiln_toolkit/serve_worker.py");
  EXPECT_EQ(plan.env["KILN_MODEL_SERVER_FRAMEWORK"], "pytorch");
  EXPECT_EQ(plan.env["KILN_PIP_TARGET"], "/opt/ml/.kiln/site-packages");
  EXPECT_EQ(plan.env["OMP_NUM_THREADS"], "2");
  EXPECT_EQ(plan.env["SAGEMAKER_PROGRAM"], "inference.py");
  EXPECT_EQ(plan.env["SAGEMAKER_BIND_TO_PORT"], "20100");
  EXPECT_EQ(plan.env["SAGEMAKER_SAFE_PORT_RANGE"], "20101-20199");
  EXPECT_EQ(plan.env["AWS_REGION"], "eu-west-1");
  EXPECT_EQ(plan.env["AWS_ENDPOINT_URL_S3"], "http://127.0.0.1:5456");
  EXPECT_EQ(plan.env["AWS_SESSION_TOKEN"], "TOKEN");
  EXPECT_TRUE(plan.binds.empty());
}

TEST(ServingLaunchTest, MultiModelContainersGetSageMakerMultiModel) {
  json container = {{"Image", "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"},
                    {"Mode", "MultiModel"},
                    {"ModelDataUrl", "s3://b/models/"},
                    {"Environment", {{"SAGEMAKER_MULTI_MODEL", "false"}}}};
  EXPECT_EQ(PlanServingLaunch(container, Framework(), Context()).env["SAGEMAKER_MULTI_MODEL"], "true");
  container["Mode"] = "SingleModel";
  container.erase("Environment");
  EXPECT_FALSE(PlanServingLaunch(container, Framework(), Context()).env.contains("SAGEMAKER_MULTI_MODEL"));
}

TEST(ServingLaunchTest, ContainerImagesRunTheirEntrypointWithServeAndTheirOwnPath) {
  runtime::ImageResolution image;
  image.kind = Kind::kContainerImage;
  image.environment_name = "container";
  image.image = "registry.local/byo-serve:2";
  json container = {{"Image", "registry.local/byo-serve:2"}, {"Environment", {{"MODEL_MODE", "fast"}}}};
  ServingLaunchPlan plan = PlanServingLaunch(container, image, Context());
  ASSERT_TRUE(plan.container.has_value());
  EXPECT_EQ(plan.container->requested, "registry.local/byo-serve:2");
  EXPECT_EQ(plan.container->reference, "");
  EXPECT_FALSE(plan.container->entrypoint.has_value());
  EXPECT_EQ(plan.argv, (std::vector<std::string>{"serve"}));
  EXPECT_TRUE(plan.binds.empty());
  EXPECT_EQ(plan.env.count("PATH"), 0u);
  EXPECT_EQ(plan.env.count("HOME"), 0u);
  EXPECT_EQ(plan.env.count("LANG"), 0u);
  // Not Kiln's model server: none of its variables.
  EXPECT_EQ(plan.env.count("KILN_MODEL_SERVER_PYTHON"), 0u);
  EXPECT_EQ(plan.env.count("KILN_MODEL_SERVER_WORKER"), 0u);
  EXPECT_EQ(plan.env.count("KILN_PIP_TARGET"), 0u);
  EXPECT_EQ(plan.env["MODEL_MODE"], "fast");
  EXPECT_EQ(plan.env["SAGEMAKER_BIND_TO_PORT"], "20100");
  EXPECT_EQ(plan.env["SAGEMAKER_SAFE_PORT_RANGE"], "20101-20199");
  EXPECT_EQ(plan.env["AWS_REGION"], "eu-west-1");
  EXPECT_EQ(plan.env["AWS_ENDPOINT_URL"], "http://127.0.0.1:5456");
  EXPECT_EQ(plan.env["AWS_ACCESS_KEY_ID"], "AKID");
  EXPECT_FALSE(PlanServingLaunch(container, Framework(), Context()).container.has_value());
}

TEST(ServingLaunchTest, LocalImagesRunTheirExecutableWithServe) {
  runtime::ImageResolution local;
  local.kind = Kind::kLocalExecutable;
  local.executable = "/tmp/algo/serve.sh";
  ServingLaunchPlan plan = PlanServingLaunch({{"Image", "local:/tmp/algo/serve.sh"}}, local, Context());
  EXPECT_EQ(plan.argv, (std::vector<std::string>{"/tmp/algo/serve.sh", "serve"}));
  EXPECT_EQ(plan.env.count("KILN_MODEL_SERVER_WORKER"), 0u);
  EXPECT_EQ(plan.env.count("KILN_PIP_TARGET"), 0u);
  ASSERT_EQ(plan.binds.size(), 1u);
  EXPECT_EQ(plan.binds[0].host_path, "/tmp/algo");
}

TEST(ServingLaunchTest, ANamespacedInstanceListensOn8080AndReachesKilnAtTheSameUrl) {
  // Namespaced mode: every instance on 8080 in its own namespace, its safe range above it;
  // AWS_ENDPOINT_URL unchanged (the shim forwards 127.0.0.1:<port> inside to the node's).
  ServingLaunchContext context = Context();
  context.port = 8080;
  ServingLaunchPlan plan = PlanServingLaunch({{"Image", "x/sagemaker-scikit-learn:1.2-1"}}, Framework(), context);
  EXPECT_EQ(plan.env["SAGEMAKER_BIND_TO_PORT"], "8080");
  EXPECT_EQ(plan.env["SAGEMAKER_SAFE_PORT_RANGE"], "8081-8179");
  EXPECT_EQ(plan.env["AWS_ENDPOINT_URL"], "http://127.0.0.1:5456");
}

TEST(ServingLaunchTest, TheContainerEnvironmentCannotReplaceCredentialsOrPorts) {
  json container = {{"Image", "x/sagemaker-scikit-learn:1.2-1"},
                    {"Environment",
                     {{"AWS_ACCESS_KEY_ID", "mine"},
                      {"SAGEMAKER_BIND_TO_PORT", "8080"},
                      {"KILN_MODEL_SERVER_BACKEND", "torchscript"},
                      {"AWS_REGION", "us-west-2"}}}};
  ServingLaunchPlan plan = PlanServingLaunch(container, Framework(), Context());
  EXPECT_EQ(plan.env["AWS_ACCESS_KEY_ID"], "AKID");
  EXPECT_EQ(plan.env["SAGEMAKER_BIND_TO_PORT"], "20100");
  // The model's environment chooses model server settings and may set its own region.
  EXPECT_EQ(plan.env["KILN_MODEL_SERVER_BACKEND"], "torchscript");
  EXPECT_EQ(plan.env["AWS_REGION"], "us-west-2");
  EXPECT_EQ(plan.env["KILN_MODEL_SERVER_FRAMEWORK"], "sklearn");
}

TEST(ServingLaunchTest, AVirtualenvInterpreterInstallsItsOwnRequirementsAndTmpPathsAreBound) {
  ServingLaunchContext context = Context();
  context.model_server = "/tmp/build/src/modelserver/kiln-model-server";
  context.serve_worker = "/tmp/src/python/kiln_toolkit/serve_worker.py";
  ServingLaunchPlan plan =
      PlanServingLaunch({{"Image", "pytorch-inference:2"}}, Framework("/tmp/venv/bin/python"), context);
  EXPECT_EQ(plan.env.count("KILN_PIP_TARGET"), 0u);
  std::vector<std::string> bound;
  for (const auto& b : plan.binds) bound.push_back(b.host_path);
  EXPECT_THAT(bound, ::testing::UnorderedElementsAre("/tmp/venv", "/tmp/build", "/tmp/src"));
}

// serving-contract.md §2 Resources: equal CPU shares for the containers of one instance.
TEST(ServingLaunchTest, MultiContainerCpusAreEqualSlices) {
  const std::vector<int> cpus = {4, 5, 6, 7, 8};
  EXPECT_EQ(MultiContainerCpus(cpus, 0, 1), cpus);
  EXPECT_EQ(MultiContainerCpus(cpus, 0, 2), (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(MultiContainerCpus(cpus, 1, 2), (std::vector<int>{7, 8}));
  EXPECT_EQ(MultiContainerCpus(cpus, 2, 5), (std::vector<int>{6}));
  // Fewer CPUs than containers: they share them all.
  EXPECT_EQ(MultiContainerCpus({0, 1}, 2, 3), (std::vector<int>{0, 1}));
  EXPECT_EQ(MultiContainerCpus({}, 0, 2), std::vector<int>{});
}

// Every container of a multi-container model gets its own bind port and safe range.
TEST(ServingLaunchTest, EachContainerItsOwnBindPortAndSafeRange) {
  ServingLaunchContext context = Context();
  context.port = 8180;
  context.port_block = 100;
  runtime::ImageResolution local;
  local.kind = Kind::kLocalExecutable;
  local.executable = "/opt/x/serve";
  ServingLaunchPlan plan = PlanServingLaunch(nlohmann::json{{"Image", "local:/opt/x/serve"}}, local, context);
  EXPECT_EQ(plan.env["SAGEMAKER_BIND_TO_PORT"], "8180");
  EXPECT_EQ(plan.env["SAGEMAKER_SAFE_PORT_RANGE"], "8181-8279");
}

}  // namespace
}  // namespace kiln::control
