#pragma once
// Private to src/net: the pieces of HttpServer that its files share. http_server.cc (the accept
// loop, the connection registry and limits, the worker threads) hands each accepted connection
// to ServeOneRequest (http_exchange.cc), which reads one request through FdReadStream and
// RequestBody (http_request_body.cc) and answers it through ResponseWriterImpl
// (http_response_writer.cc). Nothing here is for other modules.

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/system/system_error.hpp>

#include "base/status.h"
#include "net/http_server.h"
#include "net/socket_io.h"

namespace kiln::net::internal {

namespace beast = boost::beast;
namespace http = boost::beast::http;
using boost::system::error_code;

using RequestParser = http::request_parser<http::buffer_body>;

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

inline int MillisOrInfinite(int seconds) { return seconds > 0 ? seconds * 1000 : -1; }

inline int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The registry's view of one open connection, for the connection limits. Owned by the server's
// registry (HttpServerImpl::conns_, under mu_) from accept until the worker closes the fd; the
// worker serving it holds a pointer for that long.
struct ConnSlot {
  // kFresh: accepted, no byte read yet. kBusy: a request is being read or served (or bytes of
  // the next one are buffered). kIdle: a keep-alive connection between requests. kEvicted: closed
  // for room by the acceptor (terminal).
  // Transitions: worker kFresh/kIdle → kBusy (TryClaim, loses to an eviction) and kBusy → kIdle
  // (MarkIdle); acceptor kFresh/kIdle → kEvicted (CAS), after which it shuts the socket down.
  enum Phase : int { kFresh, kBusy, kIdle, kEvicted };

  uint64_t id = 0;  // accept order; unique for the server's lifetime
  int fd = -1;
  std::string address;  // remote IP without port: the per-address key
  std::atomic<int> phase{kFresh};
  std::atomic<int64_t> idle_since_ms{0};  // SteadyMillis() when it last became kFresh/kIdle

  // The connection got a request byte. False when the acceptor evicted it first.
  bool TryClaim() {
    int p = phase.load(std::memory_order_acquire);
    while (p == kFresh || p == kIdle) {
      if (phase.compare_exchange_weak(p, kBusy, std::memory_order_acq_rel)) {
        return true;
      }
    }
    return p == kBusy;
  }
  void MarkIdle() {
    idle_since_ms.store(SteadyMillis(), std::memory_order_relaxed);
    phase.store(kIdle, std::memory_order_release);
  }
  bool idle() const {
    int p = phase.load(std::memory_order_acquire);
    return p == kFresh || p == kIdle;
  }
};

// Per-connection state. A worker thread keeps one and reuses it (buffers keep their capacity)
// for every connection it serves.
struct Connection {
  int fd = -1;
  ConnSlot* slot = nullptr;  // the registry's entry; valid until Close()
  std::string remote_address;
  beast::flat_buffer buffer;
  // Set when the request stream may hold bytes we did not read (error paths, unread body).
  bool unread_input = false;
  // ResponseWriter::Upgrade released the slot (slot is then null): the socket is the handler's
  // (through a dup); the server only closes its own descriptor, without lingering or shutdown().
  bool upgraded = false;
  HttpRequest request;
  std::string head;  // response header scratch

