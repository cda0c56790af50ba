// A minimal, fast HTTP/1.1 inference backend for bench/serving_bench.py: the same backend sits
// behind every path the benchmark compares (direct, nginx, Kiln), so what differs between the
// rows is the proxy alone.
//
//   serving_backend serve          listen on 0.0.0.0:$SAGEMAKER_BIND_TO_PORT (default 8080), as a
//                                  `local:` image is run by Kiln (`docker run IMAGE serve`)
//
//   GET  /ping          200, empty body
//   POST /invocations   200 application/json {"ok":true} (the request body is read and dropped)
//   anything else       404
//
// Keep-alive and pipelining (HTTP/1.1; HTTP/1.0 and "Connection: close" close after the answer);
// request bodies only by Content-Length (the proxies under test send it). One epoll loop per
// thread, each with its own SO_REUSEPORT listener; $BACKEND_THREADS loops (default: one per CPU;
// measured on 2 cores with wrk -t2 -c64 on the same machine, 2 loops answered ~69k requests/s
// against ~50k for one). SIGTERM/SIGINT exit 0.

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr std::string_view kPing = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
constexpr std::string_view kInvoke =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}";
constexpr std::string_view kNotFound = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
constexpr std::string_view kBadRequest = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
constexpr size_t kMaxHeader = 64 * 1024;

struct Conn {
  std::string in;
  std::string out;
  bool close_after = false;
};

// Case-insensitive search for header `name` in the header block; returns its value or "".
std::string_view HeaderValue(std::string_view head, std::string_view name) {
  size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos && pos + 2 < head.size()) {
    size_t start = pos + 2;
    size_t end = head.find("\r\n", start);
    std::string_view line = head.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (line.size() > name.size() && line[name.size()] == ':' &&
        strncasecmp(line.data(), name.data(), name.size()) == 0) {
      std::string_view v = line.substr(name.size() + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
      return v;
    }
    pos = end;
  }
  return {};
}

// Consumes every complete request in c.in, appending answers to c.out. False: protocol error
// (the answer is queued and the connection closes after it).
bool Process(Conn& c) {
  size_t off = 0;
  while (true) {
    size_t end = c.in.find("\r\n\r\n", off);
    if (end == std::string::npos) {
      if (c.in.size() - off > kMaxHeader) {
        c.out += kBadRequest;
        c.close_after = true;
        return false;
      }
      break;
    }
    std::string_view head(c.in.data() + off, end - off);
    std::string_view cl = HeaderValue(head, "content-length");
    size_t body = 0;
    for (char ch : cl) {
      if (ch < '0' || ch > '9') {
        c.out += kBadRequest;
        c.close_after = true;
        return false;
      }
      body = body * 10 + static_cast<size_t>(ch - '0');
    }
    if (!HeaderValue(head, "transfer-encoding").empty()) {
      c.out += kBadRequest;  // not needed by the benchmark's clients
      c.close_after = true;
      return false;
    }
    size_t total = end + 4 - off + body;
    if (c.in.size() - off < total) break;  // body not complete yet
    bool get_ping = head.starts_with("GET /ping ");
    bool post_invoke = head.starts_with("POST /invocations ");
    c.out += get_ping ? kPing : post_invoke ? kInvoke : kNotFound;
    size_t line_end = head.find("\r\n");
    std::string_view request_line = head.substr(0, line_end);
    std::string_view conn = HeaderValue(head, "connection");
    if (request_line.ends_with("HTTP/1.0") ? conn.size() != 10 || strncasecmp(conn.data(), "keep-alive", 10) != 0
                                           : (conn.size() == 5 && strncasecmp(conn.data(), "close", 5) == 0)) {
      c.close_after = true;
      off += total;
      break;
    }
    off += total;
  }
  c.in.erase(0, off);
  return true;
}

int Listen(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1024) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void Loop(int listen_fd) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd;
  epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd, &ev);
  std::unordered_map<int, Conn> conns;
  std::vector<epoll_event> events(256);
  std::vector<char> buf(64 * 1024);
  auto drop = [&](int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    conns.erase(fd);
  };
  while (true) {
    int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[static_cast<size_t>(i)].data.fd;
      if (fd == listen_fd) {
        while (true) {
          int c = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          int one = 1;
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          epoll_event cev{};
          cev.events = EPOLLIN | EPOLLRDHUP;
          cev.data.fd = c;
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
          conns.emplace(c, Conn{});
        }
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      Conn& c = it->second;
      bool dead = false;
      if (events[static_cast<size_t>(i)].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        while (true) {
          ssize_t r = read(fd, buf.data(), buf.size());
          if (r > 0) {
            c.in.append(buf.data(), static_cast<size_t>(r));
            if (static_cast<size_t>(r) < buf.size()) break;
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EINTR)) dead = true;
          break;
        }
        if (!c.close_after) Process(c);
      }
      while (!c.out.empty()) {
        ssize_t w = write(fd, c.out.data(), c.out.size());
        if (w > 0) {
          c.out.erase(0, static_cast<size_t>(w));
        } else {
          if (w < 0 && errno == EINTR) continue;
          if (w < 0 && errno != EAGAIN) dead = true;
          break;
        }
      }
      if (dead || (c.close_after && c.out.empty())) {
        drop(fd);
        continue;
      }
      epoll_event mev{};
      mev.events = EPOLLIN | EPOLLRDHUP | (c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
      mev.data.fd = fd;
      epoll_ctl(ep, EPOLL_CTL_MOD, fd, &mev);
    }
  }
}

void OnSignal(int) { _exit(0); }

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) != "serve") {
    fprintf(stderr, "usage: %s [serve]\n", argv[0]);
    return 2;
  }
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  const char* p = getenv("SAGEMAKER_BIND_TO_PORT");
  int port = p != nullptr && *p != '\0' ? atoi(p) : 8080;
  const char* t = getenv("BACKEND_THREADS");
  int threads = t != nullptr && atoi(t) > 0 ? atoi(t) : static_cast<int>(std::thread::hardware_concurrency());
  if (threads < 1) threads = 1;
  std::vector<int> fds;
  for (int i = 0; i < threads; ++i) {
    int fd = Listen(port);
    if (fd < 0) {
      fprintf(stderr, "serving_backend: cannot listen on port %d: %s\n", port, strerror(errno));
      return 1;
    }
    fds.push_back(fd);
  }
  printf("serving_backend ready on port %d (%d thread%s)\n", port, threads, threads == 1 ? "" : "s");
  fflush(stdout);
  std::vector<std::thread> workers;
  for (size_t i = 1; i < fds.size(); ++i) workers.emplace_back(Loop, fds[i]);
  Loop(fds[0]);
  for (auto& w : workers) w.join();
  return 0;
}
