// HttpClient's response reading (ReadResponse, http_client_internal.h): Beast's HTTP/1.1 response
// parser (http::response_parser, the parser the server's request side uses) over
// ClientReadStream, a synchronous read stream whose every wait counts against the call's one
// deadline and watches its CancelSignal. What stays the client's own: finding where a head ends
// (so the bound covers the whole head: Beast 1.74's header_limit counts per parse pass; and so a
// head with bare-LF line ends can be handed over with CRLF), 1xx interim responses skipped (101
// is an error), header fields taken before the body (trailers dropped), the keep-alive decision,
// TCP_QUICKACK before each wait for the rest of a response, and the mapping of Beast's errors to
// the Status codes HttpClient::Send documents, with messages that name the peer.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/system/system_error.hpp>

#include "net/http_client_internal.h"
#include "net/http_client_testing.h"

namespace kiln::net::internal {
namespace {

namespace http = boost::beast::http;
using boost::system::error_code;
using Parser = http::response_parser<http::string_body>;

// Beast's SyncReadStream over the client's connected non-blocking socket: recv, and when nothing
// is there, poll until the call's deadline or its CancelSignal. EOF is asio's eof; a reset is
// connection_reset (the peer is gone either way; ResponseReader words the error). A timeout,
// a cancel or a failed poll/recv end the read with operation_aborted and leave the Status to
// return in failure().
class ClientReadStream {
 public:
  ClientReadStream(int fd, const std::string& peer, TimePoint deadline, int response_ms, const CancelSignal* cancel)
      : fd_(fd), peer_(peer), deadline_(deadline), response_ms_(response_ms), cancel_(cancel) {}

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, error_code& ec) {
    ec = {};
    auto it = boost::asio::buffer_sequence_begin(buffers);
    auto end = boost::asio::buffer_sequence_end(buffers);
    for (; it != end; ++it) {
      boost::asio::mutable_buffer b = *it;
      if (b.size() != 0) {
        return Recv(static_cast<char*>(b.data()), b.size(), ec);
      }
    }
    return 0;
  }

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) {
      throw boost::system::system_error(ec);
    }
    return n;
  }

  bool got_any_byte() const { return got_any_byte_; }
  bool reset() const { return reset_; }
  // Set when a read ended with operation_aborted: why (DeadlineExceeded or Aborted).
  const std::optional<Status>& failure() const { return failure_; }

 private:
  size_t Recv(char* p, size_t n, error_code& ec) {
    for (;;) {
      // Right after sending, the answer cannot be there yet: wait first, saving a recv that
      // would only say EAGAIN.
      ssize_t r = -1;
      errno = EAGAIN;
      if (!wait_first_) {
        r = ::recv(fd_, p, n, 0);
      }
      wait_first_ = false;
      if (r > 0) {
        got_any_byte_ = true;
        return static_cast<size_t>(r);
      }
      if (r == 0) {
        ec = boost::asio::error::eof;
        return 0;
      }
      if (errno == EINTR) {
        continue;
      }
      if (errno == ECONNRESET || errno == EPIPE) {
        reset_ = true;
        ec = boost::asio::error::connection_reset;
        return 0;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Fail(Status::Aborted("reading the response from " + peer_ + " failed: " + std::strerror(errno)), ec);
      }
      if (got_any_byte_) {
        // Part of the response is here and we are about to wait for the rest: acknowledge what
        // came at once. A peer that wrote its response in two small segments with Nagle's
        // algorithm on (Python's http.server, Flask's development server) holds the second one
        // back until this ACK, which Linux would otherwise delay by up to 40 ms in its
        // request/response ("pingpong") mode. Linux leaves quick-ACK mode again by itself, so it
        // is re-armed before every such wait; a response that arrives whole never gets here.
        int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
      }
      int wait = RemainingMs(deadline_);
      int pr = wait == 0 ? 0 : PollOrCancel(fd_, POLLIN, wait, cancel_);
      if (pr == kPollCancelled) {
        return Fail(CancelledError(peer_, *cancel_), ec);
      }
      if (pr < 0 && errno != EINTR) {
        return Fail(Status::Aborted(std::string("poll: ") + std::strerror(errno)), ec);
      }
      if (pr == 0) {
        return Fail(Status::DeadlineExceeded((got_any_byte_ ? "the response from " + peer_ + " was not complete within "
                                                            : peer_ + " did not answer within ") +
                                             std::to_string(response_ms_) + " ms"),
                    ec);
      }
    }
  }

  size_t Fail(Status status, error_code& ec) {
    failure_ = std::move(status);
    ec = boost::asio::error::operation_aborted;
    return 0;
  }

  const int fd_;
  const std::string& peer_;
  const TimePoint deadline_;
  const int response_ms_;
  const CancelSignal* const cancel_;
  bool wait_first_ = true;
  bool got_any_byte_ = false;
  bool reset_ = false;
  std::optional<Status> failure_;
};

