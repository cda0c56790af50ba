// HttpClient's response parser (ReadResponse, http_client_internal.h). Hand-written: status
// line, headers, Content-Length / chunked / close-delimited bodies, 1xx interim responses
// skipped. It reads through a per-thread buffer and reads known-length body bytes (Content-Length
// bodies and chunk payloads) straight into the response string, so large bodies are copied once.

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>

#include "base/strings.h"
#include "net/http_client_internal.h"
#include "net/http_client_testing.h"

namespace kiln::net::internal {
namespace {

// A chunk-size line or a trailer line longer than this is malformed.
constexpr size_t kMaxChunkLine = 4096;
// Close-delimited bodies are read in steps of this size.
constexpr size_t kCloseDelimitedStep = 64 * 1024;
// Initial per-thread read buffer.
constexpr size_t kInitialReadBuffer = 16 * 1024;

// RFC 9110 token characters (header names).
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
    return true;
  }
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// True when the comma-separated header value `value` holds `token` (case-insensitive).
bool HasToken(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    size_t comma = value.find(',');
    if (EqualsIgnoreCase(Trim(value.substr(0, comma)), token)) {
      return true;
    }
    if (comma == std::string_view::npos) {
      break;
    }
    value.remove_prefix(comma + 1);
  }
  return false;
}

// Reads and parses one response from `fd` into `out`.
class ResponseReader {
 public:
  ResponseReader(int fd, const std::string& peer, const HttpClientOptions& options, TimePoint deadline, int response_ms,
                 bool head_request, const CancelSignal* cancel, ThreadScratch& s)
      : fd_(fd),
        peer_(peer),
        options_(options),
        deadline_(deadline),
        response_ms_(response_ms),
        head_request_(head_request),
        cancel_(cancel),
        s_(s) {
    s_.pos = s_.end = 0;
    if (s_.cap == 0) {
      s_.cap = kInitialReadBuffer;
      s_.buf = std::make_unique<char[]>(s_.cap);
    }
  }

  // Fills `out`; sets *keep_alive when the connection may be reused.
  Exchange Read(ClientResponse* out) {
    Exchange ex;
    for (;;) {
      bool http10 = false;
      Status st = ReadHead(out, &http10);
      if (!st.ok()) {
        ex.status = std::move(st);
        ex.retryable = eof_before_any_byte_;
        return ex;
      }
      if (out->status >= 100 && out->status < 200) {
        if (out->status == 101) {
          ex.status = Status::DataLoss(peer_ + " switched protocols (101) unasked");
          return ex;
        }
        continue;  // an interim response (100 Continue, 103 Early Hints): the real one follows
      }
      bool keep = true;
      const std::string* connection = FindHeader(out->headers, "Connection");
      if (http10) {
        keep = connection != nullptr && HasToken(*connection, "keep-alive");
      } else if (connection != nullptr && HasToken(*connection, "close")) {
        keep = false;
      }
      st = ReadBody(out, &keep);
      if (!st.ok()) {
        ex.status = std::move(st);
        return ex;
      }
      // Bytes beyond the response (we never pipeline) mean a confused peer: do not reuse.
      ex.keep_alive = keep && s_.pos == s_.end;
      return ex;
    }
  }

 private:
  enum class Fill { kOk, kEof };

  // Reads more bytes into the buffer (growing or compacting it as needed).
  Result<Fill> More() {
    if (s_.pos == s_.end) {
      consumed_base_ += s_.pos;
      s_.pos = s_.end = 0;
    }
    if (s_.end == s_.cap) {
      if (s_.pos > 0) {
        std::memmove(s_.buf.get(), s_.buf.get() + s_.pos, s_.end - s_.pos);
        consumed_base_ += s_.pos;
        s_.end -= s_.pos;
        s_.pos = 0;
      } else {
        size_t cap = s_.cap * 2;
        auto bigger = std::make_unique<char[]>(cap);
        std::memcpy(bigger.get(), s_.buf.get(), s_.end);
        s_.buf = std::move(bigger);
        s_.cap = cap;
      }
    }
    ASSIGN_OR_RETURN(size_t n, Recv(s_.buf.get() + s_.end, s_.cap - s_.end));
    if (n == 0) {
      return Fill::kEof;
    }
    s_.end += n;
    return Fill::kOk;
  }

