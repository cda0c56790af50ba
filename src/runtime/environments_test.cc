#include "runtime/environments.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace kiln::runtime {
namespace {

using ::testing::HasSubstr;

std::string MakeFile(const std::string& name, mode_t mode) {
  std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "kiln_env_test";
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path) << "#!/bin/sh\nexit 0\n";
  chmod(path.c_str(), mode);
  return path;
}

TEST(EnvironmentTableTest, DefaultCoversFrameworkImages) {
  EnvironmentTable table = EnvironmentTable::Default();
  for (const char* uri : {
           "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310",
           "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.3.0-gpu-py311-cu121-ubuntu20.04-sagemaker",
           "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.1.0-cpu-py310",
           "763104351884.dkr.ecr.us-east-1.amazonaws.com/tensorflow-training:2.14.1-gpu-py310",
           "763104351884.dkr.ecr.us-east-1.amazonaws.com/"
           "huggingface-pytorch-training:2.1.0-transformers4.36.0-gpu-py310-cu121-ubuntu20.04",
           "763104351884.dkr.ecr.us-east-1.amazonaws.com/"
           "huggingface-pytorch-inference:2.1.0-transformers4.37.0-cpu-py310-ubuntu22.04",
           "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3",
           "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-xgboost:1.7-1",
           "763104351884.dkr.ecr.us-east-1.amazonaws.com/mxnet-training:1.9.0-cpu-py38",
       }) {
    Result<ImageResolution> how = table.Resolve(uri);
    ASSERT_TRUE(how.ok()) << uri << ": " << how.status().ToString();
    EXPECT_EQ(how->kind, ImageResolution::Kind::kScriptMode) << uri;
    EXPECT_EQ(how->environment_name, "system") << uri;
    EXPECT_EQ(how->interpreter, "/usr/bin/python3") << uri;
  }
  EXPECT_EQ(table.default_interpreter(), "/usr/bin/python3");
}

TEST(EnvironmentTableTest, UnknownImageExplainsHowToMapIt) {
  EnvironmentTable table = EnvironmentTable::Default();
  Result<ImageResolution> how = table.Resolve("123456789012.dkr.ecr.us-east-1.amazonaws.com/my-algo:latest");
  ASSERT_FALSE(how.ok());
  EXPECT_EQ(how.status().code(), StatusCode::kFailedPrecondition);
  const std::string& msg = how.status().message();
  EXPECT_THAT(msg, HasSubstr("cannot run image \"123456789012.dkr.ecr.us-east-1.amazonaws.com/my-algo:latest\""));
  EXPECT_THAT(msg, HasSubstr("without a container engine"));
  EXPECT_THAT(msg, HasSubstr("\"environments\" list in the Kiln config file"));
  EXPECT_THAT(msg, HasSubstr(R"({"images":["*my-algo*"],"interpreter":"/usr/bin/python3","name":"my-algo"})"));
  EXPECT_THAT(msg, HasSubstr("local:/path/to/train"));
  // The snippet in the message is valid config: pasted in, the image resolves.
  auto entry = nlohmann::json::parse(R"({"images":["*my-algo*"],"interpreter":"/usr/bin/python3","name":"my-algo"})");
  Result<EnvironmentTable> fixed = EnvironmentTable::FromJson(nlohmann::json::array({entry}));
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->Resolve("123456789012.dkr.ecr.us-east-1.amazonaws.com/my-algo:latest").ok());
}

TEST(EnvironmentTableTest, LocalImages) {
  EnvironmentTable table = EnvironmentTable::Default();
  std::string exe = MakeFile("train-exe", 0755);
  Result<ImageResolution> how = table.Resolve("local:" + exe);
  ASSERT_TRUE(how.ok()) << how.status().ToString();
  EXPECT_EQ(how->kind, ImageResolution::Kind::kLocalExecutable);
  EXPECT_EQ(how->executable, exe);
  EXPECT_EQ(how->environment_name, "local");

  Result<ImageResolution> relative = table.Resolve("local:bin/train");
  ASSERT_FALSE(relative.ok());
  EXPECT_EQ(relative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(relative.status().message(), HasSubstr("absolute path"));

  std::string plain = MakeFile("train-plain", 0644);
  Result<ImageResolution> not_exec = table.Resolve("local:" + plain);
  ASSERT_FALSE(not_exec.ok());
  EXPECT_THAT(not_exec.status().message(), HasSubstr("is not executable"));

  Result<ImageResolution> missing = table.Resolve("local:/nonexistent/kiln/train");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("does not exist"));

  Result<ImageResolution> dir = table.Resolve("local:/tmp");
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));
}

TEST(EnvironmentTableTest, OperatorEntriesWin) {
  std::string python = MakeFile("venv-python", 0755);
  auto section = nlohmann::json::parse(R"([
    {"name": "torch", "images": ["*pytorch-training*"], "interpreter": ")" +
                                       python + R"(",
     "env": {"OMP_NUM_THREADS": "4"}},
    {"name": "mine", "images": ["registry.local/team/*"]}
  ])");
  Result<EnvironmentTable> table = EnvironmentTable::FromJson(section);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  ASSERT_EQ(table->environments().size(), 3u);
  EXPECT_EQ(table->environments()[2].name, "system");

  Result<ImageResolution> torch =
      table->Resolve("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310");
  ASSERT_TRUE(torch.ok()) << torch.status().ToString();
  EXPECT_EQ(torch->environment_name, "torch");
  EXPECT_EQ(torch->interpreter, python);
  EXPECT_EQ(torch->env.at("OMP_NUM_THREADS"), "4");

  Result<ImageResolution> mine = table->Resolve("registry.local/team/algo:3");
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->environment_name, "mine");
  EXPECT_EQ(mine->interpreter, "/usr/bin/python3");  // default interpreter

  // The built-in patterns still apply to everything else.
  Result<ImageResolution> sklearn =
      table->Resolve("683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3");
  ASSERT_TRUE(sklearn.ok());
  EXPECT_EQ(sklearn->environment_name, "system");
}

