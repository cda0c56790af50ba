#pragma once
// Test-only entry points of the HTTP server, for unit tests and fuzzers (fuzz/): they reach the
// connection loop without a listening socket. Not for production code.

#include "net/http_server.h"

namespace kiln::net {

// Serves the connected, non-blocking socket `fd` on the calling thread exactly as a worker
// serves an accepted connection (request loop, bodies, limits, lingering close; the connection
// is registered and counted like any other), until the connection should close; then closes
// `fd`. `server` must come from HttpServer::Create and must not be stopped meanwhile; Start() is
// not needed. Timeouts apply as configured, so the peer should have sent everything and shut its
// side down (or be answering) or the call waits for them.
void ServeConnectionForTest(HttpServer& server, int fd);

}  // namespace kiln::net
