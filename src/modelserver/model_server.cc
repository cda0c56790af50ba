#include "modelserver/model_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/encoding.h"
#include "base/fs.h"
#include "base/io.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/query_string.h"
#include "base/strings.h"
#include "net/event_loop.h"
#include "net/http_server.h"

namespace kiln::modelserver {
namespace {

using Clock = std::chrono::steady_clock;

// POST /models bodies are two short strings; anything larger is not a load request.
constexpr size_t kMaxManagementBody = 64 * 1024;
constexpr size_t kMaxModelNameBytes = 1024;
constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
// A load is refused once the models and the server would hold this share of the memory limit.
constexpr double kLoadMemoryShare = 0.9;

constexpr std::string_view kHealthy = R"({"status": "Healthy"})";

// A whole answer of the blocking path or of a management call.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string custom_attributes;
  std::string body;
  std::string_view allow;  // 405: the Allow header
  bool close = false;      // the request body was left unread
};

Reply FromInference(InferenceResponse response) {
  Reply reply;
  reply.status = response.status;
  reply.content_type = std::move(response.content_type);
  reply.custom_attributes = std::move(response.custom_attributes);
  reply.body = std::move(response.body);
  return reply;
}

Reply Error(int status, std::string_view type, std::string_view message) {
  return FromInference(ErrorResponse(status, type, message));
}

Reply Json(int status, const nlohmann::json& body) {
  Reply reply;
  reply.status = status;
  reply.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return reply;
}

HeaderMap ReplyHeaders(const Reply& reply) {
  HeaderMap headers;
  if (!reply.content_type.empty()) headers.emplace("Content-Type", reply.content_type);
  if (!reply.custom_attributes.empty()) headers.emplace("X-Amzn-SageMaker-Custom-Attributes", reply.custom_attributes);
  if (!reply.allow.empty()) headers.emplace("Allow", std::string(reply.allow));
  return headers;
}

Reply NotFoundRoute(std::string_view method, std::string_view path) {
  return Error(404, "NotFound", "No route for " + std::string(method) + " " + std::string(path) + ".");
}

Reply MethodNotAllowed(const RouteMatch& match, std::string_view method) {
  Reply reply = Error(405, "MethodNotAllowed",
                      "Method " + std::string(method) + " is not allowed here; use " + std::string(match.allow) + ".");
  reply.allow = match.allow;
  return reply;
}

Reply PayloadTooLarge(uint64_t limit) {
  Reply reply = Error(413, "PayloadTooLarge",
                      "The request body is larger than the limit of " + std::to_string(limit) +
                          " bytes; send less per request or raise SAGEMAKER_MAX_PAYLOAD_IN_MB.");
  reply.close = true;
  return reply;
}

// The status a failed model load answers: 507 for memory, 504 for a load past its time, else 500.
Reply LoadFailure(std::string_view name, const Status& error) {
  std::string message = "Model \"" + std::string(name) + "\" could not be loaded: " + error.message();
  switch (error.code()) {
    case StatusCode::kResourceExhausted: return Error(507, "InsufficientMemory", message);
    case StatusCode::kDeadlineExceeded: return Error(504, "LoadTimeout", message);
    default: return Error(500, "ModelLoadError", message);
  }
}

InferenceRequest MakeRequest(const net::HttpRequest& head, std::string body, Clock::time_point arrived) {
  InferenceRequest request;
  if (const std::string* v = head.Header("Content-Type")) request.content_type = *v;
  if (const std::string* v = head.Header("Accept")) request.accept = *v;
  if (const std::string* v = head.Header("X-Amzn-SageMaker-Custom-Attributes")) request.custom_attributes = *v;
  if (const std::string* v = head.Header("X-Amzn-SageMaker-Inference-Id")) request.inference_id = *v;
  if (const std::string* v = head.Header("X-Amzn-SageMaker-Target-Model")) request.target_model = *v;
  request.body = std::move(body);
  request.arrived = arrived;
  return request;
}

void RespondInference(net::AsyncExchange& exchange, InferenceResponse response) {
  HeaderMap headers;
  if (!response.content_type.empty()) headers.emplace("Content-Type", std::move(response.content_type));
  if (!response.custom_attributes.empty()) {
    headers.emplace("X-Amzn-SageMaker-Custom-Attributes", std::move(response.custom_attributes));
  }
  exchange.Respond(response.status, headers, std::move(response.body));
}

void RespondReply(net::AsyncExchange& exchange, Reply reply) {
  if (reply.close) exchange.CloseAfterResponse();
  exchange.Respond(reply.status, ReplyHeaders(reply), std::move(reply.body));
}

uint64_t OwnResidentBytes() {
  auto statm = ReadFile("/proc/self/statm");
  if (!statm.ok()) return 0;
  std::vector<std::string_view> fields = Split(Trim(*statm), ' ');
  if (fields.size() < 2) return 0;
  return ParseUint64(fields[1]).value_or(0) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

RouteMatch MatchRoute(std::string_view method, std::string_view raw_path) {
  RouteMatch match;
  auto set = [&](Route route, std::string_view allow, bool allowed) {
    match.route = route;
    match.allow = allow;
    match.method_allowed = allowed;
    return match;
  };
  if (raw_path == "/ping") return set(Route::kPing, "GET", method == "GET");
  if (raw_path == "/invocations") return set(Route::kInvocations, "POST", method == "POST");
  if (raw_path == "/execution-parameters") return set(Route::kExecutionParameters, "GET", method == "GET");
  if (raw_path == "/models") return set(Route::kModels, "GET, POST", method == "GET" || method == "POST");
  constexpr std::string_view kPrefix = "/models/";
  if (!StartsWith(raw_path, kPrefix)) return match;
  std::string_view rest = raw_path.substr(kPrefix.size());
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    match.raw_name = rest;
    return set(Route::kModel, "GET, DELETE", method == "GET" || method == "DELETE");
  }
  if (rest.substr(slash) != "/invoke") return match;
  match.raw_name = rest.substr(0, slash);
  return set(Route::kModelInvoke, "POST", method == "POST");
}

Result<std::string> DecodeModelName(std::string_view raw_name) {
  std::optional<std::string> name = UriDecode(raw_name);
  if (!name) return Status::InvalidArgument("The model name is not correctly percent-encoded.");
  if (name->empty()) return Status::InvalidArgument("The model name is empty.");
  if (name->size() > kMaxModelNameBytes) {
    return Status::InvalidArgument("The model name is longer than " + std::to_string(kMaxModelNameBytes) + " bytes.");
  }
  if (*name == "." || *name == "..") return Status::InvalidArgument("The model name cannot be \".\" or \"..\".");
  for (unsigned char c : *name) {
    if (c == '/') return Status::InvalidArgument("The model name cannot contain '/'.");
    if (c < 0x20 || c == 0x7f) return Status::InvalidArgument("The model name cannot contain control characters.");
  }
  return std::move(*name);
}

// One model of multi-model mode. Fields are guarded by Impl::models_mu_.
struct ModelEntry {
  std::string url;
  std::shared_ptr<InferenceBackend> backend;  // null until the factory made it
  bool ready = false;                         // loaded: listed, invoked, unloadable
};

struct ModelServer::Impl final : public net::AsyncService {
  ModelServerParams params;
  const ModelServerOptions& options = params.options;
  std::unique_ptr<net::HttpServer> http;

