// HttpServer implementation. Design notes:
//
// - Sockets are plain non-blocking fds driven by socket_io.h (poll with deadlines), not Asio
//   sockets: Asio's synchronous reads retry EAGAIN with an infinite poll, which would defeat
//   SO_RCVTIMEO. Beast is used only for parsing: request line + headers, and chunked bodies
//   (request_parser<buffer_body>, fed through FdReadStream). Content-Length bodies bypass the
//   parser and are read straight into the handler's buffer, so large uploads cost one copy less.
// - One acceptor thread; connections are handed to a pool of worker threads, each serving one
//   connection at a time, created on demand up to max_connections and reused until Stop().
// - Stop() signals an eventfd that every idle keep-alive reader and the acceptor poll on, so idle
//   connections close at once; requests in flight finish (they see stopping_ and answer with
//   `Connection: close`); after the grace period, every registered socket is shut down.
// - Limits: every accepted connection gets a ConnSlot in the registry (conns_, under mu_) from
//   accept until its fd is closed. The slot's phase says whether the connection is idle (no byte
//   yet, or between requests). When a new connection would pass max_connections or
//   max_connections_per_address, the acceptor closes an idle one (shutdown() wakes its worker,
//   which sees EOF and closes) and waits for its slot to go before admitting the new one, so the
//   thread count stays bounded by max_connections. The worker and the acceptor race for an idle
//   slot with one CAS each (worker: idle → busy on the first byte; acceptor: idle → evicted), so
//   a connection whose request is being read is never closed for room.

#include "net/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <optional>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>

#include "base/crash_handler.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"
#include "net/http_server_testing.h"
#include "net/socket_io.h"

namespace kiln::net {

Status ResponseWriter::Send(int status, const HeaderMap& headers, std::string_view body) {
  RETURN_IF_ERROR(Start(status, headers, body.size()));
  if (!body.empty()) {
    RETURN_IF_ERROR(Write(body));
  }
  return Finish();
}

namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
using boost::system::error_code;

using RequestParser = http::request_parser<http::buffer_body>;

// http::read_header with a limit on the header's total size. Beast 1.74's header_limit bounds
// the bytes of one parse pass, not the header: depending on how the reads split the header
// (e.g. a first read of 1 byte, or of ~36 KB, then the rest), parse passes consume complete
// fields without counting them, and a 101 KB header passed a 64 KiB limit (the flaky
// test_oversize_headers_431). Here every pass gets only the budget that is left.
template <class Stream, class Buffer>
void ReadHeaderWithin(Stream& stream, Buffer& buffer, RequestParser& parser, size_t max_header_bytes,
                      boost::beast::error_code& ec) {
  const size_t limit = std::min<size_t>(max_header_bytes, std::numeric_limits<uint32_t>::max());
  size_t consumed = 0;
  while (!parser.is_header_done()) {
    parser.header_limit(static_cast<uint32_t>(limit - consumed));
    consumed += http::read_some(stream, buffer, parser, ec);
    if (ec) return;
    if (consumed > limit) {
      ec = http::error::header_limit;
      return;
    }
  }
}

// Bounds on the "lingering close": after an error response we stop writing, then read and
// discard what the client is still sending for a moment, so that closing with unread data does
// not turn into a TCP reset that destroys the response before the client reads it.
constexpr int kLingerMillis = 1000;
constexpr size_t kLingerBytes = 1 << 20;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

int MillisOrInfinite(int seconds) { return seconds > 0 ? seconds * 1000 : -1; }

// "Wed, 01 May 2024 10:00:00 GMT", formatted at most once per second per thread.
const std::string& CachedDate() {
  thread_local int64_t cached_second = -1;
  thread_local std::string cached;
  int64_t now = NowMillis();
  if (now / 1000 != cached_second) {
    cached_second = now / 1000;
    cached = FormatRfc1123(now);
  }
  return cached;
}

std::string_view ReasonPhrase(int status) {
  auto reason = http::obsolete_reason(static_cast<http::status>(status));
  std::string_view r(reason.data(), reason.size());
  if (r.empty() || r.front() == '<') {
    return "Unknown";
  }
  return r;
}

void AppendNumber(std::string& out, uint64_t v, int base = 10) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, base);
  out.append(buf, end);
}

// Header names and values from handlers must not carry CR/LF (response splitting).
bool SafeHeaderText(std::string_view s) {
  return s.find_first_of("\r\n") == std::string_view::npos;
}

std::string FormatAddress(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "unknown";
}

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
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

// The per-address key: the IP text, with IPv4-mapped IPv6 shown as IPv4 (a dual-stack listener
// must not give one client two budgets).
std::string AddressKey(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
    return host;
  }
  if (ss.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      ::inet_ntop(AF_INET, &a.s6_addr[12], host, sizeof(host));
    } else {
      ::inet_ntop(AF_INET6, &a, host, sizeof(host));
    }
    return host;
  }
  return "local";  // AF_UNIX (tests and fuzzers)
}

