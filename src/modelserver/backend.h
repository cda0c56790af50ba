#pragma once
// InferenceBackend: what the HTTP front end (model_server.h) needs from one loaded model. Two
// implementations: WorkerPool (Python workers running the user's handlers) and TorchScriptBackend
// (libtorch in process).
//
// Thread-safety: every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"

namespace kiln::modelserver {

// One invocation as the front end received it. Absent headers are empty strings.
struct InferenceRequest {
  std::string content_type;
  std::string accept;
  std::string custom_attributes;  // X-Amzn-SageMaker-Custom-Attributes
  std::string inference_id;       // X-Amzn-SageMaker-Inference-Id
  std::string target_model;       // X-Amzn-SageMaker-Target-Model (multi-model, for logs)
  std::string body;
  // When the request arrived (its budget, SAGEMAKER_MODEL_SERVER_TIMEOUT, counts from here).
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
};

struct InferenceResponse {
  int status = 200;
  std::string content_type;       // empty: none
  std::string custom_attributes;  // empty: none
  std::string body;
};

// Called exactly once per Invoke, from any thread (possibly inline, within Invoke, e.g. for a full
// queue). Must not block for long: the front end posts the answer to its event loop.
using InferenceCallback = std::function<void(InferenceResponse)>;

// The JSON error body every error answer carries: {"code": status, "type": type, "message": message}.
InferenceResponse ErrorResponse(int status, std::string_view type, std::string_view message);

enum class BackendState {
  kLoading,  // Start() called; not yet able to answer
  kReady,    // at least one worker (or the in-process model) answers
  kFailed,   // loading failed for good (load_error() says why); Invoke answers 503
  kStopped,
};

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;
  // Begins loading the model (asynchronously; state() follows). Once.
  virtual Status Start() = 0;
  // Waits until the model is ready (OK), loading failed (the load error: ResourceExhausted when the
  // model did not fit in memory → 507, else the handler's message) or `timeout` passed
  // (DeadlineExceeded).
  virtual Status WaitUntilLoaded(std::chrono::milliseconds timeout) = 0;
  // Answers `request` through `done`. Never blocks: a full queue answers 503 inline.
  virtual void Invoke(InferenceRequest request, InferenceCallback done) = 0;
  virtual BackendState state() const = 0;
  virtual Status load_error() const = 0;
  // Resident memory of the model (the workers' RSS, or the in-process model's estimate), bytes.
  virtual uint64_t MemoryBytes() const = 0;
  // Workers (or threads) that answer requests: GET /execution-parameters, GET /models/{name}.
  virtual int workers() const = 0;
  // Stops accepting requests, answers the queued ones 503, waits up to `grace` for those in flight,
  // then ends the workers. Idempotent; the destructor calls it.
  virtual void Stop(std::chrono::milliseconds grace) = 0;
};

}  // namespace kiln::modelserver
