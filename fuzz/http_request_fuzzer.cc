// Fuzzes the HTTP/1.1 server's request side (src/net/http_exchange.cc and the request body and
// response writer beside it): the bytes of one client connection go through the real connection
// loop (net::ServeConnectionForTest over a socketpair):
// request line and headers (Beast's parser, the header bound, 400/413/431/505), keep-alive and
// pipelining, Content-Length and chunked bodies read by the handler in input-chosen sizes,
// Expect: 100-continue, draining of unread bodies, the response writer and the lingering close.
//
// Input layout: byte 0 = flags, the rest = what the client sends before shutting down its side.
//   bits 0-1  the handler's read size: 1, 7, 4096, 65536 bytes
//   bit 2     the handler leaves the body unread (the server drains it or closes)
//   bit 3     small limits: max_header_bytes 256, max_body_bytes 1024, max_drain_bytes 64
//   bit 4     the handler answers with an unknown length (chunked), else Content-Length
//   bit 5     the handler asks for Connection: close
//
// Checks besides "no crash, no sanitizer report":
//   - what the handler sees is well-formed: a token method, a target without SP/CR/LF that
//     raw_path '?' raw_query rebuilds, version 10 or 11, token header names, values without
//     CR/LF/NUL; a body read to its end is exactly its Content-Length and never over
//     max_body_bytes;
//   - every response the server writes parses with HttpClient's response parser (the two
//     hand-written sides agree), and every request the handler saw got its response, in order.

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/strings.h"
#include "net/http_client.h"
#include "net/http_client_testing.h"
#include "net/http_server.h"
#include "net/http_server_testing.h"

