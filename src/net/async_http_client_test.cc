#include "net/test_util/raw_http_peer.h"
#include "net/async_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/io.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "net/http_server.h"

namespace kiln::net {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

using test_peer::Canned;
using test_peer::RawServer;
using test_peer::ReadRequest;
using test_peer::SendRaw;

// Answers every request with its own body (Content-Length framed, keep-alive).
void Echo(int fd, int) {
  for (;;) {
    std::string request = ReadRequest(fd);
    if (request.empty()) {
      return;
    }
    std::string body = request.substr(request.find("\r\n\r\n") + 4);
    SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }
}

// Keeps the connection open without answering until `done`.
void Hold(const std::atomic<bool>& done) {
  while (!done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

ClientRequest Post(std::string_view body, std::string_view target = "/invocations") {
  ClientRequest r;
  r.method = "POST";
  r.target = target;
  r.body = body;
  return r;
}

ClientTimeouts Budget(int response_ms = 5000) {
  ClientTimeouts t;
  t.connect_ms = 1000;
  t.response_ms = response_ms;
  return t;
}

// An io_context driven from the test thread, and the client on it.
class Loop {
 public:
  explicit Loop(HttpClientOptions options = {}) : client(io, options) {}

  // Runs the loop until `ready` (bounded: a hung call fails the test instead of hanging it).
  void RunUntil(const std::function<bool()>& ready, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    auto deadline = Clock::now() + limit;
    while (!ready() && Clock::now() < deadline) {
      if (io.stopped()) {
        io.restart();
      }
      io.run_one_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(ready()) << "the loop did not get there in time";
  }

  // Send, and run the loop until its callback has run.
  Result<ClientResponse> Call(const std::string& host, uint16_t port, const ClientRequest& request,
                              const ClientTimeouts& timeouts = Budget()) {
    std::optional<Result<ClientResponse>> out;
    client.Send(host, port, request, timeouts, [&](Result<ClientResponse> r) { out.emplace(std::move(r)); });
    EXPECT_FALSE(out.has_value()) << "done ran inline";
    RunUntil([&] { return out.has_value(); });
    if (!out.has_value()) {
      return Status::Internal("no answer");
    }
    return std::move(*out);
  }

  Result<ClientResponse> Call(uint16_t port, const ClientRequest& request, const ClientTimeouts& timeouts = Budget()) {
    return Call("127.0.0.1", port, request, timeouts);
  }

  boost::asio::io_context io{1};
  AsyncHttpClient client;
};

TEST(AsyncHttpClientTest, BasicPostAndTheRequestHeadOnTheWire) {
  Mutex mu;
  std::string seen;
  RawServer server([&](int fd, int) {
    std::string request = ReadRequest(fd);
    {
      MutexLock lock(mu);
      seen = request;
    }
    SendRaw(
        fd,
        "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nX-Two: a\r\nX-Two: b\r\nContent-Length: 5\r\n\r\nhello");
  });
  Loop loop;
  HeaderMap headers{
      {"Content-Type", "application/json"}, {"Host", "evil"}, {"Content-Length", "99"}, {"Connection", "close"},
      {"Transfer-Encoding", "x"},           {"X-Custom", "v"}};
  ClientRequest request = Post("{\"a\":1}");
  request.headers = &headers;
  auto r = loop.Call(server.port(), request);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->body, "hello");
  ASSERT_NE(FindHeader(r->headers, "content-type"), nullptr);
  EXPECT_EQ(*FindHeader(r->headers, "content-type"), "text/plain");
  EXPECT_EQ(r->headers.count("X-Two"), 2u);
  MutexLock lock(mu);
  EXPECT_EQ(seen, "POST /invocations HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(server.port()) +
                      "\r\nContent-Length: 7\r\nContent-Type: application/json\r\nX-Custom: v\r\n\r\n{\"a\":1}");
}

TEST(AsyncHttpClientTest, GetWithoutBodyHasNoContentLengthAndLocalhostWorks) {
  Mutex mu;
  std::string seen;
  RawServer server([&](int fd, int) {
    std::string request = ReadRequest(fd);
    {
      MutexLock lock(mu);
      seen = request;
    }
    SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  });
  Loop loop;
  ClientRequest request;
  request.method = "GET";
  request.target = "/ping";
  auto r = loop.Call("localhost", server.port(), request);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "");
  MutexLock lock(mu);
  EXPECT_EQ(seen, "GET /ping HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(server.port()) + "\r\n\r\n");
}

TEST(AsyncHttpClientTest, BadRequestsAreInvalidArgumentAndNeverInline) {
  Loop loop;
  auto r = loop.Call("example.com", 80, Post("x"));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  HeaderMap headers{{"X-Bad", "a\r\nInjected: yes"}};
  ClientRequest request = Post("x");
  request.headers = &headers;
  r = loop.Call(1, request);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  request.headers = nullptr;
  request.target = "/a b";
  r = loop.Call(1, request);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
}

TEST(AsyncHttpClientTest, KeepAliveReusesOneConnection) {
  RawServer server(Echo);
  Loop loop;
  for (std::string body : {"one", "two", ""}) {
    auto r = loop.Call(server.port(), Post(body));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->body, body);
    EXPECT_EQ(loop.client.idle_connections(), 1u);
  }
  EXPECT_EQ(server.accepted(), 1);
}

TEST(AsyncHttpClientTest, ManySequentialCallsShareOneConnection) {
  RawServer server(Echo);
  Loop loop;
  std::string big(300 * 1024, 'b');  // more than one socket buffer's worth each way
  for (int i = 0; i < 300; ++i) {
    std::string body = i % 50 == 0 ? big : "request " + std::to_string(i);
    auto r = loop.Call(server.port(), Post(body));
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    ASSERT_EQ(r->body, body);
  }
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_EQ(loop.client.idle_connections(), 1u);
}

TEST(AsyncHttpClientTest, ChunkedWithExtensionsAndTrailersByteByByte) {
  RawServer server(
      Canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A:  spaced value \r\n\r\n"
             "5;name=value\r\nhello\r\n"
             "1\r\n \r\n"
             "A\r\n0123456789\r\n"
             "0\r\nX-Trailer: t\r\n\r\n",
             /*byte_by_byte=*/true));
  Loop loop;
  for (int i = 0; i < 2; ++i) {
    auto r = loop.Call(server.port(), Post("x"));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->body, "hello 0123456789");
    ASSERT_NE(FindHeader(r->headers, "x-a"), nullptr);
    EXPECT_EQ(*FindHeader(r->headers, "x-a"), "spaced value");
    EXPECT_EQ(FindHeader(r->headers, "x-trailer"), nullptr);  // trailers are dropped, as HttpClient does
  }
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_EQ(loop.client.idle_connections(), 1u);
}

