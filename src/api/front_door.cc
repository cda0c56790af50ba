#include "api/front_door.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include <nlohmann/json.hpp>

#include "api/sts.h"
#include "aws/cbor.h"
#include "aws/gzip.h"
#include "aws/query_codec.h"
#include "aws/sigv2.h"
#include "base/encoding.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/query_string.h"
#include "base/strings.h"
#include "base/time.h"
#include "net/event_loop.h"

namespace kiln::api {

namespace {

constexpr std::string_view kHealthPath = "/_kiln/health";
// Remote access (issue 16): no S3 bucket name starts with '_', so these paths are never S3's.
constexpr std::string_view kRemotePrefix = "/_kiln/remote/";
// Training job actions outside the SageMaker API (issue 18: `kiln interrupt`); never S3's either.
constexpr std::string_view kTrainingPrefix = "/_kiln/training/";
// The Slurm runtime's node protocol (issue 21, runtime/slurm/node_service.h): token-authenticated,
// never SigV4, never S3's.
constexpr std::string_view kNodePrefix = "/_kiln/node/";
// The web console (issue 22): its sign-in route (never S3's) and its files (S3's too: front_door.h).
constexpr std::string_view kConsoleSessionPath = "/_kiln/console/session";
constexpr std::string_view kConsoleSessionPrefix = "/_kiln/console/";
constexpr std::string_view kConsolePath = "/console";
constexpr std::string_view kConsolePrefix = "/console/";
// The sign-in body is `{}`; anything near this size is not a console.
constexpr size_t kMaxConsoleSessionBody = 64 * 1024;
constexpr std::string_view kMetricsPath = "/metrics";
constexpr std::string_view kEndpointsPrefix = "/endpoints/";
// The per-thread invoke body buffer keeps its capacity between requests up to this size; a
// larger body's buffer is released afterwards, so hundreds of server threads cannot each pin
// 6 MB after one big request.
constexpr size_t kKeepBodyCapacity = 1 << 20;

// The request as SigV4 sees it: a view of its own strings (nothing copied).
aws::SignableRequest Signable(const net::HttpRequest& request) {
  return {request.method, request.raw_path, request.raw_query, request.headers};
}

// ^[a-zA-Z0-9](-*[a-zA-Z0-9])*$, at most 63 characters (runtime-api.md §1).
bool IsEndpointName(std::string_view name) {
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (name.empty() || name.size() > 63 || !alnum(name.front()) || !alnum(name.back())) return false;
  for (char c : name) {
    if (!alnum(c) && c != '-') return false;
  }
  return true;
}

// "/endpoints/<name>/<op>" → name and op; false when the path has another shape.
bool SplitRuntimePath(std::string_view path, std::string_view* name, std::string_view* op) {
  if (!StartsWith(path, kEndpointsPrefix)) return false;
  path.remove_prefix(kEndpointsPrefix.size());
  size_t slash = path.find('/');
  if (slash == std::string_view::npos) return false;
  *name = path.substr(0, slash);
  *op = path.substr(slash + 1);
  return op->find('/') == std::string_view::npos;
}

// The runtime operation a path names, for the access log; empty when it names none.
std::string RuntimeOperation(std::string_view path) {
  std::string_view name, op;
  if (!SplitRuntimePath(path, &name, &op)) return {};
  if (op == "invocations") return "InvokeEndpoint";
  if (op == "async-invocations") return "InvokeEndpointAsync";
  if (op == "invocations-response-stream") return "InvokeEndpointWithResponseStream";
  return {};
}

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Records what was answered, for the access log.
class RecordingWriter final : public net::ResponseWriter {
 public:
  explicit RecordingWriter(net::ResponseWriter& inner) : inner_(inner) {}
  Status Start(int status, const HeaderMap& headers, std::optional<uint64_t> content_length) override {
    status_ = status;
    return inner_.Start(status, headers, content_length);
  }
  Status Write(std::string_view data) override {
    bytes_ += data.size();
    return inner_.Write(data);
  }
  Status Finish() override { return inner_.Finish(); }
  Result<net::UpgradedConnection> Upgrade(const HeaderMap& headers) override {
    Result<net::UpgradedConnection> upgraded = inner_.Upgrade(headers);
    if (upgraded.ok()) status_ = 101;
    return upgraded;
  }
  bool started() const override { return inner_.started(); }
  void CloseAfterResponse() override { inner_.CloseAfterResponse(); }
  int status() const { return status_; }
  uint64_t bytes() const { return bytes_; }

