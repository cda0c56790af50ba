#include "modelserver/options.h"

#include <gtest/gtest.h>

namespace kiln::modelserver {
namespace {

using Env = std::map<std::string, std::string>;

SystemInfo Machine() {
  SystemInfo system;
  system.cpus = 6;
  system.gpus_all = 4;
  system.mem_total = 16ull << 30;
  return system;
}

Env Minimal() { return {{"KILN_MODEL_SERVER_WORKER", "/srv/serve_worker.py"}}; }

TEST(ModelServerOptionsTest, DefaultsFollowTheReadmeTable) {
  auto options = ParseModelServerOptions(Minimal(), Machine());
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->port, 8080);
  EXPECT_EQ(options->base_dir, "/opt/ml");
  EXPECT_EQ(options->model_dir(), "/opt/ml/model");
  EXPECT_FALSE(options->multi_model);
  EXPECT_EQ(options->workers, 6);  // CPUs in the affinity mask
  EXPECT_EQ(options->timeout, std::chrono::seconds(60));
  EXPECT_EQ(options->max_payload_bytes, 6'553'500u);
  EXPECT_EQ(options->max_payload_mb(), 6u);
  EXPECT_EQ(options->batch_size, 1);
  EXPECT_EQ(options->batch_delay, std::chrono::milliseconds(100));
  EXPECT_EQ(options->python, "/usr/bin/python3");
  EXPECT_EQ(options->worker_script, "/srv/serve_worker.py");
  EXPECT_EQ(options->framework, "");
  EXPECT_EQ(options->backend, BackendKind::kPython);
  EXPECT_EQ(options->queue_size, 100u);
  EXPECT_EQ(options->memory_limit_bytes, 16ull << 30);  // MemTotal without a cgroup limit
}

TEST(ModelServerOptionsTest, EveryVariableIsRead) {
  Env env = {{"SAGEMAKER_BIND_TO_PORT", "9090"},
             {"SAGEMAKER_BASE_DIR", "/srv/ml/"},
             {"SAGEMAKER_MULTI_MODEL", "TRUE"},
             {"SAGEMAKER_MODEL_SERVER_WORKERS", "3"},
             {"SAGEMAKER_MODEL_SERVER_TIMEOUT", "20"},
             {"SAGEMAKER_MAX_PAYLOAD_IN_MB", "100"},
             {"SAGEMAKER_TS_BATCH_SIZE", "8"},
             {"SAGEMAKER_TS_MAX_BATCH_DELAY", "5"},
             {"KILN_MODEL_SERVER_PYTHON", "/venv/bin/python"},
             {"KILN_MODEL_SERVER_FRAMEWORK", "PyTorch"},
             {"KILN_MODEL_SERVER_BACKEND", "torchscript"},
             {"KILN_MODEL_SERVER_QUEUE_SIZE", "7"},
             {"KILN_MODEL_SERVER_MEMORY_LIMIT_MB", "512"}};
  auto options = ParseModelServerOptions(env, Machine());
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->port, 9090);
  EXPECT_EQ(options->base_dir, "/srv/ml");
  EXPECT_EQ(options->model_dir(), "/srv/ml/model");
  EXPECT_TRUE(options->multi_model);
  EXPECT_EQ(options->workers, 3);
  EXPECT_EQ(options->timeout, std::chrono::seconds(20));
  EXPECT_EQ(options->max_payload_bytes, 100ull << 20);
  EXPECT_EQ(options->max_payload_mb(), 100u);
  EXPECT_EQ(options->batch_size, 8);
  EXPECT_EQ(options->batch_delay, std::chrono::milliseconds(5));
  EXPECT_EQ(options->python, "/venv/bin/python");
  EXPECT_EQ(options->framework, "pytorch");
  EXPECT_EQ(options->backend, BackendKind::kTorchScript);  // needs no worker script
  EXPECT_EQ(options->queue_size, 7u);
  EXPECT_EQ(options->memory_limit_bytes, 512ull << 20);
}

TEST(ModelServerOptionsTest, TimeoutSecondsWinsOverTimeout) {
  Env env = Minimal();
  env["SAGEMAKER_MODEL_SERVER_TIMEOUT"] = "20";
  env["SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS"] = "7";
  auto options = ParseModelServerOptions(env, Machine());
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->timeout, std::chrono::seconds(7));
}

TEST(ModelServerOptionsTest, WorkersDefaultToVisibleGpusThenOnePerModelInMultiModelMode) {
  Env env = Minimal();
  env["NVIDIA_VISIBLE_DEVICES"] = "0,1";
  EXPECT_EQ(ParseModelServerOptions(env, Machine())->workers, 2);
  env["NVIDIA_VISIBLE_DEVICES"] = "all";
  EXPECT_EQ(ParseModelServerOptions(env, Machine())->workers, 4);
  for (const char* none : {"void", "none", "", "NONE"}) {
    env["NVIDIA_VISIBLE_DEVICES"] = none;
    EXPECT_EQ(ParseModelServerOptions(env, Machine())->workers, 6) << none;
  }
  SystemInfo no_gpus = Machine();
  no_gpus.gpus_all = 0;
  env["NVIDIA_VISIBLE_DEVICES"] = "all";
  EXPECT_EQ(ParseModelServerOptions(env, no_gpus)->workers, 6);
  env["SAGEMAKER_MULTI_MODEL"] = "true";
  EXPECT_EQ(ParseModelServerOptions(env, Machine())->workers, 1);
  env["SAGEMAKER_MODEL_SERVER_WORKERS"] = "2";
  EXPECT_EQ(ParseModelServerOptions(env, Machine())->workers, 2);
}