  // Single-model mode: the model, set once in Start() (before serving), read by every thread.
  std::shared_ptr<InferenceBackend> single_owner;
  std::atomic<InferenceBackend*> single{nullptr};

  mutable SharedMutex models_mu;
  std::map<std::string, std::shared_ptr<ModelEntry>> models GUARDED_BY(models_mu);

  std::atomic<bool> stopping{false};
  bool started = false;
  bool stopped = false;

  explicit Impl(ModelServerParams p) : params(std::move(p)) {}

  // ---- net::AsyncService: the invoke path on the event loops ----

  bool Claims(const net::HttpRequest& head) const override {
    std::string_view path = head.raw_path;
    if (head.method == "GET") return path == "/ping";
    if (head.method != "POST") return false;
    if (path == "/invocations") return true;
    return options.multi_model && StartsWith(path, "/models/") && EndsWith(path, "/invoke");
  }

  size_t max_body_bytes() const override { return options.max_payload_bytes; }

  void Serve(net::AsyncExchange& exchange) override {
    const net::HttpRequest& head = exchange.request();
    RouteMatch match = MatchRoute(head.method, head.raw_path);
    if (match.route == Route::kPing && match.method_allowed) {
      RespondReply(exchange, Ping());
      return;
    }
    if (exchange.body().size() > options.max_payload_bytes) {
      RespondReply(exchange, PayloadTooLarge(options.max_payload_bytes));
      return;
    }
    Reply error;
    std::shared_ptr<InferenceBackend> backend = FindInvokeTarget(head, match, &error);
    if (backend == nullptr) {
      RespondReply(exchange, std::move(error));
      return;
    }
    Clock::time_point arrived{std::chrono::nanoseconds(exchange.start_steady_ns())};
    InferenceRequest request = MakeRequest(head, std::string(exchange.body()), arrived);
    net::AsyncExchange* ex = &exchange;
    backend->Invoke(std::move(request), [ex](InferenceResponse response) {
      net::EventLoop& loop = ex->loop();
      if (loop.InLoopThread()) {
        RespondInference(*ex, std::move(response));
        return;
      }
      loop.Post([ex, response = std::move(response)]() mutable { RespondInference(*ex, std::move(response)); });
    });
  }