// Up to 80 bytes of `text`'s first line, with control and non-ASCII bytes shown as '?'.
std::string Shown(std::string_view text) {
  std::string shown(text.substr(0, std::min(text.find_first_of("\r\n"), size_t{80})));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      c = '?';
    }
  }
  return shown;
}

// The first line of the head at the front of `unparsed` (up to its empty line) holding a bare CR
// or a NUL, if any. RFC 9110 §5.5: both are invalid in a field; naming them tells the container's
// author what to fix (Beast reports them as "bad line ending" / "bad value").
std::optional<std::string_view> LineWithBareCrOrNul(std::string_view unparsed) {
  size_t end = unparsed.find("\r\n\r\n");
  std::string_view head = unparsed.substr(0, end == std::string_view::npos ? unparsed.size() : end + 2);
  size_t start = 0;
  for (size_t i = 0; i < head.size(); ++i) {
    const char c = head[i];
    if (c == '\n') {
      start = i + 1;
    } else if (c == '\0' || (c == '\r' && (i + 1 >= head.size() || head[i + 1] != '\n'))) {
      size_t stop = head.find("\r\n", i + 1);
      return head.substr(start, stop == std::string_view::npos ? std::string_view::npos : stop - start);
    }
  }
  return std::nullopt;
}

// Reads and parses one response from `fd` into `out`.
class ResponseReader {
 public:
  ResponseReader(int fd, const std::string& peer, const HttpClientOptions& options, TimePoint deadline, int response_ms,
                 bool head_request, const CancelSignal* cancel, ThreadScratch& s)
      : peer_(peer),
        options_(options),
        head_request_(head_request),
        stream_(fd, peer, deadline, response_ms, cancel),
        buffer_(s.buffer) {
    buffer_.clear();
    // Bytes held unparsed at once: a head in progress (also bounded by the header budget), a
    // chunk-size line or the trailer. Body bytes pass through and are consumed every read.
    buffer_.max_size(std::max<size_t>(options_.max_response_header_bytes, 1));
  }

  Exchange Read(ClientResponse* out) {
    Exchange ex;
    for (;;) {
      Parser& parser = parser_.emplace();
      if (head_request_) {
        parser.skip(true);  // the answer to HEAD has no body whatever its header says
      }
      // Before the header: Beast checks a Content-Length against it as the header completes.
      parser.body_limit(options_.max_response_body_bytes);
      Status st = ReadHeader(parser);
      if (!st.ok()) {
        ex.status = std::move(st);
        ex.retryable = eof_before_any_byte_;
        return ex;
      }
      const auto& msg = parser.get();
      const int status = static_cast<int>(msg.result_int());
      if (status >= 100 && status < 200) {
        if (status == 101) {
          ex.status = Status::DataLoss(peer_ + " switched protocols (101) unasked");
          return ex;
        }
        continue;  // an interim response (100 Continue, 103 Early Hints): the real one follows
      }
      if (status < 100) {
        ex.status = Malformed("status code", std::to_string(status));
        return ex;
      }
      if (msg.version() != 10 && msg.version() != 11) {
        ex.status = Malformed("status line",
                              "HTTP/" + std::to_string(msg.version() / 10) + "." + std::to_string(msg.version() % 10));
        return ex;
      }
      if (msg.find(http::field::transfer_encoding) != msg.end() && msg.find(http::field::content_length) != msg.end()) {
        // Beast rejects the pair in one order (Content-Length first) and frames by
        // Content-Length in the other when the coding is not chunked, where RFC 9112 §6.3 says
        // Transfer-Encoding wins: a smuggling-shaped response either way.
        ex.status = Malformed("both Transfer-Encoding and Content-Length");
        return ex;
      }
      // The header fields now, before the body: trailer fields (Beast adds them to the same
      // field list) are dropped, as they always were.
      out->status = status;
      out->headers.clear();
      for (const auto& field : msg) {
        out->headers.emplace(std::string(field.name_string()), std::string(field.value()));
      }
      const bool keep = parser.keep_alive();  // false for a close-delimited body
      st = ReadBody(parser);
      if (!st.ok()) {
        ex.status = std::move(st);
        return ex;
      }
      out->body = std::move(parser.get().body());
      // Bytes beyond the response (we never pipeline) mean a confused peer: do not reuse.
      ex.keep_alive = keep && buffer_.size() == 0;
      return ex;
    }
  }