TEST(AsyncHttpClientTest, CloseDelimitedBodyAndHttp10AreNotPooled) {
  RawServer server([](int fd, int) {
    ReadRequest(fd);
    SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil ");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    SendRaw(fd, "the close");
  });
  Loop loop;
  auto r = loop.Call(server.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "until the close");
  EXPECT_EQ(loop.client.idle_connections(), 0u);

  RawServer close(Canned("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"));
  RawServer http10(Canned("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"));
  RawServer http10_keep(Canned("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"));
  for (RawServer* s : {&close, &http10}) {
    r = loop.Call(s->port(), Post("x"));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->body, "ok");
    EXPECT_EQ(loop.client.idle_connections(), 0u);
  }
  r = loop.Call(http10_keep.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(loop.client.idle_connections(), 1u);
  loop.client.Shutdown();  // the servers' threads end now, not at their 5 s receive timeout
}

TEST(AsyncHttpClientTest, NoBodyStatusesAndHead) {
  RawServer server([](int fd, int) {
    for (;;) {
      std::string request = ReadRequest(fd);
      if (request.empty()) {
        return;
      }
      if (request.rfind("HEAD ", 0) == 0) {
        SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
      } else if (request.find("/304") != std::string::npos) {
        SendRaw(fd, "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n");
      } else {
        SendRaw(fd, "HTTP/1.1 204 No Content\r\n\r\n");
      }
    }
  });
  Loop loop;
  ClientRequest head;
  head.method = "HEAD";
  head.target = "/";
  for (const ClientRequest& request : {Post("x", "/204"), Post("x", "/304"), head, Post("x", "/204")}) {
    auto r = loop.Call(server.port(), request);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->body, "");
  }
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_EQ(loop.client.idle_connections(), 1u);
}