 private:
  net::ResponseWriter& inner_;
  int status_ = 0;
  uint64_t bytes_ = 0;
};

// STS's lenient form reading: a pair with a bad escape is skipped (CloudWatch's ParseQueryForm
// refuses it instead).
std::map<std::string, std::string> ParseForm(std::string_view text) {
  Result<std::vector<QueryParam>> params =
      ParseQueryString(text, {.plus_is_space = true, .bad_escape = QueryBadEscape::kDropPair});  // cannot fail
  return QueryParamMap(std::move(*params));
}

void SendWire(net::ResponseWriter& response, const aws::WireResponse& wire) {
  (void)response.Send(wire.status, wire.headers, wire.body);
}

std::string_view ProtocolName(aws::Protocol p) {
  switch (p) {
    case aws::Protocol::kJson11: return "json-1.1";
    case aws::Protocol::kJson10: return "json-1.0";
    case aws::Protocol::kRestJson: return "rest-json";
    case aws::Protocol::kRestXml: return "rest-xml";
    case aws::Protocol::kQuery: return "query";
  }
  return "?";
}

}  // namespace

struct FrontDoor::Route {
  enum class Kind {
    kHealth,
    kMetrics,
    kRemote,
    kTraining,
    kNode,
    kConsole,
    kConsoleSession,
    kJson,
    kQuery,
    kCbor,
    kRuntime,
    kS3
  } kind = Kind::kS3;
  const JsonService* json = nullptr;  // kJson with a known prefix
  std::string target_prefix;          // kJson
  std::string operation;              // kJson: from X-Amz-Target
  std::string signing_name;
  aws::Protocol protocol = aws::Protocol::kRestXml;
};

aws::AwsError AuthErrorFor(aws::Protocol protocol, const aws::AuthError& error) {
  using F = aws::AuthFailure;
  const std::string& m = error.message;
  if (protocol == aws::Protocol::kRestXml) {
    switch (error.failure) {
      case F::kMissing: return aws::AwsError("AccessDenied", "Access Denied", 403);
      case F::kMalformed:
        // S3: a presigned URL's parameters are AuthorizationQueryParametersError (SigV4) or
        // AccessDenied (SigV2); only the header form is AuthorizationHeaderMalformed.
        if (error.form == aws::AuthForm::kQueryV4) return aws::AwsError("AuthorizationQueryParametersError", m, 400);
        if (error.form == aws::AuthForm::kQueryV2) return aws::AwsError("AccessDenied", m, 403);
        return aws::AwsError("AuthorizationHeaderMalformed", m, 400);
      case F::kUnknownKey:
        return aws::AwsError("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.",
                             403);
      case F::kBadToken:
        return aws::AwsError("InvalidToken", "The provided token is malformed or otherwise invalid.", 400);
      case F::kBadSignature:
        return aws::AwsError("SignatureDoesNotMatch",
                             "The request signature we calculated does not match the signature you provided. "
                             "Check your key and signing method." +
                                 (m.empty() ? std::string() : " " + m),
                             403);
      case F::kSkewed: {
        aws::AwsError e("RequestTimeTooSkewed",
                        "The difference between the request time and the current time is too large.", 403);
        e.With("ServerTime", FormatIso8601Millis(NowMillis())).With("MaxAllowedSkewMilliseconds", "900000");
        return e;
      }
      case F::kExpired: {
        // S3 adds X-Amz-Expires / Expires / ServerTime (see AuthError::details).
        aws::AwsError e("AccessDenied", m.empty() ? "Request has expired" : m, 403);
        for (const auto& [name, value] : error.details) e.With(name, value);
        return e;
      }
      case F::kBadContentSha256: return aws::AwsError("InvalidArgument", m, 400);
    }
  }
  if (protocol == aws::Protocol::kQuery) {
    switch (error.failure) {
      case F::kMissing:
        return aws::AwsError("MissingAuthenticationToken", "Request is missing Authentication Token", 403);
      case F::kMalformed: return aws::AwsError("IncompleteSignature", m, 400);
      case F::kUnknownKey:
      case F::kBadToken:
        return aws::AwsError("InvalidClientTokenId", "The security token included in the request is invalid.", 403);
      case F::kBadSignature:
        return aws::AwsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
            403);
      case F::kSkewed:
      case F::kExpired:
      case F::kBadContentSha256: return aws::AwsError("SignatureDoesNotMatch", m, 403);
    }
  }
  // JSON 1.0/1.1 answer 400; the REST-JSON runtime answers 403.
  int status = protocol == aws::Protocol::kRestJson ? 403 : 400;
  switch (error.failure) {
    case F::kMissing:
      return aws::AwsError("MissingAuthenticationTokenException", "Missing Authentication Token", status);
    case F::kMalformed: return aws::AwsError("IncompleteSignatureException", m, status);
    case F::kUnknownKey:
    case F::kBadToken:
      return aws::AwsError("UnrecognizedClientException", "The security token included in the request is invalid.",
                           status);
    case F::kBadSignature:
      return aws::AwsError(
          "InvalidSignatureException",
          "The request signature we calculated does not match the signature you provided. "
          "Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
          status);
    case F::kSkewed:
    case F::kExpired:
    case F::kBadContentSha256: return aws::AwsError("InvalidSignatureException", m, status);
  }
  return aws::AwsError("AccessDeniedException", m, status);
}

namespace {

// A console request (cookie, no signature) that changes state without X-Kiln-Console: 1.
aws::AwsError ConsoleCsrfError(aws::Protocol protocol) {
  const std::string message = "Console requests must carry X-Kiln-Console: 1";
  if (protocol == aws::Protocol::kRestXml || protocol == aws::Protocol::kQuery) {
    return aws::AwsError("AccessDenied", message, 403);
  }
  return aws::AwsError("AccessDeniedException", message, 403);
}

// A console cookie naming no live session: unknown, expired, signed out, or its key revoked.
aws::AwsError ConsoleSessionExpiredError(aws::Protocol protocol) {
  const std::string message = "The console session expired or was signed out: sign in again";
  if (protocol == aws::Protocol::kRestXml || protocol == aws::Protocol::kQuery) {
    return aws::AwsError("ExpiredToken", message, 400);
  }
  return aws::AwsError("ExpiredTokenException", message, protocol == aws::Protocol::kRestJson ? 403 : 400);
}

}  // namespace

FrontDoor::FrontDoor(FrontDoorOptions options, const aws::CredentialProvider* credentials, objects::S3Api* s3)
    : options_(std::move(options)), credentials_(credentials), s3_(s3) {}

void FrontDoor::AddJsonService(std::unique_ptr<JsonService> service) {
  std::string prefix = service->target_prefix();
  json_services_[prefix] = std::move(service);
}

FrontDoor::Route FrontDoor::Classify(const net::HttpRequest& request) const {
  Route route;
  if (request.raw_path == kHealthPath && (request.method == "GET" || request.method == "HEAD")) {
    route.kind = Route::Kind::kHealth;
    return route;
  }
  if (metrics_exporter_ != nullptr && request.raw_path == kMetricsPath &&
      (request.method == "GET" || request.method == "HEAD") && request.Header("Authorization") == nullptr &&
      request.raw_query.find("X-Amz-Credential=") == std::string::npos) {
    route.kind = Route::Kind::kMetrics;
    return route;
  }
  if (StartsWith(request.raw_path, kRemotePrefix)) {
    route.kind = Route::Kind::kRemote;
    route.signing_name = "sagemaker";
    route.protocol = aws::Protocol::kJson11;
    return route;
  }
  if (StartsWith(request.raw_path, kConsoleSessionPrefix)) {
    route.kind = Route::Kind::kConsoleSession;
    route.signing_name = "sagemaker";
    route.protocol = aws::Protocol::kJson11;
    return route;
  }
  if (console_ != nullptr && (request.method == "GET" || request.method == "HEAD") &&
      (request.raw_path == kConsolePath || StartsWith(request.raw_path, kConsolePrefix)) &&
      request.Header(Console::kCsrfHeader) == nullptr && !CarriesSignature(request)) {
    route.kind = Route::Kind::kConsole;
    route.protocol = aws::Protocol::kRestXml;
    return route;
  }
  if (StartsWith(request.raw_path, kNodePrefix)) {
    route.kind = Route::Kind::kNode;
    route.protocol = aws::Protocol::kJson11;
    return route;
  }
  if (StartsWith(request.raw_path, kTrainingPrefix)) {
    route.kind = Route::Kind::kTraining;
    route.signing_name = "sagemaker";
    route.protocol = aws::Protocol::kJson11;
    return route;
  }
  const std::string scope = aws::ScopeServiceOf(Signable(request));
  if (const std::string* target = request.Header("X-Amz-Target")) {
    route.kind = Route::Kind::kJson;
    size_t dot = target->rfind('.');
    route.target_prefix = dot == std::string::npos ? *target : target->substr(0, dot);
    route.operation = dot == std::string::npos ? "" : target->substr(dot + 1);
    auto it = json_services_.find(route.target_prefix);
    if (it != json_services_.end()) {
      route.json = it->second.get();
      route.signing_name = route.json->signing_name();
      route.protocol = route.json->protocol();
    } else {
      route.signing_name = scope;
      route.protocol = StartsWith(request.HeaderOr("Content-Type", ""), "application/x-amz-json-1.0")
                           ? aws::Protocol::kJson10
                           : aws::Protocol::kJson11;
    }
    return route;
  }
  // Smithy RPC v2 CBOR (CloudWatch): a path S3 could also own ("service" as a path-style bucket),
  // so only when signed for monitoring or, unsigned, when the client says it speaks the protocol.
  if (request.method == "POST" && StartsWith(request.raw_path, "/service/") &&
      (scope == kCloudWatchSigningName || (scope.empty() && request.Header("smithy-protocol") != nullptr))) {
    route.kind = Route::Kind::kCbor;
    route.signing_name = std::string(kCloudWatchSigningName);
    route.protocol = aws::Protocol::kJson10;
    return route;
  }
  if (scope == kCloudWatchSigningName && request.raw_path == "/") {
    route.kind = Route::Kind::kQuery;
    route.signing_name = std::string(kCloudWatchSigningName);
    route.protocol = aws::Protocol::kQuery;
    return route;
  }
  const std::string content_type = ToLower(request.HeaderOr("Content-Type", ""));
  bool form = request.method == "POST" && request.raw_path == "/" &&
              StartsWith(content_type, "application/x-www-form-urlencoded");
  bool query_action = request.raw_path == "/" && (StartsWith(request.raw_query, "Action=") ||
                                                  request.raw_query.find("&Action=") != std::string::npos);
  if (scope == "sts" || (scope.empty() && (form || query_action))) {
    route.kind = Route::Kind::kQuery;
    route.signing_name = "sts";
    route.protocol = aws::Protocol::kQuery;
    return route;
  }
  std::string_view runtime_name, runtime_op;
  if ((scope == "sagemaker" && StartsWith(request.raw_path, "/endpoints/")) ||
      (runtime_ != nullptr && scope.empty() && request.method == "POST" &&
       SplitRuntimePath(request.raw_path, &runtime_name, &runtime_op))) {
    route.kind = Route::Kind::kRuntime;
    route.signing_name = "sagemaker";
    route.protocol = aws::Protocol::kRestJson;
    return route;
  }
  route.kind = Route::Kind::kS3;
  route.signing_name = "s3";
  route.protocol = aws::Protocol::kRestXml;
  return route;
}