 private:
  enum class Part { kHeader, kBody };

  // Reads the status line and header fields of one response and hands them to the parser.
  // The client finds where the head ends itself, and only then gives Beast the whole head at
  // once, for two reasons: the bound applies to the head as a whole (Beast 1.74's header_limit
  // counts per parse pass, not per header; see ReadHeaderWithin in http_exchange.cc), and a head
  // whose lines end in a bare LF is accepted (RFC 9112 §2.2 allows it and most clients do; Beast
  // wants CRLF), by handing Beast a copy with CRLF line ends.
  Status ReadHeader(Parser& parser) {
    const size_t limit = options_.max_response_header_bytes;
    size_t scanned = 0;  // bytes of the buffer already searched for the end of the head
    for (;;) {
      std::string_view data = Buffered();
      size_t end = FindEndOfHead(data, &scanned);
      if (end != std::string_view::npos) {
        if (end > limit) {
          return HeaderTooLarge();
        }
        RETURN_IF_ERROR(ParseHead(parser, data.substr(0, end)));
        buffer_.consume(end);
        return Status::Ok();
      }
      if (data.size() >= limit) {
        return HeaderTooLarge();
      }
      // A peer that is not speaking HTTP (an SSH banner, a TLS alert) fails at once, not at the
      // deadline or the close.
      constexpr std::string_view kHttp = "HTTP/";
      if (data.substr(0, kHttp.size()) != kHttp.substr(0, std::min(kHttp.size(), data.size()))) {
        return Malformed("status line", data);
      }
      error_code ec;
      size_t got = stream_.read_some(buffer_.prepare(std::min<size_t>(limit - data.size(), 64 * 1024)), ec);
      buffer_.commit(got);
      if (ec == boost::asio::error::eof && !data.empty() && !stream_.failure()) {
        // Cut short: Beast's word on what came, when it is malformed already, says more than
        // that the peer left.
        error_code parse_ec;
        parser.header_limit(std::numeric_limits<uint32_t>::max());
        size_t used = parser.put(boost::asio::const_buffer(data.data(), data.size()), parse_ec);
        if (parse_ec && parse_ec != http::error::need_more) {
          return Error(parse_ec, Part::kHeader, data.substr(std::min(used, data.size())));
        }
      }
      if (ec) {
        return Error(ec, Part::kHeader, {});
      }
    }
  }

  // The bytes read and not yet consumed.
  std::string_view Buffered() const {
    return std::string_view(static_cast<const char*>(buffer_.data().data()), buffer_.size());
  }

  // The length of the head at the front of `data` (through its empty line, which may end in
  // CRLF or a bare LF), or npos when it is not all there yet. *scanned: where the search
  // resumes next time (data only grows at its end between calls).
  static size_t FindEndOfHead(std::string_view data, size_t* scanned) {
    size_t i = *scanned;
    for (;;) {
      i = data.find('\n', i);
      if (i == std::string_view::npos) {
        *scanned = data.size();
        return std::string_view::npos;
      }
      // An LF: is the next line empty?
      if (i + 1 < data.size() && data[i + 1] == '\n') {
        return i + 2;
      }
      if (i + 2 < data.size() && data[i + 1] == '\r' && data[i + 2] == '\n') {
        return i + 3;
      }
      if (i + 2 >= data.size()) {
        *scanned = i;  // undecided: look at this LF again once more bytes are in
        return std::string_view::npos;
      }
      ++i;
    }
  }