TEST(AsyncHttpClientTest, InterimResponsesAreSkippedAnd101IsDataLoss) {
  RawServer server(
      Canned("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
             "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal"));
  Loop loop;
  auto r = loop.Call(server.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "real");
  EXPECT_EQ(FindHeader(r->headers, "link"), nullptr);
  EXPECT_EQ(loop.client.idle_connections(), 1u);

  RawServer upgrade(Canned("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"));
  r = loop.Call(upgrade.port(), Post("x"));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
}

TEST(AsyncHttpClientTest, OversizedBodyIsResourceExhausted) {
  HttpClientOptions options;
  options.max_response_body_bytes = 1000;
  Loop loop(options);
  for (const std::string& response :
       std::vector<std::string>{"HTTP/1.1 200 OK\r\nContent-Length: 1001\r\n\r\n",
                                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n" +
                                    std::string(1000, 'a') + "\r\n1\r\nb\r\n0\r\n\r\n",
                                "HTTP/1.1 200 OK\r\n\r\n" + std::string(1001, 'a')}) {
    RawServer server([response](int fd, int) {
      ReadRequest(fd);
      SendRaw(fd, response);
    });
    auto r = loop.Call(server.port(), Post("x"));
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr("exceeds 1000 bytes"));
    EXPECT_EQ(loop.client.idle_connections(), 0u);
  }
  // Exactly at the limit is fine.
  RawServer server([](int fd, int) {
    ReadRequest(fd);
    SendRaw(fd, "HTTP/1.1 200 OK\r\n\r\n" + std::string(1000, 'a'));
  });
  auto r = loop.Call(server.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body.size(), 1000u);
}

TEST(AsyncHttpClientTest, OversizedHeaderIsResourceExhausted) {
  HttpClientOptions options;
  options.max_response_header_bytes = 1024;
  Loop loop(options);
  RawServer server(Canned("HTTP/1.1 200 OK\r\nX-Big: " + std::string(2000, 'h') + "\r\nContent-Length: 0\r\n\r\n"));
  auto r = loop.Call(server.port(), Post("x"));
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("response header"));
  // Many small headers add up too, also when they arrive a few bytes at a time.
  std::string many = "HTTP/1.1 200 OK\r\n";
  for (int i = 0; i < 100; ++i) {
    many += "X-H" + std::to_string(i) + ": value\r\n";
  }
  RawServer server2(Canned(many + "Content-Length: 0\r\n\r\n", /*byte_by_byte=*/true));
  r = loop.Call(server2.port(), Post("x"));
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // Interim responses each get the budget, not more.
  std::string interim = "HTTP/1.1 100 Continue\r\nX-Pad: " + std::string(600, 'p') + "\r\n\r\n";
  RawServer server3(Canned(interim + interim + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"));
  r = loop.Call(server3.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "ok");
  loop.client.Shutdown();  // the servers' threads end now, not at their 5 s receive timeout
}

TEST(AsyncHttpClientTest, MalformedResponsesAreDataLoss) {
  Loop loop;
  for (std::string garbage :
       {"SSH-2.0-OpenSSH_9.2\r\n", "HTTP/1.1 2x0 OK\r\n\r\n", "HTTP/2 200\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\na",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "HTTP/1.1 200 OK\r\nX-Bad: a\rb\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"}) {
    RawServer server([garbage](int fd, int) {
      ReadRequest(fd);
      SendRaw(fd, garbage);
    });
    auto r = loop.Call(server.port(), Post("x"));
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << garbage << " -> " << r.status().ToString();
    EXPECT_EQ(loop.client.idle_connections(), 0u);
  }
}

TEST(AsyncHttpClientTest, EarlyAnswerToALargeBodyIsReturned) {
  // The server answers after the head and closes without reading the body: sending fails, but
  // the answer that arrived first is the result.
  RawServer server([](int fd, int) {
    std::string data;
    char buf[4096];
    while (data.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) {
        return;
      }
      data.append(buf, static_cast<size_t>(n));
    }
    SendRaw(fd, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbig");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  Loop loop;
  std::string body(32 * 1024 * 1024, 'x');
  auto r = loop.Call(server.port(), Post(body));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->body, "big");
  EXPECT_EQ(loop.client.idle_connections(), 0u);
}

TEST(AsyncHttpClientTest, ConnectionRefusedIsUnavailable) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);  // bound, never listening: nothing there
  Loop loop;
  auto r = loop.Call(ntohs(addr.sin_port), Post("x"));
  ASSERT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_THAT(r.status().message(),
              HasSubstr("connection refused by 127.0.0.1:" + std::to_string(ntohs(addr.sin_port))));
}