  // ---- the blocking Handler: everything the loops do not claim ----

  void Handle(net::HttpRequest& request, net::ResponseWriter& out) {
    RouteMatch match = MatchRoute(request.method, request.raw_path);
    Reply reply = Dispatch(request, match);
    if (reply.close) out.CloseAfterResponse();
    (void)out.Send(reply.status, ReplyHeaders(reply), reply.body);
  }

  Reply Dispatch(net::HttpRequest& request, const RouteMatch& match) {
    bool model_route =
        match.route == Route::kModels || match.route == Route::kModel || match.route == Route::kModelInvoke;
    if (match.route == Route::kNone || (model_route && !options.multi_model)) {
      return NotFoundRoute(request.method, request.raw_path);
    }
    if (!match.method_allowed) return MethodNotAllowed(match, request.method);
    switch (match.route) {
      case Route::kPing: return Ping();
      case Route::kExecutionParameters: return ExecutionParameters();
      case Route::kInvocations:
      case Route::kModelInvoke: return InvokeBlocking(request, match);
      case Route::kModels:
        if (request.method == "GET") return ListModels(request.raw_query);
        return LoadModel(request);
      case Route::kModel: {
        auto name = DecodeModelName(match.raw_name);
        if (!name.ok()) return Error(400, "BadRequest", name.status().message());
        return request.method == "GET" ? DescribeModel(*name) : UnloadModel(*name);
      }
      case Route::kNone: break;
    }
    return NotFoundRoute(request.method, request.raw_path);
  }

  Reply InvokeBlocking(net::HttpRequest& request, const RouteMatch& match) {
    Clock::time_point arrived = Clock::now();
    std::optional<uint64_t> declared = request.body->size_hint();
    if (declared && *declared > options.max_payload_bytes) return PayloadTooLarge(options.max_payload_bytes);
    Reply error;
    std::shared_ptr<InferenceBackend> backend = FindInvokeTarget(request, match, &error);
    if (backend == nullptr) {
      error.close = true;  // the body was not read
      return error;
    }
    auto body = ReadAll(*request.body, options.max_payload_bytes);
    if (!body.ok()) {
      if (body.status().code() == StatusCode::kResourceExhausted) return PayloadTooLarge(options.max_payload_bytes);
      Reply gone = Error(400, "BadRequest", "The request body could not be read: " + body.status().message());
      gone.close = true;
      return gone;
    }
    auto answer = std::make_shared<std::promise<InferenceResponse>>();
    std::future<InferenceResponse> future = answer->get_future();
    backend->Invoke(MakeRequest(request, std::move(body).value(), arrived),
                    [answer](InferenceResponse response) { answer->set_value(std::move(response)); });
    return FromInference(future.get());
  }