TEST(EnvironmentTableTest, ReplacingSystemAndDefaultInterpreter) {
  std::string python = MakeFile("sys-python", 0755);
  auto section = nlohmann::json{{"default_interpreter", python}, {"environments", nlohmann::json::array()}};
  Result<EnvironmentTable> table = EnvironmentTable::FromJson(section);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  Result<ImageResolution> how = table->Resolve("x/pytorch-training:1");
  ASSERT_TRUE(how.ok());
  EXPECT_EQ(how->interpreter, python);

  // An entry named "system" replaces the built-in one and keeps its patterns.
  auto replace = nlohmann::json::parse(R"([{"name": "system", "interpreter": ")" + python + R"("}])");
  Result<EnvironmentTable> replaced = EnvironmentTable::FromJson(replace);
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  ASSERT_EQ(replaced->environments().size(), 1u);
  Result<ImageResolution> xgb =
      replaced->Resolve("683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-xgboost:1.7-1");
  ASSERT_TRUE(xgb.ok());
  EXPECT_EQ(xgb->interpreter, python);

  EXPECT_TRUE(EnvironmentTable::FromJson(nullptr).ok());
}

TEST(EnvironmentTableTest, ValidatesConfig) {
  auto bad = [](const char* text) {
    Result<EnvironmentTable> t = EnvironmentTable::FromJson(nlohmann::json::parse(text));
    EXPECT_FALSE(t.ok()) << text;
    return t.ok() ? std::string() : t.status().message();
  };
  EXPECT_THAT(bad(R"([{"name": "a", "images": ["*x*"], "interpreter": "python3"}])"), HasSubstr("absolute path"));
  EXPECT_THAT(bad(R"([{"images": ["*x*"]}])"), HasSubstr("name"));
  EXPECT_THAT(bad(R"([{"name": "a", "images": []}])"), HasSubstr("at least one image pattern"));
  EXPECT_THAT(bad(R"([{"name": "a", "images": ["*x*"]}, {"name": "a", "images": ["*y*"]}])"), HasSubstr("duplicate"));
  EXPECT_THAT(bad(R"([{"name": "a", "images": ["*x*"], "env": {"A": 1}}])"), HasSubstr("env.A"));
  EXPECT_THAT(bad(R"([{"name": "a", "image": ["*x*"]}])"), HasSubstr("unknown field \"image\""));
  EXPECT_THAT(bad(R"("torch")"), HasSubstr("must be a list"));
}

TEST(EnvironmentTableTest, MissingInterpreterIsAClearError) {
  auto section = nlohmann::json::parse(
      R"([{"name": "torch", "images": ["*pytorch-training*"], "interpreter": "/opt/venvs/none/bin/python"}])");
  Result<EnvironmentTable> table = EnvironmentTable::FromJson(section);
  ASSERT_TRUE(table.ok());  // only a warning at load time
  Result<ImageResolution> how = table->Resolve("x.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310");
  ASSERT_FALSE(how.ok());
  EXPECT_EQ(how.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(how.status().message(), HasSubstr("environment \"torch\""));
  EXPECT_THAT(how.status().message(), HasSubstr("/opt/venvs/none/bin/python does not exist"));
}

TEST(FrameworkOfImageTest, NamesTheFrameworkOfSageMakerImages) {
  EXPECT_EQ(FrameworkOfImage("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.1.0-cpu-py310"),
            "pytorch");
  EXPECT_EQ(FrameworkOfImage("763104351884.dkr.ecr.us-east-1.amazonaws.com/"
                             "huggingface-pytorch-inference:2.1.0-transformers4.37.0-cpu-py310-ubuntu22.04"),
            "huggingface");
  EXPECT_EQ(FrameworkOfImage("763104351884.dkr.ecr.us-west-2.amazonaws.com/tensorflow-inference:2.13-cpu"),
            "tensorflow");
  EXPECT_EQ(FrameworkOfImage("683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"),
            "sklearn");
  EXPECT_EQ(FrameworkOfImage("683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-xgboost:1.7-1"), "xgboost");
  EXPECT_EQ(FrameworkOfImage("763104351884.dkr.ecr.us-east-1.amazonaws.com/mxnet-inference:1.9.0-cpu-py38"), "mxnet");
  // Only the repository counts: a registry host or tag that names a framework does not.
  EXPECT_EQ(FrameworkOfImage("pytorch.example.com/my-algo:xgboost"), "");
  EXPECT_EQ(FrameworkOfImage("acct.dkr.ecr.us-east-1.amazonaws.com/my-algo@sha256:abc"), "");
}

}  // namespace
}  // namespace kiln::runtime