// A listener whose accept queue is full: Linux drops further SYNs, so a connect hangs. Returns
// the listener's port; `fds` gets every socket to close.
uint16_t FullBacklogListener(std::vector<int>& fds) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  fds.push_back(lfd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(lfd, 0), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  for (int i = 0; i < 4; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return ntohs(addr.sin_port);
}

TEST(AsyncHttpClientTest, ConnectTimeoutIsUnavailable) {
  std::vector<int> fds;
  const uint16_t port = FullBacklogListener(fds);
  Loop loop;
  ClientTimeouts t = Budget(1000);
  t.connect_ms = 200;
  auto start = Clock::now();
  auto r = loop.Call(port, Post("x"), t);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  for (int fd : fds) {
    ::close(fd);
  }
  if (r.ok() || r.status().code() == StatusCode::kDeadlineExceeded) {
    GTEST_SKIP() << "this kernel completed the connection despite the full backlog";
  }
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("did not accept a connection within 200 ms"));
  EXPECT_GE(ms, 195);
  EXPECT_LT(ms, 2000);
}

TEST(AsyncHttpClientTest, CancelWhileConnectingSendsNothing) {
  std::vector<int> fds;
  const uint16_t port = FullBacklogListener(fds);
  Loop loop;
  CancelSignal cancel;
  ClientRequest request = Post("x");
  request.cancel = &cancel;
  ClientTimeouts t = Budget(1000);
  t.connect_ms = 5000;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel.Cancel("instance failed");
  });
  auto r = loop.Call(port, request, t);
  canceller.join();
  for (int fd : fds) {
    ::close(fd);
  }
  if (r.ok() || r.status().code() == StatusCode::kDeadlineExceeded || r.status().code() == StatusCode::kAborted) {
    GTEST_SKIP() << "this kernel completed the connection despite the full backlog";
  }
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("nothing was sent"));
  EXPECT_THAT(r.status().message(), HasSubstr("instance failed"));
}

TEST(AsyncHttpClientTest, SilentPeerIsDeadlineExceeded) {
  std::atomic<bool> done{false};
  RawServer server([&](int fd, int) {
    ReadRequest(fd);
    Hold(done);
  });
  Loop loop;
  auto start = Clock::now();
  auto r = loop.Call(server.port(), Post("x"), Budget(300));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  done = true;
  ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("did not answer within 300 ms"));
  EXPECT_GE(ms, 295);
  EXPECT_LT(ms, 3000);
  EXPECT_EQ(loop.client.idle_connections(), 0u);
}

TEST(AsyncHttpClientTest, SlowBodyIsDeadlineExceeded) {
  std::atomic<bool> done{false};
  RawServer server([&](int fd, int) {
    ReadRequest(fd);
    SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
    Hold(done);
  });
  Loop loop;
  // A budget the peer's first bytes arrive well within even on a loaded machine (with 200 ms, a
  // sanitizer build beside other work once saw the deadline before the headers: "did not answer").
  auto r = loop.Call(server.port(), Post("x"), Budget(1000));
  done = true;
  ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("not complete within 1000 ms"));
}

TEST(AsyncHttpClientTest, PeerNotReadingTheBodyIsDeadlineExceeded) {
  std::atomic<bool> done{false};
  RawServer server([&](int fd, int) {
    char buf[256];
    (void)::recv(fd, buf, sizeof(buf), 0);
    Hold(done);
  });
  Loop loop;
  std::string body(64 * 1024 * 1024, 'b');
  auto r = loop.Call(server.port(), Post(body), Budget(300));
  done = true;
  ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("did not read the request within 300 ms"));
}

