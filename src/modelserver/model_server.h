#pragma once
// ModelServer: the HTTP front end of `kiln-model-server` (README.md, "HTTP"): the routes, single-
// and multi-model mode, and the multi-model memory bound (507).
//
// Threads: one net::HttpServer. GET /ping, POST /invocations and POST /models/{name}/invoke with a
// Content-Length body within the payload limit are served on the event loops (net::AsyncService):
// the loop copies the body into an InferenceRequest, calls InferenceBackend::Invoke, and the
// backend's callback posts the answer back to that loop (one hop each way; answered inline when
// the callback runs on the loop itself). Everything else (chunked or 100-continue invocations, the
// /models management calls, which block on a load or an unload) runs on the server's blocking
// worker threads.
//
// Models: in single-model mode Start() creates the one model "model" (<base>/model) through the
// BackendFactory and starts loading it; /ping is 503 until it is ready. In multi-model mode
// (SAGEMAKER_MULTI_MODEL) no model exists at start; POST /models creates, starts and waits for
// one, DELETE /models/{name} stops it. Each model has its own backend (its own workers).
//
// Answers (every error body is ErrorResponse's {"code", "type", "message"}, application/json):
//   GET /ping                 200 {"status": "Healthy"}; 503 {"status": "Unhealthy", "message": why}
//                             while the single model loads, after it failed, or while stopping
//   POST /invocations         the backend's status, Content-Type, X-Amzn-SageMaker-Custom-Attributes
//                             and body; 503 before the model exists; 404 in multi-model mode
//   GET /execution-parameters {"MaxConcurrentTransforms": workers, "BatchStrategy": "MULTI_RECORD",
//                             "MaxPayloadInMB": payload limit in whole MiB}
//   POST /models              200 {"status": "Model \"n\" loaded"}; 400 bad JSON, missing fields, a bad
//                             name or a url that is not a directory; 409 loaded or being loaded; 507
//                             memory (90 % of the limit in use before, the limit passed after, or
//                             the backend's ResourceExhausted); 500 other load errors; 504 load timeout
//   GET /models               {"models": [{"modelName", "modelUrl"}...], "nextPageToken"}: loaded
//                             models in name order (byte-wise), `limit` 1..1000 (default 100); the
//                             token (absent on the last page) is the hex of the page's last name, so
//                             it stays valid while models come and go
//   GET /models/{name}        {"modelName", "modelUrl", "workers", "memoryBytes"}; 404 not loaded
//                             (a model still loading counts as not loaded here and in the list)
//   DELETE /models/{name}     200 {"status": "Model \"n\" unloaded"} after Stop; 404; 409 while loading
//   POST /models/{name}/invoke as /invocations; 404 not loaded, 503 still loading
//   anything else             404; a known path with another method 405 with Allow; bodies over the
//                             payload limit 413 (and the connection closes)
// The multi-model paths answer 404 in single-model mode. {name} is one percent-decoded path
// segment (DecodeModelName); a bad one answers 400.
//
// Shutdown: Stop() makes /ping 503, stops every backend with the grace given (requests in flight
// finish, queued ones answer 503: their answers still go out, the loops run), then stops the HTTP
// server. Backends are always stopped before the loops go, so no callback can post to a loop that
// no longer exists.
//
//   ModelServerParams params;
//   params.options = *ParseModelServerOptions(EnvironmentMap(), ProbeSystem());
//   params.backend_factory = [](const ModelSpec& spec) { return MakeWorkerPool(spec); };
//   ASSIGN_OR_RETURN(auto server, ModelServer::Create(std::move(params)));
//   RETURN_IF_ERROR(server->Start());
//   ... server->Stop(std::chrono::seconds(60));
//
// Thread-safety: Start and Stop from one thread (main); the accessors from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "modelserver/backend.h"
#include "modelserver/options.h"

namespace kiln::modelserver {

// What the BackendFactory needs to build one model's backend.
struct ModelSpec {
  std::string name;  // "model" in single-model mode; the model_name of POST /models
  std::string dir;   // <base>/model, or the url of POST /models
  int workers = 1;
  size_t queue_size = 100;
  std::chrono::milliseconds timeout{60'000};
  int batch_size = 1;
  std::chrono::milliseconds batch_delay{100};
};

// Builds a backend, not yet started (ModelServer calls Start()). Called from main's thread in
// single-model mode and from a blocking HTTP worker thread in multi-model mode.
using BackendFactory = std::function<Result<std::unique_ptr<InferenceBackend>>(const ModelSpec&)>;

struct ModelServerParams {
  ModelServerOptions options;
  BackendFactory backend_factory;
  // "host:port" to listen on; empty: "0.0.0.0:<options.port>". Tests use "127.0.0.1:0".
  std::string listen;
  // Event loops; 0: min(cores, 4). More loops than the cores the workers leave idle only add
  // context switches.
  size_t event_loops = 0;
  // Longest POST /models waits for its model to load before it answers 504 (the load is stopped).
  std::chrono::milliseconds load_timeout{std::chrono::minutes(10)};
  // The server process's own resident memory, counted with the models' against the multi-model
  // memory bound. Null: this process's RSS (/proc/self/statm).
  std::function<uint64_t()> server_memory_bytes;
};

// The route table (built once; MatchRoute has its own tests).
enum class Route {
  kNone,  // no such path: 404
  kPing,
  kInvocations,
  kExecutionParameters,
  kModels,       // /models: GET lists, POST loads
  kModel,        // /models/{name}: GET describes, DELETE unloads
  kModelInvoke,  // /models/{name}/invoke
};

struct RouteMatch {
  Route route = Route::kNone;
  bool method_allowed = false;
  std::string_view allow;     // the methods the path takes (the Allow header of a 405)
  std::string_view raw_name;  // {name} as sent, still percent-encoded
};

// Matches a request's method and raw path (without the query). Multi-model paths match in either
// mode; the server answers them 404 in single-model mode.
RouteMatch MatchRoute(std::string_view method, std::string_view raw_path);

// Percent-decodes a {name} path segment and checks it is a model name: not empty, not "." or
// "..", no '/', no control characters, at most 1,024 bytes. InvalidArgument saying which.
Result<std::string> DecodeModelName(std::string_view raw_name);

class ModelServer {
 public:
  // Binds the listening socket (so port() is valid) but serves nothing before Start().
  // Errors: InvalidArgument (no backend_factory), those of net::HttpServer::Create (address in use).
  static Result<std::unique_ptr<ModelServer>> Create(ModelServerParams params);
  // Stop(0) when still running.
  ~ModelServer();
  ModelServer(const ModelServer&) = delete;
  ModelServer& operator=(const ModelServer&) = delete;

  // Single-model mode: creates the model's backend and starts loading it (state() follows), then
  // starts serving. Errors: the factory's or the backend's Start() error (nothing is served then).
  Status Start();
  uint16_t port() const;

  // Single-model mode: the model's state (kLoading before Start) and its load error.
  BackendState model_state() const;
  Status model_load_error() const;

  // See the class comment. Idempotent.
  void Stop(std::chrono::milliseconds grace);

 private:
  struct Impl;
  explicit ModelServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::modelserver