  // Parses the complete head `head` (see ReadHeader). Two leniencies of the client's own parser
  // before Beast are kept, by rewriting a copy of the head: lines ending in a bare LF (RFC 9112
  // §2.2: a recipient MAY accept them), and a status line without the SP before an empty reason
  // phrase ("HTTP/1.1 200", which some small servers send; Beast insists on the SP).
  Status ParseHead(Parser& parser, std::string_view head) {
    std::string_view text = head;
    bool bare_lf = false;
    for (size_t i = head.find('\n'); i != std::string_view::npos; i = head.find('\n', i + 1)) {
      if (i == 0 || head[i - 1] != '\r') {
        bare_lf = true;
        break;
      }
    }
    const size_t status_line = std::min(head.find_first_of("\r\n"), head.size());
    const bool no_reason_sp = status_line == 12;
    if (bare_lf || no_reason_sp) {
      std::string& fixed = crlf_head_;
      fixed.clear();
      for (size_t i = 0; i < head.size(); ++i) {
        if (i == status_line && no_reason_sp) {
          fixed.push_back(' ');
        }
        if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) {
          fixed.push_back('\r');
        }
        fixed.push_back(head[i]);
      }
      text = fixed;
    }
    parser.header_limit(std::numeric_limits<uint32_t>::max());  // bounded by ReadHeader
    error_code ec;
    size_t used = parser.put(boost::asio::const_buffer(text.data(), text.size()), ec);
    if (ec) {
      // Beast stops at the start of the line at fault (the status line or a field).
      return Error(ec, Part::kHeader, text.substr(std::min(used, text.size())));
    }
    if (!parser.is_header_done() || used != text.size()) {
      return Malformed("header", text);  // not expected: Beast had the whole head
    }
    return Status::Ok();
  }

  Status ReadBody(Parser& parser) {
    while (!parser.is_done()) {
      error_code ec;
      http::read_some(stream_, buffer_, parser, ec);
      if (ec) {
        return Error(ec, Part::kBody, Buffered());
      }
    }
    return Status::Ok();
  }

  // The Status for an error of a read or parse in `part`; `unparsed`: the input at fault.
  Status Error(const error_code& ec, Part part, std::string_view unparsed) {
    if (stream_.failure()) {
      return *stream_.failure();  // deadline, cancel, a failed poll/recv
    }
    const std::string_view during = part == Part::kHeader ? "header" : "body";
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == boost::asio::error::connection_reset || ec == boost::asio::error::eof) {
      return PeerGone(during);
    }
    if (ec == http::error::body_limit) {
      return Status::ResourceExhausted("the response body from " + peer_ + " exceeds " +
                                       std::to_string(options_.max_response_body_bytes) + " bytes");
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      if (part == Part::kHeader) {
        return HeaderTooLarge();
      }
      return Status::ResourceExhausted("a chunk-size line or the trailer of the response from " + peer_ + " exceeds " +
                                       std::to_string(options_.max_response_header_bytes) + " bytes");
    }
    if (part == Part::kHeader) {
      if (std::optional<std::string_view> line = LineWithBareCrOrNul(unparsed)) {
        return Malformed("header line (bare CR or NUL)", *line);
      }
    }
    return Malformed(ec.message(), unparsed);
  }

  // The error for a peer that went away mid-exchange.
  Status PeerGone(std::string_view during) {
    const char* what = stream_.reset() ? " reset the connection" : " closed the connection";
    if (!stream_.got_any_byte()) {
      eof_before_any_byte_ = true;
      return Status::Aborted(peer_ + what + " before answering");
    }
    return Status::Aborted(peer_ + what + " in the middle of the response " + std::string(during));
  }

  Status HeaderTooLarge() {
    return Status::ResourceExhausted("the response header from " + peer_ + " exceeds " +
                                     std::to_string(options_.max_response_header_bytes) + " bytes");
  }

  // DataLoss naming what is wrong and, when given, the line at fault (sanitized).
  Status Malformed(std::string_view what, std::string_view text = {}) {
    std::string detail(what);
    if (!text.empty()) {
      detail += ": \"" + Shown(text) + "\"";
    }
    return Status::DataLoss(peer_ + " sent a malformed HTTP response (" + detail + ")");
  }

  const std::string& peer_;  // "host:port", for messages
  const HttpClientOptions& options_;
  const bool head_request_;
  ClientReadStream stream_;
  boost::beast::flat_buffer& buffer_;
  std::optional<Parser> parser_;
  std::string crlf_head_;  // a head with bare LF line ends, rewritten with CRLF
  bool eof_before_any_byte_ = false;
};

}  // namespace

Exchange ReadResponse(int fd, const std::string& peer, const HttpClientOptions& options, TimePoint deadline,
                      int response_ms, bool head_request, const CancelSignal* cancel, ThreadScratch& scratch,
                      ClientResponse* out) {
  ResponseReader reader(fd, peer, options, deadline, response_ms, head_request, cancel, scratch);
  return reader.Read(out);
}

}  // namespace kiln::net::internal

namespace kiln::net {

ParsedResponseForTest ReadResponseForTest(int fd, bool head_request, const HttpClientOptions& options,
                                          int response_ms) {
  using internal::SteadyClock;
  using internal::TimePoint;
  const TimePoint deadline =
      response_ms > 0 ? SteadyClock::now() + std::chrono::milliseconds(response_ms) : TimePoint::max();
  ParsedResponseForTest out;
  internal::Exchange ex = internal::ReadResponse(fd, "test:0", options, deadline, response_ms, head_request,
                                                 /*cancel=*/nullptr, internal::Scratch(), &out.response);
  out.status = std::move(ex.status);
  out.keep_alive = ex.keep_alive;
  return out;
}

}  // namespace kiln::net
