#pragma once
// What the front door knows about a request once it has authenticated it; handed to every
// service handler.

#include <cstdint>
#include <string>

#include "aws/errors.h"
#include "aws/sigv4.h"

namespace kiln::aws {

struct RequestContext {
  std::string request_id;  // echoed in every response and log line
  Protocol protocol = Protocol::kJson11;
  std::string service;  // signing name: "s3", "sagemaker", "sts", "logs", ...
  // The verified signature (credential, signing key for chunk signatures, payload mode). Null
  // when authentication is off for the listener.
  const VerifiedRequest* auth = nullptr;
  std::string account_id;  // the account of the caller (Kiln's configured account)
  std::string region;      // the region the request was signed for (or Kiln's default)
  int64_t start_millis = 0;
  // The operation the service resolved ("PutObject", "ListTrainingJobs", ...), for the access
  // log. Services fill it in while handling; it is the only member they may change.
  mutable std::string operation;
};

}  // namespace kiln::aws
