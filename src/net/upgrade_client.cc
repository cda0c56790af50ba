// OpenUpgrade (upgrade_client.h): connect (getaddrinfo, each address in turn, non-blocking
// connect bounded by poll), send the GET head, read until the answer's head is complete (found
// by its blank line, so that the bytes after a 101's head are known exactly), parse it with
// Beast's response parser, and then either hand the socket over (101) or read the body with the
// same parser (Content-Length, chunked or close-delimited, bounded).

#include "net/upgrade_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "base/strings.h"
#include "net/http_server.h"
#include "net/socket_io.h"

namespace kiln::net {
namespace {

namespace http = boost::beast::http;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 16 * 1024;

struct Endpoint {
  std::string host;  // for getaddrinfo: no brackets
  uint16_t port = 0;
  std::string host_header;  // what `Host` says when the caller gave none
  std::string label;        // "host:port" for messages
};

bool HasCrLf(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

std::string Label(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> ResolveEndpoint(const UpgradeRequest& request) {
  Endpoint ep;
  if (request.url.empty()) {
    if (request.host.empty() || request.port == 0) {
      return Status::InvalidArgument("an upgrade needs a URL, or a host and a port");
    }
    ep.host = request.host;
    ep.port = request.port;
    ep.label = Label(ep.host, ep.port);
    ep.host_header = ep.label;
    return ep;
  }
  std::string_view url(request.url);
  constexpr std::string_view kScheme = "http://";
  if (url.size() < kScheme.size() || !EqualsIgnoreCase(url.substr(0, kScheme.size()), kScheme)) {
    return Status::InvalidArgument("endpoint URL '" + request.url +
                                   "' must start with http:// (TLS is not supported for remote connections)");
  }
  std::string_view authority = url.substr(kScheme.size());
  authority = authority.substr(0, authority.find_first_of("/?#"));
  if (authority.empty() || authority.find('@') != std::string_view::npos) {
    return Status::InvalidArgument("endpoint URL '" + request.url + "' needs a host[:port] (and no user info)");
  }
  const bool has_port = authority.front() == '[' ? authority.find("]:") != std::string_view::npos
                                                 : authority.find(':') != std::string_view::npos;
  std::string with_port(authority);
  if (!has_port) {
    with_port += ":80";
  }
  Status parsed = ParseHostPort(with_port, &ep.host, &ep.port);
  if (!parsed.ok() || ep.port == 0) {
    return Status::InvalidArgument("endpoint URL '" + request.url +
                                   "': " + (parsed.ok() ? std::string("port 0") : parsed.message()));
  }
  ep.host_header = std::string(authority);
  ep.label = Label(ep.host, ep.port);
  return ep;
}

// Milliseconds left to `deadline` (at least 0), or -1 without one.
int LeftMs(const std::optional<Clock::time_point>& deadline) {
  if (!deadline) {
    return -1;
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

Result<UniqueFd> Connect(const Endpoint& ep, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const std::string port = std::to_string(ep.port);
  const int gai = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &addrs);
  if (gai != 0) {
    return Status::Unavailable("cannot connect to " + ep.label + ": cannot resolve '" + ep.host +
                               "': " + ::gai_strerror(gai));
  }
  std::string last = "no address";
  UniqueFd fd;
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    UniqueFd s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    int rc = ::connect(s.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{s.get(), POLLOUT, 0};
      do {
        rc = ::poll(&p, 1, timeout_ms > 0 ? timeout_ms : -1);
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        last = "not accepted within " + std::to_string(timeout_ms) + " ms";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (rc < 0 || ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
      if (err != 0) {
        last = std::strerror(err);
        continue;
      }
    } else if (rc != 0) {
      last = std::strerror(errno);
      continue;
    }
    fd = std::move(s);
    break;
  }
  ::freeaddrinfo(addrs);
  if (!fd.valid()) {
    return Status::Unavailable("cannot connect to " + ep.label + ": " + last);
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // interactive traffic
  return fd;
}

std::string FormatHead(const UpgradeRequest& request, const Endpoint& ep) {
  std::string h;
  h.reserve(256 + request.target.size());
  h.append("GET ").append(request.target).append(" HTTP/1.1\r\n");
  if (FindHeader(request.headers, "Host") == nullptr) {
    h.append("Host: ").append(ep.host_header).append("\r\n");
  }
  for (const auto& [name, value] : request.headers) {
    h.append(name).append(": ").append(value).append("\r\n");
  }
  h.append("\r\n");
  return h;
}

// Reads more of the answer into `buf`. False at EOF.
Result<bool> ReadMore(int fd, std::string& buf, const std::optional<Clock::time_point>& deadline, const Endpoint& ep,
                      int timeout_ms) {
  const size_t have = buf.size();
  buf.resize(have + kReadChunk);
  Result<size_t> r = internal::RecvSome(fd, buf.data() + have, kReadChunk, LeftMs(deadline));
  buf.resize(have + (r.ok() ? *r : 0));
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kDeadlineExceeded) {
      return Status::DeadlineExceeded(ep.label + " did not answer the upgrade within " + std::to_string(timeout_ms) +
                                      " ms");
    }
    return Status::Unavailable(ep.label + " reset the connection: " + r.status().message());
  }
  return *r > 0;
}

Status ParserError(const error_code& ec, const Endpoint& ep) {
  if (ec == http::error::body_limit) {
    return Status::ResourceExhausted("the answer from " + ep.label + " has a body over " +
                                     std::to_string(kMaxUpgradeBodyBytes) + " bytes");
  }
  if (ec == http::error::header_limit) {
    return Status::ResourceExhausted("the answer head from " + ep.label + " is over " +
                                     std::to_string(kMaxUpgradeHeadBytes) + " bytes");
  }
  return Status::DataLoss("malformed answer from " + ep.label + ": " + ec.message());
}

}  // namespace

Result<UpgradeResult> OpenUpgrade(const UpgradeRequest& request) {
  ASSIGN_OR_RETURN(Endpoint ep, ResolveEndpoint(request));
  if (request.target.empty() || request.target.front() != '/' ||
      request.target.find_first_of(" \r\n") != std::string::npos) {
    return Status::InvalidArgument("the upgrade target must be an origin-form path without spaces: '" + request.target +
                                   "'");
  }
  for (const auto& [name, value] : request.headers) {
    if (name.empty() || HasCrLf(name) || HasCrLf(value) || name.find(':') != std::string::npos) {
      return Status::InvalidArgument("bad request header '" + name + "'");
    }
  }
  ASSIGN_OR_RETURN(UniqueFd fd, Connect(ep, request.connect_timeout_ms));
  std::optional<Clock::time_point> deadline;
  if (request.response_timeout_ms > 0) {
    deadline = Clock::now() + std::chrono::milliseconds(request.response_timeout_ms);
  }

  std::string head = FormatHead(request, ep);
  iovec iov{head.data(), head.size()};
  Status sent = internal::SendAll(fd.get(), &iov, 1, LeftMs(deadline));
  if (!sent.ok()) {
    if (sent.code() == StatusCode::kDeadlineExceeded) {
      return Status::DeadlineExceeded(ep.label + " did not take the upgrade request within " +
                                      std::to_string(request.response_timeout_ms) + " ms");
    }
    return Status::Unavailable("sending the upgrade request to " + ep.label + ": " + sent.message());
  }

  std::string buf;
  for (;;) {  // one pass per answer head: interim 1xx answers (not 101) are skipped
    size_t head_end = std::string::npos;
    size_t scanned = 0;
    while ((head_end = buf.find("\r\n\r\n", scanned > 3 ? scanned - 3 : 0)) == std::string::npos) {
      scanned = buf.size();
      if (buf.size() > kMaxUpgradeHeadBytes) {
        return ParserError(http::error::header_limit, ep);
      }
      if (buf.size() >= 5 && buf.compare(0, 5, "HTTP/") != 0) {
        return Status::DataLoss(ep.label + " did not answer with HTTP");
      }
      ASSIGN_OR_RETURN(bool more, ReadMore(fd.get(), buf, deadline, ep, request.response_timeout_ms));
      if (!more) {
        return Status::Unavailable(ep.label + " closed the connection before answering the upgrade");
      }
    }
    head_end += 4;
    if (head_end > kMaxUpgradeHeadBytes) {
      return ParserError(http::error::header_limit, ep);
    }

    http::response_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(kMaxUpgradeHeadBytes));
    parser.body_limit(kMaxUpgradeBodyBytes);
    error_code ec;
    const size_t used = parser.put(boost::asio::buffer(buf.data(), head_end), ec);
    if (!ec && (!parser.is_header_done() || used != head_end)) {
      ec = http::error::bad_field;  // a head that ends where Beast does not see it end
    }
    if (ec) {
      return ParserError(ec, ep);
    }
    const auto& msg = parser.get();
    UpgradeResult result;
    result.status = static_cast<int>(msg.result_int());
    for (const auto& field : msg) {
      result.headers.emplace(std::string(field.name_string()), std::string(field.value()));
    }
    buf.erase(0, head_end);
    if (result.status == 101) {
      const int flags = ::fcntl(fd.get(), F_GETFL);
      if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) < 0) {
        return Status::Internal(std::string("blocking mode for the upgraded connection: ") + std::strerror(errno));
      }
      result.fd = std::move(fd);
      result.buffered = std::move(buf);
      return result;
    }
    if (result.status < 200) {
      continue;  // 100 Continue and the like: the final answer follows
    }
    // The body, through the same parser (it knows the framing from the head).
    while (!parser.is_done()) {
      if (!buf.empty()) {
        const size_t n = parser.put(boost::asio::buffer(buf), ec);
        buf.erase(0, n);
        if (ec == http::error::need_more) {
          ec = {};
        } else if (ec) {
          return ParserError(ec, ep);
        } else if (n > 0) {
          continue;
        }
        if (parser.is_done()) {
          break;
        }
      }
      ASSIGN_OR_RETURN(bool more, ReadMore(fd.get(), buf, deadline, ep, request.response_timeout_ms));
      if (!more) {
        parser.put_eof(ec);
        if (ec) {
          return Status::Unavailable(ep.label + " closed the connection in the middle of the answer's body");
        }
        break;
      }
    }
    result.body = std::move(parser.get().body());
    return result;
  }
}

}  // namespace kiln::net