  // The backend an invocation goes to, or null with the error answer in *error.
  std::shared_ptr<InferenceBackend> FindInvokeTarget(const net::HttpRequest& head, const RouteMatch& match,
                                                     Reply* error) {
    bool model_route = match.route == Route::kModelInvoke;
    if (match.route == Route::kNone || (model_route && !options.multi_model)) {
      *error = NotFoundRoute(head.method, head.raw_path);
      return nullptr;
    }
    if (!match.method_allowed) {
      *error = MethodNotAllowed(match, head.method);
      return nullptr;
    }
    if (match.route != Route::kInvocations && match.route != Route::kModelInvoke) {
      // GET /ping and the like never reach here from Serve; the rest is not an invocation.
      *error = NotFoundRoute(head.method, head.raw_path);
      return nullptr;
    }
    if (!options.multi_model) {
      InferenceBackend* backend = single.load(std::memory_order_acquire);
      if (backend == nullptr) {
        *error = Error(503, "ServiceUnavailable", "The model is not loaded yet.");
        return nullptr;
      }
      // Aliasing constructor: no reference count traffic for the one model that lives as long as
      // the server.
      return std::shared_ptr<InferenceBackend>(std::shared_ptr<InferenceBackend>(), backend);
    }
    if (match.route == Route::kInvocations) {
      *error = Error(404, "NotFound",
                     "This server runs in multi-model mode: invoke a loaded model with POST /models/<name>/invoke.");
      return nullptr;
    }
    auto name = DecodeModelName(match.raw_name);
    if (!name.ok()) {
      *error = Error(400, "BadRequest", name.status().message());
      return nullptr;
    }
    ReaderMutexLock lock(models_mu);
    auto it = models.find(*name);
    if (it == models.end()) {
      *error = Error(404, "ModelNotFound", "Model \"" + *name + "\" is not loaded; load it with POST /models.");
      return nullptr;
    }
    if (!it->second->ready) {
      *error = Error(503, "ModelLoading", "Model \"" + *name + "\" is still loading; retry shortly.");
      return nullptr;
    }
    return it->second->backend;
  }

  // ---- routes answered on either path ----

  Reply Ping() const {
    if (stopping.load(std::memory_order_relaxed)) return Unhealthy("the server is stopping");
    if (options.multi_model) return Healthy();
    InferenceBackend* backend = single.load(std::memory_order_acquire);
    if (backend == nullptr) return Unhealthy("the model is not loaded yet");
    switch (backend->state()) {
      case BackendState::kReady: return Healthy();
      case BackendState::kLoading: return Unhealthy("the model is loading");
      case BackendState::kFailed: return Unhealthy("the model failed to load: " + backend->load_error().message());
      case BackendState::kStopped: return Unhealthy("the model is stopped");
    }
    return Unhealthy("unknown state");
  }

  static Reply Healthy() {
    Reply reply;
    reply.body = std::string(kHealthy);
    return reply;
  }

  static Reply Unhealthy(std::string_view message) {
    return Json(503, {{"status", "Unhealthy"}, {"message", std::string(message)}});
  }

  Reply ExecutionParameters() const {
    int workers = options.workers;
    if (InferenceBackend* backend = single.load(std::memory_order_acquire)) workers = backend->workers();
    return Json(200, {{"MaxConcurrentTransforms", workers},
                      {"BatchStrategy", "MULTI_RECORD"},
                      {"MaxPayloadInMB", options.max_payload_mb()}});
  }

  // ---- multi-model management (blocking worker threads) ----

