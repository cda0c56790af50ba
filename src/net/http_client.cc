// HttpClient implementation. Design notes:
//
// - The pool is a hash map from (host, port) to a Target under a shared_mutex; lookups use a
//   string_view key (heterogeneous lookup), so the hot path allocates nothing to find its
//   target. A Target holds the resolved address, the Host header value and its idle fds (LIFO)
//   under its own small mutex. Targets are shared_ptrs so that Forget() can drop one while a
//   request on it is in flight: the connection that request gives back then dies with the
//   detached Target instead of returning to a pool nobody uses.
// - The response parser is hand-written (status line, headers, Content-Length / chunked /
//   close-delimited bodies, 1xx interim responses skipped). It reads through a per-thread buffer
//   and reads known-length body bytes (Content-Length bodies and chunk payloads) straight into
//   the response string, so large bodies are copied once.
// - Every wait is bounded by the one deadline of the call (ClientTimeouts.response_ms); connect
//   has its own (connect_ms).
// - Cancelling (ClientRequest::cancel): every poll() while sending or reading also watches the
//   signal's eventfd; the socket wins when both are ready (a complete answer beats an error).
//   Connect is not watched: it is bounded by connect_ms (250 ms on the invoke path).

#include "net/http_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "base/strings.h"
#include "net/http_client_testing.h"

namespace kiln::net {
namespace {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

// A pooled connection idle longer than this is probed (a non-blocking MSG_PEEK) before reuse, to
// notice a peer that closed it meanwhile without paying a failed attempt. Connections used more
// recently skip the probe (one syscall less on the hot path); the retry rule covers the rare race.
constexpr auto kProbeAfterIdle = std::chrono::milliseconds(1000);
// A chunk-size line or a trailer line longer than this is malformed.
constexpr size_t kMaxChunkLine = 4096;
// Close-delimited bodies are read in steps of this size.
constexpr size_t kCloseDelimitedStep = 64 * 1024;
// Initial per-thread read buffer.
constexpr size_t kInitialReadBuffer = 16 * 1024;

// Milliseconds left until `deadline` (rounded up, so a wait never ends early), at least 0.
// A max() deadline means no limit (-1, poll's "forever").
int RemainingMs(TimePoint deadline) {
  if (deadline == TimePoint::max()) {
    return -1;
  }
  auto left = deadline - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) {
    return 0;
  }
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
}

void AppendNumber(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, end);
}

// PollOrCancel's answer when the call's CancelSignal was set.
constexpr int kPollCancelled = -2;
// Without an eventfd, a waiting call looks at the signal's flag this often.
constexpr int kCancelCheckMs = 20;

// poll() of `fd` for `events` for up to `timeout_ms` (-1: no limit) that also ends when `cancel`
// (may be null) is set. Returns poll's result (> 0 ready, 0 timed out, -1 with errno), or
// kPollCancelled. Without an eventfd the wait is cut into slices; the end of a slice that is not
// the end of the timeout returns -1 with errno EINTR, which every caller treats as "wait again".
int PollOrCancel(int fd, short events, int timeout_ms, const CancelSignal* cancel) {
  if (cancel == nullptr) {
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, timeout_ms);
  }
  if (cancel->fd() < 0) {
    if (cancel->cancelled()) {
      return kPollCancelled;
    }
    bool sliced = timeout_ms < 0 || timeout_ms > kCancelCheckMs;
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, sliced ? kCancelCheckMs : timeout_ms);
    if (r == 0 && sliced) {
      errno = EINTR;
      return -1;
    }
    return r;
  }
  pollfd p[2] = {{fd, events, 0}, {cancel->fd(), POLLIN, 0}};
  int r = ::poll(p, 2, timeout_ms);
  if (r > 0 && p[0].revents == 0) {
    return kPollCancelled;
  }
  return r;
}

bool HasCrLf(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

// RFC 9110 token characters (header names).
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
    return true;
  }
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// True when the comma-separated header value `value` holds `token` (case-insensitive).
bool HasToken(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    size_t comma = value.find(',');
    if (EqualsIgnoreCase(Trim(value.substr(0, comma)), token)) {
      return true;
    }
    if (comma == std::string_view::npos) {
      break;
    }
    value.remove_prefix(comma + 1);
  }
  return false;
}

struct TargetKeyView {
  std::string_view host;
  uint16_t port;
};

