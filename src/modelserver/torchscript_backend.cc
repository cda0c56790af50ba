#include "modelserver/torchscript_backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "base/log.h"
#include "modelserver/torchscript/torchscript_plugin.h"

// The program's half of the TorchScript backend: it checks the options and loads
// libkiln_torchscript.so, the libtorch half (torchscript/torchscript_plugin.h says why it is a
// plugin), on first use. No libtorch here.

namespace kiln::modelserver {

namespace {

#if KILN_HAVE_LIBTORCH

// "Application/JSON; charset=utf-8 " → "application/json".
std::string MediaType(std::string_view header) {
  std::string_view t = header.substr(0, header.find(';'));
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  std::string out(t);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

void HostLog(bool error, const std::string& msg, const std::vector<std::pair<std::string, std::string>>& f) {
  // FormatLogLine takes a braced list; the plugin logs at most three fields.
  auto field = [&](size_t i) { return i < f.size() ? LogField{f[i].first, f[i].second} : LogField{"", ""}; };
  std::string line;
  switch (f.size()) {
    case 0: line = FormatLogLine(msg, {}); break;
    case 1: line = FormatLogLine(msg, {field(0)}); break;
    case 2: line = FormatLogLine(msg, {field(0), field(1)}); break;
    default: line = FormatLogLine(msg, {field(0), field(1), field(2)}); break;
  }
  if (error) {
    spdlog::error("{}", line);
  } else {
    spdlog::info("{}", line);
  }
}

struct LoadedPlugin {
  const TorchScriptPluginApi* api = nullptr;
  Status error;
};

// Tries KILN_MODEL_SERVER_TORCHSCRIPT_PLUGIN when set; else libkiln_torchscript.so beside the
// program (where it is installed or mounted with it), then where this build wrote it.
LoadedPlugin LoadPlugin() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KILN_MODEL_SERVER_TORCHSCRIPT_PLUGIN"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  } else {
    std::error_code ec;
    std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) candidates.push_back((self.parent_path() / "libkiln_torchscript.so").string());
    candidates.emplace_back(KILN_TORCHSCRIPT_PLUGIN_PATH);
  }
  std::string tried;
  for (const std::string& path : candidates) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      tried += (tried.empty() ? "" : "; ") + path + ": no such file";
      continue;
    }
    // Never closed: backends, their threads and libtorch's own state live in it until exit.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + path + ": " + (e ? e : "dlopen failed");
      continue;
    }
    auto entry = reinterpret_cast<const TorchScriptPluginApi* (*)()>(dlsym(handle, "KilnTorchScriptPlugin"));
    const TorchScriptPluginApi* api = entry ? entry() : nullptr;
    if (api == nullptr || api->version != kTorchScriptPluginVersion) {
      tried += (tried.empty() ? "" : "; ") + path + ": not a TorchScript plugin of this kiln-model-server's version";
      continue;
    }
    return {api, Status::Ok()};
  }
  return {nullptr,
          Status::Unimplemented("the TorchScript backend's libtorch half (libkiln_torchscript.so) could not be "
                                "loaded (" +
                                tried +
                                "): install libtorch-dev where the model server runs, "
                                "or serve the model through the Python backend")};
}

#endif  // KILN_HAVE_LIBTORCH

}  // namespace

bool TorchScriptAvailable() {
#if KILN_HAVE_LIBTORCH
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<InferenceBackend>> CreateTorchScriptBackend(TorchScriptOptions options) {
#if !KILN_HAVE_LIBTORCH
  (void)options;
  return Status::Unimplemented(
      "this kiln-model-server was built without libtorch, so the TorchScript backend "
      "(KILN_MODEL_SERVER_BACKEND=torchscript) is not available: install libtorch-dev and rebuild, or serve the "
      "model through the Python backend");
#else
  if (options.workers < 1) return Status::InvalidArgument("the TorchScript backend needs at least one worker");
  if (options.queue_size == 0)
    return Status::InvalidArgument("the TorchScript backend needs a queue size of at least 1");
  if (options.timeout.count() <= 0) return Status::InvalidArgument("the TorchScript backend needs a positive timeout");
  if (options.model_file.empty()) options.model_file = "model.pt";
  std::filesystem::path path = std::filesystem::path(options.model_dir) / options.model_file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::NotFound("the TorchScript backend needs the model file " + path.string() +
                            ", which does not exist (save it with torch.jit.save, or serve the model through the "
                            "Python backend)");
  }
  std::string accept = MediaType(options.default_accept);
  if (accept != "application/json" && accept != "text/csv" && accept != "application/x-npy") {
    return Status::InvalidArgument("the default accept type " + options.default_accept +
                                   " is not one the TorchScript backend encodes (application/json, text/csv, "
                                   "application/x-npy)");
  }
  options.default_accept = accept;
  static const LoadedPlugin plugin = LoadPlugin();  // once per process; thread-safe
  if (!plugin.error.ok()) return plugin.error;
  InferenceBackend* backend = plugin.api->create(options, TorchScriptPluginHost{&HostLog});
  if (backend == nullptr) return Status::Internal("the TorchScript plugin could not create a backend");
  return std::unique_ptr<InferenceBackend>(backend);
#endif
}

}  // namespace kiln::modelserver