void FrontDoor::Handle(net::HttpRequest& request, net::ResponseWriter& raw_response) {
  const int64_t start_steady_ns = SteadyNanos();
  RecordingWriter response(raw_response);
  aws::RequestContext context;
  // Outlives the service call and the access log line; context.auth points into it.
  std::optional<aws::VerifiedRequest> verified;
  context.start_millis = NowMillis();
  context.account_id = options_.account_id;
  context.region = options_.regions.empty() ? "us-east-1" : options_.regions.front();
  Route route;
  try {
    route = Classify(request);
    context.protocol = route.protocol;
    context.service = route.signing_name;
    context.request_id = route.kind == Route::Kind::kS3 ? NewS3RequestId() : NewUuid();
    switch (route.kind) {
      case Route::Kind::kHealth: {
        context.service = "kiln";
        context.operation = "Health";
        nlohmann::json body = {{"status", "ok"}, {"version", options_.version}};
        (void)response.Send(200, {{"Content-Type", "application/json"}}, body.dump());
        break;
      }
      case Route::Kind::kMetrics: {
        context.service = "kiln";
        context.operation = "Metrics";
        std::string text;
        metrics_exporter_->Render(&text);
        (void)response.Send(200, {{"Content-Type", serving::PrometheusExporter::kContentType}},
                            request.method == "HEAD" ? std::string_view() : std::string_view(text));
        break;
      }
      case Route::Kind::kS3: ServeS3(request, response, context, verified); break;
      case Route::Kind::kRemote: ServeRemote(request, response, context, verified); break;
      case Route::Kind::kTraining: ServeTraining(request, response, context, verified); break;
      case Route::Kind::kConsole:
        context.service = "kiln";
        context.operation = "Console";
        console_->ServeStatic(request, response);
        break;
      case Route::Kind::kConsoleSession: ServeConsoleSession(request, response, context, verified); break;
      case Route::Kind::kNode: {
        context.service = "kiln";
        context.operation = "Node";
        if (node_service_) {
          node_service_(request, response);
        } else {
          nlohmann::json body = {{"error", "NotFound"},
                                 {"message", "this Kiln server runs no Slurm runtime (\"runtime\": \"slurm\")"}};
          (void)response.Send(404, {{"Content-Type", "application/json"}}, body.dump());
        }
        break;
      }
      case Route::Kind::kRuntime:
        if (runtime_ != nullptr) {
          ServeRuntime(request, response, context, verified, start_steady_ns);
          break;
        }
        ServeRpc(route, request, response, context, verified);
        break;
      default: ServeRpc(route, request, response, context, verified); break;
    }
  } catch (const std::exception& e) {
    KLOG(error, "request failed with exception", {{"what", e.what()}, {"request_id", context.request_id}});
    if (!response.started()) {
      aws::AwsError internal("InternalFailure", "Internal error", 500);
      SendWire(response, route.kind == Route::Kind::kCbor
                             ? aws::SerializeCborError(internal, context.request_id)
                             : aws::SerializeError(route.protocol, internal, context.request_id));
    }
    response.CloseAfterResponse();
  }
  if (!response.started()) {
    // A service that forgot to answer is a bug; the client still gets a well-formed error.
    aws::AwsError internal("InternalFailure", "No response", 500);
    SendWire(response, route.kind == Route::Kind::kCbor
                           ? aws::SerializeCborError(internal, context.request_id)
                           : aws::SerializeError(route.protocol, internal, context.request_id));
  }
  LogRequest(request, context, route.protocol, route.operation, response.status(), response.bytes());
}

void FrontDoor::LogRequest(const net::HttpRequest& request, const aws::RequestContext& context, aws::Protocol protocol,
                           std::string_view route_operation, int status, uint64_t bytes) {
  // KLOG formats its line even when the level is off; with the access log filtered, skip it all.
  if (!spdlog::default_logger_raw()->should_log(spdlog::level::info)) return;
  std::string status_text = std::to_string(status);
  std::string millis = std::to_string(NowMillis() - context.start_millis);
  std::string bytes_text = std::to_string(bytes);
  std::string principal = context.auth ? context.auth->credential.access_key_id : "-";
  KLOG(info, "request",
       {{"request_id", context.request_id},
        {"remote", request.remote_address},
        {"method", request.method},
        {"path", std::string_view(request.raw_path).substr(0, 256)},
        {"service", context.service},
        {"protocol", ProtocolName(protocol)},
        {"operation", context.operation.empty() ? route_operation : std::string_view(context.operation)},
        {"key", principal},
        {"status", status_text},
        {"bytes_out", bytes_text},
        {"duration_ms", millis}});
}

bool CarriesSignature(const net::HttpRequest& request) {
  const std::string& q = request.raw_query;
  return request.Header("Authorization") != nullptr || q.find("X-Amz-Credential=") != std::string::npos ||
         q.find("X-Amz-Signature=") != std::string::npos || q.find("AWSAccessKeyId=") != std::string::npos;
}