struct TargetKey {
  std::string host;
  uint16_t port;
};

struct TargetKeyHash {
  using is_transparent = void;
  size_t operator()(const TargetKeyView& k) const {
    return std::hash<std::string_view>()(k.host) ^ (static_cast<size_t>(k.port) * 0x9E3779B97F4A7C15ull);
  }
  size_t operator()(const TargetKey& k) const { return (*this)(TargetKeyView{k.host, k.port}); }
};

struct TargetKeyEq {
  using is_transparent = void;
  static TargetKeyView View(const TargetKey& k) { return {k.host, k.port}; }
  static TargetKeyView View(const TargetKeyView& k) { return k; }
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    TargetKeyView x = View(a), y = View(b);
    return x.port == y.port && x.host == y.host;
  }
};

// Per-thread scratch, reused by every call on the thread so the hot path allocates nothing.
struct ThreadScratch {
  std::string head;            // the request head being sent
  std::unique_ptr<char[]> buf;  // response bytes read but not yet consumed: [pos, end)
  size_t cap = 0;
  size_t pos = 0;
  size_t end = 0;
};

ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

struct Idle {
  int fd;
  TimePoint since;
};

// One "host:port": its address and its idle connections.
struct Target {
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::string name;  // "127.0.0.1:8081" / "[::1]:8081": the Host header value and for messages
  std::atomic<size_t>* total_idle = nullptr;

  std::mutex mu;
  std::vector<Idle> idle;  // guarded by mu; oldest first, so the back is the warmest

  ~Target() {
    for (const Idle& c : idle) {
      ::close(c.fd);
    }
    total_idle->fetch_sub(idle.size(), std::memory_order_relaxed);
  }

  // Takes the warmest idle connection that is still usable, or returns -1.
  int Take(TimePoint now, std::chrono::milliseconds max_idle) {
    std::lock_guard<std::mutex> lock(mu);
    while (!idle.empty()) {
      Idle c = idle.back();
      idle.pop_back();
      total_idle->fetch_sub(1, std::memory_order_relaxed);
      if (now - c.since > max_idle) {
        // Everything below is older still: close it all.
        ::close(c.fd);
        for (const Idle& older : idle) {
          ::close(older.fd);
        }
        total_idle->fetch_sub(idle.size(), std::memory_order_relaxed);
        idle.clear();
        return -1;
      }
      if (now - c.since > kProbeAfterIdle) {
        char byte;
        ssize_t r = ::recv(c.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (!(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
          ::close(c.fd);  // EOF, an error, or unsolicited bytes: not reusable
          continue;
        }
      }
      return c.fd;
    }
    return -1;
  }

  void GiveBack(int fd, size_t max_idle_per_target) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (idle.size() < max_idle_per_target) {
        idle.push_back({fd, SteadyClock::now()});
        total_idle->fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    ::close(fd);
  }

  void CloseIdle() {
    std::vector<Idle> dropped;
    {
      std::lock_guard<std::mutex> lock(mu);
      dropped.swap(idle);
      total_idle->fetch_sub(dropped.size(), std::memory_order_relaxed);
    }
    for (const Idle& c : dropped) {
      ::close(c.fd);
    }
  }
};

}  // namespace

struct HttpClient::Pool {
  HttpClientOptions options;
  std::atomic<size_t> total_idle{0};
  mutable std::shared_mutex mu;
  std::unordered_map<TargetKey, std::shared_ptr<Target>, TargetKeyHash, TargetKeyEq> targets;  // guarded by mu

  explicit Pool(HttpClientOptions o) : options(o) {}

