// HttpServer implementation: the listening socket and the acceptor thread, the connection
// registry and its limits, the event loops that own the connections, the worker pool that runs
// the blocking Handler, and Stop. What happens inside one blocking exchange lives beside it: the
// exchange in http_exchange.cc, the request body in http_request_body.cc, the response writer in
// http_response_writer.cc, the types they share in http_server_internal.h. Design notes:
//
// - Event loops (event_loop.h): a fixed set of threads, each running one io_context. The acceptor
//   hands each connection to a loop (round robin), which owns it until it closes. A connection
//   that waits for a request costs its LoopConnection object (with a 1 KiB inline buffer for its
//   first bytes) and its socket: no thread; the read buffer is released whenever a connection
//   goes idle with nothing buffered.
// - Callbacks, not C++20 coroutines: clang 14 with Boost 1.74 does not enable asio::awaitable
//   (CI's sanitizer build is clang), and a per-connection object driven by completion handlers
//   allocates nothing per request.
// - Reads: a waiting connection reads through Asio (async_read_some into its inline buffer):
//   Asio skips the speculative read when the last one took everything there was and queues the
//   read without a syscall, where each async_wait costs an EPOLL_CTL_MOD. The rest of a header
//   and bodies are read with plain recv, tried first and waited for (async_wait) only on EAGAIN;
//   answers are written with sendmsg, tried first likewise.
// - The request header is read and parsed on the loop (Beast's parser fed with put(), the whole
//   header bounded by max_header_bytes across passes). Then either the AsyncService claims the
//   request (the invoke path: body read on the loop, served on the loop, answer written on the
//   loop), or the connection is handed to the worker pool, where the blocking exchange
//   (ServeParsedRequest) reads the body, runs the Handler and writes the answer with the socket
//   I/O of socket_io.h, then gives the connection back to its loop. While a worker has it, the
//   loop does not touch the socket.
// - Timeouts on the loops are checked by one sweep timer per loop (kSweepMillis resolution):
//   each connection carries a deadline (first byte, idle, header, body or write progress), so no
//   timer is armed or cancelled per request.
// - Limits: every accepted connection gets a ConnSlot in the registry (conns_, under mu_) from
//   accept until its fd is closed. The slot's phase says whether the connection is idle (no byte
//   yet, or between requests). When a new connection would pass max_connections or
//   max_connections_per_address, the acceptor closes an idle one (shutdown(): its loop sees EOF
//   and closes it) and waits for its slot to go before admitting the new one. The loop and the
//   acceptor race for an idle slot with one CAS each (loop: idle → busy on the first byte;
//   acceptor: idle → evicted), so a connection whose request is being read is never closed for
//   room. A slot's fd is closed only under mu_, together with its removal, so the acceptor never
//   shuts down a reused descriptor number.
// - Stop() closes the listening socket, closes idle connections at once, lets requests in flight
//   finish (answered with `Connection: close`), and after the grace period shuts every socket down
//   and fails the loops' upstream calls.

#include "net/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <memory>
#include <optional>
#include <unordered_set>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/crash_handler.h"
#include "base/log.h"
#include "base/mutex.h"
#include "net/event_loop.h"
#include "net/event_loop_internal.h"
#include "net/http_server_internal.h"
#include "net/http_server_testing.h"
#include "net/socket_io.h"

namespace kiln::net {
namespace {

using boost::system::error_code;
using internal::Connection;
using internal::ConnSlot;
using internal::Limits;
using internal::MillisOrInfinite;
using internal::RequestParser;
using internal::ServeParsedRequest;
namespace asio = boost::asio;
namespace http = boost::beast::http;
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

// The loops' timeout sweep runs this often; timeouts are whole seconds, so a quarter second of
// lateness is noise.
constexpr int kSweepMillis = 250;
// recv() size on the loops while reading headers and bodies.
constexpr size_t kReadChunk = 16 * 1024;

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class HttpServerImpl;
class LoopConnection;

// One event loop and what it owns.
struct LoopState {
  LoopState(size_t index, const HttpClientOptions& upstream) : loop(index, upstream), sweep(IoContextOf(loop)) {}
  EventLoop loop;
  asio::steady_timer sweep;
  // The open connections of this loop, owned here until they close. Loop thread only.
  std::unordered_map<LoopConnection*, std::shared_ptr<LoopConnection>> conns;
  std::thread thread;
};

// One accepted connection, owned by its loop. Every method runs on the loop's thread, except
// while state_ is kWorker: then a worker thread runs the blocking exchange on conn_ and the loop
// leaves the connection alone until the worker posts it back (AfterWorker).
class LoopConnection final : public AsyncExchange, public std::enable_shared_from_this<LoopConnection> {
 public:
  enum class State {
    kWaiting,       // no request byte yet (fresh, or keep-alive between requests)
    kHeader,        // reading a request header
    kWorker,        // a worker thread runs the blocking exchange
    kAsyncBody,     // reading the body of a request the AsyncService claimed
    kAsyncServing,  // the AsyncService has it; waiting for Respond()
    kAsyncWriting,  // writing the AsyncService's answer
    kClosed,
  };

