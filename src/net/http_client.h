#pragma once
// HTTP/1.1 client with pooled keep-alive connections, for the invoke path (a request from the
// router to a serving container) and Kiln's own health pings.
//
// Model: blocking calls on the caller's thread over plain non-blocking fds with deadlines, like
// the server, but with the client's own send and receive loops (http_client.cc,
// http_response_reader.cc), not the server's socket_io.h RecvSome/SendAll: every wait here also
// watches the call's CancelSignal and counts against one deadline for the whole call rather than
// one per wait (only the single sendmsg step, SendSome, is shared). Per target ("host:port") the
// pool keeps idle connections in LIFO order (the most recently used one is the warmest); a call
// takes one (or connects), sends the request, reads the whole response, and gives the connection
// back when the response allows keep-alive. Responses are parsed by Beast's
// http::response_parser, the parser the server uses for requests. Per request the hot path
// allocates the response and the parser's field list, nothing else: request heads are formatted
// into a thread-local buffer and sent with the body in one sendmsg, and responses are read
// through a thread-local buffer. After reading part of a response and before waiting for the
// rest, the client sets TCP_QUICKACK (a peer that writes its head and body in two segments with
// Nagle's algorithm on otherwise waits up to 40 ms for our delayed ACK).
//
// Retrying: a reused connection may have been closed by the peer while idle. When sending on a
// reused connection fails, or it yields EOF/reset before the first byte of a response, the
// request is sent once more on a fresh connection: the server cannot have processed it (it never
// answered and HTTP/1.1 servers close idle connections only between requests). A fresh
// connection is never retried here (the caller decides, e.g. the router tries another instance).
//
// Cancelling: a call may carry a CancelSignal (ClientRequest::cancel). Once the signal is set,
// a call not yet sent fails at once with Unavailable (nothing was delivered) and a call being sent
// or waiting for its response stops waiting and fails with Aborted (the peer may have processed
// the request). The router uses one per serving instance, set when the instance is declared failed.
//
// Thread-safety: every method may be called from any thread.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/io.h"
#include "base/mutex.h"
#include "base/status.h"

namespace kiln::net {

// A one-shot signal that cuts the calls carrying it. Cancel() sets it for good; it is never reset.
//
// Cost for a call that carries it: one acquire load before sending and one more fd in each
// poll() of the call (an eventfd, written once by Cancel() and never read, so it stays readable:
// a call that starts waiting after Cancel() still sees it). No lock on the call's path.
// If no eventfd can be created (the process is out of fds), waiting calls check the flag every
// 20 ms instead. Thread-safe; must outlive every call that carries it.
class CancelSignal {
 public:
  CancelSignal();
  ~CancelSignal();
  CancelSignal(const CancelSignal&) = delete;
  CancelSignal& operator=(const CancelSignal&) = delete;

  // Sets the signal and wakes every call waiting on it. `reason` says why, for the error the
  // caller gives its client; only the first call's reason is kept (later calls do nothing).
  void Cancel(std::string reason) EXCLUDES(mu_);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // The reason given to Cancel() (empty while not cancelled).
  std::string reason() const EXCLUDES(mu_);
  // Readable once cancelled; -1 when the eventfd could not be created.
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  mutable Mutex mu_;
  std::string reason_ GUARDED_BY(mu_);  // written once, before cancelled_ is set
  std::atomic<bool> cancelled_{false};
};

struct ClientRequest {
  std::string_view method = "POST";
  std::string_view target = "/";  // origin-form: "/invocations"
  // Extra headers. The client adds Host and Content-Length itself (and ignores those two here).
  const HeaderMap* headers = nullptr;
  std::string_view body;  // the whole body (invoke bodies are read before signing anyway)
  // Optional: cuts the call when set (see "Cancelling" above). Not owned.
  const CancelSignal* cancel = nullptr;
};

struct ClientResponse {
  int status = 0;
  HeaderMap headers;
  std::string body;  // Content-Length, chunked and close-delimited bodies are all read whole
};

struct ClientTimeouts {
  // TCP connect (spec/serving-contract.md §5.2: the container must accept within 250 ms).
  int connect_ms = 250;
  // From the request being sent until the whole response has been read.
  int response_ms = 60000;
};

struct HttpClientOptions {
  // Idle connections kept per target; further ones are closed when given back.
  size_t max_idle_per_target = 256;
  // An idle connection older than this is closed instead of reused (servers commonly close idle
  // keep-alive connections after 60-75 s; staying below avoids racing them).
  int max_idle_ms = 20000;
  // A response body longer than this fails with ResourceExhausted (the connection is closed).
  size_t max_response_body_bytes = 6 * 1024 * 1024;
  // Response status line + headers.
  size_t max_response_header_bytes = 64 * 1024;
};

class HttpClient {
 public:
  explicit HttpClient(HttpClientOptions options = {});
  ~HttpClient();  // closes every idle connection
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends `request` to host:port (an IPv4/IPv6 literal or "localhost"; no DNS beyond that is
  // needed on the invoke path) and reads the whole response.
  // Errors (the router maps each to a runtime-API error, spec/runtime-api.md §5):
  //   Unavailable       — could not connect (refused, unreachable, or not accepted in connect_ms),
  //                       or request.cancel was already set (nothing was sent)
  //   Aborted           — connected and sent, but the peer closed or reset the connection before
  //                       a complete response (also after the one retry described above), or
  //                       request.cancel was set while the call was sending or waiting (the
  //                       message then carries the signal's reason)
  //   DeadlineExceeded  — no complete response within response_ms
  //   DataLoss          — the response is not valid HTTP/1.1
  //   ResourceExhausted — the response body exceeds max_response_body_bytes
  // Any HTTP status (including 4xx/5xx) is a successful result.
  Result<ClientResponse> Send(const std::string& host, uint16_t port, const ClientRequest& request,
                              const ClientTimeouts& timeouts);

  // Closes the idle connections to host:port (an instance that is going away).
  void Forget(const std::string& host, uint16_t port);

  // Idle connections held, over all targets (tests and /metrics).
  size_t idle_connections() const;

 private:
  struct Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace kiln::net
