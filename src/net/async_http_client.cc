// AsyncHttpClient: see async_http_client.h. Design notes:
//
// - Asio completion handlers (callbacks), not C++20 coroutines: clang 14 with Boost 1.74 does not
//   enable asio::awaitable (CI's sanitizer / thread-safety build is clang), and one heap object
//   per call (Call) with callbacks that capture only a shared_ptr to it allocates nothing per
//   await (Asio recycles its operation memory per thread).
// - Everything runs on the loop's thread: the pool (host:port → Target, idle connections LIFO)
//   needs no lock; only the idle count is an atomic, for idle_connections() from other threads.
// - A call: take a pooled connection (or connect), write the head and the body as one gather
//   write (the head formatted into a buffer that moves with the connection; the body straight
//   from the caller's string_view, no copy), then read with Beast's response parser: header
//   passes with async_read_some bounded by the budget left (Beast 1.74's header_limit counts per
//   pass; see ReadHeaderWithin in http_exchange.cc), 1xx interim responses skipped, then the body
//   (the bytes that came with the head parsed at once, eagerly) with async_read_some passes
//   until the parser is done. TCP_QUICKACK is armed after every read completion that leaves the
//   answer incomplete (Linux clears it), so a container that writes its answer in two segments
//   with Nagle on gets its ACK at once instead of after 40 ms.
// - Deadlines and cancellation: one steady_timer per client, armed only while calls are in
//   flight, fires every kSweepMillis and fails the calls whose connect/response deadline passed or
//   whose CancelSignal is set (a call already sent gets one more sweep period, so an answer the
//   loop has read or queued meanwhile wins, as in HttpClient); failing closes the call's socket, which completes its
//   pending operation with operation_aborted. Each handler first looks at Call::finished, so `done` runs exactly once
//   whatever completes first; the handlers' shared_ptr keeps the Call (its socket, buffer and parser, which a pending
//   operation references) alive until the last one has run.
// - Ownership: the client owns Impl through a shared_ptr; each Call in flight holds Impl too (its
//   handlers reach Impl through it), and Impl holds the Calls in flight (for the sweep) until
//   they finish, which breaks that cycle. The sweep timer's handler holds only a weak_ptr.

#include "net/async_http_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include "base/strings.h"
#include "net/http_client_internal.h"

namespace kiln::net {
namespace {

using internal::TargetKey;
using internal::TargetKeyEq;
using internal::TargetKeyHash;
using internal::TargetKeyView;

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;
using Parser = http::response_parser<http::string_body>;

// A pooled connection idle longer than this is probed (a non-blocking MSG_PEEK) before reuse, as
// HttpClient does: fresher ones skip the syscall and the retry rule covers the rare race.
constexpr auto kProbeAfterIdle = std::chrono::milliseconds(1000);

// A connection's read buffer: Beast reads at most the buffer's free capacity at once (512 bytes
// when empty), so each connection starts with this much, enough for a head and a small answer in
// one recv; a larger body gets the whole buffer limit (64 KiB by default) while it is read, and
// the connection goes back to the pool with this size again.
constexpr size_t kReadBufferBytes = 16 * 1024;

// One upstream connection. Its read buffer and head buffer are reused by every request it serves.
struct Conn {
  explicit Conn(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  boost::beast::flat_buffer buffer;  // response bytes read but not yet parsed
  std::string head;                  // the request head being sent
  TimePoint idle_since{};
};

// One "host:port": its address and its idle connections.
struct Target {
  tcp::endpoint endpoint;
  std::string name;                         // "127.0.0.1:8081" / "[::1]:8081": Host header and messages
  std::vector<std::unique_ptr<Conn>> idle;  // oldest first, so the back is the warmest
  bool forgotten = false;                   // Forget()/Shutdown() dropped it: connections given back close
};

// Linux clears TCP_QUICKACK after a while (sending turns delayed ACKs back on): armed after every
// read that leaves the answer incomplete, so the next segment of the answer is ACKed at once
// (setting it also sends an ACK the kernel was holding).
// Without it, a peer with Nagle on that writes its answer in two pieces waits for our delayed ACK
// (40 ms) before sending the second. After the last read of an answer it would be wasted: our
// next request turns delayed ACKs back on anyway.
void ArmQuickAck(tcp::socket& socket) {
  if (socket.is_open()) {
    int one = 1;
    ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
  }
}

// `text` for a message: at most 80 characters, control and non-ASCII bytes as '?'.
std::string Shown(std::string_view text) {
  std::string shown(text.substr(0, 80));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      c = '?';
    }
  }
  return shown;
}

bool IsHttpError(const error_code& ec) { return ec.category() == make_error_code(http::error::need_more).category(); }

}  // namespace

