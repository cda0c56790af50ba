#include "runtime/environments.h"

#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <set>
#include <utility>

#include "base/log.h"
#include "base/strings.h"

namespace kiln::runtime {
namespace {

// The SageMaker framework images ("Deep Learning Containers" and the first-party framework
// images) whose entry point runs the SageMaker training/serving toolkit in script mode. Names as
// published in the ECR repositories, e.g.
//   763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310
//   683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3
//   683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-xgboost:1.7-1
const char* const kFrameworkImagePatterns[] = {
    "*pytorch-training*",
    "*pytorch-inference*",
    "*pytorch-trcomp-training*",
    "*tensorflow-training*",
    "*tensorflow-inference*",
    "*huggingface-pytorch-training*",
    "*huggingface-pytorch-inference*",
    "*huggingface-tensorflow-training*",
    "*huggingface-tensorflow-inference*",
    "*sagemaker-scikit-learn*",
    "*sklearn*",
    "*xgboost*",
    "*mxnet-training*",
    "*mxnet-inference*",
    // Older first-party framework repositories.
    "*sagemaker-pytorch*",
    "*sagemaker-tensorflow*",
    "*sagemaker-mxnet*",
};

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// "acct.dkr.ecr.region.amazonaws.com/my-algo:latest" -> "my-algo": the repository's last path
// element without tag or digest, for the example pattern in the "no environment" message.
std::string RepositoryName(std::string_view uri) {
  size_t at = uri.find('@');
  if (at != std::string_view::npos) uri = uri.substr(0, at);
  size_t slash = uri.rfind('/');
  std::string_view last = slash == std::string_view::npos ? uri : uri.substr(slash + 1);
  size_t colon = last.find(':');
  if (colon != std::string_view::npos) last = last.substr(0, colon);
  return std::string(last);
}

Result<Environment> ParseEnvironment(const nlohmann::json& entry, size_t position,
                                     const std::string& default_interpreter, const std::vector<Environment>& builtins) {
  std::string where = "environments[" + std::to_string(position) + "]";
  if (!entry.is_object()) return Status::InvalidArgument(where + ": must be an object");
  Environment env;
  auto name = entry.find("name");
  if (name == entry.end() || !name->is_string() || name->get<std::string>().empty()) {
    return Status::InvalidArgument(where + ".name: must be a non-empty string");
  }
  env.name = name->get<std::string>();
  where += " (\"" + env.name + "\")";
  const Environment* builtin = nullptr;
  for (const Environment& b : builtins) {
    if (b.name == env.name) builtin = &b;
  }
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    if (it.key() != "name" && it.key() != "images" && it.key() != "interpreter" && it.key() != "env") {
      return Status::InvalidArgument(where + ": unknown field \"" + it.key() +
                                     "\" (expected name, images, interpreter, env)");
    }
  }
  if (auto images = entry.find("images"); images != entry.end()) {
    if (!images->is_array()) return Status::InvalidArgument(where + ".images: must be a list of globs");
    for (const auto& pattern : *images) {
      if (!pattern.is_string() || pattern.get<std::string>().empty()) {
        return Status::InvalidArgument(where + ".images: every pattern must be a non-empty string");
      }
      env.image_patterns.push_back(pattern.get<std::string>());
    }
  } else if (builtin != nullptr) {
    env.image_patterns = builtin->image_patterns;
  }
  if (env.image_patterns.empty()) {
    return Status::InvalidArgument(where + ".images: needs at least one image pattern, e.g. [\"*pytorch-training*\"]");
  }
  if (auto interpreter = entry.find("interpreter"); interpreter != entry.end()) {
    if (!interpreter->is_string()) return Status::InvalidArgument(where + ".interpreter: must be a string");
    env.interpreter = interpreter->get<std::string>();
  } else {
    env.interpreter = default_interpreter;
  }
  if (!StartsWith(env.interpreter, "/")) {
    return Status::InvalidArgument(where + ".interpreter: must be an absolute path, got \"" + env.interpreter + "\"");
  }
  if (!IsExecutableFile(env.interpreter)) {
    KLOG(warn, "environment interpreter does not exist or is not executable (yet)",
         {{"environment", env.name}, {"interpreter", env.interpreter}});
  }
  if (auto vars = entry.find("env"); vars != entry.end()) {
    if (!vars->is_object()) return Status::InvalidArgument(where + ".env: must be an object of strings");
    for (auto it = vars->begin(); it != vars->end(); ++it) {
      if (!it.value().is_string()) {
        return Status::InvalidArgument(where + ".env." + it.key() + ": must be a string");
      }
      if (it.key().empty() || it.key().find('=') != std::string::npos) {
        return Status::InvalidArgument(where + ".env: invalid variable name \"" + it.key() + "\"");
      }
      env.env[it.key()] = it.value().get<std::string>();
    }
  }
  return env;
}

}  // namespace

std::string FrameworkOfImage(std::string_view image_uri) {
  std::string repo = RepositoryName(image_uri);
  for (char& c : repo) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Hugging Face images name their framework too (huggingface-pytorch-inference): first.
  static constexpr std::pair<std::string_view, std::string_view> kFrameworks[] = {
      {"huggingface", "huggingface"}, {"pytorch", "pytorch"}, {"tensorflow", "tensorflow"}, {"scikit-learn", "sklearn"},
      {"sklearn", "sklearn"},         {"xgboost", "xgboost"}, {"mxnet", "mxnet"},
  };
  for (const auto& [needle, framework] : kFrameworks) {
    if (repo.find(needle) != std::string::npos) return std::string(framework);
  }
  return "";
}

