// HttpClient implementation: the per-target pool, connect, the request head, sending and the
// retry rule; reading the response (Beast's response parser over the call's deadline and
// CancelSignal, TCP_QUICKACK) is http_response_reader.cc. Design notes:
//
// - The pool is a hash map from (host, port) to a Target under a shared_mutex; lookups use a
//   string_view key (heterogeneous lookup), so the hot path allocates nothing to find its
//   target. A Target holds the resolved address, the Host header value and its idle fds (LIFO)
//   under its own small mutex. Targets are shared_ptrs so that Forget() can drop one while a
//   request on it is in flight: the connection that request gives back then dies with the
//   detached Target instead of returning to a pool nobody uses.
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
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/strings.h"
#include "net/http_client_internal.h"
#include "net/socket_io.h"

namespace kiln::net {

namespace internal {

// Without an eventfd, a waiting call looks at the signal's flag this often.
constexpr int kCancelCheckMs = 20;

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

ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

Status FormatRequestHead(const ClientRequest& request, std::string_view host_value, std::string& head) {
  if (request.method.empty() || request.target.empty() ||
      request.method.find_first_of(" \r\n") != std::string_view::npos ||
      request.target.find_first_of(" \r\n") != std::string_view::npos) {
    return Status::InvalidArgument("bad request line for " + std::string(host_value));
  }
  head.clear();
  head.append(request.method).append(" ").append(request.target).append(" HTTP/1.1\r\nHost: ");
  head.append(host_value).append("\r\n");
  if (!request.body.empty() || !(request.method == "GET" || request.method == "HEAD")) {
    head.append("Content-Length: ");
    char digits[24];
    auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), request.body.size());
    head.append(digits, end);
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
      if (name.empty() || name.find_first_of("\r\n") != std::string::npos ||
          value.find_first_of("\r\n") != std::string::npos || name.find(':') != std::string::npos) {
        return Status::InvalidArgument("request header '" + name + "' holds characters not allowed");
      }
      head.append(name).append(": ").append(value).append("\r\n");
    }
  }
  head.append("\r\n");
  return Status::Ok();
}

}  // namespace internal

namespace {

using internal::CancelledError;
using internal::Exchange;
using internal::FormatRequestHead;
using internal::kPollCancelled;
using internal::PollOrCancel;
using internal::ReadResponse;
using internal::RemainingMs;
using internal::Scratch;
using internal::SteadyClock;
using internal::TargetKey;
using internal::TargetKeyEq;
using internal::TargetKeyHash;
using internal::TargetKeyView;
using internal::ThreadScratch;
using internal::TimePoint;

// A pooled connection idle longer than this is probed (a non-blocking MSG_PEEK) before reuse, to
// notice a peer that closed it meanwhile without paying a failed attempt. Connections used more
// recently skip the probe (one syscall less on the hot path); the retry rule covers the rare race.
constexpr auto kProbeAfterIdle = std::chrono::milliseconds(1000);

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

  Mutex mu;
  std::vector<Idle> idle GUARDED_BY(mu);  // oldest first, so the back is the warmest

  ~Target() {  // the last owner: no other thread can reach `idle` (the analysis skips destructors)
    for (const Idle& c : idle) {
      ::close(c.fd);
    }
    total_idle->fetch_sub(idle.size(), std::memory_order_relaxed);
  }