// Per-connection state. A worker thread keeps one and reuses it (buffers keep their capacity)
// for every connection it serves.
struct Connection {
  int fd = -1;
  ConnSlot* slot = nullptr;  // the registry's entry; valid until Close()
  std::string remote_address;
  beast::flat_buffer buffer;
  // True until the first request header has been read: the first-byte timeout applies instead
  // of the idle timeout.
  bool fresh = true;
  // True while waiting for the first byte of a request: the first-byte or idle timeout applies,
  // Stop() may interrupt the wait, and the acceptor may close the connection for room.
  bool idle_phase = false;
  // Set when the request stream may hold bytes we did not read (error paths, unread body).
  bool unread_input = false;
  // While a request header is being read: when the whole header must have arrived. A client
  // trickling one byte at a time cannot hold a worker past it (slowloris).
  std::optional<std::chrono::steady_clock::time_point> header_deadline;
  HttpRequest request;
  std::string head;  // response header scratch

  explicit Connection(size_t buffer_limit) : buffer(buffer_limit) {
    buffer.reserve(std::min<size_t>(buffer_limit, 16 * 1024));  // typical headers in one read
  }
};

struct Limits {
  int io_timeout_ms;
  int idle_timeout_ms;
  int first_byte_timeout_ms;
  int header_timeout_ms;
  int wake_fd;
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
      const bool idle = conn_->idle_phase;
      int timeout_ms = !idle            ? limits_->io_timeout_ms
                       : conn_->fresh ? limits_->first_byte_timeout_ms
                                      : limits_->idle_timeout_ms;
      if (!idle && conn_->header_deadline) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*conn_->header_deadline -
                                                                          std::chrono::steady_clock::now())
                        .count();
        if (left <= 0) {
          ec = boost::asio::error::timed_out;
          return 0;
        }
        timeout_ms = timeout_ms < 0 ? static_cast<int>(left) : std::min<int>(timeout_ms, static_cast<int>(left));
      }
      Result<size_t> r = internal::RecvSome(conn_->fd, static_cast<char*>(b.data()), b.size(), timeout_ms,
                                            idle ? limits_->wake_fd : -1);
      if (!r.ok()) {
        switch (r.status().code()) {
          case StatusCode::kDeadlineExceeded:
            ec = boost::asio::error::timed_out;
            break;
          case StatusCode::kAborted:
            ec = boost::asio::error::operation_aborted;
            break;
          default:
            ec = boost::asio::error::connection_reset;
        }
        return 0;
      }
      if (*r == 0) {
        ec = boost::asio::error::eof;
        return 0;
      }
      if (idle) {
        if (!conn_->slot->TryClaim()) {
          // The acceptor closed this idle connection for room just as the bytes came: drop them,
          // as if they had come a moment later (the client sees the close, as for any keep-alive
          // connection the server closes while idle).
          ec = boost::asio::error::operation_aborted;
          return 0;
        }
        if (limits_->header_timeout_ms > 0) {
          conn_->header_deadline =
              std::chrono::steady_clock::now() + std::chrono::milliseconds(limits_->header_timeout_ms);
        }
      }
      conn_->idle_phase = false;
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

bool IsPeerGone(const error_code& ec) {
  return ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset ||
         ec == http::error::end_of_stream || ec == http::error::partial_message;
}

// The request body: Content-Length (read directly), chunked (through the Beast parser), or none.
class RequestBody final : public ByteSource {
 public:
  enum class Mode { kNone, kLength, kChunked };

  RequestBody(Connection* conn, const Limits* limits, RequestParser* parser, Mode mode,
              uint64_t content_length, bool expect_continue)
      : conn_(conn),
        limits_(limits),
        parser_(parser),
        mode_(mode),
        remaining_(content_length),
        expect_continue_(expect_continue),
        done_(mode == Mode::kNone || (mode == Mode::kLength && content_length == 0)) {}

  Result<size_t> Read(char* buf, size_t n) override {
    if (!error_.ok()) {
      return error_;
    }
    if (done_ || n == 0) {
      return size_t{0};
    }
    if (expect_continue_ && !continue_sent_) {
      continue_sent_ = true;
      // An interim response after the final one started would corrupt the stream; the client
      // then sends the body after its own expect timeout.
      if (writer_ == nullptr || !writer_->started()) {
        iovec iov{const_cast<char*>(kContinue.data()), kContinue.size()};
        Status s = internal::SendAll(conn_->fd, &iov, 1, limits_->io_timeout_ms);
        if (!s.ok()) {
          return Fail(s);
        }
      }
    }
    if (mode_ == Mode::kLength) {
      return ReadLength(buf, n);
    }
    return ReadChunked(buf, n);
  }

  std::optional<uint64_t> size_hint() const override {
    switch (mode_) {
      case Mode::kNone:
        return 0;
      case Mode::kLength:
        return total_ + remaining_;
      case Mode::kChunked:
        return std::nullopt;
    }
    return std::nullopt;
  }

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
  Status Drain(uint64_t max) {
    if (done_) {
      return Status::Ok();
    }
    if (!error_.ok()) {
      return error_;
    }
    if (continue_pending()) {
      return Status::FailedPrecondition("client awaits 100 Continue");
    }
    if (mode_ == Mode::kLength && remaining_ > max) {
      return Status::ResourceExhausted("unread body too large to drain");
    }
    char scratch[16 * 1024];
    uint64_t drained = 0;
    while (!done_) {
      Result<size_t> r = Read(scratch, sizeof(scratch));
      if (!r.ok()) {
        return r.status();
      }
      if (*r == 0) {
        break;
      }
      drained += *r;
      if (drained > max) {
        return Status::ResourceExhausted("unread body too large to drain");
      }
    }
    return Status::Ok();
  }

 private:
  Status Fail(Status s) {
    error_ = std::move(s);
    return error_;
  }

