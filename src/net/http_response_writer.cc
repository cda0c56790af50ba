// HttpServer's response writer (ResponseWriterImpl, http_server_internal.h): the header is
// formatted into the connection's reused buffer and sent together with the first body write (one
// sendmsg). Unknown length → chunked (HTTP/1.1) or close-delimited (HTTP/1.0). Also the minimal
// responses the server sends itself (WriteErrorResponse).

#include <fcntl.h>
#include <unistd.h>

#include <charconv>

#include <boost/beast/http/status.hpp>

#include "base/strings.h"
#include "base/time.h"
#include "net/http_server_internal.h"

namespace kiln::net {

Status ResponseWriter::Send(int status, const HeaderMap& headers, std::string_view body) {
  RETURN_IF_ERROR(Start(status, headers, body.size()));
  if (!body.empty()) {
    RETURN_IF_ERROR(Write(body));
  }
  return Finish();
}

Result<UpgradedConnection> ResponseWriter::Upgrade(const HeaderMap& /*headers*/) {
  return Status::Unimplemented("this response writer cannot upgrade the connection");
}

namespace internal {
namespace {

// "Wed, 01 May 2024 10:00:00 GMT", formatted at most once per second per thread.
const std::string& CachedDate() {
  thread_local int64_t cached_second = -1;
  thread_local std::string cached;
  int64_t now = NowMillis();
  if (now / 1000 != cached_second) {
    cached_second = now / 1000;
    cached = FormatRfc1123(now);
  }
  return cached;
}

std::string_view ReasonPhrase(int status) {
  auto reason = http::obsolete_reason(static_cast<http::status>(status));
  std::string_view r(reason.data(), reason.size());
  if (r.empty() || r.front() == '<') {
    return "Unknown";
  }
  return r;
}

void AppendNumber(std::string& out, uint64_t v, int base = 10) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, base);
  out.append(buf, end);
}

// Header names and values from handlers must not carry CR/LF (response splitting).
bool SafeHeaderText(std::string_view s) { return s.find_first_of("\r\n") == std::string_view::npos; }

}  // namespace

void AppendResponseHead(std::string& h, int status, const HeaderMap& headers, std::optional<uint64_t> content_length,
                        bool close, bool http10) {
  h.append("HTTP/1.1 ");
  AppendNumber(h, static_cast<uint64_t>(status));
  h.push_back(' ');
  h.append(ReasonPhrase(status));
  h.append("\r\n");
  bool has_date = false;
  bool has_server = false;
  for (const auto& [name, value] : headers) {
    if (EqualsIgnoreCase(name, "Content-Length") || EqualsIgnoreCase(name, "Transfer-Encoding") ||
        EqualsIgnoreCase(name, "Connection")) {
      continue;  // framing is the server's
    }
    if (name.empty() || !SafeHeaderText(name) || !SafeHeaderText(value)) {
      continue;
    }
    has_date = has_date || EqualsIgnoreCase(name, "Date");
    has_server = has_server || EqualsIgnoreCase(name, "Server");
    h.append(name);
    h.append(": ");
    h.append(value);
    h.append("\r\n");
  }
  if (!has_date) {
    h.append("Date: ");
    h.append(CachedDate());
    h.append("\r\n");
  }
  if (!has_server) {
    h.append("Server: kiln\r\n");
  }
  // HEAD and 304 carry the length the GET would have; 204 carries none.
  if (content_length && status != 204) {
    h.append("Content-Length: ");
    AppendNumber(h, *content_length);
    h.append("\r\n");
  }
  if (close) {
    h.append("Connection: close\r\n");
  } else if (http10) {
    h.append("Connection: keep-alive\r\n");
  }
  h.append("\r\n");
}

