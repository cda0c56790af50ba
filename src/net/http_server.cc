// HttpServer implementation: the listening socket, the acceptor thread, the connection registry
// and its limits, the worker threads and Stop — the thread-per-connection model. What happens on
// one connection lives beside it: one request/response exchange in http_exchange.cc, the request
// body in http_request_body.cc, the response writer in http_response_writer.cc, and the types
// they share in http_server_internal.h. Design notes:
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
#include <chrono>
#include <cstring>
#include <deque>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/crash_handler.h"
#include "base/log.h"
#include "base/mutex.h"
#include "net/http_server_internal.h"
#include "net/http_server_testing.h"
#include "net/socket_io.h"

namespace kiln::net {
namespace {

using internal::Connection;
using internal::ConnSlot;
using internal::Limits;
using internal::MillisOrInfinite;
using internal::ServeOneRequest;
using internal::ServerContext;
using internal::SteadyMillis;

// Bounds on the "lingering close": after an error response we stop writing, then read and
// discard what the client is still sending for a moment, so that closing with unread data does
// not turn into a TCP reset that destroys the response before the client reads it.
constexpr int kLingerMillis = 1000;
constexpr size_t kLingerBytes = 1 << 20;

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

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(HttpServerOptions options, Handler handler, int listen_fd, int wake_fd, uint16_t port)
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

  Status Start() override EXCLUDES(stop_mu_) {
    MutexLock lock(stop_mu_);
    if (stopped_) {
      return Status::FailedPrecondition("server was stopped");
    }
    if (acceptor_.joinable()) {
      return Status::FailedPrecondition("server already started");
    }
    acceptor_ = std::thread([this] { AcceptLoop(); });
    return Status::Ok();
  }

  void Stop(int grace_seconds) override EXCLUDES(stop_mu_, mu_, pool_mu_) {
    MutexLock stop_lock(stop_mu_);
    if (stopped_) {
      return;
    }
    stopped_ = true;
    {
      // Under mu_ so an acceptor waiting for an evicted slot sees it (no lost wake-up).
      MutexLock lock(mu_);
      stopping_.store(true);
    }
    active_cv_.NotifyAll();
    uint64_t one = 1;
    // Never read back: the eventfd stays readable and wakes every poller, now and later.
    (void)!::write(wake_fd_, &one, sizeof(one));
    if (acceptor_.joinable()) {
      acceptor_.join();
    }
    ::close(listen_fd_);
    {
      MutexLock lock(mu_);
      const auto grace_end = std::chrono::steady_clock::now() + std::chrono::seconds(std::max(grace_seconds, 0));
      while (!conns_.empty()) {
        if (active_cv_.WaitUntil(mu_, grace_end) == std::cv_status::timeout) {
          break;
        }
      }
      force_.store(true);
      for (const auto& [id, slot] : conns_) {
        ::shutdown(slot->fd, SHUT_RDWR);
      }
      // Every socket operation now fails fast; only a handler blocked outside the socket can
      // keep us here.
      while (!conns_.empty()) {
        active_cv_.Wait(mu_);
      }
    }
    std::vector<std::thread> workers;
    {
      MutexLock lock(pool_mu_);
      pool_shutdown_ = true;
      workers.swap(workers_);
    }
    pool_cv_.NotifyAll();
    for (std::thread& t : workers) {
      t.join();
    }
  }

  HttpServerStats stats() const override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    HttpServerStats s = counters_;
    s.open_connections = conns_.size();
    for (const auto& [id, slot] : conns_) {
      s.idle_connections += slot->idle() ? 1 : 0;
    }
    return s;
  }

