// LoopbackRelay over plain sockets in one namespace: the relay listens on one 127.0.0.1 port and
// forwards to a server on another (the shim uses the same port in two namespaces).
#include "runtime/process/loopback_relay.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kiln::runtime {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A listening socket on 127.0.0.1 with a kernel-chosen port.
int Listen(int* port, bool nonblocking) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  sockaddr_in a = Loopback(0);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 64), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// A blocking client with 5 s timeouts, so that a broken relay fails the test instead of hanging.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a = Loopback(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until EOF; false on an error or timeout.
bool RecvAll(int fd, std::string* out) {
  char buf[65536];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return false;
    out->append(buf, static_cast<size_t>(n));
  }
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed) % 251);
  return s;
}

// The relay's poll loop on its own thread (as the shim runs it in its loop).
class RelayThread {
 public:
  explicit RelayThread(LoopbackRelay::Options options) : relay_(options) { stop_ = eventfd(0, EFD_CLOEXEC); }
  ~RelayThread() { Stop(); }
  LoopbackRelay& relay() { return relay_; }  // only before Start or after Stop
  void Start() {
    thread_ = std::thread([this] {
      while (true) {
        std::vector<pollfd> fds{{stop_, POLLIN, 0}};
        relay_.AppendPollFds(&fds);
        if (poll(fds.data(), fds.size(), 1000) < 0) break;
        if (fds[0].revents != 0) break;
        relay_.HandleEvents(fds.data() + 1, fds.size() - 1);
        connections_ = relay_.connection_count();
        if (close_all_) relay_.CloseAll();
      }
    });
  }
  void Stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(stop_, &one, sizeof(one));
    thread_.join();
    close(stop_);
  }
  size_t connections() const { return connections_; }
  // The loop calls CloseAll after handling its next event.
  void RequestCloseAll() { close_all_ = true; }

 private:
  LoopbackRelay relay_;
  int stop_ = -1;
  std::thread thread_;
  std::atomic<size_t> connections_{0};
  std::atomic<bool> close_all_{false};
};

