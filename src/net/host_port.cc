// ParseHostPort and IsLoopbackHost (declared in http_server.h).

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "base/strings.h"
#include "net/http_server.h"

namespace kiln::net {

Status ParseHostPort(std::string_view text, std::string* host, uint16_t* port) {
  std::string_view host_part;
  std::string_view port_part;
  if (StartsWith(text, "[")) {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status::InvalidArgument("expected [ipv6]:port, got '" + std::string(text) + "'");
    }
    host_part = text.substr(1, close - 1);
    port_part = text.substr(close + 2);
    in6_addr addr;
    if (::inet_pton(AF_INET6, std::string(host_part).c_str(), &addr) != 1) {
      return Status::InvalidArgument("bad IPv6 address in '" + std::string(text) + "'");
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return Status::InvalidArgument("expected host:port, got '" + std::string(text) + "'");
    }
    host_part = text.substr(0, colon);
    port_part = text.substr(colon + 1);
    if (host_part.find(':') != std::string_view::npos) {
      return Status::InvalidArgument("IPv6 addresses must be bracketed: '" + std::string(text) + "'");
    }
  }
  if (host_part.empty()) {
    return Status::InvalidArgument("empty host in '" + std::string(text) + "'");
  }
  std::optional<uint64_t> p = ParseUint64(port_part);
  if (!p || *p > 65535 || port_part.size() > 5) {
    return Status::InvalidArgument("bad port in '" + std::string(text) + "'");
  }
  *host = std::string(host_part);
  *port = static_cast<uint16_t>(*p);
  return Status::Ok();
}

bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (EqualsIgnoreCase(host, "localhost") || EqualsIgnoreCase(host, "localhost.")) {
    return true;
  }
  std::string text(host);
  in_addr v4;
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) {
      return true;
    }
    // ::ffff:127.x.x.x
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace kiln::net