  Result<std::shared_ptr<Target>> Find(const std::string& host, uint16_t port) {
    {
      std::shared_lock<std::shared_mutex> lock(mu);
      auto it = targets.find(TargetKeyView{host, port});
      if (it != targets.end()) {
        return it->second;
      }
    }
    auto target = std::make_shared<Target>();
    target->total_idle = &total_idle;
    std::string_view literal = host;
    if (literal.size() >= 2 && literal.front() == '[' && literal.back() == ']') {
      literal = literal.substr(1, literal.size() - 2);
    }
    std::string text(literal);
    if (EqualsIgnoreCase(text, "localhost")) {
      text = "127.0.0.1";
    }
    auto* v4 = reinterpret_cast<sockaddr_in*>(&target->addr);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&target->addr);
    if (::inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
      v4->sin_family = AF_INET;
      v4->sin_port = htons(port);
      target->addr_len = sizeof(sockaddr_in);
      target->name = text + ":" + std::to_string(port);
    } else if (::inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(port);
      target->addr_len = sizeof(sockaddr_in6);
      target->name = "[" + text + "]:" + std::to_string(port);
    } else {
      return Status::InvalidArgument("cannot connect to '" + host +
                                     "': not an IP address literal or localhost");
    }
    std::unique_lock<std::shared_mutex> lock(mu);
    auto [it, inserted] = targets.try_emplace(TargetKey{host, port}, std::move(target));
    return it->second;
  }
};

namespace {

// Connects to `t` within `timeout_ms`. Errors: Unavailable.
Result<int> Connect(const Target& t, int timeout_ms) {
  int fd = ::socket(t.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return Status::Unavailable("cannot create a socket to connect to " + t.name + ": " +
                               std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&t.addr), t.addr_len) != 0) {
    err = errno;
    if (err == EINPROGRESS || err == EINTR) {
      pollfd p{fd, POLLOUT, 0};
      auto deadline = SteadyClock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
      for (;;) {
        int r = ::poll(&p, 1, timeout_ms < 0 ? -1 : RemainingMs(deadline));
        if (r < 0 && errno == EINTR) {
          continue;
        }
        if (r < 0) {
          err = errno;
        } else if (r == 0) {
          ::close(fd);
          return Status::Unavailable(t.name + " did not accept a connection within " +
                                     std::to_string(timeout_ms) + " ms");
        } else {
          socklen_t len = sizeof(err);
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
          }
        }
        break;
      }
    }
  }
  if (err != 0) {
    ::close(fd);
    if (err == ECONNREFUSED) {
      return Status::Unavailable("connection refused by " + t.name);
    }
    return Status::Unavailable("cannot connect to " + t.name + ": " + std::strerror(err));
  }
  return fd;
}

// Writes all of `iov` before `deadline`. Errors: DeadlineExceeded, Aborted (the peer is gone;
// the message holds the reason).
// Writes all of `iov` by `deadline`. Errors: DeadlineExceeded, Aborted (the peer is gone, or
// `cancel` was set: the caller tells these apart by looking at the signal).
Status SendAllUntil(int fd, iovec* iov, int iovcnt, TimePoint deadline, const CancelSignal* cancel) {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    // sendmsg rather than writev: MSG_NOSIGNAL keeps a vanished peer from raising SIGPIPE.
    ssize_t r = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) {
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Status::Aborted(std::strerror(errno));
      }
      int wait = RemainingMs(deadline);
      int pr = wait == 0 ? 0 : PollOrCancel(fd, POLLOUT, wait, cancel);
      if (pr == 0) {
        return Status::DeadlineExceeded("peer not reading");
      }
      if (pr == kPollCancelled) {
        return Status::Aborted("cancelled");
      }
      if (pr < 0 && errno != EINTR) {
        return Status::Aborted(std::string("poll: ") + std::strerror(errno));
      }
      continue;
    }
    size_t sent = static_cast<size_t>(r);
    while (iovcnt > 0 && sent >= iov->iov_len) {
      sent -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + sent;
      iov->iov_len -= sent;
    }
  }
  return Status::Ok();
}

// The error of a call cut by its CancelSignal after (part of) the request was sent.
Status CancelledError(const Target& target, const CancelSignal& cancel) {
  return Status::Aborted("the call to " + target.name + " was cancelled: " + cancel.reason());
}

// The error of a call whose CancelSignal was set before anything was sent.
Status CancelledBeforeSending(const Target& target, const CancelSignal& cancel) {
  return Status::Unavailable("nothing was sent to " + target.name + ": " + cancel.reason());
}

// The outcome of one request/response exchange on one connection.
struct Exchange {
  Status status;
  bool keep_alive = false;  // the connection may serve another request
  // The request cannot have been processed: sending failed, or the peer closed/reset the
  // connection before sending any response byte.
  bool retryable = false;
};

