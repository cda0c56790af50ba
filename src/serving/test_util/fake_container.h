#pragma once
// A fake serving container for router tests: a raw TCP listener on 127.0.0.1 (free port) that
// reads one HTTP/1.1 request at a time per connection and then behaves as told — answers with a
// status/body (optionally after a delay), closes the connection, sends garbage, hangs, or
// answers with a large body. It records every request it read (head + body) so tests can check
// forwarded headers.
//
// Raw sockets, not net::HttpServer, so that socket-level misbehaviour is exact.
// Thread-safe: the test thread sets the behaviour, connection threads read it under the mutex.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace kiln::serving::testing {

class FakeContainer {
 public:
  enum class Mode { kRespond, kClose, kGarbage, kHang, kBig };
  struct Received {
    std::string head;  // request line + headers, as received
    std::string body;
  };

  FakeContainer() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_fd_, 128);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~FakeContainer() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(listen_fd_);
    std::vector<std::thread> threads;
    {
      MutexLock lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  uint16_t port() const { return port_; }

  void Respond(int status, std::string body, std::string extra_headers = "Content-Type: application/json\r\n") {
    MutexLock lock(mutex_);
    mode_ = Mode::kRespond;
    status_ = status;
    body_ = std::move(body);
    extra_headers_ = std::move(extra_headers);
  }
  void SetMode(Mode mode) {
    MutexLock lock(mutex_);
    mode_ = mode;
  }
  // kRespond and kBig wait this long before answering (a slow model).
  void SetDelay(std::chrono::milliseconds delay) {
    MutexLock lock(mutex_);
    delay_ = delay;
  }
  std::vector<Received> received() const {
    MutexLock lock(mutex_);
    return received_;
  }
  size_t requests() const {
    MutexLock lock(mutex_);
    return received_.size();
  }

  // A port on 127.0.0.1 where nothing listens (connect is refused).
  static uint16_t DeadPort() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
  }

 private:
  void Accept() {
    while (!stop_) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stop_) return;
        continue;
      }
      MutexLock lock(mutex_);
      threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  // Reads until `buffer` holds a whole request; false on EOF/stop.
  bool ReadRequest(int fd, std::string& buffer, Received& out) {
    char chunk[65536];
    for (;;) {
      size_t end = buffer.find("\r\n\r\n");
      if (end != std::string::npos) {
        std::string head = buffer.substr(0, end + 4);
        size_t length = 0;
        size_t cl = Lower(head).find("\r\ncontent-length:");
        if (cl != std::string::npos) length = std::stoul(head.substr(cl + 17));
        if (buffer.size() >= end + 4 + length) {
          out.head = head;
          out.body = buffer.substr(end + 4, length);
          buffer.erase(0, end + 4 + length);
          return true;
        }
      }
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, 100);
      if (stop_) return false;
      if (r <= 0) continue;
      ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
    }
  }

  static std::string Lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

  static void WriteAll(int fd, std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  void Serve(int fd) {
    std::string buffer;
    for (;;) {
      Received request;
      if (!ReadRequest(fd, buffer, request)) break;
      Mode mode;
      int status;
      std::string body, extra;
      std::chrono::milliseconds delay;
      {
        MutexLock lock(mutex_);
        received_.push_back(request);
        mode = mode_;
        status = status_;
        body = body_;
        extra = extra_headers_;
        delay = delay_;
      }
      if (mode == Mode::kClose) break;
      if (mode == Mode::kGarbage) {
        WriteAll(fd, "this is not HTTP at all\r\n\r\n");
        break;
      }
      if (mode == Mode::kHang) {
        while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        break;
      }
      std::this_thread::sleep_for(delay);
      if (mode == Mode::kBig) {
        status = 200;
        body.assign(7 * 1024 * 1024, 'x');
        extra = "Content-Type: application/octet-stream\r\n";
      }
      std::string response = "HTTP/1.1 " + std::to_string(status) + " X\r\n" + extra +
                             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
      WriteAll(fd, response);
    }
    ::close(fd);
  }

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  mutable Mutex mutex_;
  std::vector<std::thread> threads_ GUARDED_BY(mutex_);
  std::vector<Received> received_ GUARDED_BY(mutex_);
  Mode mode_ GUARDED_BY(mutex_) = Mode::kRespond;
  int status_ GUARDED_BY(mutex_) = 200;
  std::string body_ GUARDED_BY(mutex_) = "{}";
  std::string extra_headers_ GUARDED_BY(mutex_) = "Content-Type: application/json\r\n";
  std::chrono::milliseconds delay_ GUARDED_BY(mutex_){0};
};

}  // namespace kiln::serving::testing
