#include "aws/errors.h"

#include <nlohmann/json.hpp>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/time.h"

namespace kiln::aws {
namespace {

// Error bodies keep member order (code first) so that they read like AWS's own.
std::string JsonBody(const AwsError& error, bool with_type) {
  nlohmann::ordered_json body;
  if (with_type) {
    body["__type"] = error.code;
  }
  body["message"] = error.message;
  body["Message"] = error.message;
  for (const auto& [name, value] : error.fields) {
    body[name] = value;
  }
  for (const auto& [name, value] : error.int_fields) {
    body[name] = value;
  }
  // Replace invalid UTF-8 rather than throw: messages may quote client input.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// S3's x-amz-id-2 is an opaque base64 token; Kiln derives it from the request id so the
// header and the <HostId> element agree and tests are deterministic.
std::string HostId(std::string_view request_id) { return Base64Encode(Sha256(request_id)); }

std::string XmlElement(std::string_view name, std::string_view value) {
  std::string out;
  out.append("<").append(name).append(">").append(XmlEscape(value)).append("</").append(name).append(">");
  return out;
}

}  // namespace

WireResponse SerializeError(Protocol protocol, const AwsError& error, std::string_view request_id, bool head_request) {
  WireResponse response;
  response.status = error.http_status;
  HeaderMap& headers = response.headers;
  switch (protocol) {
    case Protocol::kJson11:
    case Protocol::kJson10: {
      headers.emplace("x-amzn-RequestId", std::string(request_id));
      headers.emplace("x-amzn-ErrorType", error.code);
      headers.emplace("Content-Type",
                      protocol == Protocol::kJson11 ? "application/x-amz-json-1.1" : "application/x-amz-json-1.0");
      if (protocol == Protocol::kJson10) {
        headers.emplace("x-amzn-query-error", error.code + (error.sender_fault ? ";Sender" : ";Receiver"));
      }
      response.body = JsonBody(error, /*with_type=*/true);
      break;
    }
    case Protocol::kRestJson: {
      headers.emplace("x-amzn-RequestId", std::string(request_id));
      headers.emplace("x-amzn-ErrorType", error.code);
      headers.emplace("Content-Type", "application/json");
      response.body = JsonBody(error, /*with_type=*/false);
      break;
    }
    case Protocol::kRestXml: {
      std::string host_id = HostId(request_id);
      headers.emplace("x-amz-request-id", std::string(request_id));
      headers.emplace("x-amz-id-2", host_id);
      headers.emplace("Content-Type", "application/xml");
      std::string& body = response.body;
      body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>";
      body += XmlElement("Code", error.code);
      body += XmlElement("Message", error.message);
      for (const auto& [name, value] : error.fields) {
        body += XmlElement(name, value);
      }
      for (const auto& [name, value] : error.int_fields) {
        body += XmlElement(name, std::to_string(value));
      }
      body += XmlElement("RequestId", request_id);
      body += XmlElement("HostId", host_id);
      body += "</Error>";
      break;
    }
    case Protocol::kQuery: {
      headers.emplace("x-amzn-RequestId", std::string(request_id));
      headers.emplace("Content-Type", "text/xml");
      std::string& body = response.body;
      body = "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><Error>";
      body += XmlElement("Type", error.sender_fault ? "Sender" : "Receiver");
      body += XmlElement("Code", error.code);
      body += XmlElement("Message", error.message);
      for (const auto& [name, value] : error.fields) {
        body += XmlElement(name, value);
      }
      body += "</Error>";
      body += XmlElement("RequestId", request_id);
      body += "</ErrorResponse>";
      break;
    }
  }
  // SDKs correct their clock skew from the Date of an error response (spec §3.1 step 4).
  headers.emplace("Date", FormatRfc1123(NowMillis()));
  if (head_request) {
    response.body.clear();
  }
  return response;
}

AwsError ErrorFromStatus(Protocol protocol, const Status& status) {
  const bool s3 = protocol == Protocol::kRestXml;
  AwsError error;
  error.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      error.code = s3 ? "InvalidArgument" : protocol == Protocol::kQuery ? "ValidationError" : "ValidationException";
      error.http_status = 400;
      error.sender_fault = true;
      break;
    case StatusCode::kPermissionDenied:
      error.code = (s3 || protocol == Protocol::kQuery) ? "AccessDenied" : "AccessDeniedException";
      error.http_status = (protocol == Protocol::kJson11 || protocol == Protocol::kJson10) ? 400 : 403;
      error.sender_fault = true;
      break;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      error.code = s3 ? (status.code() == StatusCode::kResourceExhausted ? "InternalError" : "ServiceUnavailable")
                      : "ServiceUnavailable";
      error.http_status = 503;
      error.sender_fault = false;
      break;
    default:
      error.code = s3 ? "InternalError" : "InternalFailure";
      error.http_status = 500;
      error.sender_fault = false;
      break;
  }
  if (error.message.empty()) {
    error.message = error.code;
  }
  return error;
}

}  // namespace kiln::aws