  LoopConnection(HttpServerImpl* server, LoopState* loop, int fd, ConnSlot* slot, std::string remote_address,
                 size_t buffer_limit)
      : server_(server), loop_(loop), socket_(IoContextOf(loop->loop), fd), conn_(buffer_limit) {
    conn_.fd = fd;
    conn_.slot = slot;
    conn_.remote_address = std::move(remote_address);
  }

  void Start();
  // The connection's deadline (first byte, idle, header, body or write progress) has passed.
  bool Expired(int64_t now_ms) const { return deadline_ms_ != 0 && now_ms >= deadline_ms_; }
  void TimeOut() { Close(); }
  // Stop(): closes the connection if it waits for a request.
  void CloseIfWaiting() {
    if (state_ == State::kWaiting) Close();
  }
  // The grace period is over: a connection still waiting for its AsyncService answer is cut.
  State state() const { return state_; }

  // AsyncExchange
  const HttpRequest& request() const override { return conn_.request; }
  std::string_view body() const override { return async_body_; }
  EventLoop& loop() override { return loop_->loop; }
  int64_t start_steady_ns() const override { return start_ns_; }
  void Respond(int status, const HeaderMap& headers, std::string body) override;
  void CloseAfterResponse() override { close_after_ = true; }

 private:
  void ReadHeader();
  void IdleRead();
  void OnFirstBytes(size_t n);
  void WaitReadable();
  void WaitWritable();
  void OnHeaderDone();
  void HeaderError(const error_code& ec);
  bool AsyncEligible() const;
  void ToWorker(int error_status);
  void AfterWorker(bool keep);
  void NextRequest();
  void StartAsync();
  void ReadAsyncBody();
  void ServeAsync();
  void WriteResponse();
  void Close();
  void SetDeadlineIn(int timeout_ms) { deadline_ms_ = timeout_ms < 0 ? 0 : SteadyMillis() + timeout_ms; }

  HttpServerImpl* const server_;
  LoopState* const loop_;
  asio::posix::stream_descriptor socket_;  // readiness only; bytes move with recv/sendmsg
  Connection conn_;
  State state_ = State::kWaiting;
  int64_t deadline_ms_ = 0;  // steady ms; 0: none (a worker or the AsyncService has it)
  int64_t header_deadline_ms_ = 0;
  std::optional<RequestParser> parser_;
  // Where a waiting connection's first bytes land (IdleRead): small, so that idle connections
  // stay cheap, and large enough for a typical request head (a SigV4-signed invoke is ~1 KiB).
  char first_bytes_[1024];
  size_t header_consumed_ = 0;
  int64_t start_ns_ = 0;
  // The AsyncService's exchange.
  std::string async_body_;
  size_t async_body_expected_ = 0;
  std::shared_ptr<LoopConnection> serving_self_;  // held from Serve() until Respond()
  bool responded_ = true;
  bool close_after_ = false;
  bool keep_after_write_ = false;
  std::string out_head_;
  std::string out_body_;
  size_t out_written_ = 0;
};

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(HttpServerOptions options, Handler handler, AsyncService* async, int listen_fd, int wake_fd,
                 uint16_t port)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        async_(async),
        listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        port_(port) {
    limits_.io_timeout_ms = MillisOrInfinite(options_.io_timeout_seconds);
    limits_.idle_timeout_ms = MillisOrInfinite(options_.idle_timeout_seconds);
    limits_.first_byte_timeout_ms = MillisOrInfinite(options_.first_byte_timeout_seconds);
    limits_.header_timeout_ms = MillisOrInfinite(options_.header_timeout_seconds);
    limits_.wake_fd = wake_fd_;
    size_t loops = options_.event_loops;
    if (loops == 0) {
      loops = std::max<size_t>(1, std::thread::hardware_concurrency());
    }
    for (size_t i = 0; i < loops; ++i) {
      loops_.push_back(std::make_unique<LoopState>(i, options_.upstream));
    }
  }