  // recv with the call's deadline. 0 = EOF (a reset counts as EOF: both mean the peer is gone;
  // the caller words the error).
  Result<size_t> Recv(char* p, size_t n) {
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
        return size_t{0};
      }
      if (errno == EINTR) {
        continue;
      }
      if (errno == ECONNRESET || errno == EPIPE) {
        reset_ = true;
        return size_t{0};
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Status::Aborted("reading the response from " + peer_ + " failed: " + std::strerror(errno));
      }
      int wait = RemainingMs(deadline_);
      int pr = wait == 0 ? 0 : PollOrCancel(fd_, POLLIN, wait, cancel_);
      if (pr == kPollCancelled) {
        return CancelledError(peer_, *cancel_);
      }
      if (pr < 0 && errno != EINTR) {
        return Status::Aborted(std::string("poll: ") + std::strerror(errno));
      }
      if (pr == 0) {
        return Status::DeadlineExceeded((got_any_byte_ ? "the response from " + peer_ + " was not complete within "
                                                       : peer_ + " did not answer within ") +
                                        std::to_string(response_ms_) + " ms");
      }
    }
  }

  // The error for a peer that went away mid-exchange.
  Status PeerGone(std::string_view during) {
    if (!got_any_byte_) {
      eof_before_any_byte_ = true;
      return Status::Aborted(peer_ + (reset_ ? " reset the connection" : " closed the connection") +
                             " before answering");
    }
    return Status::Aborted(peer_ + (reset_ ? " reset the connection" : " closed the connection") +
                           " in the middle of the response " + std::string(during));
  }

  enum class Part { kHeader, kBody, kTrailer };

  // The error for a line longer than allowed (built only when needed: no allocation per call).
  Status LineTooLong(Part part) {
    switch (part) {
      case Part::kHeader:
        return Status::ResourceExhausted("the response header from " + peer_ + " exceeds " +
                                         std::to_string(options_.max_response_header_bytes) + " bytes");
      case Part::kTrailer:
        return Status::ResourceExhausted("the response trailer from " + peer_ + " exceeds " +
                                         std::to_string(options_.max_response_header_bytes) + " bytes");
      case Part::kBody: break;
    }
    return Malformed("chunk size line", "(too long)");
  }

  static std::string_view PartName(Part part) {
    switch (part) {
      case Part::kHeader: return "header";
      case Part::kBody: return "body";
      case Part::kTrailer: return "trailer";
    }
    return "";
  }

  // Returns the next line (without CR LF) or fails. A line longer than `max` fails with
  // LineTooLong(part) (bare LF line ends are accepted, as most clients do).
  Result<std::string_view> ReadLine(size_t max, Part part) {
    size_t scanned = s_.pos;
    for (;;) {
      const char* base = s_.buf.get();
      const void* nl = std::memchr(base + scanned, '\n', s_.end - scanned);
      if (nl != nullptr) {
        size_t at = static_cast<const char*>(nl) - base;
        if (at - s_.pos + 1 > max) {
          return LineTooLong(part);
        }
        std::string_view line(base + s_.pos, at - s_.pos);
        s_.pos = at + 1;
        if (!line.empty() && line.back() == '\r') {
          line.remove_suffix(1);
        }
        return line;
      }
      if (s_.end - s_.pos >= max) {
        return LineTooLong(part);
      }
      size_t offset = s_.end - s_.pos;  // More() may move the unread bytes
      ASSIGN_OR_RETURN(Fill f, More());
      if (f == Fill::kEof) {
        return PeerGone(PartName(part));
      }
      scanned = s_.pos + offset;
    }
  }

  Status ReadHead(ClientResponse* out, bool* http10) {
    out->headers.clear();
    const size_t budget = options_.max_response_header_bytes;
    size_t start = consumed_before();
    ASSIGN_OR_RETURN(std::string_view line, ReadLine(budget, Part::kHeader));
    // HTTP/1.x SP 3DIGIT [SP reason]
    if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' ||
        (line.size() > 12 && line[12] != ' ')) {
      return Malformed("status line", line);
    }
    *http10 = line[7] == '0';
    int status = 0;
    for (int i = 9; i < 12; ++i) {
      if (line[i] < '0' || line[i] > '9') {
        return Malformed("status line", line);
      }
      status = status * 10 + (line[i] - '0');
    }
    if (status < 100) {
      return Malformed("status line", line);
    }
    out->status = status;
    for (;;) {
      size_t used = consumed_before() - start;
      if (used >= budget) {
        return LineTooLong(Part::kHeader);
      }
      ASSIGN_OR_RETURN(line, ReadLine(budget - used, Part::kHeader));
      if (line.empty()) {
        return Status::Ok();
      }
      if (line.front() == ' ' || line.front() == '\t') {
        return Malformed("header (obsolete line folding)", line);
      }
      // RFC 9110 §5.5: CR (here only a bare one: the line ends at LF) and NUL in a field are
      // invalid; a recipient rejects the message or blanks them. Rejecting keeps a bare CR out of
      // headers the router hands on (found by fuzz/http_response_fuzzer.cc).
      if (line.find_first_of(std::string_view("\r\0", 2)) != std::string_view::npos) {
        return Malformed("header line (bare CR or NUL)", line);
      }
      size_t colon = line.find(':');
      if (colon == std::string_view::npos || colon == 0) {
        return Malformed("header line", line);
      }
      std::string_view name = line.substr(0, colon);
      for (char c : name) {
        if (!IsTokenChar(c)) {
          return Malformed("header name", line);
        }
      }
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
        value.remove_prefix(1);
      }
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
        value.remove_suffix(1);
      }
      out->headers.emplace(std::string(name), std::string(value));
    }
  }

  // Bytes consumed from the stream so far (for the header budget).
  size_t consumed_before() const { return consumed_base_ + s_.pos; }

  Status Malformed(std::string_view what, std::string_view line) {
    std::string shown(line.substr(0, 80));
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
        c = '?';
      }
    }
    return Status::DataLoss(peer_ + " sent a malformed HTTP response (" + std::string(what) + ": \"" + shown + "\")");
  }

  Status TooLarge() {
    return Status::ResourceExhausted("the response body from " + peer_ + " exceeds " +
                                     std::to_string(options_.max_response_body_bytes) + " bytes");
  }

  // Appends exactly `n` bytes to `body`: first what is buffered, then straight from the socket.
  Status ReadExact(std::string& body, size_t n, std::string_view during) {
    size_t at = body.size();
    body.resize(at + n);
    size_t buffered = std::min(n, s_.end - s_.pos);
    std::memcpy(body.data() + at, s_.buf.get() + s_.pos, buffered);
    s_.pos += buffered;
    at += buffered;
    n -= buffered;
    while (n > 0) {
      ASSIGN_OR_RETURN(size_t got, Recv(body.data() + at, n));
      if (got == 0) {
        body.resize(at);
        return PeerGone(during);
      }
      at += got;
      n -= got;
    }
    return Status::Ok();
  }

  Status ReadBody(ClientResponse* out, bool* keep) {
    out->body.clear();
    const int status = out->status;
    if (status == 204 || status == 304 || head_request_) {
      return Status::Ok();
    }
    const std::string* te = FindHeader(out->headers, "Transfer-Encoding");
    if (te != nullptr) {
      // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length; a response whose last coding
      // is not chunked is delimited by the close.
      std::string_view codings = *te;
      size_t comma = codings.rfind(',');
      std::string_view last = Trim(comma == std::string_view::npos ? codings : codings.substr(comma + 1));
      if (FindHeader(out->headers, "Content-Length") != nullptr) {
        *keep = false;  // both: a smuggling-shaped response; do not trust the connection after it
      }
      if (EqualsIgnoreCase(last, "chunked")) {
        return ReadChunked(out);
      }
      *keep = false;
      return ReadUntilClose(out);
    }
    auto [lo, hi] = out->headers.equal_range("Content-Length");
    if (lo != hi) {
      std::optional<uint64_t> length;
      for (auto it = lo; it != hi; ++it) {
        for (std::string_view part : Split(it->second, ',')) {
          std::optional<uint64_t> v = ParseUint64(Trim(part));
          if (!v || (length && *length != *v)) {
            return Malformed("Content-Length", it->second);
          }
          length = v;
        }
      }
      if (*length > options_.max_response_body_bytes) {
        return TooLarge();
      }
      return ReadExact(out->body, static_cast<size_t>(*length), "body");
    }
    *keep = false;
    return ReadUntilClose(out);
  }

  Status ReadUntilClose(ClientResponse* out) {
    std::string& body = out->body;
    const size_t limit = options_.max_response_body_bytes;
    body.assign(s_.buf.get() + s_.pos, s_.end - s_.pos);
    s_.pos = s_.end = 0;
    if (body.size() > limit) {
      return TooLarge();
    }
    for (;;) {
      size_t at = body.size();
      // One byte past the limit is enough to know it is exceeded.
      size_t step = std::min(kCloseDelimitedStep, limit + 1 - at);
      body.resize(at + step);
      Result<size_t> got = Recv(body.data() + at, step);
      if (!got.ok()) {
        body.resize(at);
        return got.status();
      }
      body.resize(at + *got);
      if (*got == 0) {
        // The close is the end of the body. A reset instead of a FIN may have cut it short.
        if (reset_) {
          return PeerGone("body");
        }
        return Status::Ok();
      }
      if (body.size() > limit) {
        return TooLarge();
      }
    }
  }

  Status ReadChunked(ClientResponse* out) {
    for (;;) {
      ASSIGN_OR_RETURN(std::string_view line, ReadLine(kMaxChunkLine, Part::kBody));
      std::string_view size_text = line.substr(0, line.find(';'));  // chunk extensions ignored
      while (!size_text.empty() && (size_text.back() == ' ' || size_text.back() == '\t')) {
        size_text.remove_suffix(1);
      }
      if (size_text.empty() || size_text.size() > 15) {
        return Malformed("chunk size", line);
      }
      uint64_t size = 0;
      auto [p, ec] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size, 16);
      if (ec != std::errc() || p != size_text.data() + size_text.size()) {
        return Malformed("chunk size", line);
      }
      if (size == 0) {
        break;
      }
      if (size > options_.max_response_body_bytes - out->body.size()) {
        return TooLarge();
      }
      RETURN_IF_ERROR(ReadExact(out->body, static_cast<size_t>(size), "body"));
      ASSIGN_OR_RETURN(line, ReadLine(kMaxChunkLine, Part::kBody));
      if (!line.empty()) {
        return Malformed("chunk data longer than its size", line);
      }
    }
    // Trailer fields (dropped) up to the empty line, within the header budget.
    const size_t budget = options_.max_response_header_bytes;
    const size_t start = consumed_before();
    for (;;) {
      size_t used = consumed_before() - start;
      if (used >= budget) {
        return LineTooLong(Part::kTrailer);
      }
      ASSIGN_OR_RETURN(std::string_view line, ReadLine(budget - used, Part::kTrailer));
      if (line.empty()) {
        return Status::Ok();
      }
    }
  }

  const int fd_;
  const std::string& peer_;  // "host:port", for messages
  const HttpClientOptions& options_;
  const TimePoint deadline_;
  const int response_ms_;
  const bool head_request_;
  const CancelSignal* const cancel_;
  ThreadScratch& s_;
  size_t consumed_base_ = 0;
  bool wait_first_ = true;
  bool got_any_byte_ = false;
  bool reset_ = false;
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