  // The buffer allocates on first use (an idle connection on an event loop holds none).
  explicit Connection(size_t buffer_limit) : buffer(buffer_limit) {}
};

// The server's timeouts in milliseconds (-1: none, from HttpServerOptions) and its stop eventfd.
struct Limits {
  int io_timeout_ms;
  int idle_timeout_ms;
  int first_byte_timeout_ms;
  int header_timeout_ms;
  int wake_fd;
};

// What one request/response exchange needs from its server (HttpServerImpl owns all of it and
// outlives every exchange).
struct ServerContext {
  const HttpServerOptions& options;
  const Limits& limits;
  const Handler& handler;
  const std::atomic<bool>& stopping;  // Stop() began: answer with `Connection: close`
  // ResponseWriter::Upgrade: removes the connection's slot from the registry (its fd is not
  // closed) unless Stop() began; false then. Thread-safe.
  const std::function<bool(ConnSlot*)>& release_slot;
};

// A Beast SyncReadStream over a Connection's fd, with the deadlines of socket_io.h.
class FdReadStream {
 public:
  FdReadStream(Connection* conn, const Limits* limits) : conn_(conn), limits_(limits) {}

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, error_code& ec) {
    ec = {};
    auto it = boost::asio::buffer_sequence_begin(buffers);
    auto end = boost::asio::buffer_sequence_end(buffers);
    for (; it != end; ++it) {
      boost::asio::mutable_buffer b = *it;
      if (b.size() == 0) {
        continue;
      }
      Result<size_t> r = internal::RecvSome(conn_->fd, static_cast<char*>(b.data()), b.size(), limits_->io_timeout_ms);
      if (!r.ok()) {
        switch (r.status().code()) {
          case StatusCode::kDeadlineExceeded: ec = boost::asio::error::timed_out; break;
          case StatusCode::kAborted: ec = boost::asio::error::operation_aborted; break;
          default: ec = boost::asio::error::connection_reset;
        }
        return 0;
      }
      if (*r == 0) {
        ec = boost::asio::error::eof;
        return 0;
      }
      return *r;
    }
    return 0;
  }

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) {
      throw boost::system::system_error(ec);
    }
    return n;
  }

 private:
  Connection* conn_;
  const Limits* limits_;
};

inline bool IsPeerGone(const error_code& ec) {
  return ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset ||
         ec == http::error::end_of_stream || ec == http::error::partial_message;
}

// The request body: Content-Length (read directly), chunked (through the Beast parser), or none.
// Lives on the serving thread's stack for one exchange (http_request_body.cc).
class RequestBody final : public ByteSource {
 public:
  enum class Mode { kNone, kLength, kChunked };

  RequestBody(Connection* conn, const Limits* limits, RequestParser* parser, Mode mode, uint64_t content_length,
              bool expect_continue)
      : conn_(conn),
        limits_(limits),
        parser_(parser),
        mode_(mode),
        remaining_(content_length),
        expect_continue_(expect_continue),
        done_(mode == Mode::kNone || (mode == Mode::kLength && content_length == 0)) {}

  // ByteSource
  Result<size_t> Read(char* buf, size_t n) override;
  std::optional<uint64_t> size_hint() const override;

  // The response on the same connection; no "100 Continue" once it has started.
  void set_writer(const ResponseWriter* writer) { writer_ = writer; }
  bool done() const { return done_; }
  bool failed() const { return !error_.ok(); }
  // True when the client waits for "100 Continue" before sending a body we have not read.
  bool continue_pending() const { return expect_continue_ && !continue_sent_ && !done_; }
  // True when the client asked for "100 Continue" on an empty body and none was sent yet.
  bool empty_body_awaits_continue() const { return expect_continue_ && !continue_sent_ && done_; }
  // Body bytes still expected, when known.
  std::optional<uint64_t> known_remaining() const {
    if (mode_ == Mode::kLength) {
      return remaining_;
    }
    return done_ ? std::optional<uint64_t>(0) : std::nullopt;
  }

  // Reads and discards the rest of the body. Fails when more than `max` bytes remain, when the
  // body is broken, or when the client still waits for 100 Continue.
  Status Drain(uint64_t max);

 private:
  Status Fail(Status s) {
    error_ = std::move(s);
    return error_;
  }

  Result<size_t> ReadLength(char* buf, size_t n);
  Result<size_t> ReadChunked(char* buf, size_t n);

  Connection* conn_;
  const Limits* limits_;
  RequestParser* parser_;
  Mode mode_;
  uint64_t remaining_;  // kLength only
  uint64_t total_ = 0;
  bool expect_continue_;
  bool continue_sent_ = false;
  const ResponseWriter* writer_ = nullptr;
  bool done_;
  Status error_;  // sticky: once a Read failed, every later Read fails the same way
};