  // Takes the warmest idle connection that is still usable, or returns -1.
  int Take(TimePoint now, std::chrono::milliseconds max_idle) EXCLUDES(mu) {
    MutexLock lock(mu);
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

  void GiveBack(int fd, size_t max_idle_per_target) EXCLUDES(mu) {
    {
      MutexLock lock(mu);
      if (idle.size() < max_idle_per_target) {
        idle.push_back({fd, SteadyClock::now()});
        total_idle->fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    ::close(fd);
  }

  void CloseIdle() EXCLUDES(mu) {
    std::vector<Idle> dropped;
    {
      MutexLock lock(mu);
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
  mutable SharedMutex mu;  // readers find a known target; writers add or forget one
  std::unordered_map<TargetKey, std::shared_ptr<Target>, TargetKeyHash, TargetKeyEq> targets GUARDED_BY(mu);

  explicit Pool(HttpClientOptions o) : options(o) {}

  Result<std::shared_ptr<Target>> Find(const std::string& host, uint16_t port) EXCLUDES(mu) {
    {
      ReaderMutexLock lock(mu);
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
      return Status::InvalidArgument("cannot connect to '" + host + "': not an IP address literal or localhost");
    }
    WriterMutexLock lock(mu);
    auto [it, inserted] = targets.try_emplace(TargetKey{host, port}, std::move(target));
    return it->second;
  }
};

namespace {

// Connects to `t` within `timeout_ms`. Errors: Unavailable.
Result<int> Connect(const Target& t, int timeout_ms) {
  int fd = ::socket(t.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return Status::Unavailable("cannot create a socket to connect to " + t.name + ": " + std::strerror(errno));
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
          return Status::Unavailable(t.name + " did not accept a connection within " + std::to_string(timeout_ms) +
                                     " ms");
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

// Writes all of `iov` by `deadline`. Errors: DeadlineExceeded, Aborted (the peer is gone, or
// `cancel` was set: the caller tells these apart by looking at the signal).
Status SendAllUntil(int fd, iovec* iov, int iovcnt, TimePoint deadline, const CancelSignal* cancel) {
  while (iovcnt > 0) {
    if (internal::SendSome(fd, iov, iovcnt)) {
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
  }
  return Status::Ok();
}

// The error of a call whose CancelSignal was set before anything was sent.
Status CancelledBeforeSending(const Target& target, const CancelSignal& cancel) {
  return Status::Unavailable("nothing was sent to " + target.name + ": " + cancel.reason());
}

}  // namespace

CancelSignal::CancelSignal() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

CancelSignal::~CancelSignal() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

void CancelSignal::Cancel(std::string reason) {
  MutexLock lock(mu_);
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
  MutexLock lock(mu_);
  return reason_;
}

HttpClient::HttpClient(HttpClientOptions options) : pool_(std::make_unique<Pool>(options)) {}

HttpClient::~HttpClient() = default;  // Targets close their idle fds

Result<ClientResponse> HttpClient::Send(const std::string& host, uint16_t port, const ClientRequest& request,
                                        const ClientTimeouts& timeouts) {
  ASSIGN_OR_RETURN(std::shared_ptr<Target> target, pool_->Find(host, port));
  const HttpClientOptions& options = pool_->options;

  ThreadScratch& scratch = Scratch();
  std::string& head = scratch.head;
  RETURN_IF_ERROR(FormatRequestHead(request, target->name, head));

  const bool is_head = request.method == "HEAD";
  const TimePoint start = SteadyClock::now();
  const TimePoint deadline =
      timeouts.response_ms > 0 ? start + std::chrono::milliseconds(timeouts.response_ms) : TimePoint::max();
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
    iovec iov[2] = {{head.data(), head.size()}, {const_cast<char*>(request.body.data()), request.body.size()}};
    Status sent = SendAllUntil(fd, iov, request.body.empty() ? 1 : 2, deadline, cancel);
    ClientResponse response;
    if (!sent.ok() && cancel != nullptr && cancel->cancelled()) {
      ex.status = CancelledError(target->name, *cancel);
    } else if (sent.code() == StatusCode::kDeadlineExceeded) {
      ex.status = Status::DeadlineExceeded(target->name + " did not read the request within " +
                                           std::to_string(timeouts.response_ms) + " ms");
    } else {
      // Also after a failed send: a server may answer early (e.g. 413) and close without reading
      // the whole body; that answer is still in our receive buffer and is the real outcome.
      ex = ReadResponse(fd, target->name, options, deadline, timeouts.response_ms, is_head, cancel, scratch, &response);
      if (!sent.ok()) {
        if (ex.status.ok()) {
          ex.keep_alive = false;
        } else if (ex.retryable || ex.status.code() == StatusCode::kAborted) {
          ex.status = Status::Aborted(target->name + " closed the connection before reading the whole request (" +
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
    WriterMutexLock lock(pool_->mu);
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

size_t HttpClient::idle_connections() const { return pool_->total_idle.load(std::memory_order_relaxed); }

}  // namespace kiln::net