  Result<size_t> ReadLength(char* buf, size_t n) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, remaining_));
    size_t got = 0;
    if (conn_->buffer.size() > 0) {
      got = std::min(want, conn_->buffer.size());
      std::memcpy(buf, conn_->buffer.data().data(), got);
      conn_->buffer.consume(got);
    } else {
      Result<size_t> r = internal::RecvSome(conn_->fd, buf, want, limits_->io_timeout_ms);
      if (!r.ok()) {
        return Fail(r.status().code() == StatusCode::kDeadlineExceeded
                        ? r.status()
                        : Status::Unavailable("request body: " + r.status().message()));
      }
      if (*r == 0) {
        return Fail(Status::Unavailable("client closed the connection with " +
                                        std::to_string(remaining_) + " body bytes unsent"));
      }
      got = *r;
    }
    remaining_ -= got;
    total_ += got;
    done_ = remaining_ == 0;
    return got;
  }

  Result<size_t> ReadChunked(char* buf, size_t n) {
    FdReadStream stream(conn_, limits_);
    auto& body = parser_->get().body();
    for (;;) {
      if (parser_->is_done()) {
        done_ = true;
        return size_t{0};
      }
      body.data = buf;
      body.size = n;
      error_code ec;
      http::read_some(stream, conn_->buffer, *parser_, ec);
      size_t got = n - body.size;
      body.data = nullptr;
      body.size = 0;
      if (ec == http::error::need_buffer) {
        ec = {};
      }
      if (ec) {
        if (ec == http::error::body_limit) {
          return Fail(Status::ResourceExhausted("request body exceeds the server limit"));
        }
        if (ec == boost::asio::error::timed_out) {
          return Fail(Status::DeadlineExceeded("timed out reading the request body"));
        }
        if (IsPeerGone(ec) || ec == boost::asio::error::operation_aborted) {
          return Fail(Status::Unavailable("client closed the connection mid-body"));
        }
        return Fail(Status::InvalidArgument("malformed chunked body: " + ec.message()));
      }
      if (got > 0) {
        total_ += got;
        done_ = parser_->is_done();
        return got;
      }
    }
  }

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

class ResponseWriterImpl final : public ResponseWriter {
 public:
  struct RequestInfo {
    bool head = false;
    bool http10 = false;
    bool keep_alive = true;  // what the request asked for
  };

  ResponseWriterImpl(Connection* conn, const Limits* limits, const HttpServerOptions* options,
                     const std::atomic<bool>* stopping, RequestBody* body, RequestInfo info)
      : conn_(conn),
        limits_(limits),
        options_(options),
        stopping_(stopping),
        body_(body),
        info_(info) {}

  // ResponseWriter
  Status Start(int status, const HeaderMap& headers,
               std::optional<uint64_t> content_length) override {
    if (started_) {
      return Status::FailedPrecondition("response already started");
    }
    if (status < 200 || status > 999) {
      return Status::InvalidArgument("bad response status " + std::to_string(status));
    }
    started_ = true;
    const bool body_allowed = status != 204 && status != 304 && !info_.head;

    bool keep_alive = info_.keep_alive && !close_requested_ && !stopping_->load() &&
                      !body_->continue_pending() && !body_->failed();
    if (keep_alive && !body_->done()) {
      std::optional<uint64_t> rest = body_->known_remaining();
      keep_alive = !rest || *rest <= options_->max_drain_bytes;
    }

    if (!body_allowed) {
      mode_ = Mode::kNoBody;
    } else if (content_length) {
      mode_ = Mode::kLength;
    } else if (!info_.http10) {
      mode_ = Mode::kChunked;
    } else {
      mode_ = Mode::kCloseDelimited;
      keep_alive = false;
    }
    declared_ = content_length.value_or(0);
    close_after_ = !keep_alive;

    std::string& h = conn_->head;
    h.clear();
    if (body_->empty_body_awaits_continue()) {
      // botocore sends `Expect: 100-continue` even with Content-Length: 0. When it gets the final
      // response instead of 100, it keeps that status line cached on the connection
      // (AWSConnection.response_class) and misreads the next response on it, stalling until the
      // idle timeout. Answering 100 first, as S3 does, keeps its connection state clean.
      h.append(kContinue);
    }
    h.append("HTTP/1.1 ");
    AppendNumber(h, static_cast<uint64_t>(status));
    h.push_back(' ');
    h.append(ReasonPhrase(status));
    h.append("\r\n");
    bool has_date = false;
    bool has_server = false;
    for (const auto& [name, value] : headers) {
      if (EqualsIgnoreCase(name, "Content-Length") || EqualsIgnoreCase(name, "Transfer-Encoding") ||
          EqualsIgnoreCase(name, "Connection")) {
        continue;  // framing is the server's
      }
      if (name.empty() || !SafeHeaderText(name) || !SafeHeaderText(value)) {
        continue;
      }
      has_date = has_date || EqualsIgnoreCase(name, "Date");
      has_server = has_server || EqualsIgnoreCase(name, "Server");
      h.append(name);
      h.append(": ");
      h.append(value);
      h.append("\r\n");
    }
    if (!has_date) {
      h.append("Date: ");
      h.append(CachedDate());
      h.append("\r\n");
    }
    if (!has_server) {
      h.append("Server: kiln\r\n");
    }
    // HEAD and 304 carry the length the GET would have; 204 carries none.
    if (content_length && status != 204) {
      h.append("Content-Length: ");
      AppendNumber(h, *content_length);
      h.append("\r\n");
    } else if (mode_ == Mode::kChunked) {
      h.append("Transfer-Encoding: chunked\r\n");
    }
    if (close_after_) {
      h.append("Connection: close\r\n");
    } else if (info_.http10) {
      h.append("Connection: keep-alive\r\n");
    }
    h.append("\r\n");
    head_pending_ = true;
    return Status::Ok();
  }

