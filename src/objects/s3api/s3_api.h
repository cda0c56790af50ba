#pragma once
// The S3 REST-XML front of an ObjectStore (spec/control-plane-api.md §10): turns authenticated
// HTTP requests into ObjectStore calls and S3-shaped responses and errors. Stateless apart from
// its options; thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "aws/request_context.h"
#include "net/http_server.h"
#include "objects/object_store.h"

namespace kiln::objects {

struct S3ApiOptions {
  // Host names (without port) under which virtual-hosted-style requests arrive:
  // "<bucket>.<suffix>". Requests whose Host is exactly a suffix, an IP or anything else use
  // path style.
  std::vector<std::string> virtual_host_suffixes = {"localhost"};
  std::string default_region = "us-east-1";
  std::string account_id = "000000000000";
  std::string owner_display_name = "kiln";
};

class S3Api {
 public:
  // `store` must outlive the S3Api.
  S3Api(S3ApiOptions options, ObjectStore* store);
  // Serves one request completely (response written, body consumed or connection marked to
  // close). Never throws; every failure becomes an S3 <Error> response.
  void Handle(const aws::RequestContext& context, net::HttpRequest& request, net::ResponseWriter& response);

 private:
  S3ApiOptions options_;
  ObjectStore* store_;
};

}  // namespace kiln::objects