std::optional<aws::AwsError> FrontDoor::Authenticate(const net::HttpRequest& request, std::string_view signing_name,
                                                     std::optional<std::string_view> body, aws::Protocol protocol,
                                                     aws::RequestContext& context,
                                                     std::optional<aws::VerifiedRequest>& verified) const {
  // The console's session cookie, for requests without any signature (front_door.h).
  std::optional<std::string_view> cookie;
  if (console_ != nullptr && !CarriesSignature(request)) cookie = Console::SessionCookie(request);
  if (cookie) {
    // Only S3 GETs and HEADs (the console's download links) go without the header: cookies are
    // not port-scoped and SameSite counts every port of the host as the same site, so another web
    // app on the GPU box (a notebook, TensorBoard) could make the browser send GETs here with the
    // cookie; S3 GETs change nothing, while some Kiln routes accept GET for actions
    // (/_kiln/remote/release).
    const bool download = !body.has_value() && (request.method == "GET" || request.method == "HEAD");
    std::optional<ConsoleSessions::Live> live;
    if (download || request.HeaderOr(Console::kCsrfHeader, "") == "1") {
      live = console_->sessions().Find(*cookie);
      if (!live && options_.auth_enabled) return ConsoleSessionExpiredError(protocol);
    } else if (options_.auth_enabled) {
      return ConsoleCsrfError(protocol);
    }
    // With listener auth "off", a refused cookie leaves the request unsigned, as it was before.
    if (!live) return std::nullopt;
    verified.emplace();
    verified->credential = std::move(live->credential);
    verified->region = context.region;
    verified->service = std::string(signing_name);
    verified->payload_mode = std::string(aws::kUnsignedPayload);
    context.auth = &*verified;
    return std::nullopt;
  }
  const aws::SignableRequest signable = Signable(request);
  const bool s3 = !body.has_value();
  const bool sigv2 = s3 && aws::IsSigV2(signable);
  bool has_auth =
      request.Header("Authorization") != nullptr || request.raw_query.find("X-Amz-Signature=") != std::string::npos;
  // S3 also verifies (and so refuses) a presigned URL missing its signature, and SigV2.
  if (s3) has_auth = has_auth || sigv2 || request.raw_query.find("X-Amz-Credential=") != std::string::npos;
  if (!has_auth && !options_.auth_enabled) return std::nullopt;
  aws::VerifyOptions verify;
  verify.expected_service = std::string(signing_name);
  verify.regions = options_.regions;
  verify.accept_any_region = options_.accept_any_region;
  verify.s3 = s3;
  std::variant<aws::VerifiedRequest, aws::AuthError> outcome =
      sigv2 ? aws::VerifySigV2(signable, *credentials_, context.region, NowMillis())
      : s3  ? aws::VerifyRequest(signable, *credentials_, verify, NowMillis(), std::nullopt)
            : aws::VerifyRequest(signable, *credentials_, verify, NowMillis(), aws::PayloadSha256Hex(*body));
  if (auto* error = std::get_if<aws::AuthError>(&outcome)) {
    KLOG(debug, "signature rejected",
         {{"request_id", context.request_id},
          {"reason", error->message},
          {"canonical_request", error->canonical_request},
          {"string_to_sign", error->string_to_sign}});
    return AuthErrorFor(protocol, *error);
  }
  verified = std::get<aws::VerifiedRequest>(std::move(outcome));
  context.auth = &*verified;
  context.region = verified->region;
  return std::nullopt;
}

void FrontDoor::ServeS3(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                        std::optional<aws::VerifiedRequest>& verified) {
  if (auto error = Authenticate(request, "s3", std::nullopt, aws::Protocol::kRestXml, context, verified)) {
    SendWire(response,
             aws::SerializeError(aws::Protocol::kRestXml, *error, context.request_id, request.method == "HEAD"));
    response.CloseAfterResponse();
    return;
  }
  s3_->Handle(context, request, response);
}

namespace {

// A TunnelService error as the JSON 1.1 error of the remote routes (issue16-design.md).
aws::AwsError RemoteError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument: return aws::AwsError("ValidationException", status.message(), 400);
    case StatusCode::kNotFound: return aws::AwsError("ResourceNotFound", status.message(), 404);
    case StatusCode::kPermissionDenied: return aws::AwsError("AccessDeniedException", status.message(), 403);
    case StatusCode::kFailedPrecondition: return aws::AwsError("ConflictException", status.message(), 409);
    case StatusCode::kUnavailable: return aws::AwsError("ServiceUnavailable", status.message(), 503);
    default: return aws::AwsError("InternalFailure", status.message(), 500);
  }
}

// True when the comma-separated header `value` holds `token` (case-insensitive), as Connection's.
bool HasToken(const std::string* value, std::string_view token) {
  if (value == nullptr) return false;
  for (std::string_view part : Split(*value, ',')) {
    if (EqualsIgnoreCase(Trim(part), token)) return true;
  }
  return false;
}

}  // namespace