  // See ServeConnectionForTest (http_server_testing.h).
  void ServeForTest(int fd) EXCLUDES(mu_) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      addr.ss_family = AF_UNSPEC;
    }
    Pending p{fd, addr, nullptr};
    {
      MutexLock lock(mu_);
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

  void AcceptLoop() EXCLUDES(mu_, pool_mu_) {
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
      p.fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&p.addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (p.fd < 0) {
        const int err = errno;
        if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED || err == EPROTO) {
          continue;  // the client gave up before we took it, or a spurious wake-up
        }
        NoteAcceptError(err);
        // Out of descriptors or memory: an idle connection's descriptor is worth more to a
        // waiting client. With none to close, wait (the pending connection keeps the listening
        // socket readable, so retrying at once would spin).
        if ((err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) && EvictIdleAndWait(nullptr)) {
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
        MutexLock lock(mu_);
        const uint64_t evicted_before = counters_.evicted;
        admitted = AdmitLocked(address);
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
  bool AdmitLocked(const std::string& address) REQUIRES(mu_) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEvictionWaitMs);
    for (;;) {
      if (stopping_.load()) {
        return false;
      }
      auto it = per_address_.find(address);
      const bool address_full = it != per_address_.end() && it->second >= options_.max_connections_per_address;
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
      if (!WaitGoneLocked(victim->id, deadline)) {
        return false;
      }
    }
  }

  // Closes one idle connection (from `address` only, when given) and waits until it is gone.
  bool EvictIdleAndWait(const std::string* address) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ConnSlot* victim = EvictLocked(address);
    if (victim == nullptr) {
      return false;
    }
    return WaitGoneLocked(victim->id, std::chrono::steady_clock::now() + std::chrono::milliseconds(kEvictionWaitMs));
  }

  // Waits until the connection `id` has been closed by its worker. False on timeout or Stop.
  // mu_ is released while waiting.
  bool WaitGoneLocked(uint64_t id, std::chrono::steady_clock::time_point deadline) REQUIRES(mu_) {
    while (!stopping_.load() && conns_.contains(id)) {
      if (active_cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) {
        break;  // the answer below still counts a slot that went at the deadline
      }
    }
    return !stopping_.load() && !conns_.contains(id);
  }

  // Picks the idle connection to close for room — never-used ones before keep-alive ones, the
  // longest idle first, restricted to `address` when given — and shuts it down. Its worker then
  // sees EOF and closes it. Returns the slot (still registered), or null when none is idle.
  ConnSlot* EvictLocked(const std::string* address) REQUIRES(mu_) {
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
      candidates.push_back(
          {phase == ConnSlot::kFresh ? 0 : 1, slot->idle_since_ms.load(std::memory_order_relaxed), slot.get()});
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
      if (!c.slot->phase.compare_exchange_strong(expected, ConnSlot::kEvicted, std::memory_order_acq_rel)) {
        continue;  // its worker just claimed it
      }
      ::shutdown(c.slot->fd, SHUT_RDWR);
      ++counters_.evicted;
      return c.slot;
    }
    return nullptr;
  }

  ConnSlot* RegisterLocked(int fd, std::string address) REQUIRES(mu_) {
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
  void UnregisterLocked(ConnSlot* slot, bool close_fd) REQUIRES(mu_) {
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
  void MaybeLogShedding() EXCLUDES(mu_) {
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
  void NoteAcceptError(int err) EXCLUDES(mu_) {
    int64_t now = SteadyMillis();
    {
      MutexLock lock(mu_);
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

  void Submit(const Pending& p) EXCLUDES(pool_mu_, mu_) {
    MutexLock lock(pool_mu_);
    queue_.push_back(p);
    if (idle_workers_ >= queue_.size()) {
      pool_cv_.NotifyOne();
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
        MutexLock registry_lock(mu_);
        UnregisterLocked(p.slot, /*close_fd=*/false);
        ++counters_.refused;
      }
      active_cv_.NotifyAll();
      Reject(p.fd);
    }
  }

  void WorkerLoop() EXCLUDES(pool_mu_, mu_) {
    // A handler that overflows this thread's stack still gets its crash reported (base/crash_handler.h).
    InstallAlternateSignalStack();
    Connection conn(options_.max_header_bytes + 64 * 1024);
    for (;;) {
      Pending p;
      {
        MutexLock lock(pool_mu_);
        ++idle_workers_;
        while (queue_.empty() && !pool_shutdown_) {
          pool_cv_.Wait(pool_mu_);
        }
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
  void ServeAccepted(Connection& conn, const Pending& p) EXCLUDES(mu_) {
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

  void Close(Connection& conn) EXCLUDES(mu_) {
    if (conn.unread_input && !force_.load()) {
      // Lingering close (see kLingerMillis).
      ::shutdown(conn.fd, SHUT_WR);
      char scratch[16 * 1024];
      size_t total = 0;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLingerMillis);
      while (total < kLingerBytes) {
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
          break;
        }
        Result<size_t> r = internal::RecvSome(conn.fd, scratch, sizeof(scratch), static_cast<int>(left), wake_fd_);
        if (!r.ok() || *r == 0) {
          break;
        }
        total += *r;
      }
    }
    {
      MutexLock lock(mu_);
      UnregisterLocked(conn.slot, /*close_fd=*/true);
    }
    active_cv_.NotifyAll();
    conn.fd = -1;
    conn.slot = nullptr;
  }

  // Serves requests on one connection until it should close.
  void Serve(Connection& conn) {
    while (ServeOneRequest(conn, context_)) {
    }
  }

  const HttpServerOptions options_;
  const Handler handler_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd, readable once Stop() begins
  const uint16_t port_;
  Limits limits_;
  std::atomic<bool> stopping_{false};
  const ServerContext context_{options_, limits_, handler_, stopping_};  // for ServeOneRequest

  // Serializes Start/Stop. Taken before mu_ and pool_mu_ (Stop holds it throughout).
  Mutex stop_mu_;
  bool stopped_ GUARDED_BY(stop_mu_) = false;
  std::thread acceptor_ GUARDED_BY(stop_mu_);

  // The connection registry. Every accepted connection has a slot from accept until its fd is
  // closed (queued or served); per_address_ counts them by AddressKey (no zero entries).
  // Taken after pool_mu_ when both are held (Submit).
  mutable Mutex mu_;
  CondVar active_cv_;  // a slot went away, or stopping_ was set
  // By ConnSlot::id. The map is guarded; a slot's id, fd and address are set before it is
  // inserted and never change, its phase and idle clock are atomics (http_server_internal.h).
  std::unordered_map<uint64_t, std::unique_ptr<ConnSlot>> conns_ GUARDED_BY(mu_);
  std::unordered_map<std::string, size_t> per_address_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 0;
  HttpServerStats counters_ GUARDED_BY(mu_);  // the cumulative fields
  std::atomic<bool> force_{false};            // grace is over: sockets are shut down as they register

  // Acceptor thread only.
  int64_t last_shed_log_ms_ = -kShedLogIntervalMs;
  int64_t last_accept_log_ms_ = -kShedLogIntervalMs;

  Mutex pool_mu_;
  CondVar pool_cv_;
  std::deque<Pending> queue_ GUARDED_BY(pool_mu_);
  size_t idle_workers_ GUARDED_BY(pool_mu_) = 0;
  bool pool_shutdown_ GUARDED_BY(pool_mu_) = false;
  std::vector<std::thread> workers_ GUARDED_BY(pool_mu_);
};

Status ErrnoToStatus(std::string_view what, int err) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case EADDRINUSE: return Status::Unavailable(msg);
    case EACCES:
    case EPERM: return Status::PermissionDenied(msg);
    case EADDRNOTAVAIL: return Status::InvalidArgument(msg);
    default: return Status::Internal(msg);
  }
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options, Handler handler,
                                                       AsyncService* /*async*/) {
  if (!handler) {
    return Status::InvalidArgument("HttpServer needs a handler");
  }
  if (options.max_connections == 0 || options.max_connections_per_address == 0 || options.max_header_bytes < 256) {
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
  uint16_t actual_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    Status s = ErrnoToStatus("eventfd", errno);
    ::close(fd);
    return s;
  }
  return std::unique_ptr<HttpServer>(
      std::make_unique<HttpServerImpl>(std::move(options), std::move(handler), fd, wake, actual_port));
}

void ServeConnectionForTest(HttpServer& server, int fd) { static_cast<HttpServerImpl&>(server).ServeForTest(fd); }

}  // namespace kiln::net