  Status Write(std::string_view data) override {
    if (!started_) {
      return Status::FailedPrecondition("Write before Start");
    }
    if (finished_) {
      return Status::FailedPrecondition("Write after Finish");
    }
    if (!error_.ok()) {
      return error_;
    }
    if (data.empty() || mode_ == Mode::kNoBody) {
      return Status::Ok();  // HEAD / 204 / 304: the body is never sent
    }
    if (mode_ == Mode::kLength && data.size() > declared_ - written_) {
      close_after_ = true;
      return Status::InvalidArgument("write past the declared Content-Length");
    }
    iovec iov[4];
    int count = 0;
    if (head_pending_) {
      iov[count++] = {conn_->head.data(), conn_->head.size()};
    }
    char prefix[24];
    if (mode_ == Mode::kChunked) {
      auto [end, ec] = std::to_chars(prefix, prefix + 20, data.size(), 16);
      *end++ = '\r';
      *end++ = '\n';
      iov[count++] = {prefix, static_cast<size_t>(end - prefix)};
    }
    iov[count++] = {const_cast<char*>(data.data()), data.size()};
    if (mode_ == Mode::kChunked) {
      iov[count++] = {const_cast<char*>("\r\n"), 2};
    }
    RETURN_IF_ERROR(SendIov(iov, count));
    head_pending_ = false;
    written_ += data.size();
    return Status::Ok();
  }

  Status Finish() override {
    if (!started_) {
      return Status::FailedPrecondition("Finish before Start");
    }
    if (finished_) {
      return Status::Ok();
    }
    if (!error_.ok()) {
      return error_;
    }
    finished_ = true;
    if (mode_ == Mode::kLength && written_ < declared_) {
      // The client would wait for bytes that never come; closing tells it the body is short.
      close_after_ = true;
    }
    iovec iov[2];
    int count = 0;
    if (head_pending_) {
      iov[count++] = {conn_->head.data(), conn_->head.size()};
    }
    if (mode_ == Mode::kChunked) {
      iov[count++] = {const_cast<char*>("0\r\n\r\n"), 5};
    }
    if (count > 0) {
      RETURN_IF_ERROR(SendIov(iov, count));
    }
    head_pending_ = false;
    return Status::Ok();
  }

  bool started() const override { return started_; }
  void CloseAfterResponse() override { close_requested_ = close_after_ = true; }

  // For the connection loop.
  bool finished() const { return finished_; }
  bool failed() const { return !error_.ok(); }
  bool close_after() const { return close_after_; }
  // Completes a response the handler left open when that is safe; false when the connection
  // must be closed to signal a truncated response.
  bool Complete() {
    if (finished_) {
      return error_.ok();
    }
    if (!error_.ok()) {
      return false;
    }
    if (mode_ == Mode::kNoBody || (mode_ == Mode::kLength && written_ == declared_)) {
      return Finish().ok();
    }
    // Chunked without the last chunk, or a short known-length body: the handler gave up. Flush
    // the header if nothing was written, then close so the client sees a truncated response.
    if (head_pending_) {
      iovec iov{conn_->head.data(), conn_->head.size()};
      (void)SendIov(&iov, 1);
    }
    close_after_ = true;
    return false;
  }

 private:
  enum class Mode { kNoBody, kLength, kChunked, kCloseDelimited };

  Status SendIov(iovec* iov, int count) {
    Status s = internal::SendAll(conn_->fd, iov, count, limits_->io_timeout_ms);
    if (!s.ok()) {
      error_ = s;
      close_after_ = true;
    }
    return s;
  }

