// One request/response exchange on an HttpServer connection (ServeOneRequest): the request
// header read within its limits and timeouts, the HttpRequest filled (reused per connection),
// the handler run, and afterwards the response completed and the unread body drained, or the
// connection marked for closing. How connections are accepted and which thread serves them is
// http_server.cc's business, not this file's.

#include <limits>

#include <boost/beast/http/read.hpp>

#include "base/log.h"
#include "base/strings.h"
#include "net/http_server_internal.h"

namespace kiln::net::internal {
namespace {

// http::read_header with a limit on the header's total size. Beast 1.74's header_limit bounds
// the bytes of one parse pass, not the header: depending on how the reads split the header
// (e.g. a first read of 1 byte, or of ~36 KB, then the rest), parse passes consume complete
// fields without counting them, and a 101 KB header passed a 64 KiB limit (the flaky
// test_oversize_headers_431). Here every pass gets only the budget that is left.
template <class Stream, class Buffer>
void ReadHeaderWithin(Stream& stream, Buffer& buffer, RequestParser& parser, size_t max_header_bytes,
                      boost::beast::error_code& ec) {
  const size_t limit = std::min<size_t>(max_header_bytes, std::numeric_limits<uint32_t>::max());
  size_t consumed = 0;
  while (!parser.is_header_done()) {
    parser.header_limit(static_cast<uint32_t>(limit - consumed));
    consumed += http::read_some(stream, buffer, parser, ec);
    if (ec) return;
    if (consumed > limit) {
      ec = http::error::header_limit;
      return;
    }
  }
}

// Starts waiting for the next request on `conn`: the idle phase (first-byte or idle timeout,
// Stop() may interrupt, the acceptor may close it for room), unless bytes of it are buffered.
void BeginRequest(Connection& conn, const Limits& limits) {
  conn.header_deadline.reset();
  if (conn.buffer.size() > 0) {
    // Bytes of this request came with the previous one (pipelining): the connection is busy
    // (the acceptor must not close it for room: the bytes are in our buffer, not the socket),
    // and the header clock runs from now.
    conn.idle_phase = false;
    if (limits.header_timeout_ms > 0) {
      conn.header_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limits.header_timeout_ms);
    }
  } else {
    conn.idle_phase = true;
    if (!conn.fresh) {
      conn.slot->MarkIdle();
    }
  }
}

}  // namespace

int HeaderErrorStatus(const error_code& ec) {
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return 431;
  }
  if (ec == http::error::body_limit) {
    return 413;
  }
  return 400;
}

namespace {

// Reads the request header into `parser`. False when the connection is to close: quietly when it
// was idle, stopped or the peer went away or stalled, otherwise after the error response (431,
// 413, 400), with conn.unread_input set.
bool ReadRequestHeader(Connection& conn, const ServerContext& server, RequestParser& parser) {
  parser.body_limit(server.options.max_body_bytes);
  FdReadStream stream(&conn, &server.limits);
  error_code ec;
  ReadHeaderWithin(stream, conn.buffer, parser, server.options.max_header_bytes, ec);
  conn.header_deadline.reset();  // the body has its own (per-read) timeout
  if (ec) {
    if (conn.idle_phase || IsPeerGone(ec) || ec == boost::asio::error::timed_out ||
        ec == boost::asio::error::operation_aborted) {
      return false;  // idle close, stop, or the peer went away / stalled mid-header
    }
    WriteErrorResponse(conn.fd, HeaderErrorStatus(ec), server.limits.io_timeout_ms);
    conn.unread_input = true;
    return false;
  }
  conn.idle_phase = false;
  conn.fresh = false;
  return true;
}

// Checks what the handler relies on in a parsed header (HTTP/1.0 or 1.1; a length it can trust).
// False after answering 505 or 400 (conn.unread_input set): the connection is to close.
bool CheckParsedHeader(Connection& conn, const ServerContext& server, const RequestParser& parser) {
  const auto& msg = parser.get();
  const unsigned version = msg.version();
  if (version != 10 && version != 11) {
    WriteErrorResponse(conn.fd, 505, server.limits.io_timeout_ms);
    conn.unread_input = true;
    return false;
  }
  if (!parser.chunked() && msg.find(http::field::transfer_encoding) != msg.end()) {
    // RFC 7230 §3.3.3: a request whose Transfer-Encoding does not end in chunked has no
    // reliable length.
    WriteErrorResponse(conn.fd, 400, server.limits.io_timeout_ms);
    conn.unread_input = true;
    return false;
  }
  return true;
}

}  // namespace

