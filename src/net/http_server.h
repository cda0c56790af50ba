#pragma once
// HTTP/1.1 server (Boost.Beast/Asio underneath; nothing here exposes Beast).
//
// Model: one acceptor thread hands each connection to one of a fixed set of event loops
// (`event_loops`, one per core by default; Boost.Asio underneath), which owns it until it closes:
// idle keep-alive connections cost memory only. A loop reads and bounds each request header, then
// either serves the request itself through the AsyncService, when one is given and claims it
// (never blocking: the invoke path), or hands the connection to a worker thread (at most
// `worker_threads`) that calls the Handler with an HttpRequest whose body is a ByteSource
// pulling from the socket: bodies stream through, never buffered whole. See src/net/README.md.
//
// Connection limits (what an unauthenticated client can hold):
//   - A new connection must send its first byte within `first_byte_timeout_seconds`, and each
//     request header must be complete within `header_timeout_seconds` of its first byte.
//   - At most `max_connections_per_address` connections are open from one IP address, and at most
//     `max_connections` in all.
//   - When a new connection would pass either limit, an *idle* connection is closed to make room
//     (plain close, no bytes sent): first those that never sent a byte, then keep-alive ones
//     between requests, oldest first; for the per-address limit only that address's. Only when
//     every connection in the way is in the middle of a request is the new one refused, with
//     `503 Service Unavailable` + `Connection: close`. Many idle connections therefore cannot lock
//     new clients out (nginx and Envoy shed idle connections under overload the same way).
//   - When accept() fails for lack of descriptors (EMFILE/ENFILE) or memory, an idle connection is
//     closed to free one; with none to close, the acceptor backs off 100 ms at a time (no spin).
//
// Thread-safety: the Handler is called concurrently from the worker threads; the AsyncService
// from every loop's thread.
//
//   auto server = HttpServer::Create(options, [](HttpRequest& req, ResponseWriter& out) {
//     out.Send(200, {{"Content-Type", "text/plain"}}, "hello");
//   });
//   RETURN_IF_ERROR((*server)->Start());
//   ... (*server)->Stop();

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/fs.h"
#include "base/io.h"
#include "base/status.h"
#include "net/http_client.h"

namespace kiln::net {

struct HttpRequest {
  std::string method;     // "GET", "PUT", ... as sent (upper-case by HTTP convention)
  std::string target;     // the raw request-target: "/bucket/a%20b?list-type=2"
  std::string raw_path;   // target up to '?', still percent-encoded
  std::string raw_query;  // after the first '?', without it; empty when absent
  int http_version = 11;  // 10 or 11
  HeaderMap headers;
  std::string remote_address;  // "ip:port"
  // The request body. Never null; owned by the server; valid until the handler returns. Handles
  // Content-Length and Transfer-Encoding: chunked; 0 at the end. When the client sent
  // `Expect: 100-continue`, the first Read sends "100 Continue".
  ByteSource* body = nullptr;