// The response of one exchange: framing (Content-Length, chunked, close-delimited), the server's
// headers, keep-alive decided at Start() (http_response_writer.cc).
class ResponseWriterImpl final : public ResponseWriter {
 public:
  struct RequestInfo {
    bool head = false;
    bool http10 = false;
    bool keep_alive = true;  // what the request asked for
  };

  ResponseWriterImpl(Connection* conn, const Limits* limits, const HttpServerOptions* options,
                     const std::atomic<bool>* stopping, RequestBody* body, RequestInfo info,
                     const std::function<bool(ConnSlot*)>* release_slot = nullptr)
      : conn_(conn),
        limits_(limits),
        options_(options),
        stopping_(stopping),
        body_(body),
        info_(info),
        release_slot_(release_slot) {}

  // ResponseWriter
  Status Start(int status, const HeaderMap& headers, std::optional<uint64_t> content_length) override;
  Status Write(std::string_view data) override;
  Status Finish() override;

  bool started() const override { return started_; }
  void CloseAfterResponse() override { close_requested_ = close_after_ = true; }
  // Releases the slot (release_slot), sends the 101, and hands over a blocking dup of the fd
  // with the bytes buffered past the head; sets conn->upgraded once the slot is released.
  Result<UpgradedConnection> Upgrade(const HeaderMap& headers) override;

  // For the connection loop.
  bool finished() const { return finished_; }
  bool failed() const { return !error_.ok(); }
  bool close_after() const { return close_after_; }
  // Completes a response the handler left open when that is safe; false when the connection
  // must be closed to signal a truncated response.
  bool Complete();

 private:
  enum class Mode { kNoBody, kLength, kChunked, kCloseDelimited };

  Status SendIov(iovec* iov, int count);

  Connection* conn_;
  const Limits* limits_;
  const HttpServerOptions* options_;
  const std::atomic<bool>* stopping_;
  RequestBody* body_;
  RequestInfo info_;
  const std::function<bool(ConnSlot*)>* release_slot_;  // null: cannot upgrade
  bool started_ = false;
  bool finished_ = false;
  bool head_pending_ = false;  // conn_->head holds a header not yet sent (coalesced with data)
  bool close_requested_ = false;
  bool close_after_ = false;
  Mode mode_ = Mode::kNoBody;
  uint64_t declared_ = 0;
  uint64_t written_ = 0;
  Status error_;
};

// Minimal response for errors the server answers itself (before or instead of the handler).
void WriteErrorResponse(int fd, int status, int timeout_ms);

// The blocking exchange, for a request header already read into `parser` by an event loop
// (http_exchange.cc): checks it (505, 400), fills conn.request, runs the handler, completes the
// response and drains what the handler left unread. Runs on a worker thread. Returns true to keep
// the connection for another request; on false the caller closes it (lingering when
// conn.unread_input is set).
bool ServeParsedRequest(Connection& conn, const ServerContext& server, RequestParser& parser);

// Fills conn.request from a parsed header (body left null).
void FillRequest(Connection& conn, const RequestParser::value_type& msg);

// The status answered for a header the parser refused: 431 (too large), 413 (declared body over
// the limit), else 400.
int HeaderErrorStatus(const error_code& ec);

// Appends a complete response head ("HTTP/1.1 <status> <reason>" ... blank line) to `out`: the
// handler's headers (minus framing ones and any with CR/LF), Date and Server unless given,
// Content-Length (not for 204), `Connection: close` when `close`, else `Connection: keep-alive`
// for HTTP/1.0.
void AppendResponseHead(std::string& out, int status, const HeaderMap& headers, std::optional<uint64_t> content_length,
                        bool close, bool http10);

}  // namespace kiln::net::internal