  ModelSpec SpecFor(std::string name, std::string dir) const {
    ModelSpec spec;
    spec.name = std::move(name);
    spec.dir = std::move(dir);
    spec.workers = options.workers;
    spec.queue_size = options.queue_size;
    spec.timeout = options.timeout;
    spec.batch_size = options.batch_size;
    spec.batch_delay = options.batch_delay;
    return spec;
  }

  uint64_t ServerMemory() const {
    return params.server_memory_bytes ? params.server_memory_bytes() : OwnResidentBytes();
  }

  // The server's memory plus every model's (loading ones included). MemoryBytes may read /proc
  // files, so it runs outside the lock on a snapshot.
  uint64_t MemoryInUse() const {
    std::vector<std::shared_ptr<InferenceBackend>> backends;
    {
      ReaderMutexLock lock(models_mu);
      for (const auto& [name, entry] : models) {
        if (entry->backend) backends.push_back(entry->backend);
      }
    }
    uint64_t total = ServerMemory();
    for (const auto& backend : backends) total += backend->MemoryBytes();
    return total;
  }

  void Forget(const std::string& name, const std::shared_ptr<ModelEntry>& entry) {
    WriterMutexLock lock(models_mu);
    auto it = models.find(name);
    if (it != models.end() && it->second == entry) models.erase(it);
  }

  Reply LoadModel(net::HttpRequest& request) {
    auto text = ReadAll(*request.body, kMaxManagementBody);
    if (!text.ok()) {
      Reply reply = text.status().code() == StatusCode::kResourceExhausted
                        ? Error(413, "PayloadTooLarge", "A load request body is at most 64 KiB.")
                        : Error(400, "BadRequest", "The request body could not be read: " + text.status().message());
      reply.close = true;
      return reply;
    }
    auto doc = ParseJsonBounded(*text, {.max_depth = 8});
    if (!doc.ok() || !doc->is_object()) {
      return Error(400, "BadRequest",
                   R"(The body must be a JSON object {"model_name": "<name>", "url": "<model directory>"}.)");
    }
    auto name_it = doc->find("model_name");
    auto url_it = doc->find("url");
    if (name_it == doc->end() || !name_it->is_string() || url_it == doc->end() || !url_it->is_string()) {
      return Error(400, "BadRequest", R"(The body needs the strings "model_name" and "url".)");
    }
    std::string name = name_it->get<std::string>();
    std::string url = url_it->get<std::string>();
    // A body name is not percent-encoded; encode it so DecodeModelName checks the same rules.
    auto checked = DecodeModelName(UriEncode(name));
    if (!checked.ok()) return Error(400, "BadRequest", checked.status().message());
    if (url.empty() || !IsDirectory(url)) {
      return Error(400, "BadRequest", "The url \"" + url + "\" is not a directory holding the model.");
    }

    uint64_t limit = options.memory_limit_bytes;
    uint64_t in_use = MemoryInUse();
    auto entry = std::make_shared<ModelEntry>();
    entry->url = url;
    {
      WriterMutexLock lock(models_mu);
      if (stopping.load()) return Error(503, "ServiceUnavailable", "The server is stopping.");
      auto it = models.find(name);
      if (it != models.end()) {
        return Error(409, "Conflict",
                     "Model \"" + name + (it->second->ready ? "\" is already loaded." : "\" is being loaded."));
      }
      if (static_cast<double>(in_use) >= kLoadMemoryShare * static_cast<double>(limit)) {
        return Error(507, "InsufficientMemory",
                     "Loading model \"" + name + "\" would pass 90 % of the memory limit (" + std::to_string(in_use) +
                         " of " + std::to_string(limit) + " bytes in use); unload a model first.");
      }
      models.emplace(name, entry);
    }

    auto made = params.backend_factory(SpecFor(name, url));
    if (!made.ok()) {
      Forget(name, entry);
      return LoadFailure(name, made.status());
    }
    std::shared_ptr<InferenceBackend> backend = std::move(made).value();
    {
      // Stop() sets `stopping` before it collects the backends under this lock: either it sees
      // this one and stops it (the wait below then ends), or this sees `stopping`.
      WriterMutexLock lock(models_mu);
      if (!stopping.load()) entry->backend = backend;
    }
    if (entry->backend == nullptr) {
      Forget(name, entry);
      return Error(503, "ServiceUnavailable", "The server is stopping.");
    }
    Status loaded = backend->Start();
    if (loaded.ok()) loaded = backend->WaitUntilLoaded(params.load_timeout);
    if (loaded.ok() && stopping.load()) loaded = Status::Unavailable("the server is stopping");
    if (loaded.ok()) {
      uint64_t after = MemoryInUse();
      if (after > limit) {
        loaded = Status::ResourceExhausted("with it the models and the server hold " + std::to_string(after) +
                                           " bytes, over the memory limit of " + std::to_string(limit));
      }
    }
    if (!loaded.ok()) {
      KLOG(warn, "model load failed", {{"model", name}, {"error", loaded.ToString()}});
      Forget(name, entry);
      backend->Stop(std::chrono::milliseconds(0));
      return LoadFailure(name, loaded);
    }
    {
      WriterMutexLock lock(models_mu);
      entry->ready = true;
    }
    KLOG(info, "model loaded", {{"model", name}, {"url", url}, {"workers", std::to_string(backend->workers())}});
    return Json(200, {{"status", "Model \"" + name + "\" loaded"}});
  }