TEST(AsyncHttpClientTest, PeerClosingIsAbortedWithoutRetryOnAFreshConnection) {
  RawServer server([](int fd, int) { ReadRequest(fd); });
  Loop loop;
  auto r = loop.Call(server.port(), Post("x"));
  ASSERT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("closed the connection before answering"));
  EXPECT_EQ(server.accepted(), 1);

  RawServer mid([](int fd, int) {
    ReadRequest(fd);
    SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
  });
  r = loop.Call(mid.port(), Post("x"));
  ASSERT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("in the middle of the response"));
}

TEST(AsyncHttpClientTest, StaleKeptAliveConnectionIsRetriedOnce) {
  // The first connection answers once and then closes while idle; later ones serve normally.
  RawServer server([](int fd, int index) {
    if (index == 0) {
      ReadRequest(fd);
      SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
      return;  // close
    }
    Canned("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")(fd, index);
  });
  Loop loop;
  auto r = loop.Call(server.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "first");
  EXPECT_EQ(loop.client.idle_connections(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the FIN arrives
  r = loop.Call(server.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "fresh");
  EXPECT_EQ(server.accepted(), 2);
}

TEST(AsyncHttpClientTest, StaleConnectionProbedAfterIdle) {
  RawServer server([](int fd, int index) {
    if (index == 0) {
      ReadRequest(fd);
      SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
      return;
    }
    Canned("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")(fd, index);
  });
  Loop loop;
  ASSERT_TRUE(loop.Call(server.port(), Post("x")).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto r = loop.Call(server.port(), Post("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "fresh");
  EXPECT_EQ(server.accepted(), 2);
}

TEST(AsyncHttpClientTest, ReusedConnectionRetriedOnlyOnceAndNotAfterResponseBytes) {
  // Connection 0 answers the first request, then reads the second and closes without an answer;
  // every later connection also closes after reading: the retry happens once and fails.
  RawServer server([](int fd, int index) {
    if (index == 0) {
      ReadRequest(fd);
      SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    }
    ReadRequest(fd);
  });
  Loop loop;
  ASSERT_TRUE(loop.Call(server.port(), Post("x")).ok());
  auto r = loop.Call(server.port(), Post("x"));
  ASSERT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_EQ(server.accepted(), 2);

  RawServer partial([](int fd, int index) {
    if (index == 0) {
      ReadRequest(fd);
      SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
      ReadRequest(fd);
      SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Le");  // then close
      return;
    }
    Canned("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")(fd, index);
  });
  ASSERT_TRUE(loop.Call(partial.port(), Post("x")).ok());
  r = loop.Call(partial.port(), Post("x"));
  ASSERT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_EQ(partial.accepted(), 1);
}

TEST(AsyncHttpClientTest, IdleLimits) {
  RawServer server(Echo);
  HttpClientOptions options;
  options.max_idle_ms = 50;
  options.max_idle_per_target = 2;
  Loop loop(options);
  ASSERT_TRUE(loop.Call(server.port(), Post("a")).ok());
  ASSERT_TRUE(loop.Call(server.port(), Post("b")).ok());
  EXPECT_EQ(server.accepted(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  auto r = loop.Call(server.port(), Post("c"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "c");
  EXPECT_EQ(server.accepted(), 2);  // the expired one was closed, not reused
  EXPECT_EQ(loop.client.idle_connections(), 1u);

  // Four at once: two go back to the pool, the others close.
  int answered = 0;
  for (int i = 0; i < 4; ++i) {
    loop.client.Send("127.0.0.1", server.port(), Post("p"), Budget(), [&](Result<ClientResponse> r) {
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      ++answered;
    });
  }
  loop.RunUntil([&] { return answered == 4; });
  EXPECT_EQ(loop.client.idle_connections(), 2u);

  loop.client.Forget("127.0.0.1", server.port());
  EXPECT_EQ(loop.client.idle_connections(), 0u);
  ASSERT_TRUE(loop.Call(server.port(), Post("d")).ok());
  EXPECT_EQ(loop.client.idle_connections(), 1u);
}

// ---- CancelSignal.

TEST(AsyncHttpClientTest, CancelledBeforeSendingSendsNothing) {
  RawServer server(Canned("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"));
  Loop loop;
  CancelSignal cancel;
  ClientRequest request = Post("x");
  request.cancel = &cancel;
  ASSERT_TRUE(loop.Call(server.port(), request).ok());
  EXPECT_EQ(loop.client.idle_connections(), 1u);
  cancel.Cancel("first");
  auto r = loop.Call(server.port(), request);
  ASSERT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("nothing was sent"));
  EXPECT_THAT(r.status().message(), HasSubstr("first"));
  EXPECT_EQ(loop.client.idle_connections(), 1u);  // the pooled connection was not touched
  request.cancel = nullptr;
  EXPECT_TRUE(loop.Call(server.port(), request).ok());
}

TEST(AsyncHttpClientTest, CancelWakesACallWaitingForItsResponse) {
  std::atomic<bool> done{false};
  std::atomic<int> requests{0};
  RawServer server([&](int fd, int) {
    if (!ReadRequest(fd).empty()) {
      ++requests;
    }
    Hold(done);
  });
  Loop loop;
  CancelSignal cancel;
  ClientRequest request = Post("x");
  request.cancel = &cancel;
  std::thread canceller([&] {
    while (requests.load() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel.Cancel("the instance stopped answering");
  });
  auto start = Clock::now();
  auto r = loop.Call(server.port(), request, Budget(20000));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  canceller.join();
  done = true;
  ASSERT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("was cancelled: the instance stopped answering"));
  EXPECT_LT(ms, 3000);
  EXPECT_EQ(server.accepted(), 1);  // not resent
  EXPECT_EQ(loop.client.idle_connections(), 0u);
}

TEST(AsyncHttpClientTest, CancelWakesACallStuckSendingItsBody) {
  std::atomic<bool> done{false};
  RawServer server([&](int fd, int) {
    char buf[256];
    (void)::recv(fd, buf, sizeof(buf), 0);
    Hold(done);
  });
  Loop loop;
  CancelSignal cancel;
  std::string body(64 * 1024 * 1024, 'b');
  ClientRequest request = Post(body);
  request.cancel = &cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel.Cancel("gone");
  });
  auto r = loop.Call(server.port(), request, Budget(20000));
  canceller.join();
  done = true;
  ASSERT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("was cancelled: gone"));
}

TEST(AsyncHttpClientTest, AnAnswerAlreadyThereBeatsACancel) {
  RawServer server(Canned("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nanswer"));
  Loop loop;
  ASSERT_TRUE(loop.Call(server.port(), Post("warm")).ok());  // a pooled connection: sent inline
  CancelSignal cancel;
  ClientRequest request = Post("x");
  request.cancel = &cancel;
  std::optional<Result<ClientResponse>> out;
  loop.client.Send("127.0.0.1", server.port(), request, Budget(),
                   [&](Result<ClientResponse> r) { out.emplace(std::move(r)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the answer arrives meanwhile
  cancel.Cancel("too late");
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * AsyncHttpClient::kSweepMillis));  // the sweep is due
  loop.RunUntil([&] { return out.has_value(); });
  ASSERT_TRUE(out->ok()) << out->status().ToString();
  EXPECT_EQ((*out)->body, "answer");
}

// ---- The loop.

// A container with Nagle on (Python's http.server) writes the head, then the body: the body
// waits for the ACK of the head. The client ACKs at once (TCP_QUICKACK). Without it every call
// here takes the kernel's delayed-ACK minimum (40 ms; measured 48 ms median with the re-arming
// disabled, 0.01 ms with it), so a median under 30 ms checks the mechanism, not a speed.
TEST(AsyncHttpClientTest, TwoSegmentAnswerWithNagleOn) {
  RawServer server([](int fd, int) {
    int zero = 0;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &zero, sizeof(zero));
    for (;;) {
      std::string request = ReadRequest(fd);
      if (request.empty()) {
        return;
      }
      SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n");
      SendRaw(fd, "{\"answer\":42}");
    }
  });
  Loop loop;
  constexpr int kCalls = 20;
  std::vector<double> ms;
  for (int i = 0; i < kCalls; ++i) {
    auto start = Clock::now();
    auto r = loop.Call(server.port(), Post("{\"q\":1}"));
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->body, "{\"answer\":42}");
  }
  std::sort(ms.begin(), ms.end());
  std::printf("two-segment answer with Nagle on: median %.2f ms, max %.2f ms over %d calls\n", ms[kCalls / 2],
              ms.back(), kCalls);
  EXPECT_LT(ms[kCalls / 2], 30.0) << "the answer's second segment waited for a delayed ACK";
  EXPECT_EQ(server.accepted(), 1);
}

TEST(AsyncHttpClientTest, SixtyFourCallsInFlightOnOneLoop) {
  RawServer server(Echo);
  Loop loop;
  constexpr int kCalls = 64;
  std::vector<std::string> bodies;
  for (int i = 0; i < kCalls; ++i) {
    bodies.push_back("body " + std::to_string(i) + std::string(static_cast<size_t>(i) * 1000, 'x'));
  }
  for (int round = 0; round < 3; ++round) {
    int answered = 0;
    int wrong = 0;
    for (int i = 0; i < kCalls; ++i) {
      loop.client.Send("127.0.0.1", server.port(), Post(bodies[i]), Budget(), [&, i](Result<ClientResponse> r) {
        ++answered;
        if (!r.ok() || r->body != bodies[i]) {
          ++wrong;
        }
      });
    }
    EXPECT_EQ(answered, 0);  // never inline
    loop.RunUntil([&] { return answered == kCalls; });
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(loop.client.idle_connections(), static_cast<size_t>(kCalls));
  }
  EXPECT_EQ(server.accepted(), kCalls);  // later rounds reused the pool
}

TEST(AsyncHttpClientTest, ShutdownFailsCallsInFlight) {
  std::atomic<bool> done{false};
  RawServer server([&](int fd, int) {
    ReadRequest(fd);
    Hold(done);
  });
  RawServer ok(Echo);
  Loop loop;
  ASSERT_TRUE(loop.Call(ok.port(), Post("x")).ok());
  EXPECT_EQ(loop.client.idle_connections(), 1u);
  std::optional<Result<ClientResponse>> out;
  loop.client.Send("127.0.0.1", server.port(), Post("x"), Budget(20000),
                   [&](Result<ClientResponse> r) { out.emplace(std::move(r)); });
  loop.RunUntil([&] { return server.accepted() == 1; });
  loop.io.run_for(std::chrono::milliseconds(50));  // the request is sent
  loop.client.Shutdown();
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status().code(), StatusCode::kAborted) << out->status().ToString();
  EXPECT_THAT(out->status().message(), HasSubstr("shutting down"));
  EXPECT_EQ(loop.client.idle_connections(), 0u);
  auto r = loop.Call(ok.port(), Post("x"));
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  done = true;
}

TEST(AsyncHttpClientTest, CallsChainedFromCallbacks) {
  RawServer server(Echo);
  Loop loop;
  int left = 50;
  int failed = 0;
  std::function<void(Result<ClientResponse>)> next = [&](Result<ClientResponse> r) {
    if (!r.ok() || r->body != "chain") {
      ++failed;
    }
    if (--left > 0) {
      loop.client.Send("127.0.0.1", server.port(), Post("chain"), Budget(), next);
    }
  };
  loop.client.Send("127.0.0.1", server.port(), Post("chain"), Budget(), next);
  loop.RunUntil([&] { return left == 0; });
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_EQ(loop.client.idle_connections(), 1u);
}

TEST(AsyncHttpClientTest, ForgetDuringACallClosesItsConnectionAfterwards) {
  RawServer server([](int fd, int) {
    while (!ReadRequest(fd).empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      SendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    }
  });
  Loop loop;
  std::optional<Result<ClientResponse>> out;
  loop.client.Send("127.0.0.1", server.port(), Post("x"), Budget(),
                   [&](Result<ClientResponse> r) { out.emplace(std::move(r)); });
  loop.io.run_for(std::chrono::milliseconds(10));
  loop.client.Forget("127.0.0.1", server.port());
  loop.RunUntil([&] { return out.has_value(); });
  ASSERT_TRUE(out->ok()) << out->status().ToString();
  EXPECT_EQ(loop.client.idle_connections(), 0u);  // it went with the forgotten target
  ASSERT_TRUE(loop.Call(server.port(), Post("x")).ok());
  EXPECT_EQ(server.accepted(), 2);
  EXPECT_EQ(loop.client.idle_connections(), 1u);
}

// The sweep fails two calls at once; the first one's callback shuts the client down (as a
// server's stop may): every callback still runs exactly once.
TEST(AsyncHttpClientTest, ShutdownFromACallbackDuringTheSweep) {
  std::atomic<bool> done{false};
  RawServer server([&](int fd, int) {
    ReadRequest(fd);
    Hold(done);
  });
  Loop loop;
  std::vector<Status> results;
  for (int i = 0; i < 3; ++i) {
    loop.client.Send("127.0.0.1", server.port(), Post("x"), Budget(100 + 5000 * (i / 2)),
                     [&](Result<ClientResponse> r) {
                       results.push_back(r.status());
                       if (results.size() == 1) {
                         loop.client.Shutdown();
                       }
                     });
  }
  loop.RunUntil([&] { return results.size() == 3; });
  loop.io.restart();
  loop.io.run_for(std::chrono::milliseconds(100));  // nothing more may arrive
  done = true;
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].code(), StatusCode::kDeadlineExceeded) << results[0].ToString();
  for (const Status& st : results) {
    EXPECT_FALSE(st.ok());
  }
  EXPECT_EQ(loop.client.idle_connections(), 0u);
}