EnvironmentTable EnvironmentTable::Default() {
  EnvironmentTable table;
  Environment system;
  system.name = std::string(kSystemEnvironmentName);
  for (const char* pattern : kFrameworkImagePatterns) system.image_patterns.emplace_back(pattern);
  system.interpreter = table.default_interpreter_;
  table.environments_.push_back(std::move(system));
  return table;
}

Result<EnvironmentTable> EnvironmentTable::FromJson(const nlohmann::json& section) {
  EnvironmentTable table;
  const nlohmann::json* list = nullptr;
  if (section.is_null()) {
    return Default();
  }
  if (section.is_array()) {
    list = &section;
  } else if (section.is_object()) {
    for (auto it = section.begin(); it != section.end(); ++it) {
      if (it.key() != "default_interpreter" && it.key() != "environments") {
        return Status::InvalidArgument("environments: unknown field \"" + it.key() +
                                       "\" (expected default_interpreter, environments)");
      }
    }
    if (auto d = section.find("default_interpreter"); d != section.end()) {
      if (!d->is_string() || !StartsWith(d->get<std::string>(), "/")) {
        return Status::InvalidArgument("environments.default_interpreter: must be an absolute path");
      }
      table.default_interpreter_ = d->get<std::string>();
    }
    if (auto e = section.find("environments"); e != section.end()) list = &*e;
  } else {
    return Status::InvalidArgument("environments: must be a list of {name, images, interpreter, env} entries");
  }
  if (list != nullptr && !list->is_array()) {
    return Status::InvalidArgument("environments: must be a list of {name, images, interpreter, env} entries");
  }

  // Built-ins follow the default interpreter the operator chose.
  EnvironmentTable defaults = Default();
  for (Environment& b : defaults.environments_) b.interpreter = table.default_interpreter_;

  std::set<std::string> names;
  if (list != nullptr) {
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(Environment env,
                       ParseEnvironment((*list)[i], i, table.default_interpreter_, defaults.environments_));
      if (!names.insert(env.name).second) {
        return Status::InvalidArgument("environments[" + std::to_string(i) + "]: duplicate name \"" + env.name + "\"");
      }
      table.environments_.push_back(std::move(env));
    }
  }
  for (Environment& b : defaults.environments_) {
    if (names.count(b.name) == 0) table.environments_.push_back(std::move(b));
  }
  return table;
}

Result<ImageResolution> EnvironmentTable::Resolve(std::string_view image_uri) const {
  ImageResolution how;
  if (StartsWith(image_uri, kLocalImagePrefix)) {
    std::string path(image_uri.substr(kLocalImagePrefix.size()));
    if (!StartsWith(path, "/")) {
      return Status::InvalidArgument("image \"" + std::string(image_uri) +
                                     "\": a local: image must name an absolute path, e.g. local:/opt/algo/train");
    }
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return Status::FailedPrecondition("image \"" + std::string(image_uri) + "\": " + path +
                                        " does not exist on this host");
    }
    if (!S_ISREG(st.st_mode)) {
      return Status::FailedPrecondition("image \"" + std::string(image_uri) + "\": " + path + " is not a regular file");
    }
    if (access(path.c_str(), X_OK) != 0) {
      return Status::FailedPrecondition("image \"" + std::string(image_uri) + "\": " + path +
                                        " is not executable (chmod +x " + path + ")");
    }
    how.kind = ImageResolution::Kind::kLocalExecutable;
    how.environment_name = "local";
    how.executable = std::move(path);
    return how;
  }

  std::string uri(image_uri);
  for (const std::string& pattern : container_patterns_) {
    if (fnmatch(pattern.c_str(), uri.c_str(), 0) != 0) continue;
    how.kind = ImageResolution::Kind::kContainerImage;
    how.environment_name = "container";
    how.image = uri;
    return how;
  }
  for (const Environment& env : environments_) {
    for (const std::string& pattern : env.image_patterns) {
      if (fnmatch(pattern.c_str(), uri.c_str(), 0) != 0) continue;
      if (!IsExecutableFile(env.interpreter)) {
        return Status::FailedPrecondition(
            "image \"" + uri + "\" maps to environment \"" + env.name + "\" (pattern \"" + pattern +
            "\"), whose interpreter " + env.interpreter +
            " does not exist or is not executable; install it or change that environment's "
            "\"interpreter\" in the Kiln config file");
      }
      how.kind = ImageResolution::Kind::kScriptMode;
      how.environment_name = env.name;
      how.interpreter = env.interpreter;
      how.env = env.env;
      return how;
    }
  }

  std::string repo = RepositoryName(uri);
  if (repo.empty()) repo = "my-image";
  nlohmann::json example = {{"name", repo}, {"images", {"*" + repo + "*"}}, {"interpreter", default_interpreter_}};
  return Status::FailedPrecondition(
      "the process runtime cannot run image \"" + uri +
      "\" without a container engine: no environment matches it. To run it in script mode with a "
      "local Python, add this entry to the \"environments\" list in the Kiln config file: " +
      example.dump() +
      " (with the interpreter of a virtualenv that has the image's packages); or, for an "
      "algorithm with its own entry point, use the image local:/path/to/train (Kiln runs "
      "`/path/to/train train` as docker would run `IMAGE train`).");
}

}  // namespace kiln::runtime