void FrontDoor::ServeRemote(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                            std::optional<aws::VerifiedRequest>& verified) {
  const std::string_view route = std::string_view(request.raw_path).substr(kRemotePrefix.size());
  auto send_error = [&](const aws::AwsError& error) {
    SendWire(response, aws::SerializeError(aws::Protocol::kJson11, error, context.request_id));
  };
  context.operation = route == "connect"       ? "RemoteConnect"
                      : route == "targets"     ? "RemoteTargets"
                      : route == "connections" ? "RemoteConnections"
                      : route == "release"     ? "RemoteRelease"
                                               : "";
  // release changes state: POST (GET is accepted too, as the other routes' clients sign GETs).
  const bool method_ok = request.method == "GET" || (route == "release" && request.method == "POST");
  if (context.operation.empty() || !method_ok) {
    send_error(aws::AwsError("UnknownOperationException",
                             "Kiln does not serve " + request.method + " " + request.raw_path.substr(0, 256) +
                                 " (remote access serves GET /_kiln/remote/connect, /targets, /connections and "
                                 "POST /_kiln/remote/release).",
                             404));
    return;
  }
  // The signature covers an empty body (the client sends none).
  if (auto error = Authenticate(request, "sagemaker", std::string_view(), aws::Protocol::kJson11, context, verified)) {
    send_error(*error);
    return;
  }
  if (remote_access_ == nullptr) {
    send_error(aws::AwsError("UnknownOperationException", "Remote access is not served by this Kiln server.", 404));
    return;
  }
  Result<std::vector<QueryParam>> parsed = ParseQueryString(request.raw_query);
  if (!parsed.ok()) {
    send_error(aws::AwsError("ValidationException", "The query string is malformed: " + parsed.status().message()));
    return;
  }
  const std::map<std::string, std::string> query = QueryParamMap(std::move(*parsed));
  auto param = [&](const std::string& name) {
    auto it = query.find(name);
    return it == query.end() ? std::string() : it->second;
  };
  auto send_json = [&](const Result<nlohmann::json>& answer) {
    if (!answer.ok()) {
      send_error(RemoteError(answer.status()));
      return;
    }
    (void)response.Send(200, {{"Content-Type", "application/x-amz-json-1.1"}, {"x-amzn-RequestId", context.request_id}},
                        answer->dump());
  };
  if (route == "targets") {
    if (param("resource").empty()) {
      send_error(aws::AwsError("ValidationException",
                               "resource is required: a training job or endpoint name, or its ARN (?resource=<R>)."));
      return;
    }
    send_json(remote_access_->Targets(param("resource")));
    return;
  }
  if (route == "release") {
    access::ConnectRequest release;
    release.target = param("target");
    release.principal_arn = context.auth != nullptr ? context.auth->credential.principal_arn : "";
    release.source_address = request.remote_address;
    send_json(remote_access_->Release(release));
    return;
  }
  if (route == "connections") {
    int max_results = 100;
    if (!param("max-results").empty()) {
      std::optional<int64_t> n = ParseInt64(param("max-results"));
      max_results = n && *n >= 0 && *n <= 100000 ? static_cast<int>(*n) : -1;
    }
    send_json(remote_access_->Connections(param("resource"), max_results, param("connection-id")));
    return;
  }

  // connect: an HTTP/1.1 upgrade to the SSH stream.
  if (!HasToken(request.Header("Upgrade"), "kiln-ssh") || !HasToken(request.Header("Connection"), "upgrade")) {
    send_error(aws::AwsError("ValidationException",
                             "GET /_kiln/remote/connect is an HTTP/1.1 upgrade: send Connection: Upgrade and "
                             "Upgrade: kiln-ssh (kiln ssh-proxy and kiln connect do)."));
    return;
  }
  access::ConnectRequest connect;
  connect.target = param("target");
  connect.public_key = request.HeaderOr("X-Kiln-Ssh-Public-Key", "");
  connect.principal_arn = context.auth != nullptr ? context.auth->credential.principal_arn : "";
  connect.source_address = request.remote_address;
  Result<access::PreparedTunnel> prepared = remote_access_->Prepare(connect);
  if (!prepared.ok()) {
    send_error(RemoteError(prepared.status()));
    return;
  }
  Result<net::UpgradedConnection> upgraded = response.Upgrade({{"Connection", "Upgrade"},
                                                               {"Upgrade", "kiln-ssh"},
                                                               {"X-Kiln-Target", prepared->canonical_target()},
                                                               {"X-Kiln-Connection-Id", prepared->connection_id()},
                                                               {"x-amzn-RequestId", context.request_id}});
  if (!upgraded.ok()) {
    // The prepared agent ends with `prepared`. A request the server cannot upgrade still gets an
    // answer while the connection is the server's.
    KLOG(info, "remote connection not upgraded",
         {{"request_id", context.request_id}, {"error", upgraded.status().ToString()}});
    if (!response.started() && upgraded.status().code() != StatusCode::kUnavailable) {
      send_error(
          aws::AwsError("ValidationException", "The connection cannot be upgraded: " + upgraded.status().message() +
                                                   " (send GET over HTTP/1.1 without a body)."));
    }
    return;
  }
  remote_access_->Run(std::move(prepared).value(), std::move(upgraded->fd), std::move(upgraded->buffered));
}

void FrontDoor::ServeTraining(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                              std::optional<aws::VerifiedRequest>& verified) {
  const std::string_view route = std::string_view(request.raw_path).substr(kTrainingPrefix.size());
  auto send_error = [&](const aws::AwsError& error) {
    SendWire(response, aws::SerializeError(aws::Protocol::kJson11, error, context.request_id));
  };
  if (route != "interrupt" || request.method != "POST") {
    send_error(aws::AwsError("UnknownOperationException",
                             "Kiln does not serve " + request.method + " " + request.raw_path.substr(0, 256) +
                                 " (training serves POST /_kiln/training/interrupt?job=<training job name>).",
                             404));
    return;
  }
  context.operation = "InterruptTrainingJob";
  // The signature covers an empty body (the client sends none).
  if (auto error = Authenticate(request, "sagemaker", std::string_view(), aws::Protocol::kJson11, context, verified)) {
    send_error(*error);
    return;
  }
  if (!training_interrupter_) {
    send_error(
        aws::AwsError("UnknownOperationException", "Training interruption is not served by this Kiln server.", 404));
    return;
  }
  Result<std::vector<QueryParam>> parsed = ParseQueryString(request.raw_query);
  if (!parsed.ok()) {
    send_error(aws::AwsError("ValidationException", "The query string is malformed: " + parsed.status().message()));
    return;
  }
  const std::map<std::string, std::string> query = QueryParamMap(std::move(*parsed));
  auto job = query.find("job");
  if (job == query.end() || job->second.empty()) {
    send_error(aws::AwsError("ValidationException", "job is required (?job=<training job name>)."));
    return;
  }
  Status interrupted = training_interrupter_(job->second);
  if (!interrupted.ok()) {
    switch (interrupted.code()) {
      case StatusCode::kNotFound: send_error(aws::AwsError("ResourceNotFound", interrupted.message(), 404)); break;
      case StatusCode::kFailedPrecondition:
      case StatusCode::kInvalidArgument:
        send_error(aws::AwsError("ValidationException", interrupted.message(), 400));
        break;
      case StatusCode::kUnavailable: send_error(aws::AwsError("ServiceUnavailable", interrupted.message(), 503)); break;
      default: send_error(aws::AwsError("InternalFailure", interrupted.message(), 500)); break;
    }
    return;
  }
  nlohmann::json answer = {{"TrainingJobName", job->second}, {"Interrupted", true}};
  (void)response.Send(200, {{"Content-Type", "application/x-amz-json-1.1"}, {"x-amzn-RequestId", context.request_id}},
                      answer.dump());
}

namespace {

// Reads and drops at most about `max_bytes` of `body`, so that a refused client gets the answer
// rather than a reset; true when the body was read to its end.
bool DrainBody(ByteSource& body, uint64_t max_bytes) {
  char sink[16384];
  uint64_t dropped = 0;
  while (dropped <= max_bytes) {
    Result<size_t> n = body.Read(sink, sizeof sink);
    if (!n.ok()) return false;
    if (*n == 0) return true;
    dropped += *n;
  }
  return false;
}

// The whole body, at most `max_bytes` (ResourceExhausted past it), sized from Content-Length
// (`declared`) once instead of doubling past it while appending.
Result<std::string> ReadWholeBody(ByteSource& body, std::optional<uint64_t> declared, size_t max_bytes) {
  std::string text;
  if (declared) text.reserve(static_cast<size_t>(*declared));
  char buffer[16384];
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, body.Read(buffer, sizeof buffer));
    if (n == 0) return text;
    if (text.size() + n > max_bytes) {
      return Status::ResourceExhausted("body larger than " + std::to_string(max_bytes) + " bytes");
    }
    text.append(buffer, n);
  }
}

}  // namespace

