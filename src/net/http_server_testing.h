#pragma once
// Test-only entry points of the HTTP server, for unit tests and fuzzers (fuzz/): they reach the
// connection loop without a listening socket. Not for production code.

#include "net/http_server.h"

namespace kiln::net {

// Serves the connected, non-blocking socket `fd` exactly as an accepted connection is served (on
// the server's first event loop: header parsing, the AsyncService or the worker pool, bodies,
// limits, lingering close; the connection is registered and counted like any other), and returns
// once it is closed (`fd` with it). `server` must come from HttpServer::Create and must not be
// stopped meanwhile; Start() is not needed (the loops are started on first use, not the
// acceptor). Timeouts apply as configured, so the peer should have sent everything and shut its
// side down (or be answering) or the call waits for them.
void ServeConnectionForTest(HttpServer& server, int fd);

}  // namespace kiln::net
