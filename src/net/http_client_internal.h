#pragma once
// Private to src/net: the pieces of HttpClient that its two files share. http_client.cc (the
// per-target pool, connect, the request head, send and the retry rule) hands each exchange's
// reading to ReadResponse (http_response_reader.cc, over Beast's response parser). Nothing here
// is for other modules.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <functional>
#include <string>
#include <string_view>

#include <boost/beast/core/flat_buffer.hpp>

#include "base/status.h"
#include "net/http_client.h"

namespace kiln::net::internal {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

// Milliseconds left until `deadline` (rounded up, so a wait never ends early), at least 0.
// A max() deadline means no limit (-1, poll's "forever").
inline int RemainingMs(TimePoint deadline) {
  if (deadline == TimePoint::max()) {
    return -1;
  }
  auto left = deadline - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) {
    return 0;
  }
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
}

// PollOrCancel's answer when the call's CancelSignal was set.
constexpr int kPollCancelled = -2;

// poll() of `fd` for `events` for up to `timeout_ms` (-1: no limit) that also ends when `cancel`
// (may be null) is set. Returns poll's result (> 0 ready, 0 timed out, -1 with errno), or
// kPollCancelled. Without an eventfd the wait is cut into slices; the end of a slice that is not
// the end of the timeout returns -1 with errno EINTR, which every caller treats as "wait again".
int PollOrCancel(int fd, short events, int timeout_ms, const CancelSignal* cancel);

// The error of a call cut by its CancelSignal after (part of) the request was sent. `peer` is the
// target's "host:port".
inline Status CancelledError(const std::string& peer, const CancelSignal& cancel) {
  return Status::Aborted("the call to " + peer + " was cancelled: " + cancel.reason());
}

// Per-thread scratch, reused by every call on the thread so the hot path allocates nothing for
// these (both keep their capacity from call to call).
struct ThreadScratch {
  std::string head;                  // the request head being sent
  boost::beast::flat_buffer buffer;  // response bytes read but not yet parsed (cleared per call)
};

// This thread's scratch (http_client.cc).
ThreadScratch& Scratch();

// The outcome of one request/response exchange on one connection.
struct Exchange {
  Status status;
  bool keep_alive = false;  // the connection may serve another request
  // The request cannot have been processed: sending failed, or the peer closed/reset the
  // connection before sending any response byte.
  bool retryable = false;
};

// Reads and parses one response (Beast's response parser) from the connected socket `fd` into
// `out`, as the answer to a request just sent (`head_request`: a HEAD, so no body), through
// `scratch`'s buffer (bytes read past the response are left there and make the connection unfit
// for reuse). `peer` names the server in errors; every wait ends by `deadline` (`response_ms` is
// the budget errors quote) or when `cancel` (may be null) is set. Errors are in the returned Exchange: Aborted (peer
// gone, cancelled), DeadlineExceeded, DataLoss (malformed), ResourceExhausted (over the options' limits).
Exchange ReadResponse(int fd, const std::string& peer, const HttpClientOptions& options, TimePoint deadline,
                      int response_ms, bool head_request, const CancelSignal* cancel, ThreadScratch& scratch,
                      ClientResponse* out);

// The request head of both clients (HttpClient, AsyncHttpClient), formatted into `head` (cleared
// first): the request line, Host (`host_value`), Content-Length unless a GET/HEAD without body,
// and the caller's headers minus the framing and connection-management ones the client owns.
// InvalidArgument for a bad request line or CR/LF (or ':' in a name) in any piece: they would let
// a caller inject requests.
Status FormatRequestHead(const ClientRequest& request, std::string_view host_value, std::string& head);

// The pools' key, "host" + port, found by a string_view (no allocation per lookup).
struct TargetKeyView {
  std::string_view host;
  uint16_t port;
};

struct TargetKey {
  std::string host;
  uint16_t port;
};

struct TargetKeyHash {
  using is_transparent = void;
  size_t operator()(const TargetKeyView& k) const {
    return std::hash<std::string_view>()(k.host) ^ (static_cast<size_t>(k.port) * 0x9E3779B97F4A7C15ull);
  }
  size_t operator()(const TargetKey& k) const { return (*this)(TargetKeyView{k.host, k.port}); }
};

struct TargetKeyEq {
  using is_transparent = void;
  static TargetKeyView View(const TargetKey& k) { return {k.host, k.port}; }
  static TargetKeyView View(const TargetKeyView& k) { return k; }
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    TargetKeyView x = View(a), y = View(b);
    return x.port == y.port && x.host == y.host;
  }
};

}  // namespace kiln::net::internal