// Reads and parses one response from `fd` into `out`.
class ResponseReader {
 public:
  ResponseReader(int fd, const Target& target, const HttpClientOptions& options, TimePoint deadline,
                 int response_ms, bool head_request, const CancelSignal* cancel, ThreadScratch& s)
      : fd_(fd),
        target_(target),
        options_(options),
        deadline_(deadline),
        response_ms_(response_ms),
        head_request_(head_request),
        cancel_(cancel),
        s_(s) {
    s_.pos = s_.end = 0;
    if (s_.cap == 0) {
      s_.cap = kInitialReadBuffer;
      s_.buf = std::make_unique<char[]>(s_.cap);
    }
  }

  // Fills `out`; sets *keep_alive when the connection may be reused.
  Exchange Read(ClientResponse* out) {
    Exchange ex;
    for (;;) {
      bool http10 = false;
      Status st = ReadHead(out, &http10);
      if (!st.ok()) {
        ex.status = std::move(st);
        ex.retryable = eof_before_any_byte_;
        return ex;
      }
      if (out->status >= 100 && out->status < 200) {
        if (out->status == 101) {
          ex.status = Status::DataLoss(target_.name + " switched protocols (101) unasked");
          return ex;
        }
        continue;  // an interim response (100 Continue, 103 Early Hints): the real one follows
      }
      bool keep = true;
      const std::string* connection = FindHeader(out->headers, "Connection");
      if (http10) {
        keep = connection != nullptr && HasToken(*connection, "keep-alive");
      } else if (connection != nullptr && HasToken(*connection, "close")) {
        keep = false;
      }
      st = ReadBody(out, &keep);
      if (!st.ok()) {
        ex.status = std::move(st);
        return ex;
      }
      // Bytes beyond the response (we never pipeline) mean a confused peer: do not reuse.
      ex.keep_alive = keep && s_.pos == s_.end;
      return ex;
    }
  }

 private:
  enum class Fill { kOk, kEof };

  // Reads more bytes into the buffer (growing or compacting it as needed).
  Result<Fill> More() {
    if (s_.pos == s_.end) {
      consumed_base_ += s_.pos;
      s_.pos = s_.end = 0;
    }
    if (s_.end == s_.cap) {
      if (s_.pos > 0) {
        std::memmove(s_.buf.get(), s_.buf.get() + s_.pos, s_.end - s_.pos);
        consumed_base_ += s_.pos;
        s_.end -= s_.pos;
        s_.pos = 0;
      } else {
        size_t cap = s_.cap * 2;
        auto bigger = std::make_unique<char[]>(cap);
        std::memcpy(bigger.get(), s_.buf.get(), s_.end);
        s_.buf = std::move(bigger);
        s_.cap = cap;
      }
    }
    ASSIGN_OR_RETURN(size_t n, Recv(s_.buf.get() + s_.end, s_.cap - s_.end));
    if (n == 0) {
      return Fill::kEof;
    }
    s_.end += n;
    return Fill::kOk;
  }

  // recv with the call's deadline. 0 = EOF (a reset counts as EOF: both mean the peer is gone;
  // the caller words the error).
  Result<size_t> Recv(char* p, size_t n) {
    for (;;) {
      // Right after sending, the answer cannot be there yet: wait first, saving a recv that
      // would only say EAGAIN.
      ssize_t r = -1;
      errno = EAGAIN;
      if (!wait_first_) {
        r = ::recv(fd_, p, n, 0);
      }
      wait_first_ = false;
      if (r > 0) {
        got_any_byte_ = true;
        return static_cast<size_t>(r);
      }
      if (r == 0) {
        return size_t{0};
      }
      if (errno == EINTR) {
        continue;
      }
      if (errno == ECONNRESET || errno == EPIPE) {
        reset_ = true;
        return size_t{0};
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Status::Aborted("reading the response from " + target_.name + " failed: " +
                               std::strerror(errno));
      }
      int wait = RemainingMs(deadline_);
      int pr = wait == 0 ? 0 : PollOrCancel(fd_, POLLIN, wait, cancel_);
      if (pr == kPollCancelled) {
        return CancelledError(target_, *cancel_);
      }
      if (pr < 0 && errno != EINTR) {
        return Status::Aborted(std::string("poll: ") + std::strerror(errno));
      }
      if (pr == 0) {
        return Status::DeadlineExceeded(
            (got_any_byte_ ? "the response from " + target_.name + " was not complete within "
                           : target_.name + " did not answer within ") +
            std::to_string(response_ms_) + " ms");
      }
    }
  }

