// HttpServer's request body (RequestBody, http_server_internal.h): Content-Length bodies are
// read straight from the socket into the handler's buffer (one copy less for large uploads);
// chunked bodies go through Beast's buffer_body parser fed by FdReadStream. `Expect:
// 100-continue` is answered on the first Read.

#include <cstring>

#include <boost/beast/http/read.hpp>

#include "net/http_server_internal.h"

namespace kiln::net::internal {

Result<size_t> RequestBody::Read(char* buf, size_t n) {
  if (!error_.ok()) {
    return error_;
  }
  if (done_ || n == 0) {
    return size_t{0};
  }
  if (expect_continue_ && !continue_sent_) {
    continue_sent_ = true;
    // An interim response after the final one started would corrupt the stream; the client
    // then sends the body after its own expect timeout.
    if (writer_ == nullptr || !writer_->started()) {
      iovec iov{const_cast<char*>(kContinue.data()), kContinue.size()};
      Status s = internal::SendAll(conn_->fd, &iov, 1, limits_->io_timeout_ms);
      if (!s.ok()) {
        return Fail(s);
      }
    }
  }
  if (mode_ == Mode::kLength) {
    return ReadLength(buf, n);
  }
  return ReadChunked(buf, n);
}

std::optional<uint64_t> RequestBody::size_hint() const {
  switch (mode_) {
    case Mode::kNone: return 0;
    case Mode::kLength: return total_ + remaining_;
    case Mode::kChunked: return std::nullopt;
  }
  return std::nullopt;
}

Status RequestBody::Drain(uint64_t max) {
  if (done_) {
    return Status::Ok();
  }
  if (!error_.ok()) {
    return error_;
  }
  if (continue_pending()) {
    return Status::FailedPrecondition("client awaits 100 Continue");
  }
  if (mode_ == Mode::kLength && remaining_ > max) {
    return Status::ResourceExhausted("unread body too large to drain");
  }
  char scratch[16 * 1024];
  uint64_t drained = 0;
  while (!done_) {
    Result<size_t> r = Read(scratch, sizeof(scratch));
    if (!r.ok()) {
      return r.status();
    }
    if (*r == 0) {
      break;
    }
    drained += *r;
    if (drained > max) {
      return Status::ResourceExhausted("unread body too large to drain");
    }
  }
  return Status::Ok();
}

Result<size_t> RequestBody::ReadLength(char* buf, size_t n) {
  size_t want = static_cast<size_t>(std::min<uint64_t>(n, remaining_));
  size_t got = 0;
  if (conn_->buffer.size() > 0) {
    got = std::min(want, conn_->buffer.size());
    std::memcpy(buf, conn_->buffer.data().data(), got);
    conn_->buffer.consume(got);
  } else {
    Result<size_t> r = internal::RecvSome(conn_->fd, buf, want, limits_->io_timeout_ms);
    if (!r.ok()) {
      return Fail(r.status().code() == StatusCode::kDeadlineExceeded
                      ? r.status()
                      : Status::Unavailable("request body: " + r.status().message()));
    }
    if (*r == 0) {
      return Fail(Status::Unavailable("client closed the connection with " + std::to_string(remaining_) +
                                      " body bytes unsent"));
    }
    got = *r;
  }
  remaining_ -= got;
  total_ += got;
  done_ = remaining_ == 0;
  return got;
}

Result<size_t> RequestBody::ReadChunked(char* buf, size_t n) {
  FdReadStream stream(conn_, limits_);
  auto& body = parser_->get().body();
  for (;;) {
    if (parser_->is_done()) {
      done_ = true;
      return size_t{0};
    }
    body.data = buf;
    body.size = n;
    error_code ec;
    http::read_some(stream, conn_->buffer, *parser_, ec);
    size_t got = n - body.size;
    body.data = nullptr;
    body.size = 0;
    if (ec == http::error::need_buffer) {
      ec = {};
    }
    if (ec) {
      if (ec == http::error::body_limit) {
        return Fail(Status::ResourceExhausted("request body exceeds the server limit"));
      }
      if (ec == boost::asio::error::timed_out) {
        return Fail(Status::DeadlineExceeded("timed out reading the request body"));
      }
      if (IsPeerGone(ec) || ec == boost::asio::error::operation_aborted) {
        return Fail(Status::Unavailable("client closed the connection mid-body"));
      }
      return Fail(Status::InvalidArgument("malformed chunked body: " + ec.message()));
    }
    if (got > 0) {
      total_ += got;
      done_ = parser_->is_done();
      return got;
    }
  }
}

}  // namespace kiln::net::internal
