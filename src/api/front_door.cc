#include "api/front_door.h"

#include <exception>

#include <nlohmann/json.hpp>

#include "api/sts.h"
#include "aws/sigv2.h"
#include "base/encoding.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln::api {

namespace {

constexpr std::string_view kHealthPath = "/_kiln/health";

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
  bool started() const override { return inner_.started(); }
  void CloseAfterResponse() override { inner_.CloseAfterResponse(); }
  int status() const { return status_; }
  uint64_t bytes() const { return bytes_; }

 private:
  net::ResponseWriter& inner_;
  int status_ = 0;
  uint64_t bytes_ = 0;
};

std::map<std::string, std::string> ParseForm(std::string_view text) {
  std::map<std::string, std::string> out;
  if (text.empty()) return out;
  for (std::string_view pair : Split(text, '&')) {
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    auto name = UriDecode(pair.substr(0, eq), true);
    auto value = UriDecode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), true);
    if (name && value) out[*name] = *value;
  }
  return out;
}

void SendWire(net::ResponseWriter& response, const aws::WireResponse& wire) {
  (void)response.Send(wire.status, wire.headers, wire.body);
}

aws::SignableRequest ToSignable(const net::HttpRequest& request) {
  aws::SignableRequest s;
  s.method = request.method;
  s.raw_path = request.raw_path;
  s.raw_query = request.raw_query;
  s.headers = request.headers;
  return s;
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
  enum class Kind { kHealth, kJson, kQuery, kRuntime, kS3 } kind = Kind::kS3;
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
      case F::kMalformed: return aws::AwsError("AuthorizationHeaderMalformed", m, 400);
      case F::kUnknownKey:
        return aws::AwsError("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.", 403);
      case F::kBadToken: return aws::AwsError("InvalidToken", "The provided token is malformed or otherwise invalid.", 400);
      case F::kBadSignature:
        return aws::AwsError("SignatureDoesNotMatch",
                             "The request signature we calculated does not match the signature you provided. "
                             "Check your key and signing method." + (m.empty() ? std::string() : " " + m),
                             403);
      case F::kSkewed: {
        aws::AwsError e("RequestTimeTooSkewed", "The difference between the request time and the current time is too large.", 403);
        e.With("ServerTime", FormatIso8601Millis(NowMillis())).With("MaxAllowedSkewMilliseconds", "900000");
        return e;
      }
      case F::kExpired: return aws::AwsError("AccessDenied", m.empty() ? "Request has expired" : m, 403);
      case F::kBadContentSha256: return aws::AwsError("InvalidArgument", m, 400);
    }
  }
  if (protocol == aws::Protocol::kQuery) {
    switch (error.failure) {
      case F::kMissing: return aws::AwsError("MissingAuthenticationToken", "Request is missing Authentication Token", 403);
      case F::kMalformed: return aws::AwsError("IncompleteSignature", m, 400);
      case F::kUnknownKey:
      case F::kBadToken:
        return aws::AwsError("InvalidClientTokenId", "The security token included in the request is invalid.", 403);
      case F::kBadSignature:
        return aws::AwsError("SignatureDoesNotMatch",
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
    case F::kMissing: return aws::AwsError("MissingAuthenticationTokenException", "Missing Authentication Token", status);
    case F::kMalformed: return aws::AwsError("IncompleteSignatureException", m, status);
    case F::kUnknownKey:
    case F::kBadToken:
      return aws::AwsError("UnrecognizedClientException", "The security token included in the request is invalid.", status);
    case F::kBadSignature:
      return aws::AwsError("InvalidSignatureException",
                           "The request signature we calculated does not match the signature you provided. "
                           "Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
                           status);
    case F::kSkewed:
    case F::kExpired:
    case F::kBadContentSha256: return aws::AwsError("InvalidSignatureException", m, status);
  }
  return aws::AwsError("AccessDeniedException", m, status);
}

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
  std::string scope = aws::ScopeServiceOf(ToSignable(request));
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
  if (scope == "sagemaker" && StartsWith(request.raw_path, "/endpoints/")) {
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
      case Route::Kind::kS3: ServeS3(request, response, context, verified); break;
      default: ServeRpc(route, request, response, context, verified); break;
    }
  } catch (const std::exception& e) {
    KLOG(error, "request failed with exception", {{"what", e.what()}, {"request_id", context.request_id}});
    if (!response.started()) {
      SendWire(response, aws::SerializeError(route.protocol, aws::AwsError("InternalFailure", "Internal error", 500),
                                             context.request_id));
    }
    response.CloseAfterResponse();
  }
  if (!response.started()) {
    // A service that forgot to answer is a bug; the client still gets a well-formed error.
    SendWire(response, aws::SerializeError(route.protocol, aws::AwsError("InternalFailure", "No response", 500),
                                           context.request_id));
  }
  std::string status = std::to_string(response.status());
  std::string millis = std::to_string(NowMillis() - context.start_millis);
  std::string bytes = std::to_string(response.bytes());
  std::string principal = context.auth ? context.auth->credential.access_key_id : "-";
  KLOG(info, "request", {{"request_id", context.request_id},
                         {"remote", request.remote_address},
                         {"method", request.method},
                         {"path", std::string_view(request.raw_path).substr(0, 256)},
                         {"service", context.service},
                         {"protocol", ProtocolName(route.protocol)},
                         {"operation", context.operation.empty() ? route.operation : context.operation},
                         {"key", principal},
                         {"status", status},
                         {"bytes_out", bytes},
                         {"duration_ms", millis}});
}

