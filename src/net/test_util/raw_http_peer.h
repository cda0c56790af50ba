#pragma once
// Test-only: a raw HTTP peer for the client tests (http_client_test.cc, async_http_client_test.cc),
// so they control exactly what goes on the wire and can misbehave.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/mutex.h"
#include "base/strings.h"

namespace kiln::net::test_peer {

// A raw TCP peer: each accepted connection is handed to `serve(fd, index)` on its own thread, so
// tests control exactly what goes on the wire (and can misbehave).
class RawServer {
 public:
  using Serve = std::function<void(int fd, int index)>;

  explicit RawServer(Serve serve) : serve_(std::move(serve)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 128), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~RawServer() {
    stop_ = true;
    acceptor_.join();
    ::close(listen_fd_);
    MutexLock lock(mu_);
    for (auto& t : threads_) {
      t.join();
    }
  }

  uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  void AcceptLoop() EXCLUDES(mu_) {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) {
        continue;
      }
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        continue;
      }
      timeval tv{5, 0};  // a confused test fails instead of hanging
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      int index = accepted_++;
      MutexLock lock(mu_);
      threads_.emplace_back([this, fd, index] {
        serve_(fd, index);
        ::close(fd);
      });
    }
  }

  Serve serve_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  Mutex mu_;
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
};

// Reads one request (head + Content-Length body) from a raw socket; "" on EOF or error.
inline std::string ReadRequest(int fd) {
  std::string data;
  char buf[4096];
  size_t head_end = std::string::npos;
  while ((head_end = data.find("\r\n\r\n")) == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      return "";
    }
    data.append(buf, static_cast<size_t>(n));
  }
  size_t length = 0;
  std::string lower = ToLower(data.substr(0, head_end));
  size_t cl = lower.find("\r\ncontent-length:");
  if (cl != std::string::npos) {
    length = std::strtoul(lower.c_str() + cl + 17, nullptr, 10);
  }
  while (data.size() < head_end + 4 + length) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      return "";
    }
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

inline void SendRaw(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) {
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Answers every request on every connection with `response`.
inline RawServer::Serve Canned(std::string response, bool byte_by_byte = false) {
  return [response, byte_by_byte](int fd, int) {
    while (!ReadRequest(fd).empty()) {
      if (byte_by_byte) {
        for (char c : response) {
          SendRaw(fd, std::string_view(&c, 1));
        }
      } else {
        SendRaw(fd, response);
      }
    }
  };
}

}  // namespace kiln::net::test_peer