TEST(AsyncHttpClientTest, DestroyingTheClientFailsItsCalls) {
  std::atomic<bool> done{false};
  RawServer server([&](int fd, int) {
    ReadRequest(fd);
    Hold(done);
  });
  boost::asio::io_context io{1};
  std::optional<Result<ClientResponse>> out;
  {
    AsyncHttpClient client(io, {});
    client.Send("127.0.0.1", server.port(), Post("x"), Budget(20000),
                [&](Result<ClientResponse> r) { out.emplace(std::move(r)); });
    io.run_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status().code(), StatusCode::kAborted) << out->status().ToString();
  io.restart();
  io.run_for(std::chrono::milliseconds(50));  // the cancelled operations complete harmlessly
  done = true;
}

TEST(AsyncHttpClientTest, Ipv6Literal) {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0) {
    if (fd >= 0) {
      ::close(fd);
    }
    GTEST_SKIP() << "no IPv6 loopback";
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t port = ntohs(addr.sin6_port);
  std::thread peer([fd] {
    int conn = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn >= 0) {
      std::string request = ReadRequest(conn);
      size_t host = request.find("Host: ");
      std::string value = request.substr(host + 6, request.find("\r\n", host) - host - 6);
      SendRaw(conn, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(value.size()) + "\r\n\r\n" + value);
      ::close(conn);
    }
  });
  Loop loop;
  auto r = loop.Call("::1", port, Post("x"));
  peer.join();
  ::close(fd);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "[::1]:" + std::to_string(port));
}