void FrontDoor::ServeConsoleSession(net::HttpRequest& request, net::ResponseWriter& response,
                                    aws::RequestContext& context, std::optional<aws::VerifiedRequest>& verified) {
  HeaderMap headers = {{"Content-Type", "application/x-amz-json-1.1"},
                       {"x-amzn-RequestId", context.request_id},
                       {"Cache-Control", "no-store"}};
  Console::AddSecurityHeaders(headers);
  auto send_error = [&](const aws::AwsError& error) {
    aws::WireResponse wire = aws::SerializeError(aws::Protocol::kJson11, error, context.request_id);
    wire.headers.emplace("Cache-Control", "no-store");
    SendWire(response, wire);
  };
  context.operation = request.method == "POST"     ? "ConsoleSignIn"
                      : request.method == "DELETE" ? "ConsoleSignOut"
                                                   : "ConsoleSession";
  if (request.raw_path != kConsoleSessionPath ||
      (request.method != "GET" && request.method != "HEAD" && request.method != "POST" && request.method != "DELETE")) {
    send_error(aws::AwsError("UnknownOperationException",
                             "Kiln does not serve " + request.method + " " + request.raw_path.substr(0, 256) +
                                 " (the console signs in with GET, POST and DELETE /_kiln/console/session).",
                             404));
    return;
  }
  if (console_ == nullptr) {
    send_error(aws::AwsError("UnknownOperationException",
                             "The console is not served by this Kiln server (config \"console\": {\"enabled\": "
                             "true} turns it on).",
                             404));
    return;
  }
  // The session's JSON: what the console needs to know before and after signing in.
  auto answer = [&](const std::optional<ConsoleSessions::Live>& live) {
    nlohmann::json body = {{"auth", options_.auth_enabled ? "sigv4" : "off"},
                           {"region", options_.regions.empty() ? "us-east-1" : options_.regions.front()},
                           {"signed_in", live.has_value()}};
    if (live) {
      body["access_key_id"] = live->credential.access_key_id;
      body["principal_arn"] = live->credential.principal_arn;
      body["expires_at"] = live->expires_at_millis / 1000;
    }
    (void)response.Send(200, headers, request.method == "HEAD" ? std::string() : body.dump());
  };
  const std::optional<std::string_view> cookie = Console::SessionCookie(request);

  if (request.method == "GET" || request.method == "HEAD") {
    std::optional<ConsoleSessions::Live> live;
    if (cookie) live = console_->sessions().Find(*cookie);
    answer(live);
    return;
  }

  if (request.method == "DELETE") {
    if (request.HeaderOr(Console::kCsrfHeader, "") != "1") {
      send_error(ConsoleCsrfError(aws::Protocol::kJson11));
      return;
    }
    if (cookie) console_->sessions().Remove(*cookie);
    headers.emplace("Set-Cookie", Console::ClearSessionSetCookie());
    (void)response.Send(200, headers, "{}");
    return;
  }

  // POST: sign in with a request signed by the user's key (never by a cookie).
  const std::optional<uint64_t> declared = request.body->size_hint();
  Result<std::string> body = declared && *declared > kMaxConsoleSessionBody
                                 ? Result<std::string>(Status::ResourceExhausted("too large"))
                                 : ReadWholeBody(*request.body, declared, kMaxConsoleSessionBody);
  if (!body.ok()) {
    send_error(aws::AwsError("SerializationException",
                             "The sign-in request's body is `{}`: " + body.status().message() + ".",
                             body.status().code() == StatusCode::kResourceExhausted ? 413 : 400));
    response.CloseAfterResponse();
    return;
  }
  if (!CarriesSignature(request)) {
    if (!options_.auth_enabled) {
      // Listener auth "off": nothing to sign in with, and nothing needed.
      answer(std::nullopt);
      return;
    }
    send_error(aws::AwsError("MissingAuthenticationTokenException",
                             "Sign in with a request signed (SigV4, service sagemaker) by your access key.", 400));
    return;
  }
  if (auto error = Authenticate(request, "sagemaker", *body, aws::Protocol::kJson11, context, verified)) {
    send_error(*error);
    return;
  }
  if (!verified) {
    send_error(aws::AwsError("InternalFailure", "the signature was not verified", 500));
    return;
  }
  ConsoleSessions::Created created = console_->sessions().Create(verified->credential);
  headers.emplace("Set-Cookie", Console::SessionSetCookie(created.token, console_->sessions().ttl_millis() / 1000));
  KLOG(info, "console sign-in",
       {{"request_id", context.request_id},
        {"key", verified->credential.access_key_id},
        {"remote", request.remote_address}});
  answer(ConsoleSessions::Live{verified->credential, created.expires_at_millis});
}

aws::WireResponse FrontDoor::RpcError(const Route& route, const aws::AwsError& error, const std::string& request_id) {
  if (route.kind == Route::Kind::kCbor) return aws::SerializeCborError(error, request_id);
  if (route.kind == Route::Kind::kQuery && route.signing_name == kCloudWatchSigningName) {
    return aws::QueryError(kCloudWatchXmlns, error, request_id);
  }
  return aws::SerializeError(route.protocol, error, request_id);
}

// Holds a large RPC body's bytes against max_large_rpc_bytes_in_flight until it is destroyed.
struct FrontDoor::LargeRpcReservation {
  FrontDoor* door = nullptr;
  size_t bytes = 0;
  LargeRpcReservation() = default;
  LargeRpcReservation(const LargeRpcReservation&) = delete;
  LargeRpcReservation& operator=(const LargeRpcReservation&) = delete;
  ~LargeRpcReservation() {
    if (door == nullptr) return;
    bool last = false;
    {
      MutexLock lock(door->large_rpc_mutex_);
      door->large_rpc_bytes_in_flight_ -= bytes;
      last = door->large_rpc_bytes_in_flight_ == 0;
    }
    door->large_rpc_freed_.NotifyAll();
    // A large body's DOM is many small blocks (below the mmap threshold) spread over the
    // threads' malloc arenas; freed, they stay resident until trimmed. When the last large
    // request is done, give those pages back (a few ms, once per burst).
    if (last) malloc_trim(0);
  }
};

bool FrontDoor::ReserveLargeRpc(size_t bytes, LargeRpcReservation& reservation) {
  MutexLock lock(large_rpc_mutex_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.large_rpc_wait_millis);
  // One request alone always fits, whatever the budget.
  while (large_rpc_bytes_in_flight_ != 0 &&
         large_rpc_bytes_in_flight_ + bytes > options_.max_large_rpc_bytes_in_flight) {
    if (large_rpc_freed_.WaitUntil(large_rpc_mutex_, deadline) == std::cv_status::timeout &&
        large_rpc_bytes_in_flight_ != 0 &&
        large_rpc_bytes_in_flight_ + bytes > options_.max_large_rpc_bytes_in_flight) {
      return false;
    }
  }
  large_rpc_bytes_in_flight_ += bytes;
  reservation.door = this;
  reservation.bytes = bytes;
  return true;
}

