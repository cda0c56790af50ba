#include "runtime/docker/engine_client.h"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <sstream>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/http.hpp>

namespace kiln::runtime::docker {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using SteadyClock = std::chrono::steady_clock;

// The longest a wait lasts before Stream asks its `cancelled` predicate again (engine.h promises
// 200 ms to the log followers).
constexpr int kWaitSliceMs = 200;
// A non-2xx answer's body is the engine's error JSON; anything larger is cut here.
constexpr size_t kMaxErrorBody = 1u << 20;

// How one call waits: until a deadline (Call) or until `cancelled` says so (Stream).
struct WaitPolicy {
  std::optional<SteadyClock::time_point> deadline;
  int timeout_ms = 0;  // for the DeadlineExceeded message
  const std::function<bool()>* cancelled = nullptr;
};

// One connection, one request: the socket plus what messages need to say.
class Connection {
 public:
  Connection(const std::string& path, const std::string& address, std::string what)
      : path_(path), address_(address), what_(std::move(what)), socket_(io_) {}

  Status Open() {
    boost::system::error_code ec;
    socket_.open(asio::local::stream_protocol(), ec);
    if (!ec) {
      // A Unix connect completes or fails at once (it only waits when the listener's backlog is
      // full, and then for the engine to accept, which is what every call waits for anyway).
      socket_.connect(asio::local::stream_protocol::endpoint(path_), ec);
    }
    if (!ec) {
      socket_.non_blocking(true, ec);
    }
    if (ec) {
      return Unreachable(ec.message());
    }
    return Status::Ok();
  }

  Status Send(std::string_view bytes, const WaitPolicy& wait) {
    while (!bytes.empty()) {
      boost::system::error_code ec;
      // Asio sends with MSG_NOSIGNAL: an engine that closed the socket is an error, not SIGPIPE.
      size_t n = socket_.write_some(asio::buffer(bytes.data(), bytes.size()), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        RETURN_IF_ERROR(Wait(POLLOUT, wait));
        continue;
      }
      if (ec) {
        return Unreachable("sending " + what_ + ": " + ec.message());
      }
      bytes.remove_prefix(n);
    }
    return Status::Ok();
  }

  // Bytes read into `buffer`; 0 at the end of the stream.
  Result<size_t> Receive(char* buffer, size_t size, const WaitPolicy& wait) {
    for (;;) {
      boost::system::error_code ec;
      size_t n = socket_.read_some(asio::buffer(buffer, size), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        RETURN_IF_ERROR(Wait(POLLIN, wait));
        continue;
      }
      if (ec == asio::error::eof) {
        return size_t{0};
      }
      if (ec) {
        return Unreachable("reading the answer to " + what_ + ": " + ec.message());
      }
      return n;
    }
  }

  Status Unreachable(const std::string& why) const {
    return Status::Unavailable("the container engine at " + address_ + " is unreachable: " + why);
  }
  const std::string& what() const { return what_; }
  const std::string& address() const { return address_; }

 private:
  Status Wait(short events, const WaitPolicy& wait) {
    for (;;) {
      if (wait.cancelled != nullptr && *wait.cancelled && (*wait.cancelled)()) {
        return Status::Aborted("cancelled " + what_ + " on the container engine at " + address_);
      }
      int slice = kWaitSliceMs;
      if (wait.deadline) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*wait.deadline - SteadyClock::now()).count();
        if (left <= 0) {
          return Status::DeadlineExceeded("the container engine at " + address_ + " did not answer " + what_ +
                                          " within " + std::to_string(wait.timeout_ms) + " ms");
        }
        slice = static_cast<int>(std::min<int64_t>(left, slice));
      }
      pollfd pfd{socket_.native_handle(), events, 0};
      int r = ::poll(&pfd, 1, slice);
      if (r > 0) {
        return Status::Ok();  // ready, or hung up / failed: the next read or write says which
      }
      if (r < 0 && errno != EINTR) {
        return Unreachable(std::string("poll: ") + std::strerror(errno));
      }
    }
  }

  std::string path_;
  std::string address_;
  std::string what_;
  asio::io_context io_;
  asio::local::stream_protocol::socket socket_;
};

Result<std::string> SerializeRequest(const EngineHttpRequest& request) {
  http::verb verb = http::string_to_verb(request.method);
  if (verb == http::verb::unknown) {
    return Status::InvalidArgument("unknown HTTP method " + request.method);
  }
  http::request<http::string_body> message{verb, request.target, 11};
  // HTTP/1.1 needs a Host; the engines ignore its value (Docker's own client sends "docker").
  message.set(http::field::host, "docker");
  message.set(http::field::user_agent, "kiln");
  message.set(http::field::connection, "close");
  for (const auto& [name, value] : request.headers) {
    message.set(name, value);
  }
  if (!request.body.empty()) {
    message.set(http::field::content_type, "application/json");
  }
  message.body() = request.body;
  message.prepare_payload();
  std::ostringstream out;
  out << message;
  return out.str();
}