  ~HttpServerImpl() override {
    Stop(10);
    ::close(wake_fd_);
  }

  // HttpServer
  uint16_t port() const override { return port_; }

  Status Start() override EXCLUDES(stop_mu_, pool_mu_) {
    MutexLock lock(stop_mu_);
    if (stopped_) {
      return Status::FailedPrecondition("server was stopped");
    }
    if (acceptor_.joinable()) {
      return Status::FailedPrecondition("server already started");
    }
    StartLoopsLocked();
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
    const bool loops_running = loops_started_;
    if (loops_running) {
      for (auto& ls : loops_) {
        LoopState* state = ls.get();
        state->loop.Post([state] {
          std::vector<std::shared_ptr<LoopConnection>> all;
          for (auto& [raw, conn] : state->conns) all.push_back(conn);
          for (auto& conn : all) conn->CloseIfWaiting();
        });
      }
    }
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
    }
    if (loops_running) {
      // Upstream calls still in flight end now (their exchanges answer and close).
      for (auto& ls : loops_) {
        LoopState* state = ls.get();
        state->loop.Post([state] {
          if (state->loop.impl().client) state->loop.impl().client->Shutdown();
        });
      }
    }
    {
      MutexLock lock(mu_);
      // Every socket operation now fails fast; only a handler blocked outside the socket can
      // keep us here.
      while (!conns_.empty()) {
        active_cv_.Wait(mu_);
      }
    }
    for (auto& ls : loops_) {
      ls->loop.Stop();
    }
    for (auto& ls : loops_) {
      if (ls->thread.joinable()) ls->thread.join();
    }
    std::list<std::thread> workers;
    std::vector<std::thread> finished;
    {
      MutexLock lock(pool_mu_);
      pool_shutdown_ = true;
      workers.swap(workers_);
      finished.swap(finished_workers_);
    }
    pool_cv_.NotifyAll();
    for (std::thread& t : workers) {
      t.join();
    }
    for (std::thread& t : finished) {
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
    for (const auto& ls : loops_) {
      s.upstream_idle_connections += ls->loop.impl().client->idle_connections();
    }
    return s;
  }

  void ForgetUpstream(const std::string& host, uint16_t port) override {
    for (auto& ls : loops_) {
      LoopState* state = ls.get();
      state->loop.Post([state, host, port] { state->loop.client().Forget(host, port); });
    }
  }

