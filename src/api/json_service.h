#pragma once
// An AWS JSON 1.0/1.1 service (SageMaker, CloudWatch Logs, Application Auto Scaling, ...):
// `POST /` with `X-Amz-Target: <prefix>.<Operation>` and a JSON object body
// (spec/control-plane-api.md §2). Operations are registered once at start-up; the table is
// read-only afterwards, so Handle() is thread-safe.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "api/service_model.h"
#include "base/json_parse.h"
#include "aws/errors.h"
#include "aws/request_context.h"

namespace kiln::api {

// What an operation returns: its output structure, or the error to answer.
using JsonOutcome = std::variant<nlohmann::json, aws::AwsError>;
using JsonHandler = std::function<JsonOutcome(const aws::RequestContext& context, const nlohmann::json& input)>;

class JsonService {
 public:
  // Bounds applied while a body is parsed, before any copy or walk (the body's size is bounded by
  // the front door). No AWS request shape nests anywhere near 64 levels; 200,000 values hold the
  // largest legitimate requests (PutLogEvents' 10,000 events are 30,000) and bound a document's
  // DOM to ~20 MB however its text is shaped.
  static constexpr JsonLimits kRequestLimits{.max_depth = 64, .max_bytes = 0, .max_values = 200000};

  // `target_prefix`: "SageMaker", "Logs_20140328", ...; `signing_name`: "sagemaker", "logs", ...
  JsonService(std::string target_prefix, std::string signing_name, aws::Protocol protocol);

  const std::string& target_prefix() const { return target_prefix_; }
  const std::string& signing_name() const { return signing_name_; }
  aws::Protocol protocol() const { return protocol_; }

  void Register(std::string operation, JsonHandler handler);
  // Validates every request against `model` before its handler runs (call at start-up, before
  // serving). Operations the model does not know are not validated; nullptr turns validation off.
  void SetModel(std::shared_ptr<const ServiceModel> model) { model_ = std::move(model); }
  bool Has(std::string_view operation) const { return handlers_.count(std::string(operation)) > 0; }

  // Decodes `body`, runs the operation and encodes the answer. Malformed JSON, a non-object
  // body, or one past kRequestLimits → SerializationException (checked first); unknown operation →
  // UnknownOperationException naming it; with a model set, an input that fails the model →
  // the model's ValidationException/SerializationException (the handler does not run); a handler
  // that throws → InternalFailure (logged).
  aws::WireResponse Handle(const aws::RequestContext& context, std::string_view operation, std::string_view body) const;

 private:
  std::string target_prefix_;
  std::string signing_name_;
  aws::Protocol protocol_;
  std::map<std::string, JsonHandler> handlers_;
  std::shared_ptr<const ServiceModel> model_;
};

}  // namespace kiln::api
