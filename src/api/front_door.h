#pragma once
// The front door (DESIGN.md §2): every request on Kiln's one port passes here. It answers the
// health route, tells the AWS service apart (X-Amz-Target prefix, SigV4 credential scope, path),
// verifies SigV4 the same way for all of them, maps authentication failures to each protocol's
// error, hands the request to the service, and writes one access-log line.
//
// Dispatch, in order:
//   GET /_kiln/health                            → health (no auth)
//   X-Amz-Target: <prefix>.<Op>                  → the JsonService registered for <prefix>
//   scope "sts", or a form/query `Action=`        → STS (Query protocol)
//   scope "sagemaker" + /endpoints/…             → SageMaker Runtime (REST-JSON; later issue)
//   anything else                                → S3 (REST-XML)
//
// Thread-safe after construction and registration (the service table is read-only).

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/json_service.h"
#include "aws/credentials.h"
#include "net/http_server.h"
#include "objects/s3api/s3_api.h"

namespace kiln::api {

struct FrontDoorOptions {
  // false = accept unsigned requests (listener auth "off"); signed ones are still verified.
  bool auth_enabled = true;
  std::vector<std::string> regions = {"us-east-1"};
  // Accept any region in the credential scope (some tools sign for a fixed region).
  bool accept_any_region = false;
  std::string account_id = "000000000000";
  // JSON and Query bodies are read whole to hash them; larger ones get 413.
  size_t max_rpc_body_bytes = 16 * 1024 * 1024;
  std::string version;  // reported by the health route
};

class FrontDoor {
 public:
  // `credentials` and `s3` must outlive the FrontDoor.
  FrontDoor(FrontDoorOptions options, const aws::CredentialProvider* credentials, objects::S3Api* s3);

  // Registers a JSON service by its target prefix. Call before serving.
  void AddJsonService(std::unique_ptr<JsonService> service);

  // The net::Handler.
  void Handle(net::HttpRequest& request, net::ResponseWriter& response);

 private:
  struct Route;
  Route Classify(const net::HttpRequest& request) const;
  // Both verify the signature into `verified` (owned by Handle) and point context.auth at it.
  void ServeRpc(const Route& route, net::HttpRequest& request, net::ResponseWriter& response,
                aws::RequestContext& context, std::optional<aws::VerifiedRequest>& verified);
  void ServeS3(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
               std::optional<aws::VerifiedRequest>& verified);

  FrontDoorOptions options_;
  const aws::CredentialProvider* credentials_;
  objects::S3Api* s3_;
  std::map<std::string, std::unique_ptr<JsonService>> json_services_;  // by target prefix
};

// The AWS error a protocol answers for an authentication failure (spec/control-plane-api.md §3.6).
aws::AwsError AuthErrorFor(aws::Protocol protocol, const aws::AuthError& error);

}  // namespace kiln::api
