#pragma once
// A blocking HTTP/1.1 Upgrade client (RFC 9110 §7.8): one `GET` on a fresh connection whose answer
// is either `101 Switching Protocols` — the socket then belongs to the caller, who speaks the new
// protocol on it (`kiln ssh-proxy`/`kiln connect` run SSH over `Upgrade: kiln-ssh`) — or an
// ordinary response, read whole. The server side is ResponseWriter::Upgrade (http_server.h).
//
// No pool, no retry, no TLS: each call connects, sends the head, reads the answer head (at most
// kMaxUpgradeHeadBytes) and, for a final status other than 101, its body (at most
// kMaxUpgradeBodyBytes). Interim 1xx answers other than 101 are skipped. Thread-safe (no shared
// state); blocks the calling thread for up to connect_timeout_ms + response_timeout_ms.

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/fs.h"
#include "base/io.h"
#include "base/status.h"

namespace kiln::net {

inline constexpr size_t kMaxUpgradeHeadBytes = 64 * 1024;
inline constexpr size_t kMaxUpgradeBodyBytes = 1 << 20;

struct UpgradeRequest {
  // Where to connect: an "http://host[:port][/path]" URL (port 80 when absent; its path is not
  // used: `target` is sent), or — when `url` is empty — `host` (name or IP literal; IPv6 without
  // brackets) and `port`. Names are resolved with getaddrinfo; each address is tried in turn.
  std::string url;
  std::string host;
  uint16_t port = 0;
  // The request-target, origin-form: "/_kiln/remote/connect?target=training-job%2Fj".
  std::string target = "/";
  // Sent as given (in HeaderMap's order): the caller supplies Connection, Upgrade and any
  // signing headers. `Host` is added when absent: the URL's authority as written
  // ("127.0.0.1:5456", "[::1]:5456", "example.com" without a port), or host:port (IPv6
  // bracketed); sign that value. CR/LF in a name or value → InvalidArgument.
  HeaderMap headers;
  // For the TCP connect (each address).
  int connect_timeout_ms = 10000;
  // From the connection being made until the answer's head (and, when not 101, its body) has
  // been read; any wait. 0 or less: no limit.
  int response_timeout_ms = 30000;
};

struct UpgradeResult {
  int status = 0;  // the final status: 101, or the server's refusal (400, 403, ...)
  HeaderMap headers;
  // 101 only: the connection, in blocking mode with TCP_NODELAY (interactive traffic); the
  // caller's to close (UniqueFd does).
  UniqueFd fd;
  // 101 only: bytes of the new protocol the server sent right after its head, already read from
  // the socket: they come before anything read from `fd`.
  std::string buffered;
  // Not 101: the response body (Content-Length, chunked or close-delimited). The connection is
  // closed.
  std::string body;
};

// Opens the upgrade. Any HTTP status is a successful result (check `status`).
// Errors: InvalidArgument — a URL that is not http://host[:port][/...], no host/port, or CR/LF in
// a header or the target; Unavailable — the host cannot be resolved or connected to (the message
// names host:port and the reason; also a connect not accepted within connect_timeout_ms), or the
// server closed the connection before a whole answer; DeadlineExceeded — no whole answer within
// response_timeout_ms; DataLoss — the answer is not
// HTTP/1.1; ResourceExhausted — head over kMaxUpgradeHeadBytes or body over kMaxUpgradeBodyBytes.
Result<UpgradeResult> OpenUpgrade(const UpgradeRequest& request);

}  // namespace kiln::net