  // The error for a peer that went away mid-exchange.
  Status PeerGone(std::string_view during) {
    if (!got_any_byte_) {
      eof_before_any_byte_ = true;
      return Status::Aborted(target_.name + (reset_ ? " reset the connection" : " closed the connection") +
                             " before answering");
    }
    return Status::Aborted(target_.name + (reset_ ? " reset the connection" : " closed the connection") +
                           " in the middle of the response " + std::string(during));
  }

  enum class Part { kHeader, kBody, kTrailer };

  // The error for a line longer than allowed (built only when needed: no allocation per call).
  Status LineTooLong(Part part) {
    switch (part) {
      case Part::kHeader:
        return Status::ResourceExhausted("the response header from " + target_.name + " exceeds " +
                                         std::to_string(options_.max_response_header_bytes) + " bytes");
      case Part::kTrailer:
        return Status::ResourceExhausted("the response trailer from " + target_.name + " exceeds " +
                                         std::to_string(options_.max_response_header_bytes) + " bytes");
      case Part::kBody:
        break;
    }
    return Malformed("chunk size line", "(too long)");
  }

  static std::string_view PartName(Part part) {
    switch (part) {
      case Part::kHeader:
        return "header";
      case Part::kBody:
        return "body";
      case Part::kTrailer:
        return "trailer";
    }
    return "";
  }

  // Returns the next line (without CR LF) or fails. A line longer than `max` fails with
  // LineTooLong(part) (bare LF line ends are accepted, as most clients do).
  Result<std::string_view> ReadLine(size_t max, Part part) {
    size_t scanned = s_.pos;
    for (;;) {
      const char* base = s_.buf.get();
      const void* nl = std::memchr(base + scanned, '\n', s_.end - scanned);
      if (nl != nullptr) {
        size_t at = static_cast<const char*>(nl) - base;
        if (at - s_.pos + 1 > max) {
          return LineTooLong(part);
        }
        std::string_view line(base + s_.pos, at - s_.pos);
        s_.pos = at + 1;
        if (!line.empty() && line.back() == '\r') {
          line.remove_suffix(1);
        }
        return line;
      }
      if (s_.end - s_.pos >= max) {
        return LineTooLong(part);
      }
      size_t offset = s_.end - s_.pos;  // More() may move the unread bytes
      ASSIGN_OR_RETURN(Fill f, More());
      if (f == Fill::kEof) {
        return PeerGone(PartName(part));
      }
      scanned = s_.pos + offset;
    }
  }