  Connection* conn_;
  const Limits* limits_;
  const HttpServerOptions* options_;
  const std::atomic<bool>* stopping_;
  RequestBody* body_;
  RequestInfo info_;
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
void WriteErrorResponse(int fd, int status, int timeout_ms) {
  std::string out;
  out.reserve(160);
  out.append("HTTP/1.1 ");
  AppendNumber(out, static_cast<uint64_t>(status));
  out.push_back(' ');
  out.append(ReasonPhrase(status));
  out.append("\r\nDate: ");
  out.append(CachedDate());
  out.append("\r\nServer: kiln\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  iovec iov{out.data(), out.size()};
  (void)internal::SendAll(fd, &iov, 1, timeout_ms);
}

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(HttpServerOptions options, Handler handler, int listen_fd, int wake_fd,
                 uint16_t port)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        port_(port) {
    limits_.io_timeout_ms = MillisOrInfinite(options_.io_timeout_seconds);
    limits_.idle_timeout_ms = MillisOrInfinite(options_.idle_timeout_seconds);
    limits_.first_byte_timeout_ms = MillisOrInfinite(options_.first_byte_timeout_seconds);
    limits_.header_timeout_ms = MillisOrInfinite(options_.header_timeout_seconds);
    limits_.wake_fd = wake_fd_;
  }

  ~HttpServerImpl() override {
    Stop(10);
    ::close(wake_fd_);
  }

  // HttpServer
  uint16_t port() const override { return port_; }

  Status Start() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) {
      return Status::FailedPrecondition("server was stopped");
    }
    if (acceptor_.joinable()) {
      return Status::FailedPrecondition("server already started");
    }
    acceptor_ = std::thread([this] { AcceptLoop(); });
    return Status::Ok();
  }

  void Stop(int grace_seconds) override {
    std::lock_guard<std::mutex> stop_lock(stop_mu_);
    if (stopped_) {
      return;
    }
    stopped_ = true;
    {
      // Under mu_ so an acceptor waiting for an evicted slot sees it (no lost wake-up).
      std::lock_guard<std::mutex> lock(mu_);
      stopping_.store(true);
    }
    active_cv_.notify_all();
    uint64_t one = 1;
    // Never read back: the eventfd stays readable and wakes every poller, now and later.
    (void)!::write(wake_fd_, &one, sizeof(one));
    if (acceptor_.joinable()) {
      acceptor_.join();
    }
    ::close(listen_fd_);
    {
      std::unique_lock<std::mutex> lock(mu_);
      active_cv_.wait_for(lock, std::chrono::seconds(std::max(grace_seconds, 0)),
                          [this] { return conns_.empty(); });
      force_.store(true);
      for (const auto& [id, slot] : conns_) {
        ::shutdown(slot->fd, SHUT_RDWR);
      }
      // Every socket operation now fails fast; only a handler blocked outside the socket can
      // keep us here.
      active_cv_.wait(lock, [this] { return conns_.empty(); });
    }
    std::vector<std::thread> workers;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      pool_shutdown_ = true;
      workers.swap(workers_);
    }
    pool_cv_.notify_all();
    for (std::thread& t : workers) {
      t.join();
    }
  }

  HttpServerStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    HttpServerStats s = counters_;
    s.open_connections = conns_.size();
    for (const auto& [id, slot] : conns_) {
      s.idle_connections += slot->idle() ? 1 : 0;
    }
    return s;
  }

  // See ServeConnectionForTest (http_server_testing.h).
  void ServeForTest(int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      addr.ss_family = AF_UNSPEC;
    }
    Pending p{fd, addr, nullptr};
    {
      std::lock_guard<std::mutex> lock(mu_);
      p.slot = RegisterLocked(fd, AddressKey(addr));
    }
    Connection conn(options_.max_header_bytes + 64 * 1024);
    ServeAccepted(conn, p);
  }

 private:
  struct Pending {
    int fd;
    sockaddr_storage addr;
    ConnSlot* slot;  // registered by the acceptor
  };

  // How long the acceptor waits for an evicted connection's worker to close it.
  static constexpr int kEvictionWaitMs = 1000;
  // Back-off after accept() failed with nothing to evict (EMFILE and the like).
  static constexpr int kAcceptBackoffMs = 100;
  // Shedding and accept failures are logged at most this often (they come in floods).
  static constexpr int64_t kShedLogIntervalMs = 10000;

  void AcceptLoop() {
    for (;;) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      int r = ::poll(fds, 2, -1);
      if (r < 0) {
        if (errno == EINTR) {
          continue;
        }
        KLOG(error, "http accept poll failed", {{"error", std::strerror(errno)}});
        return;
      }
      if (fds[1].revents != 0) {
        return;
      }
      Pending p{};
      socklen_t len = sizeof(p.addr);
      p.fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&p.addr), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (p.fd < 0) {
        const int err = errno;
        if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED ||
            err == EPROTO) {
          continue;  // the client gave up before we took it, or a spurious wake-up
        }
        NoteAcceptError(err);
        // Out of descriptors or memory: an idle connection's descriptor is worth more to a
        // waiting client. With none to close, wait (the pending connection keeps the listening
        // socket readable, so retrying at once would spin).
        if ((err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) &&
            EvictIdleAndWait(nullptr)) {
          continue;
        }
        pollfd wake{wake_fd_, POLLIN, 0};
        if (::poll(&wake, 1, kAcceptBackoffMs) > 0) {
          return;
        }
        continue;
      }
      std::string address = AddressKey(p.addr);
      bool admitted = false;
      bool shed = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const uint64_t evicted_before = counters_.evicted;
        admitted = AdmitLocked(lock, address);
        if (admitted) {
          p.slot = RegisterLocked(p.fd, std::move(address));
        } else {
          ++counters_.refused;
        }
        shed = !admitted || counters_.evicted != evicted_before;
      }
      if (shed) {
        MaybeLogShedding();
      }
      if (!admitted) {
        Reject(p.fd);
        continue;
      }
      int one = 1;
      ::setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Submit(p);
    }
  }

  // Makes room for one more connection from `address`, closing idle connections as needed.
  // False when the limits are reached and nothing can be closed (or the server is stopping).
  bool AdmitLocked(std::unique_lock<std::mutex>& lock, const std::string& address) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEvictionWaitMs);
    for (;;) {
      if (stopping_.load()) {
        return false;
      }
      auto it = per_address_.find(address);
      const bool address_full =
          it != per_address_.end() && it->second >= options_.max_connections_per_address;
      const bool full = conns_.size() >= options_.max_connections;
      if (!address_full && !full) {
        return true;
      }
      // At the per-address limit only that address's connections make room; closing one of them
      // also makes room under the total.
      ConnSlot* victim = EvictLocked(address_full ? &address : nullptr);
      if (victim == nullptr) {
        return false;
      }
      if (!WaitGoneLocked(lock, victim->id, deadline)) {
        return false;
      }
    }
  }

  // Closes one idle connection (from `address` only, when given) and waits until it is gone.
  bool EvictIdleAndWait(const std::string* address) {
    std::unique_lock<std::mutex> lock(mu_);
    ConnSlot* victim = EvictLocked(address);
    if (victim == nullptr) {
      return false;
    }
    return WaitGoneLocked(
        lock, victim->id, std::chrono::steady_clock::now() + std::chrono::milliseconds(kEvictionWaitMs));
  }

  // Waits until the connection `id` has been closed by its worker. False on timeout or Stop.
  bool WaitGoneLocked(std::unique_lock<std::mutex>& lock, uint64_t id,
                      std::chrono::steady_clock::time_point deadline) {
    return active_cv_.wait_until(lock, deadline, [&] { return stopping_.load() || !conns_.contains(id); }) &&
           !stopping_.load();
  }

  // Picks the idle connection to close for room — never-used ones before keep-alive ones, the
  // longest idle first, restricted to `address` when given — and shuts it down. Its worker then
  // sees EOF and closes it. Returns the slot (still registered), or null when none is idle.
  ConnSlot* EvictLocked(const std::string* address) {
    struct Candidate {
      int rank;  // 0 fresh, 1 keep-alive
      int64_t since;
      ConnSlot* slot;
    };
    std::vector<Candidate> candidates;
    for (const auto& [id, slot] : conns_) {
      int phase = slot->phase.load(std::memory_order_acquire);
      if ((phase != ConnSlot::kFresh && phase != ConnSlot::kIdle) ||
          (address != nullptr && slot->address != *address)) {
        continue;
      }
      candidates.push_back({phase == ConnSlot::kFresh ? 0 : 1,
                            slot->idle_since_ms.load(std::memory_order_relaxed), slot.get()});
    }
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      return std::tie(a.rank, a.since, a.slot->id) < std::tie(b.rank, b.since, b.slot->id);
    });
    for (const Candidate& c : candidates) {
      // Bytes already waiting in the socket mean a request is arriving: leave it to its worker.
      // (The fd stays open while registered: workers close only after unregistering under mu_.)
      char byte;
      ssize_t peeked = ::recv(c.slot->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (peeked > 0) {
        continue;
      }
      int expected = c.rank == 0 ? ConnSlot::kFresh : ConnSlot::kIdle;
      if (!c.slot->phase.compare_exchange_strong(expected, ConnSlot::kEvicted,
                                                 std::memory_order_acq_rel)) {
        continue;  // its worker just claimed it
      }
      ::shutdown(c.slot->fd, SHUT_RDWR);
      ++counters_.evicted;
      return c.slot;
    }
    return nullptr;
  }

  ConnSlot* RegisterLocked(int fd, std::string address) {
    auto slot = std::make_unique<ConnSlot>();
    slot->id = ++next_id_;
    slot->fd = fd;
    slot->address = std::move(address);
    slot->idle_since_ms.store(SteadyMillis(), std::memory_order_relaxed);
    ++per_address_[slot->address];
    ++counters_.accepted;
    ConnSlot* raw = slot.get();
    conns_.emplace(raw->id, std::move(slot));
    return raw;
  }

  // Removes the slot; closes its fd too when `close_fd` (in the same critical section, so that
  // Stop() never shuts down a reused fd number and an acceptor that waited for the slot to go
  // finds the descriptor free).
  void UnregisterLocked(ConnSlot* slot, bool close_fd) {
    auto it = per_address_.find(slot->address);
    if (it != per_address_.end() && --it->second == 0) {
      per_address_.erase(it);
    }
    if (close_fd) {
      ::close(slot->fd);
    }
    conns_.erase(slot->id);
  }

  // Rate-limited warnings (the acceptor thread only; never under mu_).
  void MaybeLogShedding() {
    int64_t now = SteadyMillis();
    if (now - last_shed_log_ms_ < kShedLogIntervalMs) {
      return;
    }
    last_shed_log_ms_ = now;
    HttpServerStats s = stats();
    KLOG(warn, "http connection limits reached: closing idle connections, refusing when none is idle",
         {{"open", std::to_string(s.open_connections)},
          {"evicted_total", std::to_string(s.evicted)},
          {"refused_total", std::to_string(s.refused)},
          {"max_connections", std::to_string(options_.max_connections)},
          {"max_connections_per_address", std::to_string(options_.max_connections_per_address)}});
  }
  void NoteAcceptError(int err) {
    int64_t now = SteadyMillis();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.accept_errors;
    }
    if (now - last_accept_log_ms_ < kShedLogIntervalMs) {
      return;
    }
    last_accept_log_ms_ = now;
    KLOG(warn, "http accept failed; closing an idle connection or retrying in 100 ms",
         {{"error", std::strerror(err)}, {"open", std::to_string(stats().open_connections)}});
  }

  // Over the limits with nothing idle: answer 503 without blocking the acceptor, then close.
  void Reject(int fd) {
    static constexpr std::string_view kBusy =
        "HTTP/1.1 503 Service Unavailable\r\nServer: kiln\r\nContent-Length: 0\r\n"
        "Retry-After: 1\r\nConnection: close\r\n\r\n";
    (void)!::send(fd, kBusy.data(), kBusy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_WR);
    char scratch[4096];
    // Whatever request bytes already arrived are read so that close() sends FIN, not RST.
    while (::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0) {
    }
    ::close(fd);
  }

  void Submit(const Pending& p) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    queue_.push_back(p);
    if (idle_workers_ >= queue_.size()) {
      pool_cv_.notify_one();
      return;
    }
    // Every worker is busy: grow the pool. Bounded by max_connections through the registry.
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error& e) {
      // Out of threads: shed this connection rather than let the acceptor die.
      KLOG(error, "http worker thread creation failed", {{"error", e.what()}});
      queue_.pop_back();
      {
        std::lock_guard<std::mutex> registry_lock(mu_);
        UnregisterLocked(p.slot, /*close_fd=*/false);
        ++counters_.refused;
      }
      active_cv_.notify_all();
      Reject(p.fd);
    }
  }

  void WorkerLoop() {
    // A handler that overflows this thread's stack still gets its crash reported (base/crash_handler.h).
    InstallAlternateSignalStack();
    Connection conn(options_.max_header_bytes + 64 * 1024);
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(pool_mu_);
        ++idle_workers_;
        pool_cv_.wait(lock, [this] { return !queue_.empty() || pool_shutdown_; });
        --idle_workers_;
        if (queue_.empty()) {
          return;
        }
        p = queue_.front();
        queue_.pop_front();
      }
      ServeAccepted(conn, p);
      if (conn.buffer.capacity() > 256 * 1024) {
        conn.buffer.shrink_to_fit();  // one huge header must not pin memory for good
      }
    }
  }

  // Serves a registered connection until it should close, then closes it.
  void ServeAccepted(Connection& conn, const Pending& p) {
    conn.fd = p.fd;
    conn.slot = p.slot;
    conn.fresh = true;
    conn.remote_address = FormatAddress(p.addr);
    conn.buffer.consume(conn.buffer.size());
    conn.unread_input = false;
    if (force_.load()) {
      ::shutdown(conn.fd, SHUT_RDWR);
    }
    try {
      Serve(conn);
    } catch (const std::exception& e) {
      KLOG(error, "http connection failed", {{"remote", conn.remote_address}, {"error", e.what()}});
      conn.unread_input = true;
    } catch (...) {
      conn.unread_input = true;
    }
    Close(conn);
  }

  void Close(Connection& conn) {
    if (conn.unread_input && !force_.load()) {
      // Lingering close (see kLingerMillis).
      ::shutdown(conn.fd, SHUT_WR);
      char scratch[16 * 1024];
      size_t total = 0;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLingerMillis);
      while (total < kLingerBytes) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
        if (left <= 0) {
          break;
        }
        Result<size_t> r = internal::RecvSome(conn.fd, scratch, sizeof(scratch),
                                              static_cast<int>(left), wake_fd_);
        if (!r.ok() || *r == 0) {
          break;
        }
        total += *r;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      UnregisterLocked(conn.slot, /*close_fd=*/true);
    }
    active_cv_.notify_all();
    conn.fd = -1;
    conn.slot = nullptr;
  }

  // Serves requests on one connection until it should close.
  void Serve(Connection& conn) {
    for (;;) {
      if (!ServeOne(conn)) {
        return;
      }
    }
  }

  // Returns true to keep the connection for another request.
  bool ServeOne(Connection& conn) {
    conn.header_deadline.reset();
    if (conn.buffer.size() > 0) {
      // Bytes of this request came with the previous one (pipelining): the connection is busy
      // (the acceptor must not close it for room: the bytes are in our buffer, not the socket),
      // and the header clock runs from now.
      conn.idle_phase = false;
      if (limits_.header_timeout_ms > 0) {
        conn.header_deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(limits_.header_timeout_ms);
      }
    } else {
      conn.idle_phase = true;
      if (!conn.fresh) {
        conn.slot->MarkIdle();
      }
    }
    RequestParser parser;
    parser.body_limit(options_.max_body_bytes);
    FdReadStream stream(&conn, &limits_);
    error_code ec;
    ReadHeaderWithin(stream, conn.buffer, parser, options_.max_header_bytes, ec);
    conn.header_deadline.reset();  // the body has its own (per-read) timeout
    if (ec) {
      if (conn.idle_phase || IsPeerGone(ec) || ec == boost::asio::error::timed_out ||
          ec == boost::asio::error::operation_aborted) {
        return false;  // idle close, stop, or the peer went away / stalled mid-header
      }
      int status = 400;
      if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
        status = 431;
      } else if (ec == http::error::body_limit) {
        status = 413;
      }
      WriteErrorResponse(conn.fd, status, limits_.io_timeout_ms);
      conn.unread_input = true;
      return false;
    }
    conn.idle_phase = false;
    conn.fresh = false;
    auto& msg = parser.get();
    const unsigned version = msg.version();
    if (version != 10 && version != 11) {
      WriteErrorResponse(conn.fd, 505, limits_.io_timeout_ms);
      conn.unread_input = true;
      return false;
    }
    if (!parser.chunked() && msg.find(http::field::transfer_encoding) != msg.end()) {
      // RFC 7230 §3.3.3: a request whose Transfer-Encoding does not end in chunked has no
      // reliable length.
      WriteErrorResponse(conn.fd, 400, limits_.io_timeout_ms);
      conn.unread_input = true;
      return false;
    }

    HttpRequest& req = conn.request;
    req.method.assign(msg.method_string().data(), msg.method_string().size());
    req.target.assign(msg.target().data(), msg.target().size());
    std::string_view target(req.target);
    size_t q = target.find('?');
    req.raw_path.assign(target.substr(0, q));
    if (q == std::string_view::npos) {
      req.raw_query.clear();
    } else {
      req.raw_query.assign(target.substr(q + 1));
    }
    req.http_version = static_cast<int>(version);
    req.headers.clear();
    for (const auto& field : msg) {
      req.headers.emplace(std::string(field.name_string()), std::string(field.value()));
    }
    req.remote_address = conn.remote_address;

    RequestBody::Mode mode = RequestBody::Mode::kNone;
    uint64_t length = 0;
    if (parser.chunked()) {
      mode = RequestBody::Mode::kChunked;
    } else if (parser.content_length()) {
      mode = RequestBody::Mode::kLength;
      length = *parser.content_length();
    }
    const std::string* expect = req.Header("Expect");
    const bool expect_continue =
        version == 11 && expect != nullptr && EqualsIgnoreCase(Trim(*expect), "100-continue");

    ResponseWriterImpl::RequestInfo info;
    info.head = req.method == "HEAD";
    info.http10 = version == 10;
    info.keep_alive = parser.keep_alive();
    RequestBody body(&conn, &limits_, &parser, mode, length, expect_continue);
    ResponseWriterImpl writer(&conn, &limits_, &options_, &stopping_, &body, info);
    body.set_writer(&writer);
    req.body = &body;

    try {
      handler_(req, writer);
    } catch (const std::exception& e) {
      KLOG(error, "http handler threw", {{"target", req.target}, {"error", e.what()}});
    } catch (...) {
      KLOG(error, "http handler threw", {{"target", req.target}});
    }
    req.body = nullptr;

    if (!writer.started()) {
      (void)writer.Send(500, {{"Content-Type", "text/plain"}}, "handler produced no response\n");
    }
    bool keep = writer.Complete() && !writer.close_after();
    if (!body.done()) {
      if (keep) {
        Status drained = body.Drain(options_.max_drain_bytes);
        keep = drained.ok();
      }
      if (!keep) {
        conn.unread_input = true;
      }
    }
    if (body.failed()) {
      keep = false;
      conn.unread_input = true;
    }
    return keep && !stopping_.load();
  }

  const HttpServerOptions options_;
  const Handler handler_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd, readable once Stop() begins
  const uint16_t port_;
  Limits limits_;
  std::atomic<bool> stopping_{false};

  std::mutex stop_mu_;  // serializes Start/Stop
  bool stopped_ = false;
  std::thread acceptor_;

  // The connection registry. Every accepted connection has a slot from accept until its fd is
  // closed (queued or served); per_address_ counts them by AddressKey (no zero entries).
  mutable std::mutex mu_;
  std::condition_variable active_cv_;  // a slot went away, or stopping_ was set
  std::unordered_map<uint64_t, std::unique_ptr<ConnSlot>> conns_;  // by ConnSlot::id; guarded by mu_
  std::unordered_map<std::string, size_t> per_address_;            // guarded by mu_
  uint64_t next_id_ = 0;                                            // guarded by mu_
  HttpServerStats counters_;  // the cumulative fields; guarded by mu_
  std::atomic<bool> force_{false};  // grace is over: sockets are shut down as they register

  // Acceptor thread only.
  int64_t last_shed_log_ms_ = -kShedLogIntervalMs;
  int64_t last_accept_log_ms_ = -kShedLogIntervalMs;

  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::deque<Pending> queue_;        // guarded by pool_mu_
  size_t idle_workers_ = 0;          // guarded by pool_mu_
  bool pool_shutdown_ = false;       // guarded by pool_mu_
  std::vector<std::thread> workers_;  // guarded by pool_mu_
};

