#pragma once
// EngineClient: a small synchronous HTTP/1.1 client for a container engine's Unix socket (Docker
// Engine API; http_engine.cc builds the typed calls on it). One connection per call, closed after
// the answer ("Connection: close"): a Unix connect costs microseconds, and no pooled connection can
// go stale when the engine restarts. Requests are written and answers parsed with Boost.Beast over
// an Asio local stream socket in non-blocking mode; every wait is a poll() on the socket with a
// bounded timeout, so a call never blocks past its deadline (Call) or past 200 ms without asking
// its `cancelled` predicate (Stream).
//
//   EngineClient client("/run/podman/podman.sock");
//   auto answer = client.Call({.method = "GET", .target = "/v1.41/version"}, 30000);
//
// Errors (both calls): Unavailable "the container engine at unix://<path> is unreachable: <why>"
// when connecting fails or the connection breaks before the whole answer came; Internal when the
// engine's answer is not HTTP. An HTTP error status is not an error here: the caller maps it.
//
// Thread-safety: immutable after construction; calls may run on any threads at once.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kiln::runtime::docker {

struct EngineHttpRequest {
  std::string method = "GET";
  std::string target = "/";  // origin-form, already percent-encoded: "/v1.41/containers/json?all=1"
  std::string body;          // sent with Content-Type application/json when not empty
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (X-Registry-Auth)
};

struct EngineHttpResponse {
  int status = 0;
  std::string body;
};

// "unix:///run/podman/podman.sock" or a plain path → the socket's path.
std::string EngineSocketPath(std::string_view socket);

class EngineClient {
 public:
  // `socket`: "unix://<path>" or a plain path.
  explicit EngineClient(std::string_view socket);

  // "unix://<path>", for messages.
  const std::string& address() const { return address_; }

  // Sends `request` and reads the whole answer. DeadlineExceeded when connecting, sending and
  // reading together take longer than `timeout_ms`; ResourceExhausted when the body is larger
  // than `max_body_bytes`.
  Result<EngineHttpResponse> Call(const EngineHttpRequest& request, int timeout_ms,
                                  uint64_t max_body_bytes = 64u << 20) const;

  // Sends `request` and, for a 2xx answer, hands the body to `on_data` piece by piece as it
  // arrives (chunked, Content-Length or close-delimited; pieces have no relation to chunk or
  // message boundaries) until it ends. A non-2xx answer's body is read whole (up to 1 MiB) into
  // `error_body` instead. Returns the HTTP status. `on_data` returning non-OK stops the call with
  // that status. `cancelled` is asked before each wait and at least every 200 ms while waiting;
  // true stops the call with Aborted. No deadline otherwise (a followed log may stay quiet for
  // hours).
  Result<int> Stream(const EngineHttpRequest& request, const std::function<Status(std::string_view)>& on_data,
                     const std::function<bool()>& cancelled, std::string* error_body) const;

 private:
  std::string path_;
  std::string address_;
};

}  // namespace kiln::runtime::docker
