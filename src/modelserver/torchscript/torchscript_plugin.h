#pragma once
// The boundary between kiln-model-server and libkiln_torchscript.so, the TorchScript backend's
// libtorch half.
//
// Why a plugin: Debian's libtorch_cpu pulls ~250 shared libraries; linked into the program it costs
// every model server ~0.6 s of start-up and ~160 MB of resident memory (its operator registry is
// built at load), including the Python-backend ones that never run libtorch, and makes the program
// unable to start where libtorch is absent (a container it is mounted into). Loaded with dlopen
// only when a model selects the TorchScript backend, it costs nothing otherwise.
//
// The plugin is built from the same sources by the same compiler in the same build, so C++ types
// cross the boundary as they are (InferenceBackend, TorchScriptOptions, std::function); it keeps
// its symbols hidden (its own copies of npy.cc, backend.cc, base/status.cc, base/json_parse.cc)
// but for KilnTorchScriptPlugin. It is never unloaded.

#include <string>
#include <utility>
#include <vector>

#include "modelserver/backend.h"
#include "modelserver/torchscript_backend.h"

namespace kiln::modelserver {

// Bumped whenever anything below or in the types it uses changes shape.
inline constexpr int kTorchScriptPluginVersion = 1;

struct TorchScriptPluginHost {
  // The program's structured log (KLOG), which the plugin has no copy of.
  void (*log)(bool error, const std::string& msg, const std::vector<std::pair<std::string, std::string>>& fields);
};

struct TorchScriptPluginApi {
  int version;  // kTorchScriptPluginVersion of the plugin's build
  // A new backend (not started) for options already checked by CreateTorchScriptBackend; the
  // caller owns it (delete through InferenceBackend's virtual destructor). Never throws.
  InferenceBackend* (*create)(const TorchScriptOptions& options, const TorchScriptPluginHost& host);
};

}  // namespace kiln::modelserver

// The plugin's one exported symbol.
extern "C" const kiln::modelserver::TorchScriptPluginApi* KilnTorchScriptPlugin();
