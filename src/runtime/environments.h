#pragma once
// Environments: how the process runtime runs an image URI without a container engine
// (DESIGN.md §6).
//
// An EnvironmentTable maps image-URI glob patterns to a local interpreter (and variables) that
// runs Kiln's Python training toolkit in "script mode", exactly as the SageMaker framework images
// would. `local:/abs/path` images bypass the table: the host executable is run as the image's
// entrypoint would be (`/abs/path train`, `/abs/path serve`).
//
// Matching: patterns are fnmatch(3) globs over the whole URI ('*' also matches '/'), tried in
// table order; the first match wins. Operator entries (FromJson) come before the built-in ones,
// so an operator can send any image, including a framework image, to their own virtualenv.
//
//   ASSIGN_OR_RETURN(EnvironmentTable table, EnvironmentTable::FromJson(config["environments"]));
//   ASSIGN_OR_RETURN(ImageResolution how, table.Resolve(request.image));
//
// Thread-safety: a table is an immutable value after construction; const methods may be called
// from any thread.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::runtime {

inline constexpr std::string_view kSystemEnvironmentName = "system";
inline constexpr std::string_view kDefaultInterpreter = "/usr/bin/python3";
inline constexpr std::string_view kLocalImagePrefix = "local:";

struct Environment {
  std::string name;
  std::vector<std::string> image_patterns;  // fnmatch globs over the whole image URI
  std::string interpreter;                  // absolute path of a Python interpreter
  std::map<std::string, std::string> env;   // extra variables for instances of this environment
};

struct ImageResolution {
  enum class Kind {
    kScriptMode,       // run Kiln's Python training toolkit with `interpreter`
    kLocalExecutable,  // `local:/abs/path` image: run `/abs/path train` (or `serve`)
    kContainerImage,   // run the image itself through the container engine (SetContainerImages)
  };
  Kind kind = Kind::kScriptMode;
  std::string environment_name;  // the matching environment; "local" for kLocalExecutable
  std::string interpreter;       // kScriptMode only
  std::string executable;        // kLocalExecutable only: the absolute path
  std::string image;             // kContainerImage only: the image URI as requested
  std::map<std::string, std::string> env;
};

// The framework of a SageMaker framework image, from its repository name: "huggingface",
// "pytorch", "tensorflow", "sklearn", "xgboost", "mxnet", or "" for any other image. The model
// server's Python worker uses it for the framework's default model_fn/predict_fn and codecs, as the
// framework's own serving toolkit would (KILN_MODEL_SERVER_FRAMEWORK).
std::string FrameworkOfImage(std::string_view image_uri);

class EnvironmentTable {
 public:
  // The built-in table: one "system" environment whose patterns cover the SageMaker framework
  // images (PyTorch, TensorFlow, Hugging Face, scikit-learn, XGBoost, MXNet; training and
  // inference), all run with /usr/bin/python3.
  static EnvironmentTable Default();

  // The operator's `environments` config section on top of Default(). `section` is either a list
  //   [{"name": "torch", "images": ["*pytorch-training*"], "interpreter": "/opt/venvs/torch/bin/python",
  //     "env": {"OMP_NUM_THREADS": "4"}}, ...]
  // or an object {"default_interpreter": "/usr/bin/python3.11", "environments": [ ...list... ]}.
  // null is the defaults. Operator entries precede the built-in ones (earlier entries win); an
  // entry named like a built-in one replaces it, and may then omit "images" to keep the built-in
  // patterns. "interpreter" defaults to default_interpreter. InvalidArgument (saying which entry
  // and field) for a malformed section, a duplicate name, an empty pattern list or a relative
  // interpreter path. An interpreter that does not exist is only logged (a warning): the venv may
  // be created after the server starts; Resolve reports it if it is still missing then.
  static Result<EnvironmentTable> FromJson(const nlohmann::json& section);

  // How to run `image_uri` (see the file comment).
  //   (container images, see SetContainerImages, are matched after local: and before the table)
  //   local:/abs/path -> kLocalExecutable. InvalidArgument if the path is not absolute;
  //                      FailedPrecondition if it does not exist, is not a regular file or is not
  //                      executable (the message says which and how to fix it).
  //   matching URI    -> kScriptMode with the environment's interpreter and env.
  //                      FailedPrecondition if the interpreter is missing or not executable.
  //   anything else   -> FailedPrecondition whose message explains that the process runtime cannot
  //                      run that image without a container engine and shows the exact
  //                      `environments` entry to add to the Kiln config file, or `local:` use.
  Result<ImageResolution> Resolve(std::string_view image_uri) const;

  // With a container engine configured (config container_engine.images): URIs matching one of
  // these fnmatch globs ('*' also matches '/') resolve to kContainerImage ("environment_name"
  // "container"), before the environments are tried; `local:` URIs never do. Empty (the default):
  // no URI runs on an engine.
  void SetContainerImages(std::vector<std::string> patterns) { container_patterns_ = std::move(patterns); }
  const std::vector<std::string>& container_images() const { return container_patterns_; }

  const std::vector<Environment>& environments() const { return environments_; }
  const std::string& default_interpreter() const { return default_interpreter_; }

 private:
  std::vector<Environment> environments_;  // in match order
  std::vector<std::string> container_patterns_;
  std::string default_interpreter_ = std::string(kDefaultInterpreter);
};

}  // namespace kiln::runtime