  Reply ListModels(std::string_view raw_query) const {
    auto params_or = ParseQueryString(raw_query, {.plus_is_space = true, .bad_escape = QueryBadEscape::kRefuse});
    if (!params_or.ok()) return Error(400, "BadRequest", params_or.status().message());
    int limit = kDefaultPageSize;
    if (const std::string* text = FindQueryParam(*params_or, "limit")) {
      std::optional<uint64_t> n = ParseUint64(*text);
      if (!n || *n < 1 || *n > static_cast<uint64_t>(kMaxPageSize)) {
        return Error(400, "BadRequest", "limit must be a whole number from 1 to 1000.");
      }
      limit = static_cast<int>(*n);
    }
    // The token is the hex of the last name of the previous page: pages follow name order, so a
    // token stays valid while models come and go.
    std::string after;
    bool has_token = false;
    if (const std::string* token = FindQueryParam(*params_or, "next_page_token")) {
      std::optional<std::string> decoded = HexDecode(*token);
      if (!decoded || decoded->empty()) {
        return Error(400, "BadRequest", "next_page_token is not a token this server returned.");
      }
      after = std::move(*decoded);
      has_token = true;
    }
    nlohmann::json list = nlohmann::json::array();
    std::string last;
    bool more = false;
    {
      ReaderMutexLock lock(models_mu);
      auto it = has_token ? models.upper_bound(after) : models.begin();
      for (; it != models.end(); ++it) {
        if (!it->second->ready) continue;
        if (static_cast<int>(list.size()) == limit) {
          more = true;
          break;
        }
        list.push_back({{"modelName", it->first}, {"modelUrl", it->second->url}});
        last = it->first;
      }
    }
    nlohmann::json body = {{"models", std::move(list)}};
    if (more) body["nextPageToken"] = HexEncode(last);
    return Json(200, body);
  }

  Reply DescribeModel(const std::string& name) const {
    std::string url;
    std::shared_ptr<InferenceBackend> backend;
    {
      ReaderMutexLock lock(models_mu);
      auto it = models.find(name);
      if (it == models.end() || !it->second->ready) {
        return Error(404, "ModelNotFound", "Model \"" + name + "\" is not loaded.");
      }
      url = it->second->url;
      backend = it->second->backend;
    }
    return Json(200, {{"modelName", name},
                      {"modelUrl", url},
                      {"workers", backend->workers()},
                      {"memoryBytes", backend->MemoryBytes()}});
  }