  // See ServeConnectionForTest (http_server_testing.h): `fd` is registered and served by loop 0
  // exactly as an accepted connection; returns once it is closed.
  void ServeForTest(int fd) EXCLUDES(stop_mu_, mu_, pool_mu_) {
    {
      MutexLock lock(stop_mu_);
      StartLoopsLocked();
    }
    Pending p{fd, {}, nullptr};
    socklen_t len = sizeof(p.addr);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&p.addr), &len) != 0) {
      p.addr.ss_family = AF_UNSPEC;
    }
    uint64_t id = 0;
    {
      MutexLock lock(mu_);
      p.slot = RegisterLocked(fd, AddressKey(p.addr));
      id = p.slot->id;
    }
    SubmitTo(loops_.front().get(), p);
    MutexLock lock(mu_);
    while (conns_.contains(id)) {
      active_cv_.Wait(mu_);
    }
  }

  // For LoopConnection.
  const HttpServerOptions& options() const { return options_; }
  const Limits& limits() const { return limits_; }
  const internal::ServerContext& context() const { return context_; }
  AsyncService* async() const { return async_; }
  bool stopping() const { return stopping_.load(); }
  bool forced() const { return force_.load(); }
  size_t BufferLimit() const { return options_.max_header_bytes + 64 * 1024; }

  // Removes the slot and closes the socket, in one critical section (see the design notes). A
  // null slot: an upgraded connection, already unregistered (ReleaseSlot).
  void CloseConnection(ConnSlot* slot, asio::posix::stream_descriptor& socket) EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      if (slot != nullptr) UnregisterLocked(slot, /*close_fd=*/false);
      error_code ignored;
      socket.close(ignored);
    }
    active_cv_.NotifyAll();
  }

  // For ResponseWriter::Upgrade (a worker thread): the connection is no longer the server's to
  // count, evict or shut down. Under mu_, where Stop() sets stopping_: either Stop() never sees
  // the slot, or the upgrade is refused.
  bool ReleaseSlot(ConnSlot* slot) EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      if (stopping_.load()) {
        return false;
      }
      UnregisterLocked(slot, /*close_fd=*/false);
    }
    active_cv_.NotifyAll();
    return true;
  }

  // Runs `task` on a worker thread (queued when all worker_threads are busy).
  void SubmitWork(std::function<void()> task) EXCLUDES(pool_mu_) {
    std::vector<std::thread> finished;
    {
      MutexLock lock(pool_mu_);
      work_.push_back(std::move(task));
      finished.swap(finished_workers_);
      if (idle_workers_ >= work_.size()) {
        pool_cv_.NotifyOne();
      } else if (workers_.size() < std::max<size_t>(1, options_.worker_threads)) {
        StartWorkerLocked();
      }
    }
    // Workers that retired for idleness (WorkerLoop): they have let go of pool_mu_ for good.
    for (std::thread& t : finished) {
      t.join();
    }
  }

  // The lingering close (kLingerMillis) before a connection with unread input is closed: read and
  // drop what the client still sends, so that closing does not reset the answer away. Blocking.
  void Linger(Connection& conn) {
    if (!conn.unread_input || force_.load()) {
      return;
    }
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

 private:
  struct Pending {
    int fd;
    sockaddr_storage addr;
    ConnSlot* slot;  // registered by the acceptor
  };

  // How long the acceptor waits for an evicted connection's loop to close it.
  static constexpr int kEvictionWaitMs = 1000;
  // Back-off after accept() failed with nothing to evict (EMFILE and the like).
  static constexpr int kAcceptBackoffMs = 100;
  // Shedding and accept failures are logged at most this often (they come in floods).
  static constexpr int64_t kShedLogIntervalMs = 10000;

  // Starts the loop threads and the first worker (once).
  void StartLoopsLocked() REQUIRES(stop_mu_) EXCLUDES(pool_mu_) {
    if (loops_started_) {
      return;
    }
    loops_started_ = true;
    for (auto& ls : loops_) {
      LoopState* state = ls.get();
      state->thread = std::thread([state] {
        InstallAlternateSignalStack();
        state->loop.Run();
      });
      state->loop.Post([this, state] { ArmSweep(state); });
    }
    // One worker from the start: the pool must never depend on creating a thread under load.
    MutexLock pool_lock(pool_mu_);
    StartWorkerLocked();
  }

  void ArmSweep(LoopState* state) {
    state->sweep.expires_after(std::chrono::milliseconds(kSweepMillis));
    state->sweep.async_wait([this, state](const error_code& ec) {
      if (ec) return;
      const int64_t now = SteadyMillis();
      std::vector<std::shared_ptr<LoopConnection>> expired;
      for (auto& [raw, conn] : state->conns) {
        if (conn->Expired(now)) expired.push_back(conn);
      }
      for (auto& conn : expired) conn->TimeOut();
      ArmSweep(state);
    });
  }

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

  // Hands an admitted connection to the next loop (round robin).
  void Submit(const Pending& p) { SubmitTo(loops_[next_loop_++ % loops_.size()].get(), p); }

  void SubmitTo(LoopState* state, const Pending& p) {
    state->loop.Post([this, state, p] {
      auto conn = std::make_shared<LoopConnection>(this, state, p.fd, p.slot, FormatAddress(p.addr), BufferLimit());
      state->conns.emplace(conn.get(), conn);
      conn->Start();
    });
  }

  void StartWorkerLocked() REQUIRES(pool_mu_) {
    try {
      workers_.emplace_back();
      auto self = std::prev(workers_.end());
      *self = std::thread([this, self] { WorkerLoop(self); });
    } catch (const std::system_error& e) {
      workers_.pop_back();
      // Out of threads: the task stays queued for the workers there are.
      KLOG(error, "http worker thread creation failed", {{"error", e.what()}});
    }
  }

  // `self` is this thread's entry in workers_. A worker idle for worker_idle_seconds retires
  // (all but the last): it moves its std::thread to finished_workers_, to be joined by the next
  // SubmitWork or by Stop, so a burst's threads do not stay for good.
  void WorkerLoop(std::list<std::thread>::iterator self) EXCLUDES(pool_mu_) {
    // A handler that overflows this thread's stack still gets its crash reported (base/crash_handler.h).
    InstallAlternateSignalStack();
    const auto idle_limit = std::chrono::seconds(std::max(1, options_.worker_idle_seconds));
    for (;;) {
      std::function<void()> task;
      {
        MutexLock lock(pool_mu_);
        ++idle_workers_;
        const auto retire_at = std::chrono::steady_clock::now() + idle_limit;
        bool idle_too_long = false;
        while (work_.empty() && !pool_shutdown_ && !idle_too_long) {
          idle_too_long = pool_cv_.WaitUntil(pool_mu_, retire_at) == std::cv_status::timeout;
        }
        --idle_workers_;
        if (work_.empty() && idle_too_long && !pool_shutdown_ && workers_.size() > 1) {
          finished_workers_.push_back(std::move(*self));
          workers_.erase(self);
          return;
        }
        if (work_.empty()) {
          if (!pool_shutdown_) continue;  // the last worker stays
          return;
        }
        task = std::move(work_.front());
        work_.pop_front();
      }
      task();
    }
  }

  const HttpServerOptions options_;
  const Handler handler_;
  AsyncService* const async_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd, readable once Stop() begins
  const uint16_t port_;
  Limits limits_;
  std::atomic<bool> stopping_{false};
  // ResponseWriter::Upgrade: the connection leaves the registry (limits, stats, Stop) at once.
  const std::function<bool(ConnSlot*)> release_slot_ = [this](ConnSlot* slot) { return ReleaseSlot(slot); };
  const internal::ServerContext context_{options_, limits_, handler_, stopping_, release_slot_};  // for the exchanges
  std::vector<std::unique_ptr<LoopState>> loops_;
  size_t next_loop_ = 0;  // acceptor thread only

  // Serializes Start/Stop. Taken before mu_ and pool_mu_ (Stop holds it throughout).
  Mutex stop_mu_;
  bool stopped_ GUARDED_BY(stop_mu_) = false;
  bool loops_started_ GUARDED_BY(stop_mu_) = false;
  std::thread acceptor_ GUARDED_BY(stop_mu_);

  // The connection registry. Every accepted connection has a slot from accept until its fd is
  // closed; per_address_ counts them by AddressKey (no zero entries).
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

  // The worker pool (blocking exchanges).
  Mutex pool_mu_;
  CondVar pool_cv_;
  std::deque<std::function<void()>> work_ GUARDED_BY(pool_mu_);
  size_t idle_workers_ GUARDED_BY(pool_mu_) = 0;
  bool pool_shutdown_ GUARDED_BY(pool_mu_) = false;
  std::list<std::thread> workers_ GUARDED_BY(pool_mu_);             // running (list: stable entries)
  std::vector<std::thread> finished_workers_ GUARDED_BY(pool_mu_);  // retired, not yet joined
};