void FrontDoor::ServeS3(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                        std::optional<aws::VerifiedRequest>& verified) {
  aws::SignableRequest signable = ToSignable(request);
  bool sigv2 = aws::IsSigV2(signable);
  bool has_auth = sigv2 || request.Header("Authorization") != nullptr ||
                  request.raw_query.find("X-Amz-Signature=") != std::string::npos ||
                  request.raw_query.find("X-Amz-Credential=") != std::string::npos;
  if (has_auth || options_.auth_enabled) {
    aws::VerifyOptions verify;
    verify.expected_service = "s3";
    verify.regions = options_.regions;
    verify.accept_any_region = options_.accept_any_region;
    verify.s3 = true;
    auto outcome = sigv2 ? aws::VerifySigV2(signable, *credentials_, context.region, NowMillis())
                         : aws::VerifyRequest(signable, *credentials_, verify, NowMillis(), std::nullopt);
    if (auto* error = std::get_if<aws::AuthError>(&outcome)) {
      KLOG(debug, "signature rejected", {{"request_id", context.request_id}, {"reason", error->message},
                                         {"canonical_request", error->canonical_request},
                                         {"string_to_sign", error->string_to_sign}});
      SendWire(response, aws::SerializeError(aws::Protocol::kRestXml, AuthErrorFor(aws::Protocol::kRestXml, *error),
                                             context.request_id, request.method == "HEAD"));
      response.CloseAfterResponse();
      return;
    }
    verified = std::get<aws::VerifiedRequest>(std::move(outcome));
    context.auth = &*verified;
    context.region = verified->region;
  }
  s3_->Handle(context, request, response);
}

void FrontDoor::ServeRpc(const Route& route, net::HttpRequest& request, net::ResponseWriter& response,
                         aws::RequestContext& context, std::optional<aws::VerifiedRequest>& verified) {
  auto body = ReadAll(*request.body, options_.max_rpc_body_bytes);
  if (!body.ok()) {
    if (body.status().code() == StatusCode::kResourceExhausted) {
      aws::AwsError e("SerializationException",
                      "Request body is larger than " + std::to_string(options_.max_rpc_body_bytes) + " bytes.", 413);
      SendWire(response, aws::SerializeError(route.protocol, e, context.request_id));
    } else {
      SendWire(response, aws::SerializeError(route.protocol,
                                             aws::AwsError("SerializationException",
                                                           "Could not read the request body: " + body.status().message()),
                                             context.request_id));
    }
    response.CloseAfterResponse();
    return;
  }
  aws::SignableRequest signable = ToSignable(request);
  bool has_auth = request.Header("Authorization") != nullptr ||
                  request.raw_query.find("X-Amz-Signature=") != std::string::npos;
  if (has_auth || options_.auth_enabled) {
    aws::VerifyOptions verify;
    verify.expected_service = route.signing_name;
    verify.regions = options_.regions;
    verify.accept_any_region = options_.accept_any_region;
    std::string body_hash = Sha256Hex(*body);
    auto outcome = aws::VerifyRequest(signable, *credentials_, verify, NowMillis(), body_hash);
    if (auto* error = std::get_if<aws::AuthError>(&outcome)) {
      KLOG(debug, "signature rejected", {{"request_id", context.request_id}, {"reason", error->message},
                                         {"canonical_request", error->canonical_request},
                                         {"string_to_sign", error->string_to_sign}});
      SendWire(response, aws::SerializeError(route.protocol, AuthErrorFor(route.protocol, *error), context.request_id));
      return;
    }
    verified = std::get<aws::VerifiedRequest>(std::move(outcome));
    context.auth = &*verified;
    context.region = verified->region;
  }

  switch (route.kind) {
    case Route::Kind::kJson: {
      if (route.json == nullptr) {
        std::string target = request.HeaderOr("X-Amz-Target", "");
        SendWire(response, aws::SerializeError(route.protocol,
                                               aws::AwsError("UnknownOperationException",
                                                             "Kiln does not serve the target " + target + "."),
                                               context.request_id));
        return;
      }
      if (request.method != "POST" || request.raw_path != "/") {
        SendWire(response, aws::SerializeError(route.protocol,
                                               aws::AwsError("UnknownOperationException",
                                                             "JSON protocol requests are POST /.", 404),
                                               context.request_id));
        return;
      }
      SendWire(response, route.json->Handle(context, route.operation, *body));
      return;
    }
    case Route::Kind::kQuery: {
      std::map<std::string, std::string> params = ParseForm(request.raw_query);
      for (auto& [k, v] : ParseForm(*body)) params[k] = v;
      SendWire(response, HandleSts(context, params));
      return;
    }
    case Route::Kind::kRuntime: {
      SendWire(response, aws::SerializeError(aws::Protocol::kRestJson,
                                             aws::AwsError("UnknownOperationException",
                                                           "SageMaker Runtime is not served by this Kiln version.", 404),
                                             context.request_id));
      return;
    }
    default: break;
  }
  SendWire(response, aws::SerializeError(route.protocol, aws::AwsError("InternalFailure", "unroutable request", 500),
                                         context.request_id));
}

}  // namespace kiln::api
