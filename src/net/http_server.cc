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
#include <unordered_set>
#include <vector>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>

#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"
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

// Per-connection state. A worker thread keeps one and reuses it (buffers keep their capacity)
// for every connection it serves.
struct Connection {
  int fd = -1;
  std::string remote_address;
  beast::flat_buffer buffer;
  // True while waiting for the first byte of a request: the idle timeout applies and Stop()
  // may interrupt the wait.
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
      int timeout_ms = idle ? limits_->idle_timeout_ms : limits_->io_timeout_ms;
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
      if (idle && limits_->header_timeout_ms > 0) {
        conn_->header_deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(limits_->header_timeout_ms);
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
    stopping_.store(true);
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
                          [this] { return active_ == 0; });
    }
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      force_ = true;
      for (int fd : conns_) {
        ::shutdown(fd, SHUT_RDWR);
      }
    }
    {
      // Every socket operation now fails fast; only a handler blocked outside the socket can
      // keep us here.
      std::unique_lock<std::mutex> lock(mu_);
      active_cv_.wait(lock, [this] { return active_ == 0; });
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

 private:
  struct Pending {
    int fd;
    sockaddr_storage addr;
  };

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
      Pending p;
      socklen_t len = sizeof(p.addr);
      p.fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&p.addr), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (p.fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          KLOG(warn, "http accept failed", {{"error", std::strerror(errno)}});
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // don't spin
        }
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (active_ >= options_.max_connections) {
          Reject(p.fd);
          continue;
        }
        ++active_;
      }
      int one = 1;
      ::setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Submit(p);
    }
  }

  // Over max_connections: answer 503 without blocking the acceptor, then close.
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
    // Every worker is busy: grow the pool. Bounded by max_connections through active_.
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error& e) {
      // Out of threads: shed this connection rather than let the acceptor die.
      KLOG(error, "http worker thread creation failed", {{"error", e.what()}});
      queue_.pop_back();
      Reject(p.fd);
      {
        std::lock_guard<std::mutex> active_lock(mu_);
        --active_;
      }
      active_cv_.notify_all();
    }
  }

  void WorkerLoop() {
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
      conn.fd = p.fd;
      conn.remote_address = FormatAddress(p.addr);
      conn.buffer.consume(conn.buffer.size());
      conn.unread_input = false;
      Register(conn.fd);
      try {
        Serve(conn);
      } catch (const std::exception& e) {
        KLOG(error, "http connection failed", {{"remote", conn.remote_address}, {"error", e.what()}});
        conn.unread_input = true;
      } catch (...) {
        conn.unread_input = true;
      }
      Close(conn);
      if (conn.buffer.capacity() > 256 * 1024) {
        conn.buffer.shrink_to_fit();  // one huge header must not pin memory for good
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        --active_;
      }
      active_cv_.notify_all();
    }
  }

  void Register(int fd) {
    std::lock_guard<std::mutex> lock(conns_mu_);
    conns_.insert(fd);
    if (force_) {
      ::shutdown(fd, SHUT_RDWR);
    }
  }

  void Close(Connection& conn) {
    if (conn.unread_input && !force_) {
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
      // Unregister before close() so Stop() never shuts down a reused fd number.
      std::lock_guard<std::mutex> lock(conns_mu_);
      conns_.erase(conn.fd);
    }
    ::close(conn.fd);
    conn.fd = -1;
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
    conn.idle_phase = true;
    conn.header_deadline.reset();
    RequestParser parser;
    parser.header_limit(static_cast<uint32_t>(
        std::min<size_t>(options_.max_header_bytes, std::numeric_limits<uint32_t>::max())));
    parser.body_limit(options_.max_body_bytes);
    FdReadStream stream(&conn, &limits_);
    error_code ec;
    http::read_header(stream, conn.buffer, parser, ec);
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

  std::mutex mu_;
  std::condition_variable active_cv_;
  size_t active_ = 0;  // accepted connections not yet closed (queued or served); guarded by mu_

  std::mutex conns_mu_;
  std::unordered_set<int> conns_;  // fds being served; guarded by conns_mu_
  bool force_ = false;             // grace is over: shut sockets down; guarded by conns_mu_

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
  if (options.max_connections == 0 || options.max_header_bytes < 256) {
    return Status::InvalidArgument("max_connections must be >= 1 and max_header_bytes >= 256");
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

}  // namespace kiln::net
