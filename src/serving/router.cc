#include "serving/router.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "serving/pipeline.h"

namespace kiln::serving {

namespace {

constexpr std::string_view kOctetStream = "application/octet-stream";
// Longest container body quoted in a ModelError (runtime-api.md §5.2).
constexpr size_t kMaxOriginalMessage = 2048;

// ---- The thread's PRNG: xoshiro256** (fast, good enough for load spreading; not crypto).

struct Xoshiro {
  uint64_t s[4];
  static uint64_t SplitMix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  void Seed(uint64_t seed) {
    for (uint64_t& word : s) word = SplitMix(seed);
  }
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t Next() {
    uint64_t result = Rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = Rotl(s[3], 45);
    return result;
  }
};

Xoshiro& ThreadRng() {
  thread_local Xoshiro rng = [] {
    Xoshiro r;
    std::random_device device;
    r.Seed((static_cast<uint64_t>(device()) << 32) ^ device());
    return r;
  }();
  return rng;
}

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t EpochSecond() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- Header validation (runtime-api.md §3.1). Messages follow AWS's validation wording.

std::string ConstraintError(std::string_view value, std::string_view member, std::string_view constraint) {
  std::string m = "1 validation error detected: Value '";
  m.append(value.substr(0, 256)).append("' at '").append(member).append("' failed to satisfy constraint: ");
  m.append(constraint);
  return m;
}

bool AllAscii(std::string_view v) {
  for (unsigned char c : v) {
    if (c > 0x7e || (c < 0x20 && c != '\t')) return false;
  }
  return true;
}

bool AllPrintable(std::string_view v) {
  for (unsigned char c : v) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// ^[a-zA-Z0-9](-*[a-zA-Z0-9])*$ (endpoint, variant and container names)
bool IsResourceName(std::string_view v) {
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (v.empty() || !alnum(v.front()) || !alnum(v.back())) return false;
  for (char c : v) {
    if (!alnum(c) && c != '-') return false;
  }
  return true;
}

// Checks one header; returns an empty string when valid, else the ValidationError message.
std::string CheckLength(const std::string* v, std::string_view member, size_t min, size_t max) {
  if (v == nullptr) return {};
  if (v->size() > max) {
    return ConstraintError(*v, member, "Member must have length less than or equal to " + std::to_string(max));
  }
  if (v->size() < min) {
    return ConstraintError(*v, member, "Member must have length greater than or equal to " + std::to_string(min));
  }
  return {};
}

// Cuts `text` to at most `max` bytes without splitting a UTF-8 sequence.
std::string_view Utf8Prefix(std::string_view text, size_t max) {
  if (text.size() <= max) return text;
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

std::string_view ContainerName(const InstanceTarget& instance) {
  return instance.container_hostname.empty() ? std::string_view("primary") : instance.container_hostname;
}

// Keeps instance->outstanding right on every path out of a call.
class OutstandingGuard {
 public:
  explicit OutstandingGuard(const InstanceTarget* instance) : instance_(instance) {
    instance_->outstanding.fetch_add(1, std::memory_order_relaxed);
  }
  ~OutstandingGuard() { instance_->outstanding.fetch_sub(1, std::memory_order_relaxed); }
  OutstandingGuard(const OutstandingGuard&) = delete;
  OutstandingGuard& operator=(const OutstandingGuard&) = delete;

 private:
  const InstanceTarget* instance_;
};

// The ValidationError message when `route` (null: not found) cannot take a synchronous
// invocation; empty when it can.
std::string CheckEndpoint(const EndpointRoute* route, const InvokeRequest& request) {
  if (route == nullptr) {
    return "Endpoint " + std::string(request.endpoint_name) + " of account " + std::string(request.account_id) +
           " not found.";
  }
  const std::string& status = route->status;
  if (status != "InService" && status != "Updating" && status != "SystemUpdating" && status != "RollingBack") {
    return "Endpoint " + route->name + " is not in service.";
  }
  if (route->async) {
    return "Endpoint " + route->name + " is configured for asynchronous inference; call InvokeEndpointAsync instead.";
  }
  return {};
}

// The invocation headers Kiln reads (runtime-api.md §3.1); null when absent.
struct InvokeHeaders {
  const std::string* content_type;
  const std::string* accept;
  const std::string* custom_attributes;
  const std::string* target_model;
  const std::string* target_variant;
  const std::string* target_container;
  const std::string* inference_id;
  const std::string* explanations;
  const std::string* component;
  const std::string* session_id;
};

InvokeHeaders ReadInvokeHeaders(const HeaderMap& in) {
  return InvokeHeaders{FindHeader(in, "Content-Type"),
                       FindHeader(in, "Accept"),
                       FindHeader(in, "X-Amzn-SageMaker-Custom-Attributes"),
                       FindHeader(in, "X-Amzn-SageMaker-Target-Model"),
                       FindHeader(in, "X-Amzn-SageMaker-Target-Variant"),
                       FindHeader(in, "X-Amzn-SageMaker-Target-Container-Hostname"),
                       FindHeader(in, "X-Amzn-SageMaker-Inference-Id"),
                       FindHeader(in, "X-Amzn-SageMaker-Enable-Explanations"),
                       FindHeader(in, "X-Amzn-SageMaker-Inference-Component"),
                       FindHeader(in, "X-Amzn-SageMaker-Session-Id")};
}

// The ValidationError message for the first header that breaks its constraint or asks for what
// `route` does not offer; empty when all are acceptable.
std::string CheckInvokeHeaders(const InvokeHeaders& h, const EndpointRoute& route) {
  for (std::string m :
       {CheckLength(h.content_type, "contentType", 0, 1024), CheckLength(h.accept, "accept", 0, 1024),
        CheckLength(h.custom_attributes, "customAttributes", 0, 1024),
        CheckLength(h.target_model, "targetModel", 1, 1024), CheckLength(h.target_variant, "targetVariant", 0, 63),
        CheckLength(h.target_container, "targetContainerHostname", 0, 63),
        CheckLength(h.inference_id, "inferenceId", 1, 64), CheckLength(h.explanations, "enableExplanations", 1, 64),
        CheckLength(h.component, "inferenceComponentName", 0, 63), CheckLength(h.session_id, "sessionId", 1, 256)}) {
    if (!m.empty()) return m;
  }
  if ((h.content_type && !AllAscii(*h.content_type)) || (h.accept && !AllAscii(*h.accept))) {
    return h.content_type && !AllAscii(*h.content_type)
               ? ConstraintError(*h.content_type, "contentType",
                                 "Member must satisfy regular expression pattern: \\p{ASCII}*")
               : ConstraintError(*h.accept, "accept", "Member must satisfy regular expression pattern: \\p{ASCII}*");
  }
  if (h.custom_attributes && !AllAscii(*h.custom_attributes)) {
    return ConstraintError(*h.custom_attributes, "customAttributes",
                           "Member must satisfy regular expression pattern: \\p{ASCII}*");
  }
  if (h.target_variant && !h.target_variant->empty() && !IsResourceName(*h.target_variant)) {
    return ConstraintError(*h.target_variant, "targetVariant",
                           "Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9])*");
  }
  if (h.target_model && !AllPrintable(*h.target_model)) {
    return ConstraintError(*h.target_model, "targetModel",
                           "Member must satisfy regular expression pattern: \\A\\S[\\p{Print}]*\\z");
  }
  if (h.inference_id && (!AllPrintable(*h.inference_id) || h.inference_id->front() == ' ')) {
    return ConstraintError(*h.inference_id, "inferenceId",
                           "Member must satisfy regular expression pattern: \\A\\S[\\p{Print}]*\\z");
  }
  if (h.session_id && !AllPrintable(*h.session_id)) {
    return ConstraintError(
        *h.session_id, "sessionId",
        "Member must satisfy regular expression pattern: ^(NEW_SESSION)$|^[a-zA-Z0-9](-*[a-zA-Z0-9])*$");
  }
  if (h.component != nullptr) {
    return "Inference components are not supported by this Kiln version (X-Amzn-SageMaker-Inference-Component).";
  }
  if (h.target_model != nullptr && !route.multi_model) {
    return "Endpoint " + route.name + " is not a multi-model endpoint; remove TargetModel (" +
           "X-Amzn-SageMaker-Target-Model) or invoke a multi-model endpoint.";
  }
  if (h.target_container != nullptr && !route.direct) {
    return "Endpoint " + route.name +
           " is not a multi-container endpoint with Direct invocation; remove TargetContainerHostname.";
  }
  return {};
}

// Only serving-contract §5.3's headers go to the container (the rest, signature included, stays
// here). The map is rebuilt per request; its nodes are the only allocations besides the response.
HeaderMap ForwardHeaders(const InvokeHeaders& h, std::string_view request_id) {
  HeaderMap forward;
  forward.emplace("Content-Type", h.content_type != nullptr ? *h.content_type : std::string(kOctetStream));
  if (h.accept != nullptr) forward.emplace("Accept", *h.accept);
  if (h.custom_attributes != nullptr) forward.emplace("X-Amzn-SageMaker-Custom-Attributes", *h.custom_attributes);
  if (h.target_model != nullptr) forward.emplace("X-Amzn-SageMaker-Target-Model", *h.target_model);
  if (h.inference_id != nullptr) forward.emplace("X-Amzn-SageMaker-Inference-Id", *h.inference_id);
  if (h.session_id != nullptr) forward.emplace("X-Amzn-SageMaker-Session-Id", *h.session_id);
  forward.emplace("X-Amzn-RequestId", std::string(request_id));
  return forward;
}

// 503 for a variant with no instance to take the call; `why` (may be empty) follows "the request".
aws::AwsError NoHealthyInstance(const EndpointRoute& route, const VariantRoute& variant, const std::string& why) {
  return aws::AwsError("ServiceUnavailable",
                       "Endpoint " + route.name + " has no healthy instance in production variant " + variant.name +
                           " to serve the request" + why + ". Try again later.",
                       503);
}

// The ModelError for a call that got no answer (`error`), or whose answer was too large.
aws::AwsError ModelCallError(const Status& error, const InstanceTarget& instance, const VariantRoute& variant,
                             const EndpointRoute& route, std::string_view container) {
  aws::AwsError model_error("ModelError", "", 424);
  if (instance.failure.cancelled()) {
    // Declared failed while the request was in flight (the call was cut, or the connection
    // died with the instance): the container may have processed it, so it is not resent.
    std::string text = "The instance " + instance.instance_id + " serving variant " + variant.name +
                       " failed while the request was in flight: " + instance.failure.reason();
    std::string what(Utf8Prefix(text, kMaxOriginalMessage));
    model_error.message = "Received server error (0) from " + std::string(container) + " with message \"" + what +
                          "\". See the endpoint's log group for more information.";
    model_error.With("OriginalMessage", what);
  } else if (error.code() == StatusCode::kDeadlineExceeded) {
    model_error.message = "Your invocation timed out while waiting for a response from container " +
                          std::string(container) +
                          ". Review the latency metrics for each container, resolve the issue, and try again.";
  } else {
    std::string_view reason = error.message();
    if (error.code() == StatusCode::kResourceExhausted) {
      reason = "Response body exceeded the maximum response size of 6291456 bytes";
    }
    model_error.message =
        "Received server error (0) from " + std::string(container) + " with message \"" + std::string(reason) + "\".";
    model_error.With("OriginalMessage", std::string(Utf8Prefix(reason, kMaxOriginalMessage)));
  }
  model_error.fields.insert(model_error.fields.begin(), {"LogStreamArn", route.log_group_arn});
  model_error.fields.insert(model_error.fields.begin(), {"ErrorCode", "SERVER_ERROR_FROM_MODEL"});
  model_error.WithInt("OriginalStatusCode", 0);
  return model_error;
}

// The ModelError for a container's non-2xx answer.
aws::AwsError ModelStatusError(const net::ClientResponse& answer, std::string_view container,
                               const EndpointRoute& route) {
  bool client_error = answer.status >= 400 && answer.status < 500;
  std::string_view original = Utf8Prefix(answer.body, kMaxOriginalMessage);
  aws::AwsError model_error("ModelError", "", 424);
  model_error.message = std::string(client_error ? "Received client error (" : "Received server error (") +
                        std::to_string(answer.status) + ") from " + std::string(container) + " with message \"" +
                        std::string(original) + "\". See the endpoint's log group for more information.";
  model_error.With("ErrorCode", client_error ? "CLIENT_ERROR_FROM_MODEL" : "SERVER_ERROR_FROM_MODEL")
      .With("LogStreamArn", route.log_group_arn)
      .With("OriginalMessage", std::string(original))
      .WithInt("OriginalStatusCode", answer.status);
  return model_error;
}

// The container's 2xx answer, passed on with the headers the runtime API returns (its body moved,
// not copied).
aws::WireResponse SuccessAnswer(net::ClientResponse answer, const VariantRoute& variant, std::string_view request_id) {
  aws::WireResponse out;
  out.status = 200;
  const std::string* answer_type = FindHeader(answer.headers, "Content-Type");
  out.headers.emplace("Content-Type", answer_type != nullptr ? *answer_type : std::string(kOctetStream));
  for (std::string_view name : {"X-Amzn-SageMaker-Custom-Attributes", "X-Amzn-SageMaker-New-Session-Id",
                                "X-Amzn-SageMaker-Closed-Session-Id"}) {
    if (const std::string* value = FindHeader(answer.headers, name)) out.headers.emplace(std::string(name), *value);
  }
  out.headers.emplace("x-Amzn-Invoked-Production-Variant", variant.name);
  out.headers.emplace("x-amzn-RequestId", std::string(request_id));
  out.body = std::move(answer.body);
  return out;
}

aws::WireResponse ErrorAnswer(const aws::AwsError& error, std::string_view request_id) {
  return aws::SerializeError(aws::Protocol::kRestJson, error, request_id);
}

void Send(net::ResponseWriter& response, const aws::WireResponse& wire) {
  (void)response.Send(wire.status, wire.headers, wire.body);
}

}  // namespace

uint64_t ThreadRandom() { return ThreadRng().Next(); }

double ThreadUniform() { return static_cast<double>(ThreadRng().Next() >> 11) * 0x1.0p-53; }

void SeedThreadRandomForTest(uint64_t seed) { ThreadRng().Seed(seed); }

Router::Router(RouterOptions options, const RoutingTable* routes, net::HttpClient* client, InvocationMetrics* metrics)
    : options_(std::move(options)), routes_(routes), client_(client), metrics_(metrics) {}

const VariantRoute* Router::PickVariant(const EndpointRoute& route, std::string_view target_variant, double uniform) {
  return PickVariant(route.variants, target_variant, uniform);
}

const VariantRoute* Router::PickFleetVariant(const EndpointRoute& route, std::string_view target_variant,
                                             double fleet_uniform, double uniform) {
  if (route.new_variants.empty() || route.new_fleet_fraction <= 0)
    return PickVariant(route.variants, target_variant, uniform);
  const bool to_new = fleet_uniform < route.new_fleet_fraction;
  const std::vector<VariantRoute>& picked = to_new ? route.new_variants : route.variants;
  const VariantRoute* variant = PickVariant(picked, target_variant, uniform);
  if (variant == nullptr && !target_variant.empty()) {
    variant = PickVariant(to_new ? route.variants : route.new_variants, target_variant, uniform);
  }
  return variant;
}

const VariantRoute* Router::PickVariant(const std::vector<VariantRoute>& variants, std::string_view target_variant,
                                        double uniform) {
  if (!target_variant.empty()) {
    for (const VariantRoute& variant : variants) {
      if (variant.name == target_variant) return &variant;
    }
    return nullptr;
  }
  double total = 0;
  for (const VariantRoute& variant : variants) {
    if (variant.weight > 0) total += variant.weight;
  }
  if (total <= 0) return nullptr;
  double point = uniform * total;
  const VariantRoute* last = nullptr;
  for (const VariantRoute& variant : variants) {
    if (variant.weight <= 0) continue;
    last = &variant;
    if (point < variant.weight) return &variant;
    point -= variant.weight;
  }
  return last;  // rounding at the top end
}

const InstanceTarget* Router::PickInstance(const VariantRoute& variant, const InstanceTarget* exclude) {
  const auto& instances = variant.instances;
  size_t n = instances.size();
  if (n == 0 || (n == 1 && instances[0].get() == exclude)) return nullptr;
  if (variant.strategy == RoutingStrategy::kRandom) {
    size_t eligible = exclude != nullptr ? n - 1 : n;
    size_t pick = ThreadRandom() % eligible;
    for (const auto& instance : instances) {
      if (instance.get() == exclude) continue;
      if (pick-- == 0) return instance.get();
    }
    return nullptr;
  }
  // Least outstanding requests; among equals, each is equally likely (reservoir sampling, so
  // one pass and no allocation).
  const InstanceTarget* best = nullptr;
  int64_t best_outstanding = 0;
  uint64_t ties = 0;
  for (const auto& instance : instances) {
    if (instance.get() == exclude) continue;
    int64_t outstanding = instance->outstanding.load(std::memory_order_relaxed);
    if (best == nullptr || outstanding < best_outstanding) {
      best = instance.get();
      best_outstanding = outstanding;
      ties = 1;
    } else if (outstanding == best_outstanding) {
      ++ties;
      if (ThreadRandom() % ties == 0) best = instance.get();
    }
  }
  return best;
}

aws::WireResponse Router::ContentLengthExceeded(std::string_view request_id) const {
  aws::WireResponse wire;
  wire.status = 413;
  wire.headers.emplace("x-amzn-RequestId", std::string(request_id));
  wire.headers.emplace("Content-Type", "application/json");
  wire.body =
      "{\"message\":\"HTTP content length exceeded " + std::to_string(options_.max_request_body_bytes) + " bytes.\"}";
  return wire;
}

struct Router::Call {
  std::string_view request_id;
  int64_t start_steady_ns = 0;
  // Held to the end: the variant and instance pointers point into it.
  std::shared_ptr<const EndpointRoute> route;
  const VariantRoute* variant = nullptr;  // set once the request is counted
  const InstanceTarget* instance = nullptr;
  HeaderMap forward;           // what the container gets (request.headers points here)
  net::ClientRequest request;  // body: a view of the client's body
  net::ClientTimeouts timeouts;
  InvocationSample sample;
  int64_t model_start = 0;  // steady ns when the current attempt started
  bool retried = false;     // the one second attempt was made
  // Multi-model: "/models/<name>/invoke" (request.target views it).
  std::string model_target;
  // Direct multi-container (§8.1): the index in instance->containers of the container called
  // (the same hostname on a retry's instance); -1: the instance's host:port.
  int container = -1;
  std::string_view container_hostname;  // the header's value (views the client's headers)
};

namespace {

// Where an attempt of `instance` goes: the Direct call's container, else the instance.
std::pair<const std::string*, uint16_t> Upstream(const InstanceTarget& instance, int container) {
  if (container >= 0 && static_cast<size_t>(container) < instance.containers.size()) {
    const ContainerTarget& c = instance.containers[static_cast<size_t>(container)];
    return {&c.host, c.port};
  }
  return {&instance.host, instance.port};
}

// The container named in errors: the Direct call's, else the instance's.
std::string_view CalledContainer(const InstanceTarget& instance, int container) {
  if (container >= 0 && static_cast<size_t>(container) < instance.containers.size()) {
    return instance.containers[static_cast<size_t>(container)].hostname;
  }
  return ContainerName(instance);
}

}  // namespace

std::optional<aws::WireResponse> Router::Prepare(const InvokeRequest& request, Call& call) const {
  static const HeaderMap kNoHeaders;
  const HeaderMap& in = request.headers != nullptr ? *request.headers : kNoHeaders;
  auto validation = [&](std::string message) {
    return ErrorAnswer(aws::AwsError("ValidationError", std::move(message), 400), request.request_id);
  };
  call.request_id = request.request_id;
  call.start_steady_ns = request.start_steady_ns;

  // 1. The endpoint (one snapshot load; held until the answer).
  call.route = routes_->Find(request.endpoint_name);
  if (std::string m = CheckEndpoint(call.route.get(), request); !m.empty()) return validation(std::move(m));
  const EndpointRoute& route = *call.route;
  if (request.body.size() > options_.max_request_body_bytes) return ContentLengthExceeded(request.request_id);

  // 2. Headers.
  const InvokeHeaders headers = ReadInvokeHeaders(in);
  if (std::string m = CheckInvokeHeaders(headers, route); !m.empty()) return validation(std::move(m));

  // 3. The variant.
  std::string_view wanted =
      headers.target_variant != nullptr ? std::string_view(*headers.target_variant) : std::string_view();
  const VariantRoute* variant = PickFleetVariant(route, wanted, ThreadUniform(), ThreadUniform());
  if (variant == nullptr) {
    return validation(!wanted.empty() ? "Endpoint " + route.name + " does not have a production variant named " +
                                            std::string(wanted) + "."
                                      : "Endpoint " + route.name +
                                            " has no production variant with a weight greater than 0; set "
                                            "TargetVariant or update the weights.");
  }

  // Multi-container (§8): Direct needs the header naming one of the containers; the other
  // variants of an endpoint with a Direct one refuse it.
  if (variant->container_mode == ContainerMode::kDirect) {
    if (headers.target_container == nullptr || headers.target_container->empty()) {
      return validation("Endpoint " + route.name +
                        " is a multi-container endpoint with Direct invocation: set TargetContainerHostname "
                        "(X-Amzn-SageMaker-Target-Container-Hostname) to the ContainerHostname of the container to "
                        "invoke.");
    }
    if (!variant->instances.empty() && FindContainer(*variant->instances[0], *headers.target_container) < 0) {
      std::string names;
      for (const ContainerTarget& c : variant->instances[0]->containers)
        names += (names.empty() ? "" : ", ") + c.hostname;
      return validation("Container hostname " + *headers.target_container + " does not exist in production variant " +
                        variant->name + " of endpoint " + route.name + " (its containers: " + names + ").");
    }
    call.container_hostname = *headers.target_container;
  } else if (headers.target_container != nullptr) {
    return validation("Production variant " + variant->name + " of endpoint " + route.name +
                      " is not a multi-container endpoint with Direct invocation; remove TargetContainerHostname.");
  }

  // From here on the request is counted.
  call.variant = variant;
  call.sample.per_instance = variant->instances.empty() ? 0.0 : 1.0 / static_cast<double>(variant->instances.size());

  // 4. The instance.
  call.instance = PickInstance(*variant, nullptr);
  if (call.instance == nullptr) {
    call.sample.reached_model = false;
    return ErrorAnswer(NoHealthyInstance(route, *variant, ""), request.request_id);
  }
  if (!call.container_hostname.empty()) call.container = FindContainer(*call.instance, call.container_hostname);

  // 5. The call. Every call carries its instance's failure signal (set per attempt): when the
  // controller declares the instance failed, a call waiting on it ends at once (Aborted) and a
  // call not yet sent is not sent (Unavailable, so retried).
  call.forward = ForwardHeaders(headers, request.request_id);
  call.request.method = "POST";
  call.request.target = "/invocations";
  call.request.headers = &call.forward;
  call.request.body = request.body;
  call.timeouts.connect_ms = options_.connect_timeout_ms;
  call.timeouts.response_ms = options_.invocation_timeout_ms;
  return std::nullopt;
}

bool Router::Retry(const Result<net::ClientResponse>& result, Call& call) const {
  // Not connected (or the instance was declared failed before anything was sent), so not
  // processed: one more try on another instance (§5.2).
  if (call.retried || result.ok() || result.status().code() != StatusCode::kUnavailable) return false;
  const InstanceTarget* other = PickInstance(*call.variant, call.instance);
  if (other == nullptr) return false;
  call.instance = other;
  if (!call.container_hostname.empty()) call.container = FindContainer(*other, call.container_hostname);
  call.retried = true;
  return true;
}

aws::WireResponse Router::Answer(Call& call, Result<net::ClientResponse> result) const {
  const EndpointRoute& route = *call.route;
  const VariantRoute& variant = *call.variant;
  const InstanceTarget& instance = *call.instance;
  call.sample.model_micros = (SteadyNanos() - call.model_start) / 1000;
  if (!result.ok() && result.status().code() == StatusCode::kUnavailable && instance.failure.cancelled()) {
    // Nothing was delivered, and the only instance left was declared failed after our snapshot
    // was published: the same as having no instance (503, which botocore retries; by then the
    // snapshot without it is out).
    call.sample.reached_model = false;
    return ErrorAnswer(
        NoHealthyInstance(route, variant,
                          " (instance " + instance.instance_id + " failed: " + instance.failure.reason() + ")"),
        call.request_id);
  }
  if (result.ok() && result->body.size() > options_.max_response_body_bytes) {
    result = Status::ResourceExhausted("the response body is larger than " +
                                       std::to_string(options_.max_response_body_bytes) + " bytes");
  }
  if (!result.ok()) {
    call.sample.model_error = true;
    return ErrorAnswer(
        ModelCallError(result.status(), instance, variant, route, CalledContainer(instance, call.container)),
        call.request_id);
  }
  call.sample.model_status = result->status;
  if (result->status < 200 || result->status > 299) {
    call.sample.model_error = true;
    return ErrorAnswer(ModelStatusError(*result, CalledContainer(instance, call.container), route), call.request_id);
  }
  return SuccessAnswer(std::move(*result), variant, call.request_id);
}

void Router::Record(Call& call) const {
  if (metrics_ == nullptr || call.variant == nullptr) return;
  call.sample.epoch_second = EpochSecond();
  int64_t total = (SteadyNanos() - call.start_steady_ns) / 1000;
  call.sample.overhead_micros = std::max<int64_t>(0, total - call.sample.model_micros);
  metrics_->Record(call.route->name, call.variant->name, call.sample);
  if (call.container >= 0 && call.instance != nullptr && call.sample.reached_model) {
    // Direct (§8.1, §15.2): the container's own invocation metrics, dimension ContainerName.
    metrics_->RecordContainer(call.route->name, call.variant->name, CalledContainer(*call.instance, call.container),
                              /*direct=*/true, call.sample);
  }
}

void Router::Observe(const Call& call, const aws::WireResponse& answer) const {
  if (observer_ == nullptr || call.variant == nullptr || call.instance == nullptr) return;
  if (call.route->data_capture == nullptr && call.route->shadow_variants.empty()) return;
  ObservedInvocation invocation;
  invocation.route = &call.route;
  invocation.variant = call.variant;
  invocation.forward = &call.forward;
  invocation.body = call.request.body;
  invocation.answer = &answer;
  invocation.epoch_millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  observer_->Invoked(invocation);
}

bool Router::IsMultiModel(std::string_view endpoint) const {
  if (multi_model_ == nullptr) return false;
  std::shared_ptr<const EndpointRoute> route = routes_->Find(endpoint);
  return route != nullptr && route->multi_model;
}

std::optional<aws::WireResponse> Router::PlaceModel(Call& call, ModelLease& lease) const {
  const std::string* target_model = FindHeader(call.forward, "X-Amzn-SageMaker-Target-Model");
  if (target_model == nullptr) {
    call.sample.reached_model = false;
    return ErrorAnswer(aws::AwsError("ValidationError",
                                     "Endpoint " + call.route->name +
                                         " is a multi-model endpoint: set TargetModel "
                                         "(X-Amzn-SageMaker-Target-Model) to the model archive's path relative "
                                         "to the model's ModelDataUrl.",
                                     400),
                       call.request_id);
  }
  auto acquired = multi_model_->Acquire(*call.route, *call.variant, *target_model, call.start_steady_ns);
  if (auto* error = std::get_if<aws::AwsError>(&acquired)) {
    call.sample.reached_model = false;
    return ErrorAnswer(*error, call.request_id);
  }
  lease = std::move(std::get<ModelLease>(acquired));
  call.instance = lease.instance.get();
  call.model_target = "/models/" + lease.model_name + "/invoke";
  call.request.target = call.model_target;
  call.retried = true;  // another instance would not hold the model: no second attempt
  return std::nullopt;
}

bool Router::IsServerless(std::string_view endpoint) const {
  if (gate_ == nullptr) return false;
  std::shared_ptr<const EndpointRoute> route = routes_->Find(endpoint);
  return route != nullptr && route->serverless_max_concurrency > 0;
}

namespace {

// A route's idle routable instance (none in flight) and its variant, or nulls.
std::pair<const VariantRoute*, const InstanceTarget*> IdleInstance(const EndpointRoute& route) {
  for (const VariantRoute& variant : route.variants) {
    for (const auto& instance : variant.instances) {
      if (instance->outstanding.load(std::memory_order_relaxed) == 0) return {&variant, instance.get()};
    }
  }
  return {nullptr, nullptr};
}

}  // namespace

std::optional<aws::WireResponse> Router::AwaitServerless(const InvokeRequest& request,
                                                         const EndpointRoute& route) const {
  if (!gate_->Admit(route)) {
    // AWS's text for a serverless endpoint over its MaxConcurrency is "Rate exceeded"; botocore
    // retries ThrottlingException by name.
    return ErrorAnswer(
        aws::AwsError("ThrottlingException",
                      "Rate exceeded: endpoint " + route.name + " already has its MaxConcurrency (" +
                          std::to_string(route.serverless_max_concurrency) + ") of invocations in flight.",
                      429),
        request.request_id);
  }
  const int64_t start = request.start_steady_ns != 0 ? request.start_steady_ns : SteadyNanos();
  const int64_t deadline = start + int64_t{options_.invocation_timeout_ms} * 1000000;
  const int64_t wait_start = SteadyNanos();
  // The instances routable when the wait began: a request served by another one waited for it
  // to start (a cold start); one that waited only for a busy instance to finish did not.
  std::vector<const InstanceTarget*> warm;
  for (const VariantRoute& variant : route.variants) {
    for (const auto& instance : variant.instances) warm.push_back(instance.get());
  }
  // Polled every 5 ms: a new snapshot (the started instance routable) or an instance going idle
  // ends the wait; nothing signals either, and 5 ms is small against a container's start.
  while (true) {
    std::shared_ptr<const EndpointRoute> now = routes_->Find(route.name);
    if (now == nullptr || now->serverless_max_concurrency == 0) return std::nullopt;  // Prepare answers
    if (auto [variant, instance] = IdleInstance(*now); instance != nullptr) {
      if (std::find(warm.begin(), warm.end(), instance) == warm.end()) {
        gate_->ColdStart(*now, variant->name, (SteadyNanos() - wait_start) / 1000);
      }
      return std::nullopt;
    }
    if (SteadyNanos() >= deadline) {
      gate_->Leave(route);  // admitted, never served
      return ErrorAnswer(
          aws::AwsError("ModelNotReadyException",
                        "Serverless endpoint " + route.name + " is still provisioning capacity for the request after " +
                            std::to_string(options_.invocation_timeout_ms / 1000) + " seconds. Try again later.",
                        429),
          request.request_id);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Router::Invoke(const InvokeRequest& request, net::ResponseWriter& response) {
  // Serverless (§12): admitted, then an idle instance awaited; Leave once answered.
  std::shared_ptr<const EndpointRoute> serverless;
  if (gate_ != nullptr) {
    std::shared_ptr<const EndpointRoute> route = routes_->Find(request.endpoint_name);
    if (route != nullptr && route->serverless_max_concurrency > 0 && CheckEndpoint(route.get(), request).empty()) {
      if (std::optional<aws::WireResponse> refused = AwaitServerless(request, *route)) {
        Send(response, *refused);
        return;
      }
      serverless = std::move(route);
    }
  }
  struct Leave {
    ServerlessGate* gate;
    const EndpointRoute* route;
    ~Leave() {
      if (route != nullptr) gate->Leave(*route);
    }
  } leave{gate_, serverless.get()};
  Call call;
  if (std::optional<aws::WireResponse> early = Prepare(request, call)) {
    Send(response, *early);
    Record(call);
    return;
  }
  auto send_to_instance = [&] {
    call.request.cancel = &call.instance->failure;
    call.model_start = SteadyNanos();
    OutstandingGuard guard(call.instance);
    auto [host, port] = Upstream(*call.instance, call.container);
    return client_->Send(*host, port, call.request, call.timeouts);
  };
  if (call.variant->container_mode == ContainerMode::kSerial) {
    // An inference pipeline (§8.2): every container of the instance in order.
    aws::WireResponse answer = InvokePipeline(call);
    Send(response, answer);
    Record(call);
    Observe(call, answer);
    return;
  }
  // Multi-model (§7.3): the instance holding TargetModel, with the model loaded; released once answered.
  ModelLease lease;
  const bool place = multi_model_ != nullptr && call.route->multi_model && !call.variant->model_data_url.empty();
  if (place) {
    if (std::optional<aws::WireResponse> refused = PlaceModel(call, lease)) {
      Send(response, *refused);
      Record(call);
      return;
    }
  }
  Result<net::ClientResponse> result = send_to_instance();
  if (Retry(result, call)) result = send_to_instance();
  if (place && result.ok() && result->status == 404 && !multi_model_->StillLoaded(lease)) {
    // The container no longer holds the model (not the model's own 404): load it again, once.
    multi_model_->Release(*call.route, *call.variant, lease, /*lost=*/true);
    lease = ModelLease();
    if (std::optional<aws::WireResponse> refused = PlaceModel(call, lease)) {
      Send(response, *refused);
      Record(call);
      return;
    }
    result = send_to_instance();
  }
  if (place) multi_model_->Release(*call.route, *call.variant, lease, /*lost=*/false);
  aws::WireResponse answer = Answer(call, std::move(result));
  Send(response, answer);
  Record(call);
  Observe(call, answer);  // after the answer left: the client does not wait for the copy
}

void Router::InvokeAsync(const InvokeRequest& request, net::AsyncHttpClient& client, InvokeCompletion done) {
  auto call = std::make_shared<Call>();
  if (std::optional<aws::WireResponse> early = Prepare(request, *call)) {
    Record(*call);
    done(std::move(*early));
    return;
  }
  if (call->variant->container_mode == ContainerMode::kSerial) {
    // The front door sends pipelines to worker threads (FrontDoor::Claims, IsPipeline);
    // one reaching the loop (its route changed meanwhile) is answered as the retryable 503.
    call->sample.reached_model = false;
    aws::WireResponse answer =
        ErrorAnswer(NoHealthyInstance(*call->route, *call->variant, " (its inference pipeline was just deployed)"),
                    call->request_id);
    Record(*call);
    done(std::move(answer));
    return;
  }
  SendAsync(std::move(call), client, std::move(done));
}

void Router::SendAsync(std::shared_ptr<Call> call, net::AsyncHttpClient& client, InvokeCompletion done) const {
  const InstanceTarget* target = call->instance;
  call->request.cancel = &target->failure;
  call->model_start = SteadyNanos();
  target->outstanding.fetch_add(1, std::memory_order_relaxed);
  // The client keeps call->request's views until the callback runs; `call` (captured) owns them.
  Call& c = *call;
  auto [host, port] = Upstream(*target, c.container);
  client.Send(
      *host, port, c.request, c.timeouts,
      [this, call = std::move(call), &client, done = std::move(done)](Result<net::ClientResponse> result) mutable {
        call->instance->outstanding.fetch_sub(1, std::memory_order_relaxed);
        if (Retry(result, *call)) {
          SendAsync(std::move(call), client, std::move(done));
          return;
        }
        aws::WireResponse answer = Answer(*call, std::move(result));
        // Counted before the answer leaves: once a client has it, /metrics shows it.
        Record(*call);
        Observe(*call, answer);  // before done() takes the answer: a copy, when observed
        done(std::move(answer));
      });
}

bool Router::IsPipeline(std::string_view endpoint) const {
  std::shared_ptr<const EndpointRoute> route = routes_->Find(endpoint);
  return route != nullptr && route->pipeline;
}

aws::WireResponse Router::InvokePipeline(Call& call) const {
  const EndpointRoute& route = *call.route;
  const VariantRoute& variant = *call.variant;
  const std::string_view client_body = call.request.body;
  // One attempt over the instance's chain; a first container that could not be reached (nothing
  // delivered) is tried once on another instance (§5.2), as a single container is.
  while (true) {
    const InstanceTarget& instance = *call.instance;
    OutstandingGuard guard(&instance);
    const size_t count = instance.containers.size();
    if (count == 0) {
      call.sample.reached_model = false;
      return ErrorAnswer(NoHealthyInstance(route, variant, " (the instance lists no containers)"), call.request_id);
    }
    const int64_t chain_start = SteadyNanos();
    call.model_start = chain_start;
    int64_t model_micros = 0;
    net::ClientResponse previous;
    bool have_previous = false;
    std::optional<aws::WireResponse> failed;
    bool retry = false;
    for (size_t i = 0; i < count && !failed; ++i) {
      const ContainerTarget& container = instance.containers[i];
      HeaderMap hop_headers = PipelineHopHeaders(
          call.forward, i, count, have_previous ? FindHeader(previous.headers, "Content-Type") : nullptr);
      net::ClientRequest hop;
      hop.method = "POST";
      hop.target = "/invocations";
      hop.headers = &hop_headers;
      hop.body = have_previous ? std::string_view(previous.body) : client_body;
      hop.cancel = &instance.failure;
      net::ClientTimeouts timeouts = call.timeouts;
      // The invocation budget covers the whole chain (§8.2).
      timeouts.response_ms = RemainingBudgetMs(chain_start, SteadyNanos(), options_.invocation_timeout_ms);
      const int64_t hop_start = SteadyNanos();
      Result<net::ClientResponse> result =
          timeouts.response_ms > 0
              ? client_->Send(container.host, container.port, hop, timeouts)
              : Result<net::ClientResponse>(Status::DeadlineExceeded("the chain's budget is spent"));
      InvocationSample hop_sample;
      hop_sample.epoch_second = EpochSecond();
      hop_sample.model_micros = (SteadyNanos() - hop_start) / 1000;
      model_micros += hop_sample.model_micros;
      if (result.ok() && result->body.size() > options_.max_response_body_bytes) {
        result = Status::ResourceExhausted("the response body is larger than " +
                                           std::to_string(options_.max_response_body_bytes) + " bytes");
      }
      hop_sample.model_status = result.ok() ? result->status : 0;
      hop_sample.model_error = !result.ok() || result->status < 200 || result->status > 299;
      if (i == 0 && !result.ok() && result.status().code() == StatusCode::kUnavailable && !call.retried) {
        // Nothing delivered to the chain: another instance may take it.
        const InstanceTarget* other = PickInstance(variant, &instance);
        if (other != nullptr) {
          call.instance = other;
          call.retried = true;
          retry = true;
          break;
        }
      }
      if (metrics_ != nullptr) {
        metrics_->RecordContainer(route.name, variant.name, container.hostname, /*direct=*/false, hop_sample);
      }
      if (!result.ok()) {
        call.sample.model_error = true;
        call.sample.model_micros = model_micros;
        if (i == 0 && result.status().code() == StatusCode::kUnavailable && instance.failure.cancelled()) {
          call.sample.reached_model = false;
          call.sample.model_error = false;
          failed = ErrorAnswer(
              NoHealthyInstance(route, variant,
                                " (instance " + instance.instance_id + " failed: " + instance.failure.reason() + ")"),
              call.request_id);
        } else if (result.status().code() == StatusCode::kDeadlineExceeded) {
          failed = ErrorAnswer(
              ModelCallError(Status::DeadlineExceeded("timed out"), instance, variant, route, container.hostname),
              call.request_id);
        } else {
          failed = ErrorAnswer(ModelCallError(result.status(), instance, variant, route, container.hostname),
                               call.request_id);
        }
        break;
      }
      if (result->status < 200 || result->status > 299) {
        // A non-2xx stops the chain: ModelError naming that container (§8.2).
        call.sample.model_error = true;
        call.sample.model_status = result->status;
        call.sample.model_micros = model_micros;
        failed = ErrorAnswer(ModelStatusError(*result, container.hostname, route), call.request_id);
        break;
      }
      previous = std::move(*result);
      have_previous = true;
    }
    if (retry) continue;
    if (failed) return std::move(*failed);
    call.sample.model_micros = model_micros;  // ModelLatency: the sum over the containers
    call.sample.model_status = previous.status;
    return SuccessAnswer(std::move(previous), variant, call.request_id);
  }
}

}  // namespace kiln::serving