void FrontDoor::ServeRpc(const Route& route, net::HttpRequest& request, net::ResponseWriter& response,
                         aws::RequestContext& context, std::optional<aws::VerifiedRequest>& verified) {
  auto rpc_error = [&](const aws::AwsError& error) { return RpcError(route, error, context.request_id); };
  // Too large by its Content-Length: refused before a byte is read (the connection is closed).
  const std::optional<uint64_t> declared = request.body->size_hint();
  if (declared && *declared > options_.max_rpc_body_bytes) {
    aws::AwsError e("SerializationException",
                    "Request body is larger than " + std::to_string(options_.max_rpc_body_bytes) + " bytes.", 413);
    SendWire(response, rpc_error(e));
    response.CloseAfterResponse();
    return;
  }
  // A large body reserves its size from the in-flight budget until it is answered.
  const size_t reserved = declared ? static_cast<size_t>(*declared) : options_.max_rpc_body_bytes;
  LargeRpcReservation reservation;
  if (reserved > options_.large_rpc_body_bytes && !ReserveLargeRpc(reserved, reservation)) {
    bool drained = DrainBody(*request.body, options_.max_rpc_body_bytes);
    aws::AwsError e(route.protocol == aws::Protocol::kQuery ? "Throttling" : "ThrottlingException",
                    "Rate exceeded: " + std::to_string(options_.max_large_rpc_bytes_in_flight >> 20) +
                        " MiB of request bodies over " + std::to_string(options_.large_rpc_body_bytes >> 20) +
                        " MiB are being handled; retry with backoff.");
    SendWire(response, rpc_error(e));
    if (!drained) response.CloseAfterResponse();
    return;
  }
  Result<std::string> body = ReadWholeBody(*request.body, declared, options_.max_rpc_body_bytes);
  if (!body.ok()) {
    if (body.status().code() == StatusCode::kResourceExhausted) {
      aws::AwsError e("SerializationException",
                      "Request body is larger than " + std::to_string(options_.max_rpc_body_bytes) + " bytes.", 413);
      SendWire(response, rpc_error(e));
    } else {
      SendWire(response, rpc_error(aws::AwsError("SerializationException",
                                                 "Could not read the request body: " + body.status().message())));
    }
    response.CloseAfterResponse();
    return;
  }
  if (auto error = Authenticate(request, route.signing_name, *body, route.protocol, context, verified)) {
    SendWire(response, rpc_error(*error));
    return;
  }

  // A compressed body (botocore gzips PutMetricData bodies over 10 KiB): the signature covered the
  // compressed bytes; the service reads the decoded ones, bounded like any body.
  if (const std::string* encoding = request.Header("Content-Encoding"); encoding && aws::IsGzipEncoding(*encoding)) {
    Result<std::string> decoded = aws::Gunzip(*body, options_.max_rpc_body_bytes);
    if (!decoded.ok()) {
      bool too_large = decoded.status().code() == StatusCode::kResourceExhausted;
      SendWire(response,
               rpc_error(aws::AwsError("SerializationException",
                                       "The gzip request body was refused: " + decoded.status().message() + ".",
                                       too_large ? 413 : 400)));
      return;
    }
    body = std::move(decoded);
  }
  SendWire(response, DispatchRpc(route, request, context, *body));
}

aws::WireResponse FrontDoor::DispatchRpc(const Route& route, const net::HttpRequest& request,
                                         aws::RequestContext& context, const std::string& body) {
  auto rpc_error = [&](const aws::AwsError& error) { return RpcError(route, error, context.request_id); };
  switch (route.kind) {
    case Route::Kind::kJson: {
      if (route.json == nullptr) {
        std::string target = request.HeaderOr("X-Amz-Target", "");
        return rpc_error(aws::AwsError("UnknownOperationException", "Kiln does not serve the target " + target + "."));
      }
      if (request.method != "POST" || request.raw_path != "/") {
        return rpc_error(aws::AwsError("UnknownOperationException", "JSON protocol requests are POST /.", 404));
      }
      return route.json->Handle(context, route.operation, body);
    }
    case Route::Kind::kQuery: {
      const bool signed_for_cloudwatch = route.signing_name == kCloudWatchSigningName;
      if (cloudwatch_ != nullptr && signed_for_cloudwatch) {
        context.service = std::string(kCloudWatchSigningName);
        // CloudWatch refuses what STS's lenient parsing skips: bad percent-encoding.
        auto query = aws::ParseQueryForm(request.raw_query);
        auto form = aws::ParseQueryForm(body);
        if (!query.ok() || !form.ok()) {
          return rpc_error(aws::AwsError("MalformedQueryString", (query.ok() ? form : query).status().message()));
        }
        for (auto& [k, v] : *form) (*query)[k] = std::move(v);
        return cloudwatch_->HandleQuery(context, *query);
      }
      std::map<std::string, std::string> params = ParseForm(request.raw_query);
      for (auto& [k, v] : ParseForm(body)) params[k] = v;
      // Unsigned (listener auth "off"): the Action tells the services apart.
      auto action = params.find("Action");
      if (cloudwatch_ != nullptr && context.auth == nullptr && action != params.end() &&
          CloudWatch::Serves(action->second)) {
        context.service = std::string(kCloudWatchSigningName);
        return cloudwatch_->HandleQuery(context, params);
      }
      if (signed_for_cloudwatch) {
        return rpc_error(aws::AwsError("InvalidAction", "CloudWatch is not served by this Kiln."));
      }
      return HandleSts(context, params);
    }
    case Route::Kind::kCbor: {
      constexpr std::string_view kPrefix = kCloudWatchCborPathPrefix;
      if (cloudwatch_ == nullptr || !StartsWith(request.raw_path, kPrefix) ||
          request.raw_path.find('/', kPrefix.size()) != std::string::npos) {
        return rpc_error(aws::AwsError("UnknownOperationException",
                                       "Kiln does not serve POST " + request.raw_path.substr(0, 256) +
                                           " (RPC v2 CBOR serves /service/" + std::string(kCloudWatchTargetPrefix) +
                                           "/operation/<Op>).",
                                       404));
      }
      return cloudwatch_->HandleCbor(context, request.raw_path.substr(kPrefix.size()), body);
    }
    case Route::Kind::kRuntime:
      return aws::SerializeError(
          aws::Protocol::kRestJson,
          aws::AwsError("UnknownOperationException", "SageMaker Runtime is not served by this Kiln version.", 404),
          context.request_id);
    default: break;
  }
  return rpc_error(aws::AwsError("InternalFailure", "unroutable request", 500));
}

}  // namespace kiln::api

