#include "api/async_invocations.h"

#include <nlohmann/json.hpp>

#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln::api {

namespace {

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationError", std::move(message), 400); }

// AWS's wording for a header that breaks its model constraint.
aws::AwsError Constraint(std::string_view value, std::string_view member, std::string_view constraint) {
  return Validation("1 validation error detected: Value '" + std::string(value.substr(0, 256)) + "' at '" +
                    std::string(member) + "' failed to satisfy constraint: " + std::string(constraint));
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) > 127) return false;
  }
  return true;
}

bool IsPrintable(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

// ^(?!s3:|https:)[a-zA-Z0-9!_.*'()/-]+$
bool IsOutputPathExtension(std::string_view s) {
  if (s.empty() || StartsWith(s, "s3:") || StartsWith(s, "https:")) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::string_view("!_.*'()/-").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

// ^(?!.*\..*\.)[a-zA-Z0-9][a-zA-Z0-9-_\.]*$
bool IsFilename(std::string_view s) {
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (s.empty() || !alnum(s.front())) return false;
  int dots = 0;
  for (char c : s) {
    if (c == '.') ++dots;
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return dots <= 1;
}

std::string JoinLocation(std::string base, const std::string& extension, const std::string& name) {
  while (!base.empty() && base.back() == '/') base.pop_back();
  std::string out = base + "/";
  if (!extension.empty()) {
    std::string ext = extension;
    while (!ext.empty() && ext.back() == '/') ext.pop_back();
    while (!ext.empty() && ext.front() == '/') ext.erase(0, 1);
    if (!ext.empty()) out += ext + "/";
  }
  return out + name;
}

aws::WireResponse Error(const aws::AwsError& error, const aws::RequestContext& context) {
  return aws::SerializeError(aws::Protocol::kRestJson, error, context.request_id);
}

}  // namespace

bool SplitS3Uri(std::string_view uri, std::string* bucket, std::string* key) {
  if (!StartsWith(uri, "s3://")) return false;
  uri.remove_prefix(5);
  size_t slash = uri.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= uri.size()) return false;
  *bucket = std::string(uri.substr(0, slash));
  *key = std::string(uri.substr(slash + 1));
  return true;
}

aws::WireResponse AsyncInvoker::Invoke(std::string_view endpoint, const net::HttpRequest& request,
                                       const aws::RequestContext& context) const {
  auto header = [&](std::string_view name) { return request.Header(name); };
  // Headers (runtime-api.md §4.1).
  const std::string* input = header("X-Amzn-SageMaker-InputLocation");
  if (input == nullptr || input->empty()) {
    return Error(Validation("1 validation error detected: Value null at 'inputLocation' failed to satisfy "
                            "constraint: Member must not be null"),
                 context);
  }
  if (input->size() > 1024 || !(StartsWith(*input, "s3://") || StartsWith(*input, "https://"))) {
    return Error(Constraint(*input, "inputLocation",
                            "Member must satisfy regular expression pattern: ^(https|s3)://([^/]+)/?(.*)$"),
                 context);
  }
  std::string bucket, key;
  if (!SplitS3Uri(*input, &bucket, &key)) {
    return Error(Validation("The input location " + input->substr(0, 256) +
                            " must name an object as s3://bucket/key (Kiln reads inputs through its S3 store)."),
                 context);
  }
  for (const char* name : {"X-Amzn-SageMaker-Content-Type", "X-Amzn-SageMaker-Accept"}) {
    if (const std::string* value = header(name); value && (value->size() > 1024 || !IsAscii(*value))) {
      return Error(Constraint(*value, name == std::string_view("X-Amzn-SageMaker-Accept") ? "accept" : "contentType",
                              "Member must have length less than or equal to 1024 and be ASCII"),
                   context);
    }
  }
  const std::string* attributes = header("X-Amzn-SageMaker-Custom-Attributes");
  if (attributes && (attributes->size() > 1024 || !IsPrintable(*attributes))) {
    return Error(Constraint(*attributes, "customAttributes", "Member must have length less than or equal to 1024"),
                 context);
  }
  const std::string* client_id = header("X-Amzn-SageMaker-Inference-Id");
  if (client_id &&
      (client_id->empty() || client_id->size() > 64 || !IsPrintable(*client_id) || client_id->front() == ' ')) {
    return Error(Constraint(*client_id, "inferenceId",
                            "Member must have length between 1 and 64 and satisfy regular expression pattern: "
                            "\\A\\S[\\p{Print}]*\\z"),
                 context);
  }
  const std::string* extension = header("X-Amzn-SageMaker-S3OutputPathExtension");
  if (extension && (extension->size() > 512 || !IsOutputPathExtension(*extension))) {
    return Error(Constraint(*extension, "s3OutputPathExtension",
                            "Member must have length between 1 and 512 and satisfy regular expression pattern: "
                            "^(?!s3:|https:)[a-zA-Z0-9!_.*'()/-]+$"),
                 context);
  }
  const std::string* filename = header("X-Amzn-SageMaker-Filename");
  if (filename && (filename->size() > 32 || !IsFilename(*filename))) {
    return Error(Constraint(*filename, "filename",
                            "Member must have length between 1 and 32 and satisfy regular expression pattern: "
                            "^(?!.*\\..*\\.)[a-zA-Z0-9][a-zA-Z0-9-_\\.]*$"),
                 context);
  }
  int ttl = 21600;
  if (const std::string* value = header("X-Amzn-SageMaker-RequestTTLSeconds")) {
    std::optional<int64_t> n = ParseInt64(*value);
    if (!n || *n < 60 || *n > 21600) {
      return Error(Constraint(*value, "requestTTLSeconds",
                              "Member must have value greater than or equal to 60 and less than or equal to 21600"),
                   context);
    }
    ttl = static_cast<int>(*n);
  }
  int timeout = 900;
  if (const std::string* value = header("X-Amzn-SageMaker-InvocationTimeoutSeconds")) {
    std::optional<int64_t> n = ParseInt64(*value);
    if (!n || *n < 1 || *n > 3600) {
      return Error(Constraint(*value, "invocationTimeoutSeconds",
                              "Member must have value greater than or equal to 1 and less than or equal to 3600"),
                   context);
    }
    timeout = static_cast<int>(*n);
  }

  // The endpoint: asynchronous and in service.
  std::shared_ptr<const serving::EndpointRoute> route = deps_.routes->Find(endpoint);
  if (route == nullptr) {
    return Error(Validation("Endpoint " + std::string(endpoint) + " of account " + context.account_id + " not found."),
                 context);
  }
  const std::string& status = route->status;
  if (status != "InService" && status != "Updating" && status != "SystemUpdating" && status != "RollingBack") {
    return Error(Validation("Endpoint " + route->name + " is not in service."), context);
  }
  if (!route->async) {
    return Error(Validation("Endpoint " + route->name +
                            " is not configured for asynchronous inference (its endpoint configuration has no "
                            "AsyncInferenceConfig); call InvokeEndpoint instead."),
                 context);
  }
  const nlohmann::json config = nlohmann::json::parse(route->async_config, nullptr, false);
  const nlohmann::json output =
      config.is_object() && config.contains("OutputConfig") ? config["OutputConfig"] : nlohmann::json::object();

  // The input object must exist (Kiln checks before queuing).
  auto head = deps_.objects->HeadObject(bucket, key);
  if (!head.ok()) {
    if (head.status().code() == StatusCode::kNotFound) {
      return Error(Validation("The input location " + *input + " could not be read: no such object."), context);
    }
    return Error(Validation("The input location " + *input + " could not be read: " + head.status().message()),
                 context);
  }

  serving::AsyncRequest queued;
  queued.endpoint = route->name;
  queued.inference_id = client_id ? *client_id : NewUuid();
  queued.input_location = *input;
  if (const std::string* v = header("X-Amzn-SageMaker-Content-Type")) queued.content_type = *v;
  if (const std::string* v = header("X-Amzn-SageMaker-Accept")) queued.accept = *v;
  if (attributes) queued.custom_attributes = *attributes;
  const std::string ext = extension ? *extension : "";
  queued.output_location =
      JoinLocation(output.value("S3OutputPath", ""), ext, filename ? *filename : queued.inference_id + ".out");
  if (output.contains("S3FailurePath")) {
    queued.failure_location =
        JoinLocation(output["S3FailurePath"].get<std::string>(), ext, queued.inference_id + "-error.out");
  }
  queued.received_millis = NowMillis();
  queued.ttl_seconds = ttl;
  queued.invocation_timeout_seconds = timeout;
  Status enqueued = deps_.queue->Enqueue(queued);
  if (!enqueued.ok()) {
    if (enqueued.code() == StatusCode::kResourceExhausted) {
      return Error(aws::AwsError("ServiceUnavailable",
                                 "The request queue of endpoint " + route->name + " is full; retry later (" +
                                     enqueued.message() + ").",
                                 503),
                   context);
    }
    KLOG(error, "async request not queued", {{"endpoint", route->name}, {"error", enqueued.ToString()}});
    return Error(aws::AwsError("InternalFailure", "The request could not be queued: " + enqueued.message(), 500),
                 context);
  }

  aws::WireResponse answer;
  answer.status = 202;
  answer.headers = {{"Content-Type", "application/json"},
                    {"x-amzn-RequestId", context.request_id},
                    {"X-Amzn-SageMaker-OutputLocation", queued.output_location}};
  if (!queued.failure_location.empty()) {
    answer.headers.emplace("X-Amzn-SageMaker-FailureLocation", queued.failure_location);
  }
  answer.body = nlohmann::json{{"InferenceId", queued.inference_id}}.dump();
  return answer;
}

}  // namespace kiln::api
