// One request/response exchange on an HttpServer connection (ServeOneRequest): the request
// header read within its limits and timeouts, the HttpRequest filled (reused per connection),
// the handler run, and afterwards the response completed and the unread body drained, or the
// connection marked for closing. How connections are accepted and which thread serves them is
// http_server.cc's business, not this file's.

#include <limits>

#include "base/log.h"
#include "base/strings.h"
#include "net/http_server_internal.h"

namespace kiln::net::internal {

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
  if (conn.upgraded) {
    return false;  // the socket is the handler's: nothing more to send, read or drain
  }
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
  ResponseWriterImpl writer(&conn, &server.limits, &server.options, &server.stopping, &body, info,
                            &server.release_slot);
  body.set_writer(&writer);
  req.body = &body;
  RunHandler(server.handler, req, writer);
  req.body = nullptr;
  return FinishExchange(conn, server, writer, body);
}

}  // namespace kiln::net::internal