Status ErrnoToStatus(std::string_view what, int err) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case EADDRINUSE:
      return Status::Unavailable(msg);
    case EACCES:
    case EPERM:
      return Status::PermissionDenied(msg);
    case EADDRNOTAVAIL:
      return Status::InvalidArgument(msg);
    default:
      return Status::Internal(msg);
  }
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options,
                                                       Handler handler) {
  if (!handler) {
    return Status::InvalidArgument("HttpServer needs a handler");
  }
  if (options.max_connections == 0 || options.max_connections_per_address == 0 ||
      options.max_header_bytes < 256) {
    return Status::InvalidArgument(
        "max_connections and max_connections_per_address must be >= 1 and max_header_bytes >= 256");
  }
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(ParseHostPort(options.listen, &host, &port));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  std::string port_text = std::to_string(port);
  int gai = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &addrs);
  if (gai != 0) {
    return Status::InvalidArgument("cannot resolve '" + host + "': " + ::gai_strerror(gai));
  }
  int fd = -1;
  Status last = Status::InvalidArgument("no address for '" + host + "'");
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = ErrnoToStatus("socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      break;
    }
    last = ErrnoToStatus("bind " + options.listen, errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(addrs);
  if (fd < 0) {
    return last;
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  uint16_t actual_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    Status s = ErrnoToStatus("eventfd", errno);
    ::close(fd);
    return s;
  }
  return std::unique_ptr<HttpServer>(std::make_unique<HttpServerImpl>(
      std::move(options), std::move(handler), fd, wake, actual_port));
}

void ServeConnectionForTest(HttpServer& server, int fd) {
  static_cast<HttpServerImpl&>(server).ServeForTest(fd);
}

}  // namespace kiln::net