  Status ReadHead(ClientResponse* out, bool* http10) {
    out->headers.clear();
    const size_t budget = options_.max_response_header_bytes;
    size_t start = consumed_before();
    ASSIGN_OR_RETURN(std::string_view line, ReadLine(budget, Part::kHeader));
    // HTTP/1.x SP 3DIGIT [SP reason]
    if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || (line[7] != '0' && line[7] != '1') ||
        line[8] != ' ' || (line.size() > 12 && line[12] != ' ')) {
      return Malformed("status line", line);
    }
    *http10 = line[7] == '0';
    int status = 0;
    for (int i = 9; i < 12; ++i) {
      if (line[i] < '0' || line[i] > '9') {
        return Malformed("status line", line);
      }
      status = status * 10 + (line[i] - '0');
    }
    if (status < 100) {
      return Malformed("status line", line);
    }
    out->status = status;
    for (;;) {
      size_t used = consumed_before() - start;
      if (used >= budget) {
        return LineTooLong(Part::kHeader);
      }
      ASSIGN_OR_RETURN(line, ReadLine(budget - used, Part::kHeader));
      if (line.empty()) {
        return Status::Ok();
      }
      if (line.front() == ' ' || line.front() == '\t') {
        return Malformed("header (obsolete line folding)", line);
      }
      // RFC 9110 §5.5: CR (here only a bare one: the line ends at LF) and NUL in a field are
      // invalid; a recipient rejects the message or blanks them. Rejecting keeps a bare CR out of
      // headers the router hands on (found by fuzz/http_response_fuzzer.cc).
      if (line.find_first_of(std::string_view("\r\0", 2)) != std::string_view::npos) {
        return Malformed("header line (bare CR or NUL)", line);
      }
      size_t colon = line.find(':');
      if (colon == std::string_view::npos || colon == 0) {
        return Malformed("header line", line);
      }
      std::string_view name = line.substr(0, colon);
      for (char c : name) {
        if (!IsTokenChar(c)) {
          return Malformed("header name", line);
        }
      }
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
        value.remove_prefix(1);
      }
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
        value.remove_suffix(1);
      }
      out->headers.emplace(std::string(name), std::string(value));
    }
  }

  // Bytes consumed from the stream so far (for the header budget).
  size_t consumed_before() const { return consumed_base_ + s_.pos; }

  Status Malformed(std::string_view what, std::string_view line) {
    std::string shown(line.substr(0, 80));
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
        c = '?';
      }
    }
    return Status::DataLoss(target_.name + " sent a malformed HTTP response (" + std::string(what) +
                            ": \"" + shown + "\")");
  }

  Status TooLarge() {
    return Status::ResourceExhausted("the response body from " + target_.name + " exceeds " +
                                     std::to_string(options_.max_response_body_bytes) + " bytes");
  }

  // Appends exactly `n` bytes to `body`: first what is buffered, then straight from the socket.
  Status ReadExact(std::string& body, size_t n, std::string_view during) {
    size_t at = body.size();
    body.resize(at + n);
    size_t buffered = std::min(n, s_.end - s_.pos);
    std::memcpy(body.data() + at, s_.buf.get() + s_.pos, buffered);
    s_.pos += buffered;
    at += buffered;
    n -= buffered;
    while (n > 0) {
      ASSIGN_OR_RETURN(size_t got, Recv(body.data() + at, n));
      if (got == 0) {
        body.resize(at);
        return PeerGone(during);
      }
      at += got;
      n -= got;
    }
    return Status::Ok();
  }

  Status ReadBody(ClientResponse* out, bool* keep) {
    out->body.clear();
    const int status = out->status;
    if (status == 204 || status == 304 || head_request_) {
      return Status::Ok();
    }
    const std::string* te = FindHeader(out->headers, "Transfer-Encoding");
    if (te != nullptr) {
      // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length; a response whose last coding
      // is not chunked is delimited by the close.
      std::string_view codings = *te;
      size_t comma = codings.rfind(',');
      std::string_view last = Trim(comma == std::string_view::npos ? codings : codings.substr(comma + 1));
      if (FindHeader(out->headers, "Content-Length") != nullptr) {
        *keep = false;  // both: a smuggling-shaped response; do not trust the connection after it
      }
      if (EqualsIgnoreCase(last, "chunked")) {
        return ReadChunked(out);
      }
      *keep = false;
      return ReadUntilClose(out);
    }
    auto [lo, hi] = out->headers.equal_range("Content-Length");
    if (lo != hi) {
      std::optional<uint64_t> length;
      for (auto it = lo; it != hi; ++it) {
        for (std::string_view part : Split(it->second, ',')) {
          std::optional<uint64_t> v = ParseUint64(Trim(part));
          if (!v || (length && *length != *v)) {
            return Malformed("Content-Length", it->second);
          }
          length = v;
        }
      }
      if (*length > options_.max_response_body_bytes) {
        return TooLarge();
      }
      return ReadExact(out->body, static_cast<size_t>(*length), "body");
    }
    *keep = false;
    return ReadUntilClose(out);
  }

  Status ReadUntilClose(ClientResponse* out) {
    std::string& body = out->body;
    const size_t limit = options_.max_response_body_bytes;
    body.assign(s_.buf.get() + s_.pos, s_.end - s_.pos);
    s_.pos = s_.end = 0;
    if (body.size() > limit) {
      return TooLarge();
    }
    for (;;) {
      size_t at = body.size();
      // One byte past the limit is enough to know it is exceeded.
      size_t step = std::min(kCloseDelimitedStep, limit + 1 - at);
      body.resize(at + step);
      Result<size_t> got = Recv(body.data() + at, step);
      if (!got.ok()) {
        body.resize(at);
        return got.status();
      }
      body.resize(at + *got);
      if (*got == 0) {
        // The close is the end of the body. A reset instead of a FIN may have cut it short.
        if (reset_) {
          return PeerGone("body");
        }
        return Status::Ok();
      }
      if (body.size() > limit) {
        return TooLarge();
      }
    }
  }

  Status ReadChunked(ClientResponse* out) {
    for (;;) {
      ASSIGN_OR_RETURN(std::string_view line, ReadLine(kMaxChunkLine, Part::kBody));
      std::string_view size_text = line.substr(0, line.find(';'));  // chunk extensions ignored
      while (!size_text.empty() && (size_text.back() == ' ' || size_text.back() == '\t')) {
        size_text.remove_suffix(1);
      }
      if (size_text.empty() || size_text.size() > 15) {
        return Malformed("chunk size", line);
      }
      uint64_t size = 0;
      auto [p, ec] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size, 16);
      if (ec != std::errc() || p != size_text.data() + size_text.size()) {
        return Malformed("chunk size", line);
      }
      if (size == 0) {
        break;
      }
      if (size > options_.max_response_body_bytes - out->body.size()) {
        return TooLarge();
      }
      RETURN_IF_ERROR(ReadExact(out->body, static_cast<size_t>(size), "body"));
      ASSIGN_OR_RETURN(line, ReadLine(kMaxChunkLine, Part::kBody));
      if (!line.empty()) {
        return Malformed("chunk data longer than its size", line);
      }
    }
    // Trailer fields (dropped) up to the empty line, within the header budget.
    const size_t budget = options_.max_response_header_bytes;
    const size_t start = consumed_before();
    for (;;) {
      size_t used = consumed_before() - start;
      if (used >= budget) {
        return LineTooLong(Part::kTrailer);
      }
      ASSIGN_OR_RETURN(std::string_view line, ReadLine(budget - used, Part::kTrailer));
      if (line.empty()) {
        return Status::Ok();
      }
    }
  }

  const int fd_;
  const Target& target_;
  const HttpClientOptions& options_;
  const TimePoint deadline_;
  const int response_ms_;
  const bool head_request_;
  const CancelSignal* const cancel_;
  ThreadScratch& s_;
  size_t consumed_base_ = 0;
  bool wait_first_ = true;
  bool got_any_byte_ = false;
  bool reset_ = false;
  bool eof_before_any_byte_ = false;
};

}  // namespace