  const std::string* Header(std::string_view name) const { return FindHeader(headers, name); }
  std::string HeaderOr(std::string_view name, std::string_view fallback) const {
    const std::string* v = Header(name);
    return v ? *v : std::string(fallback);
  }
};

// A connection the server handed over with ResponseWriter::Upgrade (HTTP/1.1 Upgrade, RFC 9110
// §7.8): from then on it is the caller's alone.
struct UpgradedConnection {
  // The client's socket, in blocking mode, TCP_NODELAY set. The caller closes it (UniqueFd does).
  UniqueFd fd;
  // Bytes the client sent after the request head that the server had already read: they come
  // before anything read from `fd` (a client may send its first protocol bytes right after the
  // head, without waiting for the 101).
  std::string buffered;
};

// Writes one response. Start() once, then Write() zero or more times, then Finish(). The server
// adds `Date`, `Server`, `Connection` and (for a known length) `Content-Length`, or uses chunked
// encoding when the length is unknown. For HEAD requests, pass the length the GET would have and
// write nothing. Errors mean the connection is gone; the handler should stop writing.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual Status Start(int status, const HeaderMap& headers, std::optional<uint64_t> content_length) = 0;
  virtual Status Write(std::string_view data) = 0;
  virtual Status Finish() = 0;
  virtual bool started() const = 0;
  // Start + Write + Finish for a body held in memory.
  Status Send(int status, const HeaderMap& headers, std::string_view body);
  // Asks the server to close the connection after this response (e.g. unread body on error).
  virtual void CloseAfterResponse() = 0;
  // Instead of a response: answers `101 Switching Protocols` with `headers` (they must name the
  // protocol in `Upgrade`; `Connection: Upgrade` is added when absent; Date and Server as for any
  // response; Content-Length and Transfer-Encoding are dropped) and hands the connection to the
  // caller. From then on the server neither reads, writes, times out nor closes that socket, and
  // Stop() leaves it alone; it stops counting in HttpServerStats::open_connections at once (not
  // when the handler returns). The handler then returns normally, typically after passing the
  // connection to a thread of its own; Start/Write/Finish/Upgrade fail from then on.
  // Errors: FailedPrecondition — a response was started, the request has a body (chunked, or a
  // Content-Length above 0), is HTTP/1.0 or HEAD, or the connection was already upgraded;
  // InvalidArgument — no `Upgrade` header in `headers`, or CR/LF in one; Unavailable — the server
  // is stopping, or the 101 could not be sent (the client is gone; the connection stays the
  // server's, which closes it); Unimplemented — this writer cannot upgrade (the default, e.g.
  // writers that only record). Only the server's blocking Handler path can upgrade.
  virtual Result<UpgradedConnection> Upgrade(const HeaderMap& headers);
};

using Handler = std::function<void(HttpRequest& request, ResponseWriter& response)>;

class EventLoop;

// One request served on its connection's event loop (see AsyncService). Valid from Serve() until
// Respond() has been called, even when the client goes away meanwhile (Respond then discards).
class AsyncExchange {
 public:
  // The request header. `body` is null: the whole body is body().
  virtual const HttpRequest& request() const = 0;
  virtual std::string_view body() const = 0;
  // The loop serving the connection: its client() is the upstream pool to use.
  virtual EventLoop& loop() = 0;
  // steady_clock time (ns since its epoch) when the request's first byte was read.
  virtual int64_t start_steady_ns() const = 0;
  // Sends the whole response (the server adds Date, Server, Connection, Content-Length; for HEAD,
  // pass the body the GET would have: only its length is sent) and ends the exchange. Exactly
  // once, on the loop's thread.
  virtual void Respond(int status, const HeaderMap& headers, std::string body) = 0;
  // Closes the connection after the response.
  virtual void CloseAfterResponse() = 0;

 protected:
  ~AsyncExchange() = default;
};

// Requests a server serves on its event loops instead of on a worker thread: the invoke path,
// which never blocks (routing snapshot, SigV4, a pooled upstream connection on the same loop).
// Everything else (SQLite-backed API calls, object-store disk I/O) goes to the blocking Handler.
class AsyncService {
 public:
  virtual ~AsyncService() = default;
  // On the loop thread, once a request header is read: true to serve it with Serve(). Only
  // requests whose body has a Content-Length no larger than max_body_bytes() (or no body) and no
  // `Expect: 100-continue` are offered; the rest always go to the Handler.
  virtual bool Claims(const HttpRequest& head) const = 0;
  virtual size_t max_body_bytes() const = 0;
  // On the loop thread, with the body read whole. Must lead to exchange.Respond() exactly once
  // (on the loop thread; it may be later, from a completion on the same loop). Must not block.
  virtual void Serve(AsyncExchange& exchange) = 0;
};