namespace {

using kiln::net::HttpRequest;
using kiln::net::ResponseWriter;

void Check(bool condition) {
  if (!condition) std::abort();
}

bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// A handler's answers per connection are bounded so the responses always fit the socketpair's
// buffer (the server writes them before anyone reads).
constexpr int kMaxRequestsPerInput = 32;

struct Run {
  uint8_t flags = 0;
  size_t read_size = 1;
  uint64_t max_body = 0;
  std::vector<bool> head;  // per handled request: was it HEAD
};
Run* g_run = nullptr;

void Handle(HttpRequest& req, ResponseWriter& out) {
  Run& run = *g_run;
  Check(IsToken(req.method));
  Check(!req.target.empty() && req.target.find_first_of(" \r\n", 0) == std::string::npos &&
        req.target.find('\0') == std::string::npos);
  Check(req.raw_query.empty() ? (req.target == req.raw_path || req.target == req.raw_path + "?")
                              : req.target == req.raw_path + "?" + req.raw_query);
  Check(req.http_version == 10 || req.http_version == 11);
  for (const auto& [name, value] : req.headers) {
    Check(IsToken(name));
    Check(value.find_first_of("\r\n") == std::string::npos && value.find('\0') == std::string::npos);
  }
  Check(req.body != nullptr);

  uint64_t total = 0;
  bool body_ok = true;
  if ((run.flags & 4) == 0) {
    std::vector<char> buf(run.read_size);
    for (;;) {
      kiln::Result<size_t> n = req.body->Read(buf.data(), buf.size());
      if (!n.ok()) {
        body_ok = false;
        break;
      }
      if (*n == 0) break;
      Check(*n <= buf.size());
      total += *n;
      Check(total <= run.max_body);
    }
    const std::string* length = req.Header("Content-Length");
    if (body_ok && length != nullptr && req.Header("Transfer-Encoding") == nullptr) {
      std::optional<uint64_t> declared = kiln::ParseUint64(kiln::Trim(*length));
      if (declared) Check(total == *declared);
    }
  }

  run.head.push_back(req.method == "HEAD");
  if (run.head.size() >= kMaxRequestsPerInput || (run.flags & 32) != 0) out.CloseAfterResponse();
  std::string body = body_ok ? std::to_string(total) : "error";
  kiln::HeaderMap headers{{"X-Seen", std::to_string(run.head.size())}};
  if ((run.flags & 16) != 0) {
    if (!out.Start(200, headers, std::nullopt).ok()) return;
    if (!out.Write(body).ok()) return;
    (void)out.Finish();
  } else {
    (void)out.Send(body_ok ? 200 : 400, headers, body);
  }
}

std::unique_ptr<kiln::net::HttpServer> MakeServer(bool small) {
  kiln::net::HttpServerOptions options;
  options.listen = "127.0.0.1:0";  // bound, never started: connections come through ServeForTest
  options.io_timeout_seconds = 5;  // every input ends in EOF; this only bounds a bug
  if (small) {
    options.max_header_bytes = 256;
    options.max_body_bytes = 1024;
    options.max_drain_bytes = 64;
  }
  auto server = kiln::net::HttpServer::Create(options, Handle);
  Check(server.ok());
  return std::move(*server);
}

// Writes `bytes` into a fresh socketpair and returns the read end (the peer's side is shut down
// for writing, so the reader sees EOF after them).
int FeedSocket(std::string_view bytes) {
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  int size = 1 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  while (!bytes.empty()) {
    ssize_t n = ::send(fds[0], bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;  // a full buffer: the rest is cut (inputs are far smaller)
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  ::shutdown(fds[0], SHUT_WR);
  ::close(fds[0]);
  ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
  return fds[1];
}

// Splits the server's output into responses. Bodies are digits or "error" and no header holds
// "HTTP/1.1 ", so each response starts at one; a "100 Continue" belongs with what follows (the
// client parser skips it).
std::vector<std::string_view> SplitResponses(std::string_view out) {
  std::vector<std::string_view> starts;
  size_t at = 0;
  while ((at = out.find("HTTP/1.1 ", at)) != std::string_view::npos) {
    starts.push_back(out.substr(at));
    at += 9;
  }
  std::vector<std::string_view> responses;
  bool after_continue = false;  // the last piece was a lone "100 Continue"
  for (size_t i = 0; i < starts.size(); ++i) {
    size_t end = i + 1 < starts.size() ? starts[i].size() - starts[i + 1].size() : starts[i].size();
    std::string_view one = starts[i].substr(0, end);
    if (after_continue) {
      responses.back() = std::string_view(responses.back().data(), responses.back().size() + one.size());
    } else {
      responses.push_back(one);
    }
    after_continue = !after_continue && one.starts_with("HTTP/1.1 100 ");
  }
  return responses;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static std::unique_ptr<kiln::net::HttpServer> normal = MakeServer(false);
  static std::unique_ptr<kiln::net::HttpServer> small = MakeServer(true);
  static const size_t kReadSizes[4] = {1, 7, 4096, 65536};

  Run run;
  run.flags = data[0];
  run.read_size = kReadSizes[run.flags & 3];
  const bool small_limits = (run.flags & 8) != 0;
  run.max_body = small_limits ? 1024 : 5ull * 1024 * 1024 * 1024 + 64 * 1024 * 1024;
  g_run = &run;

  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  int buffer = 1 << 20;
  for (int fd : fds) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  }
  std::string_view rest = input;
  while (!rest.empty()) {
    ssize_t n = ::send(fds[0], rest.data(), rest.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;
    rest.remove_prefix(static_cast<size_t>(n));
  }
  ::shutdown(fds[0], SHUT_WR);
  ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
  kiln::net::ServeConnectionForTest(small_limits ? *small : *normal, fds[1]);  // closes fds[1]

  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = ::recv(fds[0], buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  g_run = nullptr;

  // Every response parses with the client's parser; the handled requests got theirs in order
  // (a last one may be the server's own error answer, e.g. 400 for garbage after them).
  std::vector<std::string_view> responses = SplitResponses(out);
  if (std::getenv("KILN_FUZZ_DEBUG") != nullptr) {
    std::fprintf(stderr, "handled %zu request(s); server wrote %zu response(s):\n%s\n", run.head.size(),
                 responses.size(), out.c_str());
  }
  Check(out.empty() || out.starts_with("HTTP/1.1 "));
  Check(responses.size() >= run.head.size());
  kiln::net::HttpClientOptions client_options;
  for (size_t i = 0; i < responses.size(); ++i) {
    const bool head = i < run.head.size() && run.head[i];
    int fd = FeedSocket(responses[i]);
    kiln::net::ParsedResponseForTest parsed = kiln::net::ReadResponseForTest(fd, head, client_options, 5000);
    ::close(fd);
    Check(parsed.status.ok());
    if (i < run.head.size()) {
      const std::string* seen = kiln::FindHeader(parsed.response.headers, "X-Seen");
      Check(seen != nullptr && *seen == std::to_string(i + 1));
    }
  }
  return 0;
}