// Not a test: a latency number for the report, beside HttpClientTest.DISABLED_SequentialPostLatency
// (same server, same request).
//   build/src/net/net_test --gtest_also_run_disabled_tests --gtest_filter='*SequentialPostLatency'
TEST(AsyncHttpClientTest, DISABLED_SequentialPostLatency) {
  HttpServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  auto server = HttpServer::Create(server_options, [](HttpRequest& req, ResponseWriter& out) {
    (void)ReadAll(*req.body, 1 << 20);
    (void)out.Send(200, {}, std::string(10, 'r'));
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*server)->Start().ok());
  Loop loop;
  std::string body(100, 'b');
  HeaderMap headers{{"Content-Type", "application/json"}};
  ClientRequest req = Post(body);
  req.headers = &headers;
  const uint16_t port = (*server)->port();
  // Chained from the callbacks: the loop never waits for the test thread between calls.
  auto run = [&](int n) {
    int left = n;
    int failed = 0;
    std::function<void(Result<ClientResponse>)> next = [&](Result<ClientResponse> r) {
      if (!r.ok()) {
        ++failed;
      }
      if (--left > 0) {
        loop.client.Send("127.0.0.1", port, req, Budget(), next);
      }
    };
    loop.client.Send("127.0.0.1", port, req, Budget(), next);
    // run() returns once the chain is done and the sweep timer has lapsed (at most kSweepMillis).
    loop.io.restart();
    loop.io.run();
    EXPECT_EQ(left, 0);
    EXPECT_EQ(failed, 0);
  };
  run(1000);
  constexpr int kN = 20000;
  auto start = Clock::now();
  run(kN);
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  std::printf("async sequential POST 100 B -> 10 B: %.1f us/request over %d requests\n", us / kN, kN);
  (*server)->Stop(1);
}

}  // namespace
}  // namespace kiln::net