// ---- LoopConnection ----

void LoopConnection::Start() {
  if (server_->forced() || server_->stopping()) {
    Close();
    return;
  }
  state_ = State::kWaiting;
  SetDeadlineIn(server_->limits().first_byte_timeout_ms);
  ReadHeader();
}

// A waiting connection reads through Asio rather than recv + async_wait: Asio skips its
// speculative read when the last read on the socket took everything there was, and queues the
// read without a syscall, where every async_wait re-arms the descriptor with EPOLL_CTL_MOD. So
// waiting for the next request on a keep-alive connection costs no syscall, and the request's
// bytes come with the wake-up.
void LoopConnection::IdleRead() {
  conn_.buffer.shrink_to_fit();  // an idle connection holds no buffer beyond first_bytes_
  socket_.async_read_some(asio::buffer(first_bytes_), [self = shared_from_this()](const error_code& ec, size_t n) {
    if (self->state_ != State::kWaiting) return;  // closed meanwhile
    if (ec) {
      self->Close();  // EOF (the peer, or an eviction's shutdown) or reset
      return;
    }
    self->OnFirstBytes(n);
  });
}

void LoopConnection::OnFirstBytes(size_t n) {
  if (!conn_.slot->TryClaim()) {
    // Closed for room by the acceptor just as the bytes came: drop them, as if they had come a
    // moment later.
    Close();
    return;
  }
  const Limits& limits = server_->limits();
  state_ = State::kHeader;
  start_ns_ = SteadyNanos();
  header_deadline_ms_ = limits.header_timeout_ms > 0 ? SteadyMillis() + limits.header_timeout_ms : 0;
  SetDeadlineIn(limits.io_timeout_ms);
  if (header_deadline_ms_ != 0 && (deadline_ms_ == 0 || deadline_ms_ > header_deadline_ms_)) {
    deadline_ms_ = header_deadline_ms_;
  }
  auto room = conn_.buffer.prepare(n);
  std::memcpy(room.data(), first_bytes_, n);
  conn_.buffer.commit(n);
  ReadHeader();
}