// Feeds the parser from the connection until the answer is complete. `after_put` runs after
// every step that may have added body bytes (Stream hands them on from there).
Status ReadAnswer(Connection& connection, http::response_parser<http::string_body>& parser, const WaitPolicy& wait,
                  const std::function<Status()>& after_put) {
  std::string pending;  // received, not yet consumed by the parser
  std::array<char, 64 * 1024> chunk;
  bool need_more = true;
  while (!parser.is_done()) {
    if (need_more) {
      ASSIGN_OR_RETURN(size_t n, connection.Receive(chunk.data(), chunk.size(), wait));
      if (n == 0) {
        // End of stream: completes a close-delimited body; anything else was cut short.
        boost::system::error_code ec;
        parser.put_eof(ec);
        if (ec) {
          return connection.Unreachable("the connection closed before the whole answer to " + connection.what() +
                                        " came");
        }
        return after_put();
      }
      pending.append(chunk.data(), n);
    }
    boost::system::error_code ec;
    size_t used = parser.put(asio::buffer(pending), ec);
    pending.erase(0, used);
    if (ec == http::error::need_more) {
      // In eager mode a put that consumed body bytes and then stopped inside the next chunk
      // header says need_more too: hand on what it parsed before waiting for more.
      need_more = true;
      RETURN_IF_ERROR(after_put());
      continue;
    }
    if (ec == http::error::body_limit) {
      return Status::ResourceExhausted("the container engine at " + connection.address() + " answered " +
                                       connection.what() + " with a body larger than the client takes");
    }
    if (ec) {
      return Status::Internal("the container engine at " + connection.address() + " sent a malformed answer to " +
                              connection.what() + ": " + ec.message());
    }
    RETURN_IF_ERROR(after_put());
    need_more = used == 0 || pending.empty();
  }
  return Status::Ok();
}

}  // namespace

std::string EngineSocketPath(std::string_view socket) {
  constexpr std::string_view kScheme = "unix://";
  if (socket.substr(0, kScheme.size()) == kScheme) {
    socket.remove_prefix(kScheme.size());
  }
  return std::string(socket);
}

EngineClient::EngineClient(std::string_view socket)
    : path_(EngineSocketPath(socket)), address_("unix://" + EngineSocketPath(socket)) {}

Result<EngineHttpResponse> EngineClient::Call(const EngineHttpRequest& request, int timeout_ms,
                                              uint64_t max_body_bytes) const {
  WaitPolicy wait;
  wait.deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  wait.timeout_ms = timeout_ms;
  ASSIGN_OR_RETURN(std::string bytes, SerializeRequest(request));
  Connection connection(path_, address_, request.method + " " + request.target);
  RETURN_IF_ERROR(connection.Open());
  RETURN_IF_ERROR(connection.Send(bytes, wait));
  http::response_parser<http::string_body> parser;
  parser.eager(true);
  parser.body_limit(max_body_bytes);
  RETURN_IF_ERROR(ReadAnswer(connection, parser, wait, [] { return Status::Ok(); }));
  EngineHttpResponse response;
  response.status = static_cast<int>(parser.get().result_int());
  response.body = std::move(parser.get().body());
  return response;
}

Result<int> EngineClient::Stream(const EngineHttpRequest& request,
                                 const std::function<Status(std::string_view)>& on_data,
                                 const std::function<bool()>& cancelled, std::string* error_body) const {
  WaitPolicy wait;
  wait.cancelled = &cancelled;
  ASSIGN_OR_RETURN(std::string bytes, SerializeRequest(request));
  Connection connection(path_, address_, request.method + " " + request.target);
  RETURN_IF_ERROR(connection.Open());
  RETURN_IF_ERROR(connection.Send(bytes, wait));
  http::response_parser<http::string_body> parser;
  parser.eager(true);
  parser.body_limit(boost::none);  // the body is handed on and cleared as it comes
  auto after_put = [&]() -> Status {
    if (!parser.is_header_done()) {
      return Status::Ok();
    }
    std::string& body = parser.get().body();
    unsigned status = parser.get().result_int();
    if (status < 200 || status > 299) {
      if (body.size() > kMaxErrorBody) {
        body.resize(kMaxErrorBody);
      }
      return Status::Ok();
    }
    if (body.empty()) {
      // Data flowing without pause never waits: ask here too so a busy stream still stops.
      if (cancelled && cancelled()) {
        return Status::Aborted("cancelled " + connection.what() + " on the container engine at " + address_);
      }
      return Status::Ok();
    }
    Status handed = on_data(body);
    body.clear();
    if (handed.ok() && cancelled && cancelled()) {
      return Status::Aborted("cancelled " + connection.what() + " on the container engine at " + address_);
    }
    return handed;
  };
  RETURN_IF_ERROR(ReadAnswer(connection, parser, wait, after_put));
  int status = static_cast<int>(parser.get().result_int());
  if ((status < 200 || status > 299) && error_body != nullptr) {
    *error_body = std::move(parser.get().body());
  }
  return status;
}

}  // namespace kiln::runtime::docker
