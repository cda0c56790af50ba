// Fuzzes HttpClient's response reading (src/net/http_response_reader.cc: Beast's
// http::response_parser, as on the server's request side, behind the client's own head framing,
// 1xx handling and keep-alive rule): the bytes a serving container sends back on the invoke path.
// Status line, header fields (bare-LF line ends, obs-fold), 1xx interim responses,
// Transfer-Encoding (chunked with extensions and trailers, or close-delimited) over
// Content-Length (repeated/comma lists), no-body statuses and HEAD, the header and body bounds —
// through net::ReadResponseForTest over a socketpair holding the input, then EOF.
//
// Input layout: byte 0 = flags, the rest = what the peer sends before closing.
//   bit 0  the request was HEAD
//   bit 1  small limits: max_response_header_bytes 256, max_response_body_bytes 1024
//
// Checks besides "no crash, no sanitizer report":
//   - a parsed response has a final status (200..999), token header names, values without CR/LF/NUL
//     or surrounding blanks, a body within the limit (empty for HEAD, 204 and 304), and, when
//     the connection would be reused, a body of exactly its Content-Length;
//   - errors are only DataLoss, Aborted or ResourceExhausted (never a timeout: the input ends);
//   - round trip: the response written back out in a canonical form (Content-Length framing)
//     parses to the same status, headers and body.

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/strings.h"
#include "net/http_client.h"
#include "net/http_client_testing.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

// A socket whose peer sent `bytes` and closed.
int FeedSocket(std::string_view bytes) {
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  int size = 1 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  while (!bytes.empty()) {
    ssize_t n = ::send(fds[0], bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;  // a full buffer cuts the input (libFuzzer's inputs are far smaller)
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  ::close(fds[0]);
  ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
  return fds[1];
}

kiln::net::ParsedResponseForTest Parse(std::string_view bytes, bool head, const kiln::net::HttpClientOptions& options) {
  int fd = FeedSocket(bytes);
  kiln::net::ParsedResponseForTest parsed = kiln::net::ReadResponseForTest(fd, head, options, 5000);
  ::close(fd);
  return parsed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool head = (data[0] & 1) != 0;
  kiln::net::HttpClientOptions options;
  if ((data[0] & 2) != 0) {
    options.max_response_header_bytes = 256;
    options.max_response_body_bytes = 1024;
  }
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  kiln::net::ParsedResponseForTest parsed = Parse(input, head, options);

  if (!parsed.status.ok()) {
    kiln::StatusCode code = parsed.status.code();
    Check(code == kiln::StatusCode::kDataLoss || code == kiln::StatusCode::kAborted ||
          code == kiln::StatusCode::kResourceExhausted);
    return 0;
  }
  const kiln::net::ClientResponse& r = parsed.response;
  Check(r.status >= 200 && r.status <= 999);
  for (const auto& [name, value] : r.headers) {
    Check(IsToken(name));
    Check(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos);
    Check(value.empty() ||
          (value.front() != ' ' && value.front() != '\t' && value.back() != ' ' && value.back() != '\t'));
  }
  Check(r.body.size() <= options.max_response_body_bytes);
  const bool no_body = head || r.status == 204 || r.status == 304;
  if (no_body) Check(r.body.empty());
  if (parsed.keep_alive && !no_body) {
    const std::string* length = kiln::FindHeader(r.headers, "Content-Length");
    if (length != nullptr && kiln::FindHeader(r.headers, "Transfer-Encoding") == nullptr) {
      std::optional<uint64_t> declared = kiln::ParseUint64(kiln::Trim(kiln::Split(*length, ',')[0]));
      Check(declared && *declared == r.body.size());
    }
  }

  // Round trip through a canonical rendering.
  std::string again = "HTTP/1.1 " + std::to_string(r.status) + " X\r\n";
  for (const auto& [name, value] : r.headers) {
    if (kiln::EqualsIgnoreCase(name, "Content-Length") || kiln::EqualsIgnoreCase(name, "Transfer-Encoding") ||
        kiln::EqualsIgnoreCase(name, "Connection")) {
      continue;
    }
    again += name + ": " + value + "\r\n";
  }
  if (r.status != 204 && r.status != 304) {
    again += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  }
  again += "\r\n" + r.body;
  // "Name: value" may be longer than the "Name:value" that was sent: the header budget is not
  // what is being checked here.
  kiln::net::HttpClientOptions roomy;
  roomy.max_response_header_bytes = again.size() + 1024;
  roomy.max_response_body_bytes = options.max_response_body_bytes;
  kiln::net::ParsedResponseForTest reparsed = Parse(again, /*head=*/false, roomy);
  Check(reparsed.status.ok());
  Check(reparsed.keep_alive);
  Check(reparsed.response.status == r.status);
  Check(reparsed.response.body == r.body);
  kiln::HeaderMap expected;
  for (const auto& [name, value] : r.headers) {
    if (!kiln::EqualsIgnoreCase(name, "Content-Length") && !kiln::EqualsIgnoreCase(name, "Transfer-Encoding") &&
        !kiln::EqualsIgnoreCase(name, "Connection")) {
      expected.emplace(name, value);
    }
  }
  if (r.status != 204 && r.status != 304) expected.emplace("Content-Length", std::to_string(r.body.size()));
  Check(reparsed.response.headers == expected);
  return 0;
}
