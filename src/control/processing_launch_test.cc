#include "control/processing_launch.h"

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using nlohmann::json;
using runtime::ImageResolution;

ProcessingLaunchContext Context() {
  ProcessingLaunchContext c;
  c.region = "eu-west-1";
  c.endpoint_url = "http://127.0.0.1:9000";
  c.credential.access_key_id = "AKIA";
  c.credential.secret_access_key = "secret";
  c.credential.session_token = "token";
  return c;
}

json Request(const json& app) {
  return {{"ProcessingJobName", "p"},
          {"AppSpecification", app},
          {"Environment", {{"MY_VAR", "1"}, {"AWS_REGION", "mine"}, {"AWS_ACCESS_KEY_ID", "spoof"}}}};
}

ImageResolution Container() {
  ImageResolution r;
  r.kind = ImageResolution::Kind::kContainerImage;
  r.image = "123.dkr.ecr.us-east-1.amazonaws.com/proc:1";
  return r;
}

ImageResolution ScriptMode() {
  ImageResolution r;
  r.kind = ImageResolution::Kind::kScriptMode;
  r.environment_name = "system";
  r.interpreter = "/opt/venv/bin/python";
  r.env = {{"FROM_TABLE", "yes"}};
  return r;
}

ImageResolution Local() {
  ImageResolution r;
  r.kind = ImageResolution::Kind::kLocalExecutable;
  r.environment_name = "local";
  r.executable = "/usr/local/bin/proc";
  return r;
}

TEST(ProcessingLaunchTest, ContainerImageRunsItsOwnEntrypointAndCmd) {
  auto plan = PlanProcessingLaunch(Request({{"ImageUri", "img"}}), Container(), Context());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->container.has_value());
  EXPECT_EQ(plan->container->requested, "123.dkr.ecr.us-east-1.amazonaws.com/proc:1");
  EXPECT_FALSE(plan->container->entrypoint.has_value());
  EXPECT_TRUE(plan->argv.empty());  // the image's CMD; never `train`
  EXPECT_EQ(plan->working_dir, "");
  EXPECT_EQ(plan->env.count("PATH"), 0u);  // the image's own
  EXPECT_TRUE(plan->binds.empty());
}

TEST(ProcessingLaunchTest, ContainerEntrypointAndArgumentsOverrideLikeDocker) {
  auto plan = PlanProcessingLaunch(
      Request(
          {{"ImageUri", "img"}, {"ContainerEntrypoint", {"python3", "x.py"}}, {"ContainerArguments", {"--a", "1"}}}),
      Container(), Context());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(*plan->container->entrypoint, (std::vector<std::string>{"python3", "x.py"}));
  EXPECT_EQ(plan->argv, (std::vector<std::string>{"--a", "1"}));
  auto args_only =
      PlanProcessingLaunch(Request({{"ImageUri", "img"}, {"ContainerArguments", {"run"}}}), Container(), Context());
  EXPECT_FALSE(args_only->container->entrypoint.has_value());
  EXPECT_EQ(args_only->argv, (std::vector<std::string>{"run"}));
}

TEST(ProcessingLaunchTest, ScriptModeRunsTheEntrypointWithTheEnvironmentsInterpreter) {
  auto plan = PlanProcessingLaunch(Request({{"ImageUri", "sklearn"},
                                            {"ContainerEntrypoint", {"python3", "/opt/ml/processing/input/code/x.py"}},
                                            {"ContainerArguments", {"--n", "2"}}}),
                                   ScriptMode(), Context());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_FALSE(plan->container.has_value());
  EXPECT_EQ(plan->argv,
            (std::vector<std::string>{"/opt/venv/bin/python", "/opt/ml/processing/input/code/x.py", "--n", "2"}));
  EXPECT_EQ(plan->working_dir, "/");
  EXPECT_EQ(plan->env.at("FROM_TABLE"), "yes");
  // `python`, `python3`, `pip` by name are the environment's (the SDK's FrameworkProcessor runs
  // `python <script>` from its runproc.sh).
  EXPECT_EQ(plan->env.at("PATH"), "/opt/ml/.kiln/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  // Another program is run as named.
  auto bash = PlanProcessingLaunch(Request({{"ImageUri", "sklearn"}, {"ContainerEntrypoint", {"bash", "-c", "x"}}}),
                                   ScriptMode(), Context());
  EXPECT_EQ(bash->argv, (std::vector<std::string>{"bash", "-c", "x"}));
}

TEST(ProcessingLaunchTest, ScriptModeWithoutAnEntrypointIsAClientError) {
  auto plan = PlanProcessingLaunch(Request({{"ImageUri", "sklearn"}}), ScriptMode(), Context());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message().rfind("ClientError: AppSpecification names no ContainerEntrypoint", 0), 0u)
      << plan.status().message();
}

TEST(ProcessingLaunchTest, LocalExecutableIsTheEntrypointWithoutTrain) {
  auto plan = PlanProcessingLaunch(Request({{"ImageUri", "local:/usr/local/bin/proc"}}), Local(), Context());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->argv, (std::vector<std::string>{"/usr/local/bin/proc"}));
  auto args = PlanProcessingLaunch(
      Request({{"ImageUri", "local:/usr/local/bin/proc"}, {"ContainerArguments", {"a", "b"}}}), Local(), Context());
  EXPECT_EQ(args->argv, (std::vector<std::string>{"/usr/local/bin/proc", "a", "b"}));
  EXPECT_EQ(args->env.at("PATH"), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");  // no shims
}

TEST(ProcessingLaunchTest, EnvironmentIsTheRequestsPlusKilnsWithoutTrainingVariables) {
  auto plan = PlanProcessingLaunch(Request({{"ImageUri", "img"}}), Container(), Context());
  ASSERT_TRUE(plan.ok());
  const auto& env = plan->env;
  EXPECT_EQ(env.at("MY_VAR"), "1");
  EXPECT_EQ(env.at("AWS_REGION"), "mine");  // the request's Environment wins over Kiln's region
  EXPECT_EQ(env.at("AWS_DEFAULT_REGION"), "eu-west-1");
  EXPECT_EQ(env.at("AWS_ENDPOINT_URL"), "http://127.0.0.1:9000");
  EXPECT_EQ(env.at("S3_ENDPOINT_URL"), "http://127.0.0.1:9000");
  EXPECT_EQ(env.at("AWS_ACCESS_KEY_ID"), "AKIA");  // credentials win over the request
  EXPECT_EQ(env.at("AWS_SECRET_ACCESS_KEY"), "secret");
  EXPECT_EQ(env.at("AWS_SESSION_TOKEN"), "token");
  for (const auto& [key, value] : env) {
    EXPECT_NE(key.rfind("TRAINING_JOB_", 0), 0u) << key;
    EXPECT_NE(key, "KILN_RSH_TOKEN");
  }
}

TEST(ProcessingLaunchTest, BindsProgramsUnderTmp) {
  ImageResolution local = Local();
  local.executable = "/tmp/tool/proc";
  auto plan = PlanProcessingLaunch(Request({{"ImageUri", "local:/tmp/tool/proc"}}), local, Context());
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->binds.size(), 1u);
  EXPECT_EQ(plan->binds[0].host_path, "/tmp/tool");
  EXPECT_TRUE(plan->binds[0].read_only);
}

}  // namespace
}  // namespace kiln::control