Status ResponseWriterImpl::Start(int status, const HeaderMap& headers, std::optional<uint64_t> content_length) {
  if (conn_->upgraded) {
    return Status::FailedPrecondition("the connection was upgraded");
  }
  if (started_) {
    return Status::FailedPrecondition("response already started");
  }
  if (status < 200 || status > 999) {
    return Status::InvalidArgument("bad response status " + std::to_string(status));
  }
  started_ = true;
  const bool body_allowed = status != 204 && status != 304 && !info_.head;

  bool keep_alive =
      info_.keep_alive && !close_requested_ && !stopping_->load() && !body_->continue_pending() && !body_->failed();
  if (keep_alive && !body_->done()) {
    std::optional<uint64_t> rest = body_->known_remaining();
    keep_alive = !rest || *rest <= options_->max_drain_bytes;
  }

  if (!body_allowed) {
    mode_ = Mode::kNoBody;
  } else if (content_length) {
    mode_ = Mode::kLength;
  } else if (!info_.http10) {
    mode_ = Mode::kChunked;
  } else {
    mode_ = Mode::kCloseDelimited;
    keep_alive = false;
  }
  declared_ = content_length.value_or(0);
  close_after_ = !keep_alive;

  std::string& h = conn_->head;
  h.clear();
  if (body_->empty_body_awaits_continue()) {
    // botocore sends `Expect: 100-continue` even with Content-Length: 0. When it gets the final
    // response instead of 100, it keeps that status line cached on the connection
    // (AWSConnection.response_class) and misreads the next response on it, stalling until the
    // idle timeout. Answering 100 first, as S3 does, keeps its connection state clean.
    h.append(kContinue);
  }
  AppendResponseHead(h, status, headers, mode_ == Mode::kChunked ? std::nullopt : content_length, close_after_,
                     info_.http10);
  if (mode_ == Mode::kChunked) {
    // AppendResponseHead ended the head; chunked framing goes before its blank line.
    h.resize(h.size() - 2);
    h.append("Transfer-Encoding: chunked\r\n\r\n");
  }
  head_pending_ = true;
  return Status::Ok();
}

Status ResponseWriterImpl::Write(std::string_view data) {
  if (conn_->upgraded) {
    return Status::FailedPrecondition("the connection was upgraded");
  }
  if (!started_) {
    return Status::FailedPrecondition("Write before Start");
  }
  if (finished_) {
    return Status::FailedPrecondition("Write after Finish");
  }
  if (!error_.ok()) {
    return error_;
  }
  if (data.empty() || mode_ == Mode::kNoBody) {
    return Status::Ok();  // HEAD / 204 / 304: the body is never sent
  }
  if (mode_ == Mode::kLength && data.size() > declared_ - written_) {
    close_after_ = true;
    return Status::InvalidArgument("write past the declared Content-Length");
  }
  iovec iov[4];
  int count = 0;
  if (head_pending_) {
    iov[count++] = {conn_->head.data(), conn_->head.size()};
  }
  char prefix[24];
  if (mode_ == Mode::kChunked) {
    auto [end, ec] = std::to_chars(prefix, prefix + 20, data.size(), 16);
    *end++ = '\r';
    *end++ = '\n';
    iov[count++] = {prefix, static_cast<size_t>(end - prefix)};
  }
  iov[count++] = {const_cast<char*>(data.data()), data.size()};
  if (mode_ == Mode::kChunked) {
    iov[count++] = {const_cast<char*>("\r\n"), 2};
  }
  RETURN_IF_ERROR(SendIov(iov, count));
  head_pending_ = false;
  written_ += data.size();
  return Status::Ok();
}

Status ResponseWriterImpl::Finish() {
  if (conn_->upgraded) {
    return Status::FailedPrecondition("the connection was upgraded");
  }
  if (!started_) {
    return Status::FailedPrecondition("Finish before Start");
  }
  if (finished_) {
    return Status::Ok();
  }
  if (!error_.ok()) {
    return error_;
  }
  finished_ = true;
  if (mode_ == Mode::kLength && written_ < declared_) {
    // The client would wait for bytes that never come; closing tells it the body is short.
    close_after_ = true;
  }
  iovec iov[2];
  int count = 0;
  if (head_pending_) {
    iov[count++] = {conn_->head.data(), conn_->head.size()};
  }
  if (mode_ == Mode::kChunked) {
    iov[count++] = {const_cast<char*>("0\r\n\r\n"), 5};
  }
  if (count > 0) {
    RETURN_IF_ERROR(SendIov(iov, count));
  }
  head_pending_ = false;
  return Status::Ok();
}