// An echo server: each connection's bytes go back until its EOF, then the server half-closes.
class EchoServer {
 public:
  EchoServer() {
    fd_ = Listen(&port_, false);
    accept_ = std::thread([this] {
      while (true) {
        int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        handlers_.emplace_back([c] {
          char buf[16384];
          while (true) {
            ssize_t n = recv(c, buf, sizeof(buf), 0);
            if (n <= 0) break;
            if (!SendAll(c, std::string(buf, static_cast<size_t>(n)))) break;
          }
          shutdown(c, SHUT_WR);
          close(c);
        });
      }
    });
  }
  ~EchoServer() {
    shutdown(fd_, SHUT_RDWR);
    accept_.join();
    close(fd_);
    for (std::thread& t : handlers_) t.join();
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread accept_;
  std::list<std::thread> handlers_;
};

int AddListener(LoopbackRelay& relay, int target_port) {
  int port = 0;
  int fd = Listen(&port, true);
  relay.AddListener(fd, Loopback(target_port));
  return port;
}

TEST(LoopbackRelayTest, RelaysBothWaysAtOnceThroughSmallBuffers) {
  EchoServer server;
  RelayThread relay({/*buffer_bytes=*/4096, /*max_connections=*/8});
  int port = AddListener(relay.relay(), server.port());
  relay.Start();
  int fd = Connect(port);
  std::string data = Pattern(8 << 20, 7);
  std::thread writer([&] {
    EXPECT_TRUE(SendAll(fd, data));
    shutdown(fd, SHUT_WR);
  });
  std::string echoed;
  EXPECT_TRUE(RecvAll(fd, &echoed));
  writer.join();
  close(fd);
  EXPECT_EQ(echoed.size(), data.size());
  EXPECT_TRUE(echoed == data);
  relay.Stop();
  EXPECT_EQ(relay.relay().accepted(), 1u);
  EXPECT_EQ(relay.relay().connection_count(), 0u);  // closed once both sides ended
}

// The client's EOF reaches the server (which answers only then), and the server's EOF the client.
TEST(LoopbackRelayTest, PropagatesHalfCloseBothWays) {
  int server_port = 0;
  int server_fd = Listen(&server_port, false);
  std::string received;
  std::thread server([&] {
    int c = accept4(server_fd, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(c, 0);
    timeval tv{5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    EXPECT_TRUE(RecvAll(c, &received));
    EXPECT_TRUE(SendAll(c, "got " + std::to_string(received.size())));
    close(c);
  });
  RelayThread relay({});
  int port = AddListener(relay.relay(), server_port);
  relay.Start();
  int fd = Connect(port);
  std::string data = Pattern(1 << 20, 3);
  ASSERT_TRUE(SendAll(fd, data));
  ASSERT_EQ(shutdown(fd, SHUT_WR), 0);
  std::string answer;
  EXPECT_TRUE(RecvAll(fd, &answer));
  EXPECT_EQ(answer, "got " + std::to_string(data.size()));
  server.join();
  EXPECT_TRUE(received == data);
  close(fd);
  close(server_fd);
}

TEST(LoopbackRelayTest, ResetsTheClientWhenNothingListensOnTheTarget) {
  int dead_port = 0;
  close(Listen(&dead_port, false));  // a port nobody listens on now
  RelayThread relay({});
  int port = AddListener(relay.relay(), dead_port);
  relay.Start();
  int fd = Connect(port);
  char c;
  ssize_t n = recv(fd, &c, 1, 0);
  EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << n << " " << std::strerror(errno);
  close(fd);
  relay.Stop();
  EXPECT_EQ(relay.relay().connection_count(), 0u);
}

TEST(LoopbackRelayTest, RefusesConnectionsBeyondTheLimit) {
  EchoServer server;
  RelayThread relay({/*buffer_bytes=*/65536, /*max_connections=*/2});
  int port = AddListener(relay.relay(), server.port());
  relay.Start();
  auto round_trip = [](int fd) {
    if (!SendAll(fd, "x")) return false;
    char c = 0;
    return recv(fd, &c, 1, 0) == 1 && c == 'x';
  };
  int a = Connect(port);
  int b = Connect(port);
  EXPECT_TRUE(round_trip(a));
  EXPECT_TRUE(round_trip(b));
  int third = Connect(port);  // the kernel accepts it; the relay closes it at once
  EXPECT_FALSE(round_trip(third));
  close(third);
  close(a);
  // Once the relay has seen a's end, a new connection is relayed again.
  for (int i = 0; i < 500 && relay.connections() > 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  int fourth = Connect(port);
  EXPECT_TRUE(round_trip(fourth));
  EXPECT_TRUE(round_trip(b));
  close(fourth);
  close(b);
  relay.Stop();
  EXPECT_EQ(relay.relay().accepted(), 4u);
  EXPECT_EQ(relay.relay().refused(), 1u);
}

TEST(LoopbackRelayTest, CloseAllEndsListenersAndConnections) {
  EchoServer server;
  RelayThread relay({});
  int port = AddListener(relay.relay(), server.port());
  relay.Start();
  int fd = Connect(port);
  ASSERT_TRUE(SendAll(fd, "hello"));
  char buf[5];
  ASSERT_EQ(recv(fd, buf, 5, MSG_WAITALL), 5);
  relay.RequestCloseAll();
  ASSERT_TRUE(SendAll(fd, "y"));  // an event on the connection: the loop runs CloseAll after it
  std::string rest;
  auto t0 = std::chrono::steady_clock::now();
  RecvAll(fd, &rest);  // EOF (or a reset) instead of the 5 s timeout
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_LE(rest.size(), 1u);
  close(fd);
  relay.Stop();
  EXPECT_EQ(relay.relay().connection_count(), 0u);
  EXPECT_EQ(relay.relay().listener_count(), 0u);
  // The port is closed: connecting now is refused.
  int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Loopback(port);
  EXPECT_NE(connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  close(probe);
}

}  // namespace
}  // namespace kiln::runtime