CancelSignal::CancelSignal() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

CancelSignal::~CancelSignal() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

void CancelSignal::Cancel(std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_.load(std::memory_order_relaxed)) {
    return;
  }
  reason_ = std::move(reason);
  cancelled_.store(true, std::memory_order_release);
  if (fd_ >= 0) {
    // Never read back: the eventfd stays readable, so later polls see it too.
    uint64_t one = 1;
    while (::write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }
}

std::string CancelSignal::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

ParsedResponseForTest ReadResponseForTest(int fd, bool head_request, const HttpClientOptions& options,
                                          int response_ms) {
  std::atomic<size_t> idle_count{0};  // ~Target accounts its idle fds here (it has none)
  Target target;
  target.name = "test:0";
  target.total_idle = &idle_count;
  const TimePoint deadline =
      response_ms > 0 ? SteadyClock::now() + std::chrono::milliseconds(response_ms) : TimePoint::max();
  ParsedResponseForTest out;
  ResponseReader reader(fd, target, options, deadline, response_ms, head_request, /*cancel=*/nullptr,
                        Scratch());
  Exchange ex = reader.Read(&out.response);
  out.status = std::move(ex.status);
  out.keep_alive = ex.keep_alive;
  return out;
}

HttpClient::HttpClient(HttpClientOptions options) : pool_(std::make_unique<Pool>(options)) {}

HttpClient::~HttpClient() = default;  // Targets close their idle fds