Result<UpgradedConnection> ResponseWriterImpl::Upgrade(const HeaderMap& headers) {
  if (release_slot_ == nullptr) {
    return ResponseWriter::Upgrade(headers);
  }
  if (conn_->upgraded) {
    return Status::FailedPrecondition("the connection was already upgraded");
  }
  if (started_) {
    return Status::FailedPrecondition("cannot upgrade: a response was already started");
  }
  if (info_.http10 || info_.head) {
    return Status::FailedPrecondition("cannot upgrade an HTTP/1.0 or HEAD request");
  }
  if (body_->size_hint() != std::optional<uint64_t>(0)) {
    // The body's bytes would sit between the head and the new protocol's.
    return Status::FailedPrecondition("cannot upgrade a request that has a body");
  }
  if (FindHeader(headers, "Upgrade") == nullptr) {
    return Status::InvalidArgument("a 101 response must name its protocol in an Upgrade header");
  }
  for (const auto& [name, value] : headers) {
    if (!SafeHeaderText(name) || !SafeHeaderText(value)) {
      return Status::InvalidArgument("CR or LF in response header " + name);
    }
  }
  // Forgotten first (under the registry's lock, which Stop() takes to begin), so that neither
  // Stop() nor an eviction can shut this socket down once the 101 has gone out.
  if (!(*release_slot_)(conn_->slot)) {
    return Status::Unavailable("the server is stopping");
  }
  conn_->slot = nullptr;
  conn_->upgraded = true;
  conn_->unread_input = false;

  HeaderMap out;
  for (const auto& [name, value] : headers) {
    if (!EqualsIgnoreCase(name, "Content-Length") && !EqualsIgnoreCase(name, "Transfer-Encoding") &&
        !EqualsIgnoreCase(name, "Connection") && !name.empty()) {
      out.emplace(name, value);
    }
  }
  std::string& h = conn_->head;
  h.clear();
  AppendResponseHead(h, 101, out, std::nullopt, /*close=*/false, /*http10=*/false);
  // AppendResponseHead leaves Connection to the server; a 101 must list "Upgrade" in it.
  const std::string* connection = FindHeader(headers, "Connection");
  h.resize(h.size() - 2);
  h.append("Connection: ");
  h.append(connection != nullptr ? *connection : std::string("Upgrade"));
  h.append("\r\n\r\n");
  iovec iov{h.data(), h.size()};
  RETURN_IF_ERROR(SendIov(&iov, 1));

  // A dup, because the descriptor itself belongs to the connection's loop (registered with its
  // reactor), which closes it once the handler has returned; the socket lives on through the
  // dup. O_NONBLOCK is per open file, so clearing it here clears it for the loop's descriptor
  // too, which does no more I/O on it.
  UpgradedConnection up;
  up.fd.Reset(::fcntl(conn_->fd, F_DUPFD_CLOEXEC, 0));
  if (!up.fd.valid()) {
    return ErrnoStatus("dup of the upgraded connection", errno);
  }
  const int flags = ::fcntl(up.fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(up.fd.get(), F_SETFL, flags & ~O_NONBLOCK) < 0) {
    return ErrnoStatus("blocking mode for the upgraded connection", errno);
  }
  const size_t buffered = conn_->buffer.size();
  if (buffered > 0) {
    up.buffered.assign(static_cast<const char*>(conn_->buffer.data().data()), buffered);
    conn_->buffer.consume(buffered);
  }
  started_ = finished_ = true;
  return up;
}

bool ResponseWriterImpl::Complete() {
  if (finished_) {
    return error_.ok();
  }
  if (!error_.ok()) {
    return false;
  }
  if (mode_ == Mode::kNoBody || (mode_ == Mode::kLength && written_ == declared_)) {
    return Finish().ok();
  }
  // Chunked without the last chunk, or a short known-length body: the handler gave up. Flush
  // the header if nothing was written, then close so the client sees a truncated response.
  if (head_pending_) {
    iovec iov{conn_->head.data(), conn_->head.size()};
    (void)SendIov(&iov, 1);
  }
  close_after_ = true;
  return false;
}

Status ResponseWriterImpl::SendIov(iovec* iov, int count) {
  Status s = internal::SendAll(conn_->fd, iov, count, limits_->io_timeout_ms);
  if (!s.ok()) {
    error_ = s;
    close_after_ = true;
  }
  return s;
}

// Minimal response for errors the server answers itself (before or instead of the handler).
void WriteErrorResponse(int fd, int status, int timeout_ms) {
  std::string out;
  out.reserve(160);
  out.append("HTTP/1.1 ");
  AppendNumber(out, static_cast<uint64_t>(status));
  out.push_back(' ');
  out.append(ReasonPhrase(status));
  out.append("\r\nDate: ");
  out.append(CachedDate());
  out.append("\r\nServer: kiln\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  iovec iov{out.data(), out.size()};
  (void)internal::SendAll(fd, &iov, 1, timeout_ms);
}

}  // namespace internal
}  // namespace kiln::net