void LoopConnection::WaitReadable() {
  socket_.async_wait(asio::posix::descriptor_base::wait_read, [self = shared_from_this()](const error_code& ec) {
    if (ec || self->state_ == State::kClosed) return;
    if (self->state_ == State::kAsyncBody) {
      self->ReadAsyncBody();
    } else {
      self->ReadHeader();
    }
  });
}

void LoopConnection::WaitWritable() {
  socket_.async_wait(asio::posix::descriptor_base::wait_write, [self = shared_from_this()](const error_code& ec) {
    if (ec || self->state_ == State::kClosed) return;
    self->WriteResponse();
  });
}

// Reads and parses until the request header is complete (then OnHeaderDone), the socket has no
// more bytes for now (then waits), or the connection is to close.
void LoopConnection::ReadHeader() {
  const Limits& limits = server_->limits();
  const size_t limit = std::min<size_t>(server_->options().max_header_bytes, std::numeric_limits<uint32_t>::max());
  for (;;) {
    if (conn_.buffer.size() > 0) {
      if (!parser_) {
        parser_.emplace();
        parser_->body_limit(server_->options().max_body_bytes);
        header_consumed_ = 0;
      }
      // The whole header is bounded, not each parse pass (see ReadHeaderWithin, http_exchange.cc).
      parser_->header_limit(static_cast<uint32_t>(limit - std::min(limit, header_consumed_)));
      error_code ec;
      const size_t used = parser_->put(conn_.buffer.data(), ec);
      conn_.buffer.consume(used);
      header_consumed_ += used;
      if (!ec && header_consumed_ > limit) {
        ec = http::error::header_limit;
      }
      if (ec == http::error::need_more && header_consumed_ + conn_.buffer.size() > limit) {
        // Everything buffered belongs to the unfinished header. Beast alone misses this when a
        // pass starts inside the fields with fewer bytes than its limit (it clamps what it
        // looks at to the limit and then waits for more forever).
        ec = http::error::header_limit;
      }
      if (ec && ec != http::error::need_more) {
        HeaderError(ec);
        return;
      }
      if (!ec && parser_->is_header_done()) {
        OnHeaderDone();
        return;
      }
      if (!ec && used > 0) {
        continue;  // a pass ended inside the header with bytes left: parse on
      }
    }
    if (state_ == State::kWaiting && conn_.buffer.size() == 0) {
      IdleRead();
      return;
    }
    thread_local char scratch[kReadChunk];
    const ssize_t n = ::recv(conn_.fd, scratch, sizeof(scratch), 0);
    if (n > 0) {
      if (state_ == State::kWaiting) {
        if (!conn_.slot->TryClaim()) {
          // Closed for room by the acceptor just as the bytes came: drop them, as if they had
          // come a moment later.
          Close();
          return;
        }
        state_ = State::kHeader;
        start_ns_ = SteadyNanos();
        header_deadline_ms_ = limits.header_timeout_ms > 0 ? SteadyMillis() + limits.header_timeout_ms : 0;
      }
      // Progress: the I/O timeout restarts, but never past the header's own deadline.
      SetDeadlineIn(limits.io_timeout_ms);
      if (header_deadline_ms_ != 0 && (deadline_ms_ == 0 || deadline_ms_ > header_deadline_ms_)) {
        deadline_ms_ = header_deadline_ms_;
      }
      try {
        auto room = conn_.buffer.prepare(static_cast<size_t>(n));
        std::memcpy(room.data(), scratch, static_cast<size_t>(n));
        conn_.buffer.commit(static_cast<size_t>(n));
      } catch (const std::length_error&) {
        HeaderError(http::error::buffer_overflow);
        return;
      }
      continue;
    }
    if (n == 0) {
      Close();  // the peer closed (between requests, or mid-header: nothing to answer)
      return;
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (state_ == State::kWaiting && conn_.buffer.size() == 0) {
        conn_.buffer.shrink_to_fit();  // an idle connection holds no buffer
      }
      WaitReadable();
      return;
    }
    Close();  // reset
    return;
  }
}