struct AsyncHttpClient::Impl : std::enable_shared_from_this<AsyncHttpClient::Impl> {
  enum class Phase { kConnecting, kSending, kReading };
  enum class Part { kHeader, kBody };

  // One Send, from the call until `done` has been called.
  struct Call {
    std::shared_ptr<Impl> impl;
    std::shared_ptr<Target> target;
    ClientRequest request;
    ClientTimeouts timeouts;
    Callback done;
    std::unique_ptr<Conn> conn;
    bool reused = false;  // conn came from the pool (a failure before any answer is retried once)
    Phase phase = Phase::kConnecting;
    TimePoint connect_deadline = TimePoint::max();
    TimePoint response_deadline = TimePoint::max();
    std::optional<Parser> parser;
    size_t header_consumed = 0;  // bytes of the current response's head parsed so far
    bool got_any_byte = false;   // of a response, on this connection
    bool send_failed = false;
    std::string send_error;
    bool keep_alive = false;
    bool cancel_noticed = false;  // a sweep saw the CancelSignal set; the next one cuts the call
    bool finished = false;
    size_t slot = 0;  // index in Impl::in_flight
    ClientResponse response;
  };
  using CallPtr = std::shared_ptr<Call>;

  Impl(asio::io_context& io_context, HttpClientOptions o) : io(io_context), options(o), timer(io_context) {}

  asio::io_context& io;
  const HttpClientOptions options;
  std::atomic<size_t> total_idle{0};
  std::unordered_map<TargetKey, std::shared_ptr<Target>, TargetKeyHash, TargetKeyEq> targets;
  std::vector<CallPtr> in_flight;
  std::vector<std::pair<CallPtr, Status>> expired;  // the sweep's scratch
  asio::steady_timer timer;
  bool timer_armed = false;
  bool shut_down = false;
  bool in_send = false;  // inside Send(): `done` must be posted, never called inline
  std::string head_scratch;

  // ---- The pool.

  Result<std::shared_ptr<Target>> FindTarget(const std::string& host, uint16_t port) {
    auto it = targets.find(TargetKeyView{host, port});
    if (it != targets.end()) {
      return it->second;
    }
    std::string_view literal = host;
    if (literal.size() >= 2 && literal.front() == '[' && literal.back() == ']') {
      literal = literal.substr(1, literal.size() - 2);
    }
    std::string text(literal);
    if (EqualsIgnoreCase(text, "localhost")) {
      text = "127.0.0.1";
    }
    error_code ec;
    asio::ip::address address = asio::ip::make_address(text, ec);
    if (ec) {
      return Status::InvalidArgument("cannot connect to '" + host + "': not an IP address literal or localhost");
    }
    auto target = std::make_shared<Target>();
    target->endpoint = tcp::endpoint(address, port);
    target->name = address.is_v6() ? "[" + text + "]:" + std::to_string(port) : text + ":" + std::to_string(port);
    targets.try_emplace(TargetKey{host, port}, target);
    return target;
  }

