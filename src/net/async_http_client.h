#pragma once
// AsyncHttpClient: HttpClient's asynchronous twin, for the invoke path. One lives on each
// EventLoop (EventLoop::client()) and is used only from that loop's thread: its pool of idle
// keep-alive connections is per loop, so a proxied request takes a connection owned by the
// thread that read the client's request and is relayed without a lock or a thread hop.
//
// Same contract as HttpClient::Send (http_client.h): the same errors (Unavailable, Aborted,
// DeadlineExceeded, DataLoss, ResourceExhausted), the same retry rule (a reused connection that
// fails before the first response byte is retried once on a fresh one), the same request head
// rules and limits (HttpClientOptions), Beast's response parser (one HTTP/1.1 parser for both
// directions), TCP_NODELAY, and TCP_QUICKACK re-armed after every read (a container that writes
// its answer in two segments with Nagle on must not cost a delayed-ACK stall).
//
// Timeouts and cancellation: connect_ms, response_ms and ClientRequest::cancel are checked by one
// sweep timer per client that runs only while calls are in flight (resolution kSweepMillis), so
// no timer is armed or cancelled per request.
//
// Thread-safety: everything on the owning loop's thread, except idle_connections().

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "net/http_client.h"

namespace boost::asio {
class io_context;
}

namespace kiln::net {

class AsyncHttpClient {
 public:
  // Resolution of the connect/response deadlines and of noticing a CancelSignal.
  static constexpr int kSweepMillis = 20;

  using Callback = std::function<void(Result<ClientResponse>)>;

  AsyncHttpClient(boost::asio::io_context& io, HttpClientOptions options);
  ~AsyncHttpClient();  // calls Shutdown()
  AsyncHttpClient(const AsyncHttpClient&) = delete;
  AsyncHttpClient& operator=(const AsyncHttpClient&) = delete;

  // Sends `request` to host:port (IP literal or "localhost") and reads the whole response.
  // `done` runs exactly once, on the loop's thread, never inline. What `request` points to
  // (target, headers, body, cancel) must stay valid until `done` runs. Errors as HttpClient::Send.
  void Send(const std::string& host, uint16_t port, const ClientRequest& request, const ClientTimeouts& timeouts,
            Callback done);

  // Closes the idle connections to host:port.
  void Forget(const std::string& host, uint16_t port);

  // Fails every call in flight with Aborted ("the server is shutting down") and closes every
  // connection. Those calls' callbacks run here, before Shutdown returns (EventLoop::Run calls it
  // after its loop has stopped, when nothing would run a posted one). Later Sends fail at once
  // (asynchronously) with Unavailable. Idempotent.
  void Shutdown();

  // Idle pooled connections (any thread; a relaxed snapshot for /metrics and tests).
  size_t idle_connections() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln::net