namespace kiln::api {

std::optional<aws::AwsError> FrontDoor::CheckRuntime(const net::HttpRequest& request, std::string_view body,
                                                     aws::RequestContext& context,
                                                     std::optional<aws::VerifiedRequest>& verified,
                                                     serving::InvokeRequest& invoke) const {
  if (auto error = Authenticate(request, "sagemaker", body, aws::Protocol::kRestJson, context, verified)) {
    return error;
  }
  std::string_view name, op;
  bool runtime_path = SplitRuntimePath(request.raw_path, &name, &op);
  if (!runtime_path || (op != "invocations" && op != "async-invocations" && op != "invocations-response-stream")) {
    return aws::AwsError("UnknownOperationException",
                         "Kiln does not serve " + request.method + " " + request.raw_path + ".", 404);
  }
  if (!IsEndpointName(name)) {
    return aws::AwsError("ValidationError", "1 validation error detected: Value '" + std::string(name.substr(0, 256)) +
                                                "' at 'endpointName' failed to satisfy constraint: Member must "
                                                "satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9])* "
                                                "and have length less than or equal to 63");
  }
  if (request.method != "POST") {
    return aws::AwsError("UnknownOperationException",
                         "Kiln does not serve " + request.method + " " + request.raw_path + ".", 404);
  }
  if (op != "invocations" && !(op == "async-invocations" && async_invoker_ != nullptr)) {
    return aws::AwsError("ValidationError",
                         context.operation + " is not supported by this Kiln version; use InvokeEndpoint.");
  }
  invoke.endpoint_name = name;
  invoke.headers = &request.headers;
  invoke.body = body;
  invoke.request_id = context.request_id;
  invoke.account_id = context.account_id;
  return std::nullopt;
}

void FrontDoor::ServeRuntime(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                             std::optional<aws::VerifiedRequest>& verified, int64_t start_steady_ns) {
  auto send_error = [&](const aws::AwsError& error) {
    SendWire(response, aws::SerializeError(aws::Protocol::kRestJson, error, context.request_id));
  };
  context.operation = RuntimeOperation(request.raw_path);

  // The body: refused from Content-Length before reading when it is too large (the connection
  // is then closed: the unread body stays on it), else read whole, as SigV4 hashes it.
  const size_t limit = runtime_->options().max_request_body_bytes;
  std::optional<uint64_t> hint = request.body->size_hint();
  if (hint && *hint > limit) {
    SendWire(response, runtime_->ContentLengthExceeded(context.request_id));
    response.CloseAfterResponse();
    return;
  }
  thread_local std::string body;
  struct ReleaseBig {
    ~ReleaseBig() {
      if (body.capacity() > kKeepBodyCapacity) std::string().swap(body);
    }
  } release_big;
  body.clear();
  for (;;) {
    size_t room = (hint && body.size() < *hint) ? static_cast<size_t>(*hint) - body.size() : 64 * 1024;
    room = std::min(room, limit + 1 - body.size());
    if (room == 0) {
      SendWire(response, runtime_->ContentLengthExceeded(context.request_id));
      response.CloseAfterResponse();
      return;
    }
    size_t old = body.size();
    body.resize(old + room);
    Result<size_t> n = request.body->Read(body.data() + old, room);
    if (!n.ok()) {
      body.resize(old);
      if (n.status().code() == StatusCode::kResourceExhausted) {
        SendWire(response, runtime_->ContentLengthExceeded(context.request_id));
      } else {
        send_error(aws::AwsError("ValidationError", "Could not read the request body: " + n.status().message()));
      }
      response.CloseAfterResponse();
      return;
    }
    body.resize(old + *n);
    if (*n == 0) break;
  }

  serving::InvokeRequest invoke;
  if (std::optional<aws::AwsError> error = CheckRuntime(request, body, context, verified, invoke)) {
    send_error(*error);
    return;
  }
  if (context.operation == "InvokeEndpointAsync") {
    SendWire(response, async_invoker_->Invoke(invoke.endpoint_name, request, context));
    return;
  }
  invoke.start_steady_ns = start_steady_ns;
  runtime_->Invoke(invoke, response);
}

bool FrontDoor::Claims(const net::HttpRequest& head) const {
  if (runtime_ == nullptr || head.method != "POST") return false;
  std::string_view name, op;
  if (!SplitRuntimePath(head.raw_path, &name, &op) || op != "invocations") return false;
  // A serverless endpoint's request may wait for an instance to start (Router::Invoke): a
  // worker thread serves it, never the event loop.
  if (runtime_->IsServerless(name)) return false;
  // A multi-model request may wait for its model to download and load (serving/multi_model.h).
  if (runtime_->IsMultiModel(name)) return false;
  // An inference pipeline calls its containers one after another (§8.2).
  if (runtime_->IsPipeline(name)) return false;
  // Handle's own classification decides, so both paths agree: an X-Amz-Target, or a credential
  // scope other than sagemaker's, sends the request elsewhere there.
  return Classify(head).kind == Route::Kind::kRuntime;
}

size_t FrontDoor::max_body_bytes() const {
  return runtime_ != nullptr ? runtime_->options().max_request_body_bytes : 0;
}

namespace {

// What an asynchronous invocation keeps until it is answered: the context (request id, account,
// the verified signature) that the InvokeRequest's views and the access-log line point into.
struct AsyncInvocation {
  aws::RequestContext context;
  std::optional<aws::VerifiedRequest> verified;
  bool answered = false;
};

}  // namespace

void FrontDoor::Serve(net::AsyncExchange& exchange) {
  const net::HttpRequest& request = exchange.request();
  auto state = std::make_shared<AsyncInvocation>();
  aws::RequestContext& context = state->context;
  // As Handle's: the request's arrival (its first byte), for duration_ms and OverheadLatency.
  const int64_t start_steady_ns = exchange.start_steady_ns();
  context.start_millis = NowMillis() - std::max<int64_t>(0, SteadyNanos() - start_steady_ns) / 1000000;
  context.account_id = options_.account_id;
  context.region = options_.regions.empty() ? "us-east-1" : options_.regions.front();
  context.protocol = aws::Protocol::kRestJson;
  context.service = "sagemaker";
  context.request_id = NewUuid();
  context.operation = RuntimeOperation(request.raw_path);
  // The one answer: logged while the exchange (and so the request) is still valid, then sent.
  auto answer = [&exchange, state](aws::WireResponse wire) {
    state->answered = true;
    LogRequest(exchange.request(), state->context, aws::Protocol::kRestJson, "", wire.status, wire.body.size());
    exchange.Respond(wire.status, wire.headers, std::move(wire.body));
  };
  try {
    serving::InvokeRequest invoke;
    if (std::optional<aws::AwsError> error = CheckRuntime(request, exchange.body(), context, state->verified, invoke)) {
      answer(aws::SerializeError(aws::Protocol::kRestJson, *error, context.request_id));
      return;
    }
    invoke.start_steady_ns = start_steady_ns;
    runtime_->InvokeAsync(invoke, exchange.loop().client(), answer);
  } catch (const std::exception& e) {
    // As Handle: an unexpected failure (memory) still gets a well-formed answer.
    KLOG(error, "request failed with exception", {{"what", e.what()}, {"request_id", context.request_id}});
    if (!state->answered) {
      exchange.CloseAfterResponse();
      answer(aws::SerializeError(aws::Protocol::kRestJson, aws::AwsError("InternalFailure", "Internal error", 500),
                                 context.request_id));
    }
  }
}

}  // namespace kiln::api
