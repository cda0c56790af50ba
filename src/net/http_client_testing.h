#pragma once
// Test-only entry points of the HTTP client, for unit tests and fuzzers (fuzz/): they reach the
// client's response reading (Beast's response parser behind the client's head framing, 1xx and
// keep-alive rules) without a server. Not for production code.

#include "net/http_client.h"

namespace kiln::net {

struct ParsedResponseForTest {
  Status status;  // as HttpClient::Send would return it (before its one retry)
  ClientResponse response;
  bool keep_alive = false;  // Send would give the connection back to the pool
};

// Reads one response from the connected socket `fd` with the parser HttpClient::Send uses, as if
// a request had just been sent on it (`head_request`: that request was HEAD), waiting at most
// `response_ms` in all (0 or less: no limit). Errors name the peer "test:0". Does not close `fd`;
// bytes read past the response are discarded.
ParsedResponseForTest ReadResponseForTest(int fd, bool head_request, const HttpClientOptions& options, int response_ms);

}  // namespace kiln::net