Result<ClientResponse> HttpClient::Send(const std::string& host, uint16_t port,
                                        const ClientRequest& request,
                                        const ClientTimeouts& timeouts) {
  ASSIGN_OR_RETURN(std::shared_ptr<Target> target, pool_->Find(host, port));
  const HttpClientOptions& options = pool_->options;

  // The request head, validated: CR/LF in any piece would let a caller inject requests.
  ThreadScratch& scratch = Scratch();
  std::string& head = scratch.head;
  if (request.method.empty() || request.target.empty() ||
      request.method.find_first_of(" \r\n") != std::string_view::npos ||
      request.target.find_first_of(" \r\n") != std::string_view::npos) {
    return Status::InvalidArgument("bad request line for " + target->name);
  }
  head.clear();
  head.append(request.method).append(" ").append(request.target).append(" HTTP/1.1\r\nHost: ");
  head.append(target->name).append("\r\n");
  if (!request.body.empty() || !(request.method == "GET" || request.method == "HEAD")) {
    head.append("Content-Length: ");
    AppendNumber(head, request.body.size());
    head.append("\r\n");
  }
  if (request.headers != nullptr) {
    for (const auto& [name, value] : *request.headers) {
      // Framing and connection management belong to the client.
      if (EqualsIgnoreCase(name, "Host") || EqualsIgnoreCase(name, "Content-Length") ||
          EqualsIgnoreCase(name, "Connection") || EqualsIgnoreCase(name, "Transfer-Encoding") ||
          EqualsIgnoreCase(name, "Keep-Alive")) {
        continue;
      }
      if (name.empty() || HasCrLf(name) || HasCrLf(value) || name.find(':') != std::string::npos) {
        return Status::InvalidArgument("request header '" + name + "' holds characters not allowed");
      }
      head.append(name).append(": ").append(value).append("\r\n");
    }
  }
  head.append("\r\n");

  const bool is_head = request.method == "HEAD";
  const TimePoint start = SteadyClock::now();
  const TimePoint deadline = timeouts.response_ms > 0
                                 ? start + std::chrono::milliseconds(timeouts.response_ms)
                                 : TimePoint::max();
  const CancelSignal* cancel = request.cancel;
  if (cancel != nullptr && cancel->cancelled()) {
    return CancelledBeforeSending(*target, *cancel);
  }
  int fd = target->Take(start, std::chrono::milliseconds(options.max_idle_ms));
  bool reused = fd >= 0;
  if (!reused) {
    ASSIGN_OR_RETURN(fd, Connect(*target, timeouts.connect_ms));
  }
  for (;;) {
    Exchange ex;
    iovec iov[2] = {{head.data(), head.size()},
                    {const_cast<char*>(request.body.data()), request.body.size()}};
    Status sent = SendAllUntil(fd, iov, request.body.empty() ? 1 : 2, deadline, cancel);
    ClientResponse response;
    if (!sent.ok() && cancel != nullptr && cancel->cancelled()) {
      ex.status = CancelledError(*target, *cancel);
    } else if (sent.code() == StatusCode::kDeadlineExceeded) {
      ex.status = Status::DeadlineExceeded(target->name + " did not read the request within " +
                                           std::to_string(timeouts.response_ms) + " ms");
    } else {
      // Also after a failed send: a server may answer early (e.g. 413) and close without reading
      // the whole body; that answer is still in our receive buffer and is the real outcome.
      ResponseReader reader(fd, *target, options, deadline, timeouts.response_ms, is_head, cancel, scratch);
      ex = reader.Read(&response);
      if (!sent.ok()) {
        if (ex.status.ok()) {
          ex.keep_alive = false;
        } else if (ex.retryable || ex.status.code() == StatusCode::kAborted) {
          ex.status = Status::Aborted(target->name +
                                      " closed the connection before reading the whole request (" +
                                      sent.message() + ")");
        }
      }
    }
    if (ex.status.ok()) {
      if (ex.keep_alive) {
        target->GiveBack(fd, options.max_idle_per_target);
      } else {
        ::close(fd);
      }
      return response;
    }
    ::close(fd);
    if (!(reused && ex.retryable)) {
      return ex.status;
    }
    // A kept-alive connection the peer had closed while idle: once more on a fresh one.
    if (cancel != nullptr && cancel->cancelled()) {
      return CancelledBeforeSending(*target, *cancel);
    }
    reused = false;
    ASSIGN_OR_RETURN(fd, Connect(*target, timeouts.connect_ms));
  }
}

void HttpClient::Forget(const std::string& host, uint16_t port) {
  std::shared_ptr<Target> target;
  {
    std::unique_lock<std::shared_mutex> lock(pool_->mu);
    auto it = pool_->targets.find(TargetKeyView{host, port});
    if (it == pool_->targets.end()) {
      return;
    }
    target = std::move(it->second);
    pool_->targets.erase(it);
  }
  // Requests in flight keep the Target alive; the connections they give back close with it.
  target->CloseIdle();
}

size_t HttpClient::idle_connections() const {
  return pool_->total_idle.load(std::memory_order_relaxed);
}

}  // namespace kiln::net
