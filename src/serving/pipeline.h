#pragma once
// Multi-container endpoints and inference pipelines (serving-contract.md §8): the pure pieces of
// the router's Direct and Serial calls (router.cc runs them), unit-tested without a network.
//
//   Direct  X-Amzn-SageMaker-Target-Container-Hostname names the one container called
//           (FindContainer); missing, unknown, or sent to an endpoint without Direct variants →
//           ValidationError (router.cc).
//   Serial  every container of the instance in the model's order: the client's body to the first,
//           each answer's body to the next with Content-Type = that answer's Content-Type
//           (octet-stream when it gave none); Accept only to the last (intermediate containers
//           answer in their default format); X-Amzn-SageMaker-Custom-Attributes (and the
//           inference id, request id, session id) to every container (PipelineHopHeaders). The
//           invocation budget covers the whole chain (RemainingBudgetMs); a non-2xx or a failed
//           call stops it with a ModelError naming that container.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>

#include "net/http_client.h"
#include "serving/routing.h"

namespace kiln::serving {

// The index in instance.containers of the container called `hostname`; -1 when none.
int FindContainer(const InstanceTarget& instance, std::string_view hostname);

// The headers container `index` (0-based) of a `count`-container pipeline gets, from `forward`
// (the client's, as ForwardHeaders built them) and the previous container's answer Content-Type
// (`previous_content_type`, null when it gave none; ignored for the first container).
HeaderMap PipelineHopHeaders(const HeaderMap& forward, size_t index, size_t count,
                             const std::string* previous_content_type);

// The milliseconds of a `budget_ms` budget started at `start_ns` left at `now_ns` (steady clock
// nanoseconds); 0 when it is spent.
int RemainingBudgetMs(int64_t start_ns, int64_t now_ns, int budget_ms);

}  // namespace kiln::serving