void LoopConnection::HeaderError(const error_code& ec) {
  if (state_ == State::kWaiting) {
    Close();
    return;
  }
  ToWorker(internal::HeaderErrorStatus(ec));
}

bool LoopConnection::AsyncEligible() const {
  const auto& msg = parser_->get();
  if (msg.version() != 11 && msg.version() != 10) return false;
  if (parser_->chunked() || msg.find(http::field::transfer_encoding) != msg.end()) return false;
  if (msg.find(http::field::expect) != msg.end()) return false;
  boost::optional<uint64_t> length = parser_->content_length();
  return !length || *length <= server_->async()->max_body_bytes();
}

void LoopConnection::OnHeaderDone() {
  deadline_ms_ = 0;
  if (server_->async() != nullptr && AsyncEligible()) {
    internal::FillRequest(conn_, parser_->get());
    if (server_->async()->Claims(conn_.request)) {
      StartAsync();
      return;
    }
  }
  ToWorker(0);
}

// The blocking exchange (or, with `error_status`, the error answer to a refused header) on a
// worker thread; the connection comes back to the loop afterwards.
void LoopConnection::ToWorker(int error_status) {
  state_ = State::kWorker;
  deadline_ms_ = 0;
  server_->SubmitWork([self = shared_from_this(), error_status] {
    bool keep = false;
    Connection& conn = self->conn_;
    if (error_status != 0) {
      internal::WriteErrorResponse(conn.fd, error_status, self->server_->limits().io_timeout_ms);
      conn.unread_input = true;
    } else {
      try {
        keep = ServeParsedRequest(conn, self->server_->context(), *self->parser_);
      } catch (const std::exception& e) {
        KLOG(error, "http connection failed", {{"remote", conn.remote_address}, {"error", e.what()}});
        conn.unread_input = true;
      } catch (...) {
        conn.unread_input = true;
      }
    }
    if (conn.upgraded) {
      // The handler has the socket (through its dup): no lingering read, no shutdown(); the loop
      // closes only its own descriptor.
    } else if (!keep) {
      self->server_->Linger(conn);
    } else if (conn.buffer.size() == 0) {
      // Idle from now, not from when the loop gets the connection back: a new client may take
      // its place at once (an eviction now shuts the socket down; the loop then sees EOF).
      conn.slot->MarkIdle();
    }
    if (conn.buffer.capacity() > 256 * 1024) {
      conn.buffer.shrink_to_fit();  // one huge header must not pin memory for good
    }
    LoopConnection* raw = self.get();
    raw->loop_->loop.Post([self = std::move(self), keep] { self->AfterWorker(keep); });
  });
}

void LoopConnection::AfterWorker(bool keep) {
  if (!keep || server_->stopping() || server_->forced()) {
    Close();
    return;
  }
  NextRequest();
}

// After a complete exchange on a connection that stays open.
void LoopConnection::NextRequest() {
  parser_.reset();
  header_consumed_ = 0;
  conn_.unread_input = false;
  if (conn_.buffer.size() > 0) {
    // Bytes of the next request came with this one (pipelining): busy at once, and the header
    // clock runs from now.
    state_ = State::kHeader;
    start_ns_ = SteadyNanos();
    const Limits& limits = server_->limits();
    header_deadline_ms_ = limits.header_timeout_ms > 0 ? SteadyMillis() + limits.header_timeout_ms : 0;
    deadline_ms_ = header_deadline_ms_;
  } else {
    state_ = State::kWaiting;
    conn_.slot->MarkIdle();
    SetDeadlineIn(server_->limits().idle_timeout_ms);
  }
  ReadHeader();
}

void LoopConnection::StartAsync() {
  boost::optional<uint64_t> length = parser_->content_length();
  async_body_expected_ = length ? static_cast<size_t>(*length) : 0;
  async_body_.clear();
  async_body_.reserve(async_body_expected_);
  const size_t buffered = std::min(async_body_expected_, conn_.buffer.size());
  if (buffered > 0) {
    async_body_.append(static_cast<const char*>(conn_.buffer.data().data()), buffered);
    conn_.buffer.consume(buffered);
  }
  if (async_body_.size() < async_body_expected_) {
    state_ = State::kAsyncBody;
    SetDeadlineIn(server_->limits().io_timeout_ms);
    ReadAsyncBody();
    return;
  }
  ServeAsync();
}

