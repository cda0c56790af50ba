#pragma once
// TorchScriptBackend: the InferenceBackend that serves a TorchScript model (torch.jit.save) in
// process through libtorch, with no Python on the request path (KILN_MODEL_SERVER_BACKEND=torchscript).
//
// - Start() loads <model_dir>/<model_file> (torch::jit::load, eval mode) on a thread of its own;
//   state() is kReady once loaded, kFailed (load_error() says why) when loading fails.
// - Invoke() queues the request (at most `queue_size` waiting; beyond that it answers 503 at once).
//   `workers` threads take the oldest and run forward() under inference mode. A request still
//   waiting or running `timeout` after it arrived answers 504 then (a running forward() cannot be
//   interrupted: it finishes and its result is dropped).
// - Codecs follow the SageMaker PyTorch inference toolkit's defaults (npy.h): Content-Type
//   application/json and text/csv decode to a float32 tensor, application/x-npy keeps its dtype;
//   the answer is encoded for the first type of Accept among application/json, text/csv and
//   application/x-npy (Accept missing or */*: `default_accept`; */* within a list:
//   application/json, as the Python worker does). Errors: an undecodable body 400, an
//   unsupported Content-Type or Accept 415, forward() failing 500 with libtorch's message, a
//   forward() that returns anything but one tensor 500.
//
// The libtorch half is a plugin, libkiln_torchscript.so, loaded on the first CreateTorchScriptBackend
// (torchscript/torchscript_plugin.h): the program itself never links libtorch. Built without
// libtorch (KILN_HAVE_LIBTORCH 0), or where the plugin cannot be loaded, CreateTorchScriptBackend
// answers Unimplemented with the advice to install libtorch-dev.
//
// Thread-safety: as InferenceBackend. Stop() may be called from an InferenceCallback; the backend
// must not be destroyed from one.

#include <chrono>
#include <memory>
#include <string>

#include "modelserver/backend.h"

namespace kiln::modelserver {

struct TorchScriptOptions {
  std::string model_dir{};              // /opt/ml/model, or /opt/ml/models/<name>/model
  std::string model_file = "model.pt";  // relative to model_dir
  int workers = 1;                      // threads running forward()
  size_t queue_size = 100;              // requests waiting beyond those running
  std::chrono::milliseconds timeout{60'000};
  std::string default_accept = "application/json";  // SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT
  // libtorch's intra-op threads (at::set_num_threads, process-wide): 1 lets `workers` requests run
  // side by side without oversubscribing the CPUs.
  int intra_op_threads = 1;
};

// True when this build has the TorchScript backend (its plugin may still fail to load where libtorch
// is absent: CreateTorchScriptBackend says so).
bool TorchScriptAvailable();

// Errors: Unimplemented when built without libtorch or when the plugin does not load (the reason
// for each place tried); InvalidArgument for bad options (workers < 1,
// queue_size 0, timeout not positive); NotFound when the model file does not exist. The model loads
// in Start().
Result<std::unique_ptr<InferenceBackend>> CreateTorchScriptBackend(TorchScriptOptions options);

}  // namespace kiln::modelserver