struct HttpServerOptions {
  // "host:port"; port 0 picks a free port (see HttpServer::port()). IPv6 as "[::1]:5456".
  std::string listen = "127.0.0.1:5456";
  // Request line + headers. Larger → 431 and close. Raising it costs memory per connection.
  size_t max_header_bytes = 64 * 1024;
  // Upper bound for any request body; larger declared bodies → 413 before the handler runs, and
  // streamed bodies fail with ResourceExhausted once past it. Handlers apply tighter limits.
  uint64_t max_body_bytes = 5ull * 1024 * 1024 * 1024 + 64 * 1024 * 1024;
  // Connections open at once, in all. An idle one costs memory only (no thread; about 3 KB here,
  // bench/idle_connections_bench.py, plus the kernel's socket), so the bound is descriptors and memory: the server
  // process needs an RLIMIT_NOFILE above it (kiln raises its soft limit to the hard one). At the
  // cap an idle connection is closed for a new one; see the class comment.
  size_t max_connections = 16384;
  // Connections open at once from one IP address (IPv4-mapped IPv6 counts as the IPv4 address).
  // Loopback is not exempt: every local client, including jobs and endpoint containers calling
  // back, shares 127.0.0.1. Behind a proxy or NAT that funnels all clients through one address,
  // raise it up to max_connections. Lowering it below a client's concurrency makes that client see
  // 503s.
  size_t max_connections_per_address = 4096;
  // A new connection that sends no byte within this long is closed (a client that connects ahead
  // of time, as connection pools may, must send its request within it). 0 or less: no limit.
  int first_byte_timeout_seconds = 10;
  // A keep-alive connection idle this long between requests is closed.
  int idle_timeout_seconds = 75;
  // A read or write that makes no progress this long fails (slowloris protection).
  int io_timeout_seconds = 120;
  // The whole request header must arrive within this long of its first byte, however slowly it
  // trickles; otherwise the connection is closed. 0 or less: no limit.
  int header_timeout_seconds = 30;
  // After the handler returns with body bytes unread, up to this many are drained to keep the
  // connection; beyond that it is closed.
  uint64_t max_drain_bytes = 1 << 20;
  // Event loops serving connections (each a thread). 0: one per core.
  size_t event_loops = 0;
  // Threads running the blocking Handler (requests in flight to it; idle connections hold none).
  // Requests beyond it wait in a queue. Started on demand, kept until Stop.
  size_t worker_threads = 256;
  // A worker idle this long exits (all but one), so a burst's threads do not stay for good.
  int worker_idle_seconds = 60;
  // The loops' upstream clients (AsyncExchange::loop().client()).
  HttpClientOptions upstream;
};

// Counters for logs, /metrics and tests. Every field is a snapshot; cumulative ones never reset.
struct HttpServerStats {
  size_t open_connections = 0;           // accepted and not yet closed (queued or served)
  size_t idle_connections = 0;           // of those, waiting for a first byte or between requests
  uint64_t accepted = 0;                 // connections admitted since Start
  uint64_t evicted = 0;                  // idle connections closed to make room for a new one
  uint64_t refused = 0;                  // new connections answered 503 (limits reached, nothing idle)
  uint64_t accept_errors = 0;            // accept() failures for lack of descriptors or memory
  size_t upstream_idle_connections = 0;  // pooled by the loops' upstream clients, all loops
};

class HttpServer {
 public:
  virtual ~HttpServer() = default;
  // Binds and listens (so port() is valid), but serves nothing until Start().
  // Errors: InvalidArgument (bad listen string), Unavailable (address in use), PermissionDenied.
  // `async` (optional, not owned, must outlive the server) serves the requests it claims on the
  // event loops.
  static Result<std::unique_ptr<HttpServer>> Create(HttpServerOptions options, Handler handler,
                                                    AsyncService* async = nullptr);
  virtual uint16_t port() const = 0;
  // Starts the acceptor and returns immediately.
  virtual Status Start() = 0;
  // Stops accepting, lets requests in flight finish (up to `grace_seconds`), then closes every
  // connection and joins all threads. Idempotent.
  virtual void Stop(int grace_seconds = 10) = 0;
  // Thread-safe; cheap (one mutex, a scan of the open connections).
  virtual HttpServerStats stats() const = 0;
  // Closes every loop's idle upstream connections to host:port (an instance going away), as
  // HttpClient::Forget does for one client. Thread-safe; takes effect on each loop shortly after.
  virtual void ForgetUpstream(const std::string& host, uint16_t port) = 0;
};

// Splits "host:port" / "[v6]:port" into parts. InvalidArgument when malformed.
Status ParseHostPort(std::string_view text, std::string* host, uint16_t* port);
// True when `host` is a loopback name or address (localhost, 127.0.0.0/8, ::1).
bool IsLoopbackHost(std::string_view host);

}  // namespace kiln::net