  // The warmest idle connection to `t` that is still usable, or null.
  std::unique_ptr<Conn> TakeIdle(Target& t, TimePoint now) {
    const auto max_idle = std::chrono::milliseconds(options.max_idle_ms);
    while (!t.idle.empty()) {
      std::unique_ptr<Conn> c = std::move(t.idle.back());
      t.idle.pop_back();
      total_idle.fetch_sub(1, std::memory_order_relaxed);
      if (now - c->idle_since > max_idle) {
        // Everything below is older still: close it all.
        total_idle.fetch_sub(t.idle.size(), std::memory_order_relaxed);
        t.idle.clear();
        return nullptr;
      }
      if (now - c->idle_since > kProbeAfterIdle) {
        char byte;
        ssize_t r = ::recv(c->socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (!(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
          continue;  // EOF, an error, or unsolicited bytes: not reusable (closed with c)
        }
      }
      return c;
    }
    return nullptr;
  }

  void GiveBack(Target& t, std::unique_ptr<Conn> c) {
    if (t.forgotten || shut_down || t.idle.size() >= options.max_idle_per_target) {
      return;  // closed with c
    }
    if (c->buffer.capacity() > kReadBufferBytes) {
      c->buffer.shrink_to_fit();  // empty: frees it all
      c->buffer.reserve(std::min(kReadBufferBytes, c->buffer.max_size()));
    }
    c->idle_since = SteadyClock::now();
    t.idle.push_back(std::move(c));
    total_idle.fetch_add(1, std::memory_order_relaxed);
  }

  void DropTarget(Target& t) {
    t.forgotten = true;
    total_idle.fetch_sub(t.idle.size(), std::memory_order_relaxed);
    t.idle.clear();
  }

  // ---- Calls in flight and the sweep.

  void Admit(const CallPtr& call) {
    call->slot = in_flight.size();
    in_flight.push_back(call);
    if (!timer_armed) {
      ArmSweep();
    }
  }

  void ArmSweep() {
    timer_armed = true;
    timer.expires_after(std::chrono::milliseconds(kSweepMillis));
    timer.async_wait([weak = weak_from_this()](const error_code& ec) {
      if (auto self = weak.lock()) {
        self->timer_armed = false;
        if (!ec && !self->shut_down) {
          self->Sweep();
        }
      }
    });
  }

  void Sweep() {
    const TimePoint now = SteadyClock::now();
    expired.clear();
    for (const CallPtr& call : in_flight) {
      const CancelSignal* cancel = call->request.cancel;
      if (cancel != nullptr && cancel->cancelled()) {
        if (call->phase != Phase::kConnecting && !call->cancel_noticed) {
          // As HttpClient, an answer that is there at the same moment wins: what the loop has
          // already read or queued runs before the next sweep, which then cuts the call.
          call->cancel_noticed = true;
          continue;
        }
        expired.emplace_back(call, call->phase == Phase::kConnecting ? NothingSent(*call) : CancelledError(*call));
      } else if (call->phase == Phase::kConnecting && now >= call->connect_deadline) {
        expired.emplace_back(call, Status::Unavailable(call->target->name + " did not accept a connection within " +
                                                       std::to_string(call->timeouts.connect_ms) + " ms"));
      } else if (now >= call->response_deadline) {
        expired.emplace_back(call, TimedOut(*call));
      }
    }
    // Finishing runs callbacks, which may start calls: in_flight changes under the loop above no more.
    for (auto& [call, status] : expired) {
      Finish(call, std::move(status));
    }
    expired.clear();
    if (!in_flight.empty() && !timer_armed) {
      ArmSweep();
    }
  }

  static Status NothingSent(const Call& call) {
    return Status::Unavailable("nothing was sent to " + call.target->name + ": " + call.request.cancel->reason());
  }

  static Status CancelledError(const Call& call) {
    return Status::Aborted("the call to " + call.target->name + " was cancelled: " + call.request.cancel->reason());
  }

  static Status TimedOut(const Call& call) {
    const std::string ms = std::to_string(call.timeouts.response_ms) + " ms";
    if (call.phase == Phase::kSending) {
      return Status::DeadlineExceeded(call.target->name + " did not read the request within " + ms);
    }
    if (call.phase == Phase::kReading && call.got_any_byte) {
      return Status::DeadlineExceeded("the response from " + call.target->name + " was not complete within " + ms);
    }
    return Status::DeadlineExceeded(call.target->name + " did not answer within " + ms);
  }

  // Ends `call` with `result` (once; later calls do nothing): the connection goes back to the
  // pool when `reuse`, else it is closed (cancelling its pending operation, whose handler then
  // sees `finished`).
  void Finish(const CallPtr& call, Result<ClientResponse> result, bool reuse = false) {
    if (call->finished) {
      return;
    }
    call->finished = true;
    const size_t slot = call->slot;
    if (slot < in_flight.size() && in_flight[slot] == call) {
      if (slot + 1 != in_flight.size()) {
        in_flight[slot] = std::move(in_flight.back());
        in_flight[slot]->slot = slot;
      }
      in_flight.pop_back();
    }
    if (call->conn != nullptr) {
      if (reuse) {
        GiveBack(*call->target, std::move(call->conn));
      } else {
        error_code ignored;
        call->conn->socket.close(ignored);  // the Conn itself lives as long as the Call
      }
    }
    Callback done = std::move(call->done);
    if (in_send) {
      asio::post(io, [done = std::move(done), result = std::move(result)]() mutable { done(std::move(result)); });
    } else {
      done(std::move(result));
    }
  }

  // ---- One attempt: connect, send, read.

  std::unique_ptr<Conn> NewConn() {
    auto conn = std::make_unique<Conn>(io);
    // Bytes held unparsed at once: a head in progress (also bounded by the header budget), a
    // chunk-size line or the trailer. Body bytes pass through and are consumed every read.
    conn->buffer.max_size(std::max<size_t>(options.max_response_header_bytes, 1));
    conn->buffer.reserve(std::min(kReadBufferBytes, conn->buffer.max_size()));
    return conn;
  }

  void StartConnect(const CallPtr& call) {
    call->phase = Phase::kConnecting;
    Conn& conn = *call->conn;
    error_code ec;
    conn.socket.open(call->target->endpoint.protocol(), ec);
    if (ec) {
      Finish(call,
             Status::Unavailable("cannot create a socket to connect to " + call->target->name + ": " + ec.message()));
      return;
    }
    conn.socket.set_option(tcp::no_delay(true), ec);
    conn.socket.async_connect(call->target->endpoint, [call](const error_code& ec) {
      if (!call->finished) {
        call->impl->OnConnected(call, ec);
      }
    });
  }

  void OnConnected(const CallPtr& call, const error_code& ec) {
    if (ec) {
      const std::string& name = call->target->name;
      Finish(call, ec == asio::error::connection_refused
                       ? Status::Unavailable("connection refused by " + name)
                       : Status::Unavailable("cannot connect to " + name + ": " + ec.message()));
      return;
    }
    StartSend(call);
  }

  void StartSend(const CallPtr& call) {
    const CancelSignal* cancel = call->request.cancel;
    if (cancel != nullptr && cancel->cancelled()) {
      Finish(call, NothingSent(*call));
      return;
    }
    call->phase = Phase::kSending;
    Conn& conn = *call->conn;
    const std::string_view body = call->request.body;
    // Fast path: the whole request in one non-blocking sendmsg here rather than through
    // async_write (which would post its completion before the read could start). The read then
    // starts at once: Asio's async_read_some skips its speculative recv when the last read on the
    // socket took everything there was, so waiting for the answer costs no syscall. (An
    // async_wait would cost one: Asio re-arms the descriptor with EPOLL_CTL_MOD for every wait.)
    iovec iov[2] = {{conn.head.data(), conn.head.size()}, {const_cast<char*>(body.data()), body.size()}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = body.empty() ? 1 : 2;
    ssize_t sent;
    do {
      sent = ::sendmsg(conn.socket.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (sent < 0 && errno == EINTR);
    const size_t total = conn.head.size() + body.size();
    if (sent == static_cast<ssize_t>(total)) {
      OnSent(call, error_code());
      return;
    }
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      // Failed at once (e.g. a pooled connection the peer closed): reported as async_write would.
      const error_code ec(errno, boost::system::system_category());
      asio::post(io, [call, ec] {
        if (!call->finished) {
          call->impl->OnSent(call, ec);
        }
      });
      return;
    }
    // A full socket buffer (a large body): the rest through async_write.
    const size_t done = sent > 0 ? static_cast<size_t>(sent) : 0;
    const size_t head_done = std::min(done, conn.head.size());
    const size_t body_done = done - head_done;
    std::array<asio::const_buffer, 2> buffers{asio::buffer(conn.head.data() + head_done, conn.head.size() - head_done),
                                              asio::buffer(body.data() + body_done, body.size() - body_done)};
    asio::async_write(conn.socket, buffers, [call](const error_code& ec, size_t) {
      if (!call->finished) {
        call->impl->OnSent(call, ec);
      }
    });
  }

  void OnSent(const CallPtr& call, const error_code& ec) {
    if (ec) {
      // Read anyway: a server may answer early (e.g. 413) and close without reading the whole
      // body; that answer is still in our receive buffer and is the real outcome.
      call->send_failed = true;
      call->send_error = ec.message();
    }
    // No QUICKACK here: an answer that comes whole needs none, and arming it now would make the
    // kernel send a bare ACK for it instead of riding on the next request (one more packet per
    // request). A read that leaves the answer incomplete arms it (OnHeaderRead, OnBodyRead): that
    // sends the held ACK at once, which is what a two-segment Nagle peer waits for.
    call->phase = Phase::kReading;
    NewParser(*call);
    ReadHeader(call);
  }

  void NewParser(Call& call) {
    // Not eager while reading the head: a pass stops at its end, so the head's byte count stays
    // apart from the body's and trailer fields cannot join the fields copied from it.
    Parser& parser = call.parser.emplace();
    parser.body_limit(options.max_response_body_bytes);
    if (call.request.method == "HEAD") {
      parser.skip(true);  // the answer to HEAD has no body whatever its header says
    }
    call.header_consumed = 0;
  }

  size_t HeaderLimit() const {
    return std::min<size_t>(options.max_response_header_bytes, std::numeric_limits<uint32_t>::max());
  }

  // One header pass, with the budget left for the whole head.
  void ReadHeader(const CallPtr& call) {
    const size_t limit = HeaderLimit();
    if (call->header_consumed >= limit) {
      Finish(call, HeaderTooLarge(*call));
      return;
    }
    call->parser->header_limit(static_cast<uint32_t>(limit - call->header_consumed));
    Conn& conn = *call->conn;
    http::async_read_some(conn.socket, conn.buffer, *call->parser, [call](const error_code& ec, size_t n) {
      if (!call->finished) {
        call->impl->OnHeaderRead(call, ec, n);
      }
    });
  }

  void OnHeaderRead(const CallPtr& call, const error_code& ec, size_t n) {
    Conn& conn = *call->conn;
    if (!call->parser->is_header_done()) {
      ArmQuickAck(conn.socket);  // more of the head to come
    }
    if (n > 0 || conn.buffer.size() > 0) {
      call->got_any_byte = true;
    }
    if (ec) {
      ReadFailed(call, ec, Part::kHeader);
      return;
    }
    // Beast's header_limit bounds one put() and a pass may make several: the budget spans them.
    call->header_consumed += n;
    if (call->header_consumed > HeaderLimit()) {
      Finish(call, HeaderTooLarge(*call));
      return;
    }
    if (!call->parser->is_header_done()) {
      ReadHeader(call);
      return;
    }
    OnHeader(call);
  }

  void OnHeader(const CallPtr& call) {
    Parser& parser = *call->parser;
    const auto& msg = parser.get();
    const int status = static_cast<int>(msg.result_int());
    if (status >= 100 && status < 200) {
      if (status == 101) {
        Finish(call, Status::DataLoss(call->target->name + " switched protocols (101) unasked"));
        return;
      }
      // An interim response (100 Continue, 103 Early Hints): the real one follows, with its own
      // header budget (bytes of it already read stay in the connection's buffer).
      NewParser(*call);
      ReadHeader(call);
      return;
    }
    if (status < 100) {
      Finish(call, Malformed(*call, "status code", std::to_string(status)));
      return;
    }
    if (msg.version() != 10 && msg.version() != 11) {
      Finish(call, Malformed(*call, "status line",
                             "HTTP/" + std::to_string(msg.version() / 10) + "." + std::to_string(msg.version() % 10)));
      return;
    }
    if (msg.find(http::field::transfer_encoding) != msg.end() && msg.find(http::field::content_length) != msg.end()) {
      // A smuggling-shaped response (RFC 9112 §6.3); Beast rejects the pair in one order only.
      Finish(call, Malformed(*call, "both Transfer-Encoding and Content-Length", {}));
      return;
    }
    ClientResponse& out = call->response;
    out.status = status;
    out.headers.clear();
    // The header fields now, before the body: trailer fields (Beast adds them to the same list)
    // are dropped, as HttpClient drops them.
    for (const auto& field : msg) {
      std::string_view name(field.name_string().data(), field.name_string().size());
      std::string_view value(field.value().data(), field.value().size());
      // RFC 9110 §5.5: CR and NUL in a field are invalid; keep them out of headers the router
      // hands on.
      if (value.find_first_of(std::string_view("\r\0", 2)) != std::string_view::npos) {
        Finish(call, Malformed(*call, "header line (bare CR or NUL)", value));
        return;
      }
      out.headers.emplace(std::string(name), std::string(value));
    }
    call->keep_alive = parser.keep_alive();  // false for a close-delimited body
    if (parser.is_done()) {
      Complete(call);
      return;
    }
    // The body bytes that came with the head are parsed here, eagerly (every chunk at once), so a
    // small answer read in one segment completes without another pass (which would complete
    // through a posted handler even with nothing to read).
    parser.eager(true);
    boost::beast::flat_buffer& buffer = call->conn->buffer;
    const boost::optional<uint64_t> length = parser.content_length();
    if (!length || *length > buffer.capacity() - buffer.size()) {
      buffer.reserve(buffer.max_size());  // a large or unknown body: read it in large pieces
    }
    if (buffer.size() > 0) {
      error_code ec;
      buffer.consume(parser.put(buffer.data(), ec));
      if (ec && ec != http::error::need_more) {
        ReadFailed(call, ec, Part::kBody);
        return;
      }
      if (parser.is_done()) {
        Complete(call);
        return;
      }
    }
    // Only now, with the body bytes that came with the head parsed, is it known that more is to
    // come (arming it after every head would cost a syscall and a bare ACK per answer).
    ArmQuickAck(call->conn->socket);
    ReadBody(call);
  }

  void ReadBody(const CallPtr& call) {
    Conn& conn = *call->conn;
    http::async_read_some(conn.socket, conn.buffer, *call->parser, [call](const error_code& ec, size_t) {
      if (!call->finished) {
        call->impl->OnBodyRead(call, ec);
      }
    });
  }

  void OnBodyRead(const CallPtr& call, const error_code& ec) {
    if (!call->parser->is_done()) {
      ArmQuickAck(call->conn->socket);  // more of the answer to come
    }
    if (ec) {
      ReadFailed(call, ec, Part::kBody);
      return;
    }
    if (!call->parser->is_done()) {
      ReadBody(call);
      return;
    }
    Complete(call);
  }

  void Complete(const CallPtr& call) {
    call->response.body = std::move(call->parser->get().body());
    // Bytes beyond the response (we never pipeline) mean a confused peer: do not reuse.
    const bool reuse = call->keep_alive && !call->send_failed && call->conn->buffer.size() == 0;
    Finish(call, std::move(call->response), reuse);
  }

  // A read failed: the error, or the retry of a reused connection that the peer had closed.
  void ReadFailed(const CallPtr& call, const error_code& ec, Part part) {
    bool retryable = false;
    Status status = ReadError(*call, ec, part, &retryable);
    if (call->send_failed && (retryable || status.code() == StatusCode::kAborted)) {
      status = Status::Aborted(call->target->name + " closed the connection before reading the whole request (" +
                               call->send_error + ")");
    }
    if (!(call->reused && retryable)) {
      Finish(call, std::move(status));
      return;
    }
    // A kept-alive connection the peer had closed while idle: once more on a fresh one (it cannot
    // have processed the request: it never answered, and servers close only between requests).
    const CancelSignal* cancel = call->request.cancel;
    if (cancel != nullptr && cancel->cancelled()) {
      Finish(call, NothingSent(*call));
      return;
    }
    // We are in the completion of the old connection's only operation: nothing references it now.
    std::unique_ptr<Conn> fresh = NewConn();
    fresh->head.swap(call->conn->head);
    call->conn = std::move(fresh);
    call->reused = false;
    call->got_any_byte = false;
    call->send_failed = false;
    call->send_error.clear();
    StartConnect(call);
  }

  Status ReadError(const Call& call, const error_code& ec, Part part, bool* retryable) {
    const std::string& name = call.target->name;
    const std::string_view during = part == Part::kHeader ? "header" : "body";
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::broken_pipe) {
      const char* what = ec == asio::error::connection_reset || ec == asio::error::broken_pipe
                             ? " reset the connection"
                             : " closed the connection";
      if (!call.got_any_byte) {
        *retryable = true;
        return Status::Aborted(name + what + " before answering");
      }
      return Status::Aborted(name + what + " in the middle of the response " + std::string(during));
    }
    if (ec == http::error::body_limit) {
      return Status::ResourceExhausted("the response body from " + name + " exceeds " +
                                       std::to_string(options.max_response_body_bytes) + " bytes");
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      if (part == Part::kHeader) {
        return HeaderTooLarge(call);
      }
      return Status::ResourceExhausted("a chunk-size line or the trailer of the response from " + name + " exceeds " +
                                       std::to_string(options.max_response_header_bytes) + " bytes");
    }
    if (IsHttpError(ec)) {
      const auto& buffer = call.conn->buffer;
      std::string_view unparsed(static_cast<const char*>(buffer.data().data()), buffer.size());
      return Malformed(call, ec.message(), unparsed);
    }
    return Status::Aborted("reading the response from " + name + " failed: " + ec.message());
  }

  Status HeaderTooLarge(const Call& call) const {
    return Status::ResourceExhausted("the response header from " + call.target->name + " exceeds " +
                                     std::to_string(options.max_response_header_bytes) + " bytes");
  }

  static Status Malformed(const Call& call, std::string_view what, std::string_view text) {
    std::string detail(what);
    if (!text.empty()) {
      detail += ": \"" + Shown(text) + "\"";
    }
    return Status::DataLoss(call.target->name + " sent a malformed HTTP response (" + detail + ")");
  }

  // ---- Entry points.

  // `done` with `result`, later on the loop (Send never calls back inline).
  void Post(Callback done, Result<ClientResponse> result) {
    asio::post(io, [done = std::move(done), result = std::move(result)]() mutable { done(std::move(result)); });
  }

  void Send(const std::string& host, uint16_t port, const ClientRequest& request, const ClientTimeouts& timeouts,
            Callback done) {
    if (shut_down) {
      Post(std::move(done), Status::Unavailable("the upstream client is shut down: nothing was sent to " + host + ":" +
                                                std::to_string(port)));
      return;
    }
    Result<std::shared_ptr<Target>> target = FindTarget(host, port);
    if (!target.ok()) {
      Post(std::move(done), target.status());
      return;
    }
    Status head = internal::FormatRequestHead(request, (*target)->name, head_scratch);
    if (!head.ok()) {
      Post(std::move(done), std::move(head));
      return;
    }
    auto call = std::make_shared<Call>();
    call->impl = shared_from_this();
    call->target = std::move(*target);
    call->request = request;
    call->timeouts = timeouts;
    call->done = std::move(done);
    const TimePoint start = SteadyClock::now();
    if (timeouts.response_ms > 0) {
      call->response_deadline = start + std::chrono::milliseconds(timeouts.response_ms);
    }
    if (timeouts.connect_ms >= 0) {
      call->connect_deadline = start + std::chrono::milliseconds(timeouts.connect_ms);
    }
    if (request.cancel != nullptr && request.cancel->cancelled()) {
      Post(std::move(call->done), NothingSent(*call));
      return;
    }
    call->conn = TakeIdle(*call->target, start);
    call->reused = call->conn != nullptr;
    if (!call->reused) {
      call->conn = NewConn();
    }
    call->conn->head.swap(head_scratch);
    Admit(call);
    const bool outer = in_send;
    in_send = true;
    if (call->reused) {
      StartSend(call);
    } else {
      StartConnect(call);
    }
    in_send = outer;
  }

  void Shutdown() {
    if (shut_down) {
      return;
    }
    shut_down = true;
    timer.cancel();
    // The loop may have stopped already (EventLoop::Run calls this after io.run() returns), so
    // the callbacks run here rather than being posted where nothing would run them.
    while (!in_flight.empty()) {
      CallPtr call = in_flight.back();
      Finish(call, Status::Aborted("the call to " + call->target->name + " was cut: the server is shutting down"));
    }
    for (auto& [key, target] : targets) {
      DropTarget(*target);
    }
    targets.clear();
  }
};

AsyncHttpClient::AsyncHttpClient(boost::asio::io_context& io, HttpClientOptions options)
    : impl_(std::make_shared<Impl>(io, options)) {}

AsyncHttpClient::~AsyncHttpClient() { Shutdown(); }

void AsyncHttpClient::Send(const std::string& host, uint16_t port, const ClientRequest& request,
                           const ClientTimeouts& timeouts, Callback done) {
  impl_->Send(host, port, request, timeouts, std::move(done));
}

void AsyncHttpClient::Forget(const std::string& host, uint16_t port) {
  auto it = impl_->targets.find(TargetKeyView{host, port});
  if (it == impl_->targets.end()) {
    return;
  }
  // Calls in flight keep the Target alive; the connections they give back close with it.
  impl_->DropTarget(*it->second);
  impl_->targets.erase(it);
}

void AsyncHttpClient::Shutdown() { impl_->Shutdown(); }

size_t AsyncHttpClient::idle_connections() const { return impl_->total_idle.load(std::memory_order_relaxed); }

}  // namespace kiln::net