void LoopConnection::ReadAsyncBody() {
  while (async_body_.size() < async_body_expected_) {
    const size_t have = async_body_.size();
    async_body_.resize(async_body_expected_);
    const ssize_t n = ::recv(conn_.fd, async_body_.data() + have, async_body_expected_ - have, 0);
    async_body_.resize(have + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n > 0) {
      SetDeadlineIn(server_->limits().io_timeout_ms);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WaitReadable();
      return;
    }
    Close();  // the client went away mid-body: nobody to answer
    return;
  }
  ServeAsync();
}

void LoopConnection::ServeAsync() {
  state_ = State::kAsyncServing;
  deadline_ms_ = 0;
  responded_ = false;
  close_after_ = false;
  serving_self_ = shared_from_this();
  conn_.request.body = nullptr;
  try {
    server_->async()->Serve(*this);
  } catch (const std::exception& e) {
    KLOG(error, "http async handler threw", {{"target", conn_.request.target}, {"error", e.what()}});
    if (!responded_) Respond(500, {{"Content-Type", "text/plain"}}, "handler failed\n");
  } catch (...) {
    if (!responded_) Respond(500, {{"Content-Type", "text/plain"}}, "handler failed\n");
  }
}

void LoopConnection::Respond(int status, const HeaderMap& headers, std::string body) {
  if (responded_) {
    return;
  }
  responded_ = true;
  // Released at the end of this call, after which the loop's map (or nothing) owns us.
  std::shared_ptr<LoopConnection> self = std::move(serving_self_);
  if (state_ != State::kAsyncServing) {
    return;  // closed meanwhile (Stop's grace ran out): nobody to answer
  }
  const auto& msg = parser_->get();
  const bool http10 = msg.version() == 10;
  const bool head = conn_.request.method == "HEAD";
  const bool body_allowed = status != 204 && status != 304 && !head;
  keep_after_write_ = parser_->keep_alive() && !close_after_ && !server_->stopping();
  out_head_.clear();
  internal::AppendResponseHead(out_head_, status, headers, std::optional<uint64_t>(body.size()), !keep_after_write_,
                               http10);
  out_body_ = body_allowed ? std::move(body) : std::string();
  out_written_ = 0;
  state_ = State::kAsyncWriting;
  SetDeadlineIn(server_->limits().io_timeout_ms);
  WriteResponse();
}

void LoopConnection::WriteResponse() {
  const size_t total = out_head_.size() + out_body_.size();
  while (out_written_ < total) {
    iovec iov[2];
    int count = 0;
    if (out_written_ < out_head_.size()) {
      iov[count++] = {out_head_.data() + out_written_, out_head_.size() - out_written_};
      if (!out_body_.empty()) iov[count++] = {out_body_.data(), out_body_.size()};
    } else {
      const size_t offset = out_written_ - out_head_.size();
      iov[count++] = {out_body_.data() + offset, out_body_.size() - offset};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(conn_.fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      out_written_ += static_cast<size_t>(n);
      SetDeadlineIn(server_->limits().io_timeout_ms);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WaitWritable();
      return;
    }
    Close();  // the client went away
    return;
  }
  if (out_body_.capacity() > 64 * 1024) {
    std::string().swap(out_body_);
  }
  if (async_body_.capacity() > 64 * 1024) {
    std::string().swap(async_body_);
  }
  if (!keep_after_write_ || server_->stopping()) {
    Close();
    return;
  }
  NextRequest();
}

void LoopConnection::Close() {
  if (state_ == State::kClosed) {
    return;
  }
  state_ = State::kClosed;
  deadline_ms_ = 0;
  // Keep ourselves alive to the end of this call: the map entry may be the last owner.
  std::shared_ptr<LoopConnection> self = shared_from_this();
  loop_->conns.erase(this);
  server_->CloseConnection(conn_.slot, socket_);
  conn_.slot = nullptr;
  conn_.fd = -1;
}

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
                                                       AsyncService* async) {
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
      std::make_unique<HttpServerImpl>(std::move(options), std::move(handler), async, fd, wake, actual_port));
}

void ServeConnectionForTest(HttpServer& server, int fd) { static_cast<HttpServerImpl&>(server).ServeForTest(fd); }

}  // namespace kiln::net
