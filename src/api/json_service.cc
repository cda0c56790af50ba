#include "api/json_service.h"

#include <exception>

#include "base/log.h"
#include "base/time.h"

namespace kiln::api {

JsonService::JsonService(std::string target_prefix, std::string signing_name, aws::Protocol protocol)
    : target_prefix_(std::move(target_prefix)), signing_name_(std::move(signing_name)), protocol_(protocol) {}

void JsonService::Register(std::string operation, JsonHandler handler) {
  handlers_[std::move(operation)] = std::move(handler);
}

aws::WireResponse JsonService::Handle(const aws::RequestContext& context, std::string_view operation,
                                      std::string_view body) const {
  // The body is decoded first: a malformed body is the caller's error whatever the operation.
  nlohmann::json input = nlohmann::json::object();
  if (!body.empty()) {
    Result<nlohmann::json> parsed = ParseJsonBounded(body, kRequestLimits);
    if (!parsed.ok()) {
      // Nesting and size limits are the caller's to fix, like malformed text; say which.
      std::string message = parsed.status().Is(ErrorReason::kMalformed)
                                ? "The request body is not a valid JSON object."
                                : "The request body was refused: " + parsed.status().message() + ".";
      return aws::SerializeError(protocol_, aws::AwsError("SerializationException", message), context.request_id);
    }
    input = std::move(parsed).value();
    if (!input.is_object()) {
      return aws::SerializeError(
          protocol_, aws::AwsError("SerializationException", "The request body is not a valid JSON object."),
          context.request_id);
    }
  }
  auto it = handlers_.find(std::string(operation));
  if (it == handlers_.end()) {
    // AWS answers an unknown target this way; naming the operation tells the user it is Kiln
    // that does not serve it yet, not a typo in their client.
    return aws::SerializeError(
        protocol_,
        aws::AwsError("UnknownOperationException",
                      "Operation " + target_prefix_ + "." + std::string(operation) + " is not supported by Kiln."),
        context.request_id);
  }
  if (model_) {
    if (auto invalid = model_->ValidateInput(operation, input)) {
      return aws::SerializeError(protocol_, *invalid, context.request_id);
    }
  }
  JsonOutcome outcome;
  try {
    outcome = it->second(context, input);
  } catch (const std::exception& e) {
    // nlohmann throws on type mismatches the validators missed: a Kiln bug, not the caller's.
    KLOG(error, "operation threw", {{"operation", operation}, {"what", e.what()}, {"request_id", context.request_id}});
    return aws::SerializeError(
        protocol_, aws::AwsError("InternalFailure", "Internal error; request id " + context.request_id, 500),
        context.request_id);
  }
  if (auto* error = std::get_if<aws::AwsError>(&outcome)) {
    return aws::SerializeError(protocol_, *error, context.request_id);
  }
  aws::WireResponse response;
  response.status = 200;
  response.headers.emplace("x-amzn-RequestId", context.request_id);
  response.headers.emplace("Content-Type", protocol_ == aws::Protocol::kJson10 ? "application/x-amz-json-1.0"
                                                                               : "application/x-amz-json-1.1");
  response.body = std::get<nlohmann::json>(outcome).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return response;
}

}  // namespace kiln::api
