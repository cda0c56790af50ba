#pragma once
// InvokeEndpointAsync (spec/runtime-api.md §4, serving-contract.md §11.2–11.3): the front door
// hands it POST /endpoints/<name>/async-invocations once SigV4 and the path checks passed. It
// validates the headers, finds the endpoint in the routing snapshot (it must be asynchronous and
// in service), checks the input object exists (HeadObject through the object store), assigns the
// InferenceId (the client's, else a UUID), computes the output and failure locations, queues the
// request durably (serving::AsyncQueue) and answers 202 {"InferenceId"} with the
// X-Amzn-SageMaker-OutputLocation / -FailureLocation headers. A full queue is ServiceUnavailable.
// The request runs later (control::AsyncDispatcher).
//
// Thread-safe (no state of its own).

#include <string_view>

#include "aws/errors.h"
#include "aws/request_context.h"
#include "net/http_server.h"
#include "objects/object_store.h"
#include "serving/async_queue.h"
#include "serving/routing.h"

namespace kiln::api {

struct AsyncInvokerDeps {
  const serving::RoutingTable* routes = nullptr;
  objects::ObjectStore* objects = nullptr;
  serving::AsyncQueue* queue = nullptr;
};

class AsyncInvoker {
 public:
  explicit AsyncInvoker(AsyncInvokerDeps deps) : deps_(deps) {}

  // The REST-JSON answer to InvokeEndpointAsync on `endpoint` (the path's name, already checked
  // against the endpoint-name pattern).
  aws::WireResponse Invoke(std::string_view endpoint, const net::HttpRequest& request,
                           const aws::RequestContext& context) const;

 private:
  AsyncInvokerDeps deps_;
};

// "s3://bucket/key" → bucket, key; false for anything else (https:// included).
bool SplitS3Uri(std::string_view uri, std::string* bucket, std::string* key);

}  // namespace kiln::api