// Fills conn.request (reused: strings keep their capacity) from the parsed header; the body is
// set by the caller.
void FillRequest(Connection& conn, const RequestParser::value_type& msg) {
  HttpRequest& req = conn.request;
  req.method.assign(msg.method_string().data(), msg.method_string().size());
  req.target.assign(msg.target().data(), msg.target().size());
  std::string_view target(req.target);
  size_t q = target.find('?');
  req.raw_path.assign(target.substr(0, q));
  if (q == std::string_view::npos) {
    req.raw_query.clear();
  } else {
    req.raw_query.assign(target.substr(q + 1));
  }
  req.http_version = static_cast<int>(msg.version());
  req.headers.clear();
  for (const auto& field : msg) {
    req.headers.emplace(std::string(field.name_string()), std::string(field.value()));
  }
  req.remote_address = conn.remote_address;
}

namespace {

// Calls the handler; what it throws is logged and treated as no response (or a cut one).
void RunHandler(const Handler& handler, HttpRequest& req, ResponseWriterImpl& writer) {
  try {
    handler(req, writer);
  } catch (const std::exception& e) {
    KLOG(error, "http handler threw", {{"target", req.target}, {"error", e.what()}});
  } catch (...) {
    KLOG(error, "http handler threw", {{"target", req.target}});
  }
}

// After the handler: answers 500 if it sent nothing, completes the response, and drains the
// body it left unread (up to max_drain_bytes). True when the connection can serve another
// request; otherwise sets conn.unread_input where bytes may be left in the stream.
bool FinishExchange(Connection& conn, const ServerContext& server, ResponseWriterImpl& writer, RequestBody& body) {
  if (!writer.started()) {
    (void)writer.Send(500, {{"Content-Type", "text/plain"}}, "handler produced no response\n");
  }
  bool keep = writer.Complete() && !writer.close_after();
  if (!body.done()) {
    if (keep) {
      Status drained = body.Drain(server.options.max_drain_bytes);
      keep = drained.ok();
    }
    if (!keep) {
      conn.unread_input = true;
    }
  }
  if (body.failed()) {
    keep = false;
    conn.unread_input = true;
  }
  return keep && !server.stopping.load();
}

}  // namespace

bool ServeOneRequest(Connection& conn, const ServerContext& server) {
  BeginRequest(conn, server.limits);
  RequestParser parser;
  if (!ReadRequestHeader(conn, server, parser)) {
    return false;
  }
  return ServeParsedRequest(conn, server, parser);
}

bool ServeParsedRequest(Connection& conn, const ServerContext& server, RequestParser& parser) {
  if (!CheckParsedHeader(conn, server, parser)) {
    return false;
  }
  const auto& msg = parser.get();
  FillRequest(conn, msg);
  HttpRequest& req = conn.request;

  RequestBody::Mode mode = RequestBody::Mode::kNone;
  uint64_t length = 0;
  if (parser.chunked()) {
    mode = RequestBody::Mode::kChunked;
  } else if (parser.content_length()) {
    mode = RequestBody::Mode::kLength;
    length = *parser.content_length();
  }
  const std::string* expect = req.Header("Expect");
  const bool expect_continue =
      msg.version() == 11 && expect != nullptr && EqualsIgnoreCase(Trim(*expect), "100-continue");

  ResponseWriterImpl::RequestInfo info;
  info.head = req.method == "HEAD";
  info.http10 = msg.version() == 10;
  info.keep_alive = parser.keep_alive();
  RequestBody body(&conn, &server.limits, &parser, mode, length, expect_continue);
  ResponseWriterImpl writer(&conn, &server.limits, &server.options, &server.stopping, &body, info);
  body.set_writer(&writer);
  req.body = &body;
  RunHandler(server.handler, req, writer);
  req.body = nullptr;
  return FinishExchange(conn, server, writer, body);
}

}  // namespace kiln::net::internal