  Reply UnloadModel(const std::string& name) {
    std::shared_ptr<InferenceBackend> backend;
    {
      WriterMutexLock lock(models_mu);
      auto it = models.find(name);
      if (it == models.end()) return Error(404, "ModelNotFound", "Model \"" + name + "\" is not loaded.");
      if (!it->second->ready) {
        return Error(409, "Conflict", "Model \"" + name + "\" is being loaded; unload it once the load answers.");
      }
      backend = it->second->backend;
      models.erase(it);
    }
    backend->Stop(options.timeout);
    KLOG(info, "model unloaded", {{"model", name}});
    return Json(200, {{"status", "Model \"" + name + "\" unloaded"}});
  }
};

Result<std::unique_ptr<ModelServer>> ModelServer::Create(ModelServerParams params) {
  if (!params.backend_factory) return Status::InvalidArgument("ModelServer needs a backend factory");
  auto impl = std::make_unique<Impl>(std::move(params));
  net::HttpServerOptions http;
  http.listen = impl->params.listen.empty() ? "0.0.0.0:" + std::to_string(impl->options.port) : impl->params.listen;
  size_t cores = std::max(1u, std::thread::hardware_concurrency());
  http.event_loops = impl->params.event_loops > 0 ? impl->params.event_loops : std::min<size_t>(cores, 4);
  // Every request comes from the platform's router on one address: no per-address cap below the
  // total one.
  http.max_connections_per_address = http.max_connections;
  // Chunked and 100-continue invocations and the management calls; each holds a thread while it
  // waits for its model.
  http.worker_threads = 64;
  Impl* raw = impl.get();
  ASSIGN_OR_RETURN(
      impl->http,
      net::HttpServer::Create(
          http, [raw](net::HttpRequest& request, net::ResponseWriter& out) { raw->Handle(request, out); }, raw));
  return std::unique_ptr<ModelServer>(new ModelServer(std::move(impl)));
}

ModelServer::ModelServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ModelServer::~ModelServer() { Stop(std::chrono::milliseconds(0)); }

Status ModelServer::Start() {
  Impl& impl = *impl_;
  if (impl.started) return Status::FailedPrecondition("ModelServer::Start called twice");
  impl.started = true;
  if (!impl.options.multi_model) {
    ASSIGN_OR_RETURN(std::unique_ptr<InferenceBackend> backend,
                     impl.params.backend_factory(impl.SpecFor("model", impl.options.model_dir())));
    RETURN_IF_ERROR(backend->Start());
    impl.single_owner = std::move(backend);
    impl.single.store(impl.single_owner.get(), std::memory_order_release);
  }
  return impl.http->Start();
}

uint16_t ModelServer::port() const { return impl_->http->port(); }

BackendState ModelServer::model_state() const {
  InferenceBackend* backend = impl_->single.load(std::memory_order_acquire);
  return backend == nullptr ? BackendState::kLoading : backend->state();
}

Status ModelServer::model_load_error() const {
  InferenceBackend* backend = impl_->single.load(std::memory_order_acquire);
  return backend == nullptr ? Status::Ok() : backend->load_error();
}

void ModelServer::Stop(std::chrono::milliseconds grace) {
  Impl& impl = *impl_;
  if (impl.stopped) return;
  impl.stopped = true;
  impl.stopping.store(true);
  // Backends first, in parallel (each waits up to `grace` for its requests in flight): their
  // answers still reach clients because the loops run until the HTTP server stops below.
  std::vector<std::shared_ptr<InferenceBackend>> backends;
  if (impl.single_owner) backends.push_back(impl.single_owner);
  {
    WriterMutexLock lock(impl.models_mu);
    for (auto& [name, entry] : impl.models) {
      if (entry->backend) backends.push_back(entry->backend);
    }
  }
  std::vector<std::thread> stoppers;
  for (auto& backend : backends) {
    stoppers.emplace_back([backend, grace] { backend->Stop(grace); });
  }
  for (std::thread& t : stoppers) t.join();
  // Answers posted by the last callbacks are written within the HTTP server's own grace.
  impl.http->Stop(1);
}

}  // namespace kiln::modelserver