TEST(ModelServerOptionsTest, MemoryLimitIsTheCgroupLimitWhenLower) {
  SystemInfo system = Machine();
  system.cgroup_memory_limit = 2ull << 30;
  EXPECT_EQ(ParseModelServerOptions(Minimal(), system)->memory_limit_bytes, 2ull << 30);
  system.mem_total = 0;
  system.cgroup_memory_limit.reset();
  EXPECT_EQ(ParseModelServerOptions(Minimal(), system)->memory_limit_bytes, UINT64_MAX);
}

TEST(ModelServerOptionsTest, EmptyValuesCountAsUnset) {
  Env env = Minimal();
  env["SAGEMAKER_BIND_TO_PORT"] = "";
  env["SAGEMAKER_MAX_PAYLOAD_IN_MB"] = " ";
  env["SAGEMAKER_BASE_DIR"] = "";
  auto options = ParseModelServerOptions(env, Machine());
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->port, 8080);
  EXPECT_EQ(options->max_payload_bytes, kDefaultMaxPayloadBytes);
  EXPECT_EQ(options->base_dir, "/opt/ml");
}

struct BadValue {
  const char* name;
  const char* value;
  const char* message_part;  // what the message must say beyond the variable's name
};

TEST(ModelServerOptionsTest, BadValuesNameTheVariableAndTheAcceptedRange) {
  const BadValue cases[] = {
      {"SAGEMAKER_BIND_TO_PORT", "0", "from 1 to 65535"},
      {"SAGEMAKER_BIND_TO_PORT", "80x", "from 1 to 65535"},
      {"SAGEMAKER_BIND_TO_PORT", "70000", "from 1 to 65535"},
      {"SAGEMAKER_MODEL_SERVER_WORKERS", "0", "from 1 to 1024"},
      {"SAGEMAKER_MODEL_SERVER_WORKERS", "-2", "from 1 to 1024"},
      {"SAGEMAKER_MODEL_SERVER_TIMEOUT", "1.5", "from 1 to 86400"},
      {"SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "0", "from 1 to 86400"},
      {"SAGEMAKER_MAX_PAYLOAD_IN_MB", "0", "from 1 to 1000"},
      {"SAGEMAKER_MAX_PAYLOAD_IN_MB", "2000", "from 1 to 1000"},
      {"SAGEMAKER_TS_BATCH_SIZE", "0", "from 1 to 1024"},
      {"SAGEMAKER_TS_MAX_BATCH_DELAY", "-1", "from 0 to 60000"},
      {"KILN_MODEL_SERVER_QUEUE_SIZE", "lots", "from 0 to 1000000"},
      {"KILN_MODEL_SERVER_MEMORY_LIMIT_MB", "0", "from 1 to"},
      {"SAGEMAKER_MULTI_MODEL", "maybe", "true or false"},
      {"KILN_MODEL_SERVER_BACKEND", "onnx", "python or torchscript"},
      {"KILN_MODEL_SERVER_FRAMEWORK", "jax", "pytorch, tensorflow"},
  };
  for (const BadValue& bad : cases) {
    Env env = Minimal();
    env[bad.name] = bad.value;
    auto options = ParseModelServerOptions(env, Machine());
    ASSERT_FALSE(options.ok()) << bad.name << "=" << bad.value;
    EXPECT_EQ(options.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(options.status().message().find(bad.name), std::string::npos) << options.status().message();
    EXPECT_NE(options.status().message().find(bad.message_part), std::string::npos) << options.status().message();
  }
}

TEST(ModelServerOptionsTest, ThePythonBackendNeedsTheWorkerScript) {
  auto options = ParseModelServerOptions({}, Machine());
  ASSERT_FALSE(options.ok());
  EXPECT_NE(options.status().message().find("KILN_MODEL_SERVER_WORKER"), std::string::npos);
  EXPECT_TRUE(ParseModelServerOptions({{"KILN_MODEL_SERVER_BACKEND", "torchscript"}}, Machine()).ok());
}

TEST(ModelServerOptionsTest, SystemFileParsers) {
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("1073741824\n"), 1073741824u);
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), std::nullopt);  // v1 "no limit"
  EXPECT_EQ(ParseCgroupMemoryLimit("garbage"), std::nullopt);
  EXPECT_EQ(ParseMemTotal("MemTotal:       16311340 kB\nMemFree:  100 kB\n"), 16311340ull * 1024);
  EXPECT_EQ(ParseMemTotal("MemFree: 1 kB\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2Path("0::/system.slice/kiln.service\n"), "/system.slice/kiln.service");
  EXPECT_EQ(ParseCgroupV2Path("12:memory:/docker/abc\n"), std::nullopt);
  EXPECT_EQ(CountVisibleGpus("GPU-1234,GPU-5678,GPU-9", 8), 3);
  EXPECT_EQ(CountVisibleGpus("all", 8), 8);
  EXPECT_EQ(CountVisibleGpus("void", 8), 0);
}

TEST(ModelServerOptionsTest, ProbeSystemSeesThisMachine) {
  SystemInfo system = ProbeSystem();
  EXPECT_GE(system.cpus, 1);
  EXPECT_GT(system.mem_total, 0u);
}

}  // namespace
}  // namespace kiln::modelserver
