// HTTP/1.1 Upgrade: ResponseWriter::Upgrade on a real HttpServer, and OpenUpgrade against it and
// against raw peers.

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/mutex.h"
#include "net/http_server.h"
#include "net/test_util/fake_response_writer.h"
#include "net/test_util/raw_http_peer.h"
#include "net/upgrade_client.h"

namespace kiln::net {
namespace {

using ::testing::HasSubstr;

bool WaitUntil(const std::function<bool()>& cond, int timeout_ms = 5000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

// Blocking I/O on an upgraded fd, bounded by a receive timeout so a broken test fails, not hangs.
void SetRecvTimeout(int fd, int seconds) {
  timeval tv{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads exactly n bytes ("" short on EOF/timeout).
std::string ReadExactly(int fd, size_t n) {
  std::string out;
  char buf[16384];
  while (out.size() < n) {
    ssize_t r = ::recv(fd, buf, std::min(sizeof(buf), n - out.size()), 0);
    if (r <= 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

bool IsBlocking(int fd) { return (::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0; }

HeaderMap UpgradeHeaders() { return {{"Connection", "Upgrade"}, {"Upgrade", "test-echo"}}; }

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kInvalidArgument: return 400;
    default: return 503;
  }
}

class UpgradeTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(HttpServerOptions{}); }

  void StartServer(HttpServerOptions options) {
    options.listen = "127.0.0.1:0";
    options.event_loops = 2;
    auto server = HttpServer::Create(options, [this](HttpRequest& req, ResponseWriter& out) { Handle(req, out); });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    port_ = server_->port();
    ASSERT_TRUE(server_->Start().ok());
  }

  static bool ListenerOpen(uint16_t port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }

  void TearDown() override {
    if (server_) server_->Stop(1);
    MutexLock lock(mu_);
    for (auto& t : echoes_) t.join();
  }

  // /echo: upgrade, then echo on the raw socket (first what came buffered) until EOF.
  // /hold: upgrade and keep the connection for the test (held_). /refuse: 403 with a body.
  // /started: Start a 200, then try to upgrade. Otherwise: upgrade, or answer the error.
  void Handle(HttpRequest& req, ResponseWriter& out) {
    if (req.raw_path == "/refuse") {
      (void)out.Send(403, {{"Content-Type", "application/x-amz-json-1.1"}, {"x-amzn-ErrorType", "AccessDenied"}},
                     R"({"__type": "AccessDeniedException", "message": "enable it"})");
      return;
    }
    if (req.raw_path == "/started") {
      (void)out.Start(200, {}, 0);
      Result<UpgradedConnection> up = out.Upgrade({{"Upgrade", "test-echo"}});
      last_error_code_ = up.ok() ? StatusCode::kOk : up.status().code();
      (void)out.Finish();
      return;
    }
    if (req.raw_path == "/after-stop") {
      // Stop() has begun once the listening socket is closed (it sets stopping first).
      handler_entered_ = true;
      for (int i = 0; i < 500 && ListenerOpen(port_); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    HeaderMap headers = {{"Upgrade", "test-echo"}, {"X-Kiln-Connection-Id", "c-1"}};
    if (req.raw_path == "/no-upgrade-header") headers.erase("Upgrade");
    Result<UpgradedConnection> up = out.Upgrade(headers);
    if (!up.ok()) {
      last_error_code_ = up.status().code();
      (void)out.Send(HttpStatusFor(up.status()), {}, up.status().message());
      return;
    }
    handler_saw_open_ = server_->stats().open_connections;
    upgrades_++;  // after the line above: tests wait for this count, then read it
    // After an upgrade the writer is done for good.
    EXPECT_EQ(out.Start(200, {}, 0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(out.Upgrade(headers).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(IsBlocking(up->fd.get()));
    if (req.raw_path == "/hold") {
      MutexLock lock(mu_);
      held_.push_back(std::move(*up));
      return;
    }
    MutexLock lock(mu_);
    echoes_.emplace_back([conn = std::move(*up)]() mutable {
      int fd = conn.fd.get();
      SetRecvTimeout(fd, 10);
      if (!WriteAll(fd, conn.buffered)) return;
      char buf[16384];
      for (;;) {
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0 || !WriteAll(fd, std::string_view(buf, static_cast<size_t>(n)))) return;
      }
    });
  }

  Result<UpgradeResult> Open(const std::string& target) {
    UpgradeRequest request;
    request.url = "http://127.0.0.1:" + std::to_string(server_->port()) + "/ignored/path";
    request.target = target;
    request.headers = UpgradeHeaders();
    request.response_timeout_ms = 5000;
    return OpenUpgrade(request);
  }

  std::unique_ptr<HttpServer> server_;
  Mutex mu_;
  std::vector<std::thread> echoes_ GUARDED_BY(mu_);
  std::vector<UpgradedConnection> held_ GUARDED_BY(mu_);
  std::atomic<int> upgrades_{0};
  std::atomic<bool> handler_entered_{false};
  uint16_t port_ = 0;
  std::atomic<size_t> handler_saw_open_{99};
  std::atomic<StatusCode> last_error_code_{StatusCode::kOk};
};

TEST_F(UpgradeTest, ClientAndServerRoundTripBytesBothWays) {
  Result<UpgradeResult> r = Open("/echo?target=x");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 101) << r->body;
  ASSERT_TRUE(r->fd.valid());
  EXPECT_TRUE(IsBlocking(r->fd.get()));
  EXPECT_EQ(r->headers.find("Upgrade")->second, "test-echo");
  EXPECT_EQ(r->headers.find("Connection")->second, "Upgrade");
  EXPECT_EQ(r->headers.find("X-Kiln-Connection-Id")->second, "c-1");
  EXPECT_EQ(r->headers.count("Content-Length"), 0u);
  EXPECT_EQ(r->buffered, "");  // the echo server speaks only when spoken to
  int fd = r->fd.get();
  SetRecvTimeout(fd, 5);
  for (int i = 0; i < 20; ++i) {
    std::string msg = "ping " + std::to_string(i);
    ASSERT_TRUE(WriteAll(fd, msg));
    EXPECT_EQ(ReadExactly(fd, msg.size()), msg);
  }
  // A larger stream, written from another thread while this one reads (neither side may block
  // the other: the echo answers as it reads).
  std::string big(2 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + (i / 4096) % 26);
  std::thread writer([&] { EXPECT_TRUE(WriteAll(fd, big)); });
  EXPECT_EQ(ReadExactly(fd, big.size()), big);
  writer.join();
  EXPECT_EQ(upgrades_.load(), 1);
}

TEST_F(UpgradeTest, BytesSentRightAfterTheHeadAreNotLost) {
  // Head and the first protocol bytes in one segment: the server has read them with the head.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  UniqueFd guard(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server_->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  SetRecvTimeout(fd, 5);
  const std::string early = "SSH-2.0-early bytes\r\n";
  ASSERT_TRUE(
      WriteAll(fd, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test-echo\r\n\r\n" + early));
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  size_t end = got.find("\r\n\r\n") + 4;
  EXPECT_THAT(got.substr(0, end), ::testing::StartsWith("HTTP/1.1 101 Switching Protocols\r\n"));
  std::string rest = got.substr(end);
  if (rest.size() < early.size()) rest += ReadExactly(fd, early.size() - rest.size());
  EXPECT_EQ(rest, early);
  ASSERT_TRUE(WriteAll(fd, "more"));
  EXPECT_EQ(ReadExactly(fd, 4), "more");
}

TEST_F(UpgradeTest, RefusalComesBackWithItsBody) {
  Result<UpgradeResult> r = Open("/refuse");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 403);
  EXPECT_FALSE(r->fd.valid());
  EXPECT_EQ(r->body, R"({"__type": "AccessDeniedException", "message": "enable it"})");
  EXPECT_EQ(r->headers.find("x-amzn-ErrorType")->second, "AccessDenied");
  EXPECT_EQ(upgrades_.load(), 0);
}

TEST_F(UpgradeTest, UpgradeAfterStartIsRefusedAndTheResponseStillGoesOut) {
  Result<UpgradeResult> r = Open("/started");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(last_error_code_.load(), StatusCode::kFailedPrecondition);
}

TEST_F(UpgradeTest, RequestsThatCannotBeUpgraded) {
  // With a body (OpenUpgrade sends none, so by hand).
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  UniqueFd guard(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server_->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  SetRecvTimeout(fd, 5);
  ASSERT_TRUE(WriteAll(fd,
                       "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test-echo\r\n"
                       "Content-Length: 3\r\n\r\nabc"));
  std::string answer = test_peer::ReadRequest(fd);  // reads a head + Content-Length body
  EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 409 "));
  EXPECT_THAT(answer, HasSubstr("has a body"));
  EXPECT_EQ(last_error_code_.load(), StatusCode::kFailedPrecondition);

  // HTTP/1.0.
  guard.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  fd = guard.get();
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  SetRecvTimeout(fd, 5);
  ASSERT_TRUE(WriteAll(fd, "GET /echo HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: test-echo\r\n\r\n"));
  EXPECT_THAT(test_peer::ReadRequest(fd), ::testing::StartsWith("HTTP/1.1 409 "));

  // The handler forgot the Upgrade header.
  Result<UpgradeResult> r = Open("/no-upgrade-header");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(last_error_code_.load(), StatusCode::kInvalidArgument);
  EXPECT_EQ(upgrades_.load(), 0);
}

TEST_F(UpgradeTest, UpgradeOnceStopHasBegunIsRefused) {
  std::thread client([&] {
    Result<UpgradeResult> r = Open("/after-stop");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 503);
    EXPECT_THAT(r->body, HasSubstr("stopping"));
  });
  ASSERT_TRUE(WaitUntil([&] { return handler_entered_.load(); }));
  server_->Stop(5);  // waits for the handler, which answers 503
  client.join();
  EXPECT_EQ(last_error_code_.load(), StatusCode::kUnavailable);
  EXPECT_EQ(upgrades_.load(), 0);
}

TEST_F(UpgradeTest, UpgradedConnectionLeavesTheServerAndOutlivesStop) {
  server_->Stop(0);
  server_.reset();
  HttpServerOptions options;
  options.io_timeout_seconds = 1;  // none of these may touch an upgraded connection
  options.idle_timeout_seconds = 1;
  options.first_byte_timeout_seconds = 1;
  StartServer(options);

  int idle = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // an ordinary connection, for the count
  UniqueFd idle_guard(idle);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server_->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_TRUE(WaitUntil([&] { return server_->stats().open_connections == 1; }));

  Result<UpgradeResult> r = Open("/hold");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->status, 101);
  ASSERT_TRUE(WaitUntil([&] { return upgrades_.load() == 1; }));
  // Forgotten at Upgrade, before the 101 went out: the handler saw only the other connection.
  EXPECT_EQ(handler_saw_open_.load(), 1u);
  EXPECT_EQ(server_->stats().open_connections, 1u);
  int server_fd = -1;
  {
    MutexLock lock(mu_);
    ASSERT_EQ(held_.size(), 1u);
    server_fd = held_[0].fd.get();
    EXPECT_EQ(held_[0].buffered, "");
  }
  SetRecvTimeout(server_fd, 5);
  int client_fd = r->fd.get();
  SetRecvTimeout(client_fd, 5);

  // Past every server timeout (1 s) and through Stop: the connection is still whole.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_TRUE(WaitUntil([&] { return server_->stats().open_connections == 0; }));  // the idle one timed out
  server_->Stop(0);
  ASSERT_TRUE(WriteAll(client_fd, "to server"));
  EXPECT_EQ(ReadExactly(server_fd, 9), "to server");
  ASSERT_TRUE(WriteAll(server_fd, "to client"));
  EXPECT_EQ(ReadExactly(client_fd, 9), "to client");
  server_.reset();  // the server's own descriptor is closed at the latest here; the socket lives on
  ASSERT_TRUE(WriteAll(server_fd, "after"));
  EXPECT_EQ(ReadExactly(client_fd, 5), "after");

  // Closing is the caller's: the peer sees EOF only then.
  {
    MutexLock lock(mu_);
    held_.clear();
  }
  char c;
  EXPECT_EQ(::recv(client_fd, &c, 1, 0), 0);
}

TEST_F(UpgradeTest, OpenConnectionCountIsRightAfterTheHandlerReturns) {
  for (int i = 0; i < 3; ++i) {
    Result<UpgradeResult> r = Open("/echo");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, 101);
  }
  // The upgraded ones never count; the echo threads still have their sockets open.
  ASSERT_TRUE(WaitUntil([&] { return upgrades_.load() == 3; }));
  EXPECT_EQ(server_->stats().open_connections, 0u);
  EXPECT_EQ(handler_saw_open_.load(), 0u);
  // A normal request afterwards is served (the workers and loops are fine).
  Result<UpgradeResult> r = Open("/refuse");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 403);
}

// Not a test: numbers for the report (loopback, this machine).
//   build/src/net/net_test --gtest_also_run_disabled_tests --gtest_filter='*UpgradeLatency'
TEST_F(UpgradeTest, DISABLED_UpgradeLatency) {
  constexpr int kOpens = 500;
  std::vector<double> opens;
  for (int i = 0; i < kOpens; ++i) {
    auto start = std::chrono::steady_clock::now();
    Result<UpgradeResult> r = Open("/echo");
    opens.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    ASSERT_TRUE(r.ok() && r->status == 101);
  }  // each closed at once: its echo thread ends
  Result<UpgradeResult> r = Open("/echo");
  ASSERT_TRUE(r.ok() && r->status == 101);
  constexpr int kPings = 20000;
  std::vector<double> pings;
  for (int i = 0; i < kPings; ++i) {
    auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(WriteAll(r->fd.get(), "p"));
    ASSERT_EQ(ReadExactly(r->fd.get(), 1), "p");
    pings.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(opens.begin(), opens.end());
  std::sort(pings.begin(), pings.end());
  std::printf("OpenUpgrade (connect + GET + 101 + dup): median %.1f us, p99 %.1f us over %d\n", opens[kOpens / 2],
              opens[kOpens * 99 / 100], kOpens);
  std::printf("1-byte echo round trip on the upgraded socket: median %.1f us, p99 %.1f us over %d\n", pings[kPings / 2],
              pings[kPings * 99 / 100], kPings);
}

// --- The client against raw peers ---

TEST(OpenUpgradeTest, ServerBytesRightAfterThe101ComeOutBuffered) {
  test_peer::RawServer peer([](int fd, int) {
    std::string request = test_peer::ReadRequest(fd);
    EXPECT_THAT(request, ::testing::StartsWith("GET /connect?target=a%2Fb HTTP/1.1\r\n"));
    EXPECT_THAT(request, HasSubstr("\r\nHost: 127.0.0.1:"));
    EXPECT_THAT(request, HasSubstr("\r\nUpgrade: test-echo\r\n"));
    test_peer::SendRaw(fd,
                       "HTTP/1.1 101 Switching Protocols\r\nUpgrade: test-echo\r\nConnection: Upgrade\r\n\r\n"
                       "SSH-2.0-server\r\n");
    char c;
    (void)::recv(fd, &c, 1, 0);  // until the client closes
  });
  UpgradeRequest request;
  request.url = "http://127.0.0.1:" + std::to_string(peer.port());
  request.target = "/connect?target=a%2Fb";
  request.headers = UpgradeHeaders();
  Result<UpgradeResult> r = OpenUpgrade(request);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 101);
  SetRecvTimeout(r->fd.get(), 5);
  std::string greeting = r->buffered;
  const std::string want = "SSH-2.0-server\r\n";
  if (greeting.size() < want.size()) greeting += ReadExactly(r->fd.get(), want.size() - greeting.size());
  EXPECT_EQ(greeting, want);
}

TEST(OpenUpgradeTest, InterimAnswersAreSkippedAndBodiesOfEveryFramingAreRead) {
  test_peer::RawServer peer([](int fd, int index) {
    (void)test_peer::ReadRequest(fd);
    if (index == 0) {
      test_peer::SendRaw(fd,
                         "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    } else {
      test_peer::SendRaw(fd, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\nuntil the end");
    }
  });
  UpgradeRequest request;
  request.host = "127.0.0.1";
  request.port = peer.port();
  request.headers = UpgradeHeaders();
  Result<UpgradeResult> r = OpenUpgrade(request);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(r->body, "hello world");
  r = OpenUpgrade(request);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body, "until the end");
}

TEST(OpenUpgradeTest, Errors) {
  // Nobody listening: Unavailable, naming the address.
  uint16_t free_port = 0;
  {
    test_peer::RawServer gone([](int, int) {});
    free_port = gone.port();
  }
  UpgradeRequest request;
  request.url = "http://127.0.0.1:" + std::to_string(free_port);
  Result<UpgradeResult> r = OpenUpgrade(request);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("127.0.0.1:" + std::to_string(free_port)));

  // A peer that never answers: DeadlineExceeded. One that closes: Unavailable. Not HTTP: DataLoss.
  // A body over the bound: ResourceExhausted (from its Content-Length, before reading it).
  test_peer::RawServer peer([](int fd, int index) {
    (void)test_peer::ReadRequest(fd);
    if (index == 0) {
      char c;
      (void)::recv(fd, &c, 1, 0);
    } else if (index == 2) {
      test_peer::SendRaw(fd, "SSH-2.0-not-http\r\n\r\n");
    } else if (index == 3) {
      test_peer::SendRaw(fd,
                         "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(kMaxUpgradeBodyBytes + 1) + "\r\n\r\n");
    }
  });
  request.url = "http://127.0.0.1:" + std::to_string(peer.port());
  request.response_timeout_ms = 200;
  r = OpenUpgrade(request);
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  request.response_timeout_ms = 5000;
  r = OpenUpgrade(request);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("closed the connection"));
  r = OpenUpgrade(request);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  r = OpenUpgrade(request);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();

  // Bad arguments.
  request.url = "https://127.0.0.1:1";
  EXPECT_EQ(OpenUpgrade(request).status().code(), StatusCode::kInvalidArgument);
  request.url = "http://";
  EXPECT_EQ(OpenUpgrade(request).status().code(), StatusCode::kInvalidArgument);
  request.url = "http://127.0.0.1:1";
  request.headers = {{"X-Bad", "a\r\nInjected: 1"}};
  EXPECT_EQ(OpenUpgrade(request).status().code(), StatusCode::kInvalidArgument);
  request.headers = {};
  request.target = "/a b";
  EXPECT_EQ(OpenUpgrade(request).status().code(), StatusCode::kInvalidArgument);
  request.url.clear();
  request.target = "/";
  EXPECT_EQ(OpenUpgrade(request).status().code(), StatusCode::kInvalidArgument);  // neither URL nor host
}

TEST(FakeResponseWriterTest, UpgradeRecordsThe101AndHandsOutASocketPair) {
  FakeResponseWriter writer;
  Result<UpgradedConnection> up = writer.Upgrade({{"Upgrade", "kiln-ssh"}});
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_EQ(writer.status(), 101);
  EXPECT_EQ(writer.header("Upgrade"), "kiln-ssh");
  ASSERT_TRUE(WriteAll(up->fd.get(), "x"));
  EXPECT_EQ(ReadExactly(writer.peer().get(), 1), "x");
  EXPECT_EQ(writer.Upgrade({{"Upgrade", "kiln-ssh"}}).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kiln::net
