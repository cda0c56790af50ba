// OpenHttpEngine (engine.h) and EngineClient (engine_client.h): first against an in-test fake
// engine (a Unix-socket HTTP server thread giving canned answers, so every framing, error and
// timing case is exact), then against Podman's socket when it runs on this machine.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "base/mutex.h"
#include "base/time.h"
#include "runtime/docker/engine.h"
#include "runtime/docker/engine_client.h"

namespace kiln::runtime::docker {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

int64_t ElapsedMs(SteadyClock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - since).count();
}

// --- The fake engine ---------------------------------------------------------------------------

struct RecordedRequest {
  std::string method;
  std::string target;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// What the fake sends for one request: `pieces` in order, `pause_ms` before each but the first,
// then it keeps the connection open for `hold_ms` (or until the client closes it) and closes.
struct Script {
  std::vector<std::string> pieces;
  int pause_ms = 0;
  int hold_ms = 0;
};

std::string Lower(std::string s) {
  for (char& c : s) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return s;
}

class FakeEngineServer {
 public:
  using Handler = std::function<Script(const RecordedRequest&)>;

  explicit FakeEngineServer(Handler handler) : handler_(std::move(handler)) {
    char tmpl[] = "/tmp/kiln-h1-engine-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/engine.sock";
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof(address.sun_path) - 1);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listen_fd_, 16) != 0) {
      std::abort();
    }
    thread_ = std::thread([this] { Run(); });
  }

  ~FakeEngineServer() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
    std::filesystem::remove_all(dir_);
  }

  std::string socket() const { return "unix://" + path_; }

  std::vector<RecordedRequest> requests() {
    MutexLock lock(mu_);
    return requests_;
  }
  // How many connections the fake saw closed by the client while it was still sending or holding.
  int closed_by_client() const { return closed_by_client_.load(); }

 private:
  void Run() {
    while (!stop_) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0) {
        continue;
      }
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        continue;
      }
      Serve(fd);
      ::close(fd);
    }
  }

  // Reads one request (head, then a Content-Length body).
  bool ReadRequest(int fd, RecordedRequest& request) {
    std::string data;
    char buffer[4096];
    size_t head_end;
    while ((head_end = data.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n <= 0) {
        return false;
      }
      data.append(buffer, static_cast<size_t>(n));
    }
    std::string head = data.substr(0, head_end);
    data.erase(0, head_end + 4);
    size_t line_end = head.find("\r\n");
    std::string first = head.substr(0, line_end);
    size_t space1 = first.find(' '), space2 = first.rfind(' ');
    request.method = first.substr(0, space1);
    request.target = first.substr(space1 + 1, space2 - space1 - 1);
    size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
      size_t end = head.find("\r\n", pos);
      if (end == std::string::npos) {
        end = head.size();
      }
      std::string line = head.substr(pos, end - pos);
      size_t colon = line.find(':');
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      request.headers[Lower(line.substr(0, colon))] = value;
      pos = end + 2;
    }
    size_t length = request.headers.count("content-length") ? std::stoul(request.headers["content-length"]) : 0;
    while (data.size() < length) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n <= 0) {
        return false;
      }
      data.append(buffer, static_cast<size_t>(n));
    }
    request.body = data.substr(0, length);
    return true;
  }

  // Sleeps up to `ms`, returning early (false) when stopping or when the client closed.
  bool Pause(int fd, int ms) {
    auto until = SteadyClock::now() + std::chrono::milliseconds(ms);
    while (!stop_ && SteadyClock::now() < until) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, 5) > 0) {
        char byte;
        if (::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0) {
          ++closed_by_client_;
          return false;
        }
      }
    }
    return !stop_;
  }

  void Serve(int fd) {
    RecordedRequest request;
    if (!ReadRequest(fd, request)) {
      return;
    }
    {
      MutexLock lock(mu_);
      requests_.push_back(request);
    }
    Script script = handler_(request);
    for (size_t i = 0; i < script.pieces.size(); ++i) {
      if (i > 0 && script.pause_ms > 0 && !Pause(fd, script.pause_ms)) {
        return;
      }
      const std::string& piece = script.pieces[i];
      size_t sent = 0;
      while (sent < piece.size()) {
        ssize_t n = ::send(fd, piece.data() + sent, piece.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) {
          ++closed_by_client_;
          return;
        }
        sent += static_cast<size_t>(n);
      }
    }
    if (script.hold_ms > 0) {
      Pause(fd, script.hold_ms);
    }
  }

  Handler handler_;
  std::string dir_;
  std::string path_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_by_client_{0};
  std::thread thread_;
  Mutex mu_;
  std::vector<RecordedRequest> requests_ GUARDED_BY(mu_);
};

// --- Canned answers ----------------------------------------------------------------------------

std::string Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 404: return "Not Found";
    case 409: return "Conflict";
    default: return "Error";
  }
}

// A whole answer with Content-Length.
std::string Answer(int status, const std::string& body = "") {
  return "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

Script Whole(int status, const std::string& body = "") { return Script{{Answer(status, body)}}; }

// A chunked answer: the head, then each piece as a chunk (sent separately), then the last chunk.
Script Chunked(int status, const std::vector<std::string>& chunks, int pause_ms = 0) {
  Script script;
  script.pause_ms = pause_ms;
  script.pieces.push_back("HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
                          "\r\nTransfer-Encoding: chunked\r\n\r\n");
  for (const std::string& chunk : chunks) {
    std::ostringstream size;
    size << std::hex << chunk.size();
    script.pieces.push_back(size.str() + "\r\n" + chunk + "\r\n");
  }
  script.pieces.push_back("0\r\n\r\n");
  return script;
}

std::string EngineError(const std::string& message) { return json{{"message", message}}.dump(); }

// One frame of a multiplexed log stream.
std::string Frame(int stream, const std::string& payload) {
  std::string header(8, '\0');
  header[0] = static_cast<char>(stream);
  uint32_t size = static_cast<uint32_t>(payload.size());
  header[4] = static_cast<char>(size >> 24);
  header[5] = static_cast<char>(size >> 16);
  header[6] = static_cast<char>(size >> 8);
  header[7] = static_cast<char>(size);
  return header + payload;
}

std::unique_ptr<Engine> EngineAt(const FakeEngineServer& server, int timeout_ms = 30000) {
  HttpEngineOptions options;
  options.socket = server.socket();
  options.timeout_ms = timeout_ms;
  return OpenHttpEngine(options);
}

std::function<bool()> Never() {
  return [] { return false; };
}

std::vector<LogLine> ReadLogs(Engine& engine, Status* status, bool follow = false, int64_t since = 0) {
  std::vector<LogLine> lines;
  *status = engine.ContainerLogs(
      "c1", follow, since, [&](const LogLine& line) { lines.push_back(line); }, Never());
  return lines;
}

// --- Tests against the fake --------------------------------------------------------------------

TEST(HttpEngineTest, VersionTellsPodmanFromDocker) {
  FakeEngineServer server([](const RecordedRequest& request) {
    if (request.target == "/v1.41/version" && request.headers.count("host")) {
      static int calls = 0;
      if (calls++ == 0) {
        return Whole(200, R"({"Components":[{"Name":"Podman Engine","Version":"4.3.1"},{"Name":"Conmon"}],
                             "Version":"4.3.1","ApiVersion":"1.41"})");
      }
      return Whole(200, R"({"Components":[{"Name":"Engine","Version":"24.0.7"},{"Name":"containerd"}],
                           "Version":"24.0.7","ApiVersion":"1.43"})");
    }
    return Whole(404, EngineError("page not found"));
  });
  auto engine = EngineAt(server);
  auto podman = engine->Version();
  ASSERT_TRUE(podman.ok()) << podman.status().ToString();
  EXPECT_TRUE(podman->podman);
  EXPECT_EQ(podman->name, "Podman Engine");
  EXPECT_EQ(podman->version, "4.3.1");
  EXPECT_EQ(podman->api_version, "1.41");
  auto docker = engine->Version();
  ASSERT_TRUE(docker.ok()) << docker.status().ToString();
  EXPECT_FALSE(docker->podman);
  EXPECT_EQ(docker->name, "Engine");
  EXPECT_EQ(docker->api_version, "1.43");
  EXPECT_EQ(server.requests()[0].method, "GET");
}

TEST(HttpEngineTest, MissingSocketIsUnavailableAndNamesTheAddress) {
  HttpEngineOptions options;
  options.socket = "unix:///tmp/kiln-h1-no-such-dir/engine.sock";
  auto engine = OpenHttpEngine(options);
  EXPECT_EQ(engine->address(), "unix:///tmp/kiln-h1-no-such-dir/engine.sock");
  auto version = engine->Version();
  ASSERT_FALSE(version.ok());
  EXPECT_EQ(version.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(version.status().message().find(
                "the container engine at unix:///tmp/kiln-h1-no-such-dir/engine.sock is unreachable: "),
            std::string::npos)
      << version.status().message();
  Status logs = engine->ContainerLogs(
      "c", true, 0, [](const LogLine&) {}, Never());
  EXPECT_EQ(logs.code(), StatusCode::kUnavailable);
  // A socket file nobody listens on (an engine that died): refused at once.
  char tmpl[] = "/tmp/kiln-h1-stale-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::string path = dir + "/engine.sock";
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  options.socket = path;
  auto stale = OpenHttpEngine(options)->ListContainers("");
  ::close(fd);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(stale.status().message().find("unix://" + path + " is unreachable: Connection refused"), std::string::npos)
      << stale.status().message();
  // A plain path works as the socket too.
  options.socket = "/tmp/kiln-h1-no-such-dir/engine.sock";
  EXPECT_EQ(OpenHttpEngine(options)->address(), "unix:///tmp/kiln-h1-no-such-dir/engine.sock");
}

TEST(HttpEngineTest, ListContainersSendsTheLabelFilterAndReadsAChunkedAnswer) {
  std::string body = R"([{"Id":"aaa","Names":["/kiln-ab-1"],"Labels":{"kiln.server":"ab12","kiln.instance":"1"},
                          "State":"running"},
                         {"Id":"bbb","Names":["/kiln-ab-2"],"Labels":null,"State":"exited"}])";
  FakeEngineServer server([&](const RecordedRequest&) {
    // Split mid-token, as an engine's writes may be.
    return Chunked(200, {body.substr(0, 7), body.substr(7, 50), body.substr(57)}, 5);
  });
  auto engine = EngineAt(server);
  auto containers = engine->ListContainers("kiln.server=ab12");
  ASSERT_TRUE(containers.ok()) << containers.status().ToString();
  ASSERT_EQ(containers->size(), 2u);
  EXPECT_EQ((*containers)[0].id, "aaa");
  EXPECT_EQ((*containers)[0].name, "kiln-ab-1");
  EXPECT_EQ((*containers)[0].labels.at("kiln.instance"), "1");
  EXPECT_EQ((*containers)[0].state, "running");
  EXPECT_TRUE((*containers)[1].labels.empty());
  EXPECT_EQ(server.requests()[0].target,
            "/v1.41/containers/json?all=1&filters=%7B%22label%22%3A%5B%22kiln.server%3Dab12%22%5D%7D");
  // No filter: every container.
  ASSERT_TRUE(engine->ListContainers("").ok());
  EXPECT_EQ(server.requests()[1].target, "/v1.41/containers/json?all=1");
}

TEST(HttpEngineTest, InspectContainerReadsStateNameAndLabels) {
  FakeEngineServer server([](const RecordedRequest& request) {
    if (request.target == "/v1.41/containers/done/json") {
      return Whole(200, R"({"Id":"d1","Name":"/done","Config":{"Labels":{"kiln.instance":"i-1"}},
          "State":{"Status":"exited","Running":false,"Pid":0,"ExitCode":137,"OOMKilled":true,"Error":"",
                   "StartedAt":"2026-12-02T11:04:28.123456789Z","FinishedAt":"2026-12-02T11:04:30Z"}})");
    }
    if (request.target == "/v1.41/containers/new/json") {
      return Whole(200, R"({"Id":"n1","Name":"/new","Config":{"Labels":null},
          "State":{"Status":"created","Running":false,"Pid":0,"ExitCode":0,"OOMKilled":false,
                   "Error":"executable file not found","StartedAt":"0001-01-01T00:00:00Z",
                   "FinishedAt":"0001-01-01T00:00:00Z"}})");
    }
    if (request.target == "/v1.41/containers/podstop/json") {
      return Whole(200, R"({"Id":"p1","Name":"/podstop","State":{"Status":"stopped","Running":false,"ExitCode":3}})");
    }
    return Whole(200, R"({"Id":"r1","Name":"/run","State":{"Status":"running","Running":true,"Pid":4242,
        "StartedAt":"2026-12-02T11:04:28Z","FinishedAt":"0001-01-01T00:00:00Z"}})");
  });
  auto engine = EngineAt(server);
  auto done = engine->InspectContainer("done");
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->id, "d1");
  EXPECT_EQ(done->name, "done");
  EXPECT_EQ(done->labels.at("kiln.instance"), "i-1");
  EXPECT_EQ(done->status, "exited");
  EXPECT_FALSE(done->running);
  EXPECT_EQ(done->exit_code, 137);
  EXPECT_TRUE(done->oom_killed);
  EXPECT_EQ(done->started_millis, *ParseIso8601("2026-12-02T11:04:28.123Z"));
  EXPECT_EQ(done->finished_millis, *ParseIso8601("2026-12-02T11:04:30Z"));
  auto created = engine->InspectContainer("new");
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->started_millis, 0);
  EXPECT_EQ(created->finished_millis, 0);
  EXPECT_EQ(created->error, "executable file not found");
  EXPECT_TRUE(created->labels.empty());
  auto running = engine->InspectContainer("run");
  ASSERT_TRUE(running.ok());
  EXPECT_TRUE(running->running);
  EXPECT_EQ(running->pid, 4242);
  EXPECT_EQ(running->finished_millis, 0);
  EXPECT_GT(running->started_millis, 0);
  // Podman's "stopped" (exited, cleanup pending) reads as Docker's "exited".
  auto stopped = engine->InspectContainer("podstop");
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->status, "exited");
  EXPECT_EQ(stopped->exit_code, 3);
}

TEST(HttpEngineTest, CreateSendsNameAndBodyAndMapsAConflict) {
  FakeEngineServer server([](const RecordedRequest& request) {
    if (request.target == "/v1.41/containers/create?name=kiln-ab-taken") {
      return Whole(409, EngineError("Conflict. The container name \"/kiln-ab-taken\" is already in use"));
    }
    if (request.target == "/v1.41/containers/create?name=kiln-ab-podtaken") {
      return Whole(500, EngineError("container create: creating container storage: the container name "
                                    "\"kiln-ab-podtaken\" is already in use by 40d3. You have to remove that "
                                    "container to be able to reuse that name: that name is already in use"));
    }
    if (request.target == "/v1.41/containers/create?name=kiln-ab-noimage") {
      return Whole(404, EngineError("No such image: byo:1"));
    }
    return Whole(201, R"({"Id":"abc123","Warnings":[]})");
  });
  auto engine = EngineAt(server);
  json body = {{"Image", "localhost/byo:1"}, {"Cmd", {"train"}}};
  auto id = engine->CreateContainer("kiln-ab-1", body);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "abc123");
  RecordedRequest sent = server.requests()[0];
  EXPECT_EQ(sent.method, "POST");
  EXPECT_EQ(sent.target, "/v1.41/containers/create?name=kiln-ab-1");
  EXPECT_EQ(sent.headers["content-type"], "application/json");
  EXPECT_EQ(json::parse(sent.body), body);

  auto taken = engine->CreateContainer("kiln-ab-taken", body);
  EXPECT_EQ(taken.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(taken.status().message().find("is already in use"), std::string::npos);
  EXPECT_EQ(engine->CreateContainer("kiln-ab-podtaken", body).status().code(), StatusCode::kAlreadyExists);
  auto missing = engine->CreateContainer("kiln-ab-noimage", body);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "No such image: byo:1");
}

TEST(HttpEngineTest, ErrorAnswersMapToCodes) {
  FakeEngineServer server([](const RecordedRequest& request) {
    const std::string& t = request.target;
    if (t == "/v1.41/containers/gone/json" || t == "/v1.41/containers/gone?force=1&v=1") {
      return Whole(404, EngineError("no container with name or ID \"gone\" found: no such container"));
    }
    if (t == "/v1.41/containers/broken/json") {
      return Whole(500, EngineError("database is locked"));
    }
    if (t == "/v1.41/containers/text/json") {
      return Whole(502, "bad gateway\n");
    }
    if (t == "/v1.41/containers/podman-exited/kill?signal=15") {
      return Whole(500,
                   EngineError("can only kill running containers. x is in state exited: container state improper"));
    }
    if (t == "/v1.41/containers/docker-exited/kill?signal=15") {
      return Whole(409, EngineError("Container x is not running"));
    }
    if (t == "/v1.41/containers/other/kill?signal=15") {
      return Whole(500, EngineError("something else broke"));
    }
    if (t == "/v1.41/containers/started/start") {
      return Whole(304);
    }
    if (t == "/v1.41/containers/fresh/start" || t == "/v1.41/containers/fresh?force=1&v=1") {
      return Whole(204);
    }
    return Whole(400, EngineError("unexpected " + t));
  });
  auto engine = EngineAt(server);
  auto gone = engine->InspectContainer("gone");
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(gone.status().message(), "no container with name or ID \"gone\" found: no such container");
  EXPECT_EQ(engine->RemoveContainer("gone").code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine->RemoveContainer("fresh").ok());
  auto broken = engine->InspectContainer("broken");
  EXPECT_EQ(broken.status().code(), StatusCode::kInternal);
  EXPECT_EQ(broken.status().message(),
            "the container engine at " + server.socket() +
                " answered GET /v1.41/containers/broken/json with HTTP 500: database is locked");
  auto text = engine->InspectContainer("text");
  EXPECT_EQ(text.status().code(), StatusCode::kInternal);
  EXPECT_NE(text.status().message().find("HTTP 502: bad gateway"), std::string::npos) << text.status().message();
  EXPECT_EQ(engine->KillContainer("podman-exited", 15).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->KillContainer("docker-exited", 15).code(), StatusCode::kFailedPrecondition);
  Status other = engine->KillContainer("other", 15);
  EXPECT_EQ(other.code(), StatusCode::kInternal);
  EXPECT_NE(other.message().find("something else broke"), std::string::npos);
  EXPECT_TRUE(engine->StartContainer("started").ok());
  EXPECT_TRUE(engine->StartContainer("fresh").ok());
}

TEST(HttpEngineTest, ImagesInspectAndList) {
  FakeEngineServer server([](const RecordedRequest& request) {
    if (request.target == "/v1.41/images/registry.local:5000/byo/train:1/json") {
      return Whole(200, R"({"Id":"sha256:abc","RepoTags":["registry.local:5000/byo/train:1"],"Size":1234,
          "Created":"2026-12-02T11:03:47.464424889Z",
          "Config":{"Entrypoint":["python3","/opt/program/train.py"],"Cmd":null,"Env":["PATH=/usr/bin","A=b"],
                    "WorkingDir":"/opt/program"}})");
    }
    if (request.target == "/v1.41/images/shell/json") {
      return Whole(200, R"({"Id":"sha256:def","RepoTags":null,"Created":"2026-12-02T11:03:47Z",
                            "Config":{"Entrypoint":"/bin/sh -c run","Cmd":["serve"]}})");
    }
    if (request.target == "/v1.41/images/json") {
      return Whole(200, R"([{"Id":"sha256:abc","RepoTags":["localhost/kiln-exp-base:latest"],"Created":1796209427,
                             "Size":56269897}])");
    }
    return Whole(404, EngineError("failed to find image: No such image"));
  });
  auto engine = EngineAt(server);
  auto image = engine->InspectImage("registry.local:5000/byo/train:1");
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  EXPECT_EQ(image->id, "sha256:abc");
  EXPECT_EQ(image->repo_tags, std::vector<std::string>{"registry.local:5000/byo/train:1"});
  EXPECT_EQ(image->size_bytes, 1234);
  EXPECT_EQ(image->created_seconds, *ParseIso8601("2026-12-02T11:03:47Z") / 1000);
  EXPECT_EQ(image->entrypoint, (std::vector<std::string>{"python3", "/opt/program/train.py"}));
  EXPECT_TRUE(image->cmd.empty());
  EXPECT_EQ(image->env, (std::vector<std::string>{"PATH=/usr/bin", "A=b"}));
  EXPECT_EQ(image->working_dir, "/opt/program");
  auto shell = engine->InspectImage("shell");
  ASSERT_TRUE(shell.ok());
  EXPECT_EQ(shell->entrypoint, std::vector<std::string>{"/bin/sh -c run"});
  EXPECT_EQ(shell->cmd, std::vector<std::string>{"serve"});
  // A character no reference has is encoded rather than sent raw.
  EXPECT_EQ(engine->InspectImage("no such").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(server.requests()[2].target, "/v1.41/images/no%20such/json");
  auto images = engine->ListImages();
  ASSERT_TRUE(images.ok()) << images.status().ToString();
  ASSERT_EQ(images->size(), 1u);
  EXPECT_EQ((*images)[0].created_seconds, 1796209427);
  EXPECT_EQ((*images)[0].size_bytes, 56269897);
  EXPECT_EQ((*images)[0].repo_tags[0], "localhost/kiln-exp-base:latest");
}

TEST(HttpEngineTest, PullSendsRepositoryTagAndAuthAndReportsProgress) {
  // Concatenated objects (no newlines), one split across chunks inside a string with a brace.
  std::string stream =
      R"({"status":"Pulling from byo/train","id":"1"}{"status":"Downloading","id":"abc","progressDetail":)"
      R"({"current":100,"total":1000},"progress":"[=> ] {x}"})"
      "\n"
      R"({"status":"Pull complete","id":"abc","progressDetail":{}})";
  FakeEngineServer server([&](const RecordedRequest&) {
    return Chunked(200, {stream.substr(0, 60), stream.substr(60, 70), stream.substr(130)}, 5);
  });
  auto engine = EngineAt(server);
  std::vector<PullProgress> progress;
  Status pulled = engine->PullImage(
      "registry.local:5000/byo/train:1", "eyJ1c2VybmFtZSI6ImEifQ",
      [&](const PullProgress& p) { progress.push_back(p); }, Never());
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(progress[1].status, "Downloading");
  EXPECT_EQ(progress[1].layer, "abc");
  EXPECT_EQ(progress[1].current, 100);
  EXPECT_EQ(progress[1].total, 1000);
  EXPECT_EQ(progress[2].status, "Pull complete");
  RecordedRequest sent = server.requests()[0];
  EXPECT_EQ(sent.method, "POST");
  EXPECT_EQ(sent.target, "/v1.41/images/create?fromImage=registry.local%3A5000%2Fbyo%2Ftrain&tag=1");
  EXPECT_EQ(sent.headers["x-registry-auth"], "eyJ1c2VybmFtZSI6ImEifQ");

  ASSERT_TRUE(engine->PullImage("localhost:5000/plain", "", nullptr, Never()).ok());
  EXPECT_EQ(server.requests()[1].target, "/v1.41/images/create?fromImage=localhost%3A5000%2Fplain&tag=latest");
  EXPECT_EQ(server.requests()[1].headers.count("x-registry-auth"), 0u);
  ASSERT_TRUE(engine->PullImage("byo/train@sha256:0123", "", nullptr, Never()).ok());
  EXPECT_EQ(server.requests()[2].target, "/v1.41/images/create?fromImage=byo%2Ftrain&tag=sha256%3A0123");
}

TEST(HttpEngineTest, PullFailuresMapToCodes) {
  struct Case {
    std::string message;
    StatusCode code;
  } cases[] = {
      {"reading manifest 1 in registry.local/byo: manifest unknown: manifest unknown", StatusCode::kNotFound},
      {"repository registry.local/byo not found: name unknown", StatusCode::kNotFound},
      {"pull access denied for byo, repository does not exist or may require 'docker login': denied",
       StatusCode::kNotFound},
      {"Head \"https://r/v2/byo/manifests/1\": unauthorized: authentication required", StatusCode::kPermissionDenied},
      {"denied: requested access to the resource is denied", StatusCode::kPermissionDenied},
      {"pinging container registry localhost:5999: connection refused", StatusCode::kInternal},
  };
  std::string current;
  FakeEngineServer server([&](const RecordedRequest&) {
    // Podman: 200, progress, then the error object (error + errorDetail).
    json failure = {{"progressDetail", json::object()}, {"errorDetail", {{"message", current}}}, {"error", current}};
    return Chunked(200, {R"({"status":"Trying to pull"})"
                         "\n",
                         failure.dump() + "\n"});
  });
  auto engine = EngineAt(server);
  for (const Case& c : cases) {
    current = c.message;
    int seen = 0;
    Status pulled = engine->PullImage(
        "registry.local/byo:1", "", [&](const PullProgress&) { ++seen; }, Never());
    EXPECT_EQ(pulled.code(), c.code) << c.message;
    EXPECT_EQ(pulled.message(), c.message);
    EXPECT_EQ(seen, 1);
  }
}

TEST(HttpEngineTest, PullRefusedWithAnHttpErrorMapsToo) {
  FakeEngineServer server([](const RecordedRequest& request) {
    if (request.target.find("fromImage=missing") != std::string::npos) {
      return Whole(404, EngineError("pull access denied for missing, repository does not exist"));
    }
    if (request.target.find("fromImage=private") != std::string::npos) {
      return Whole(500, EngineError("Get https://r/v2/: unauthorized: incorrect username or password"));
    }
    return Whole(500, EngineError("no space left on device"));
  });
  auto engine = EngineAt(server);
  EXPECT_EQ(engine->PullImage("missing", "", nullptr, Never()).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine->PullImage("private", "", nullptr, Never()).code(), StatusCode::kPermissionDenied);
  Status full = engine->PullImage("other", "", nullptr, Never());
  EXPECT_EQ(full.code(), StatusCode::kInternal);
  EXPECT_EQ(full.message(), "no space left on device");
}

// The multiplexed body the logs tests use, and the lines it must give.
std::string MultiplexedLogs() {
  return Frame(1, "2026-12-02T11:04:28.123456789Z out\n") +                  // Docker: nanoseconds
         Frame(2, "2026-12-02T11:04:29Z err\n") +                            // Podman 4.3: whole seconds
         Frame(1, "2026-12-02T11:04:30Z one\n2026-12-02T11:04:31Z two\n") +  // two lines in a frame
         Frame(1, "2026-12-02T11:04:32Z par") +                              // a partial entry ...
         Frame(2, "2026-12-02T11:04:32Z e2\n") +                             // (other stream in between)
         Frame(1, "2026-12-02T11:04:33Z tial\n") +                           // ... continued by the next entry
         Frame(1, "2026-12-02T11:04:34Z spl") + Frame(1, "it 2026 \n") +     // continued without a stamp
         Frame(1, "2026-12-02T11:04:35Z \n") +                               // an empty line
         Frame(2, "2026-12-02T11:04:36Z last");                              // no final newline
}

void ExpectMultiplexedLines(const std::vector<LogLine>& lines) {
  struct Want {
    bool err;
    std::string stamp;
    std::string text;
  } want[] = {
      {false, "2026-12-02T11:04:28.123Z", "out"},     {true, "2026-12-02T11:04:29Z", "err"},
      {false, "2026-12-02T11:04:30Z", "one"},         {false, "2026-12-02T11:04:31Z", "two"},
      {true, "2026-12-02T11:04:32Z", "e2"},           {false, "2026-12-02T11:04:32Z", "partial"},
      {false, "2026-12-02T11:04:34Z", "split 2026 "}, {false, "2026-12-02T11:04:35Z", ""},
      {true, "2026-12-02T11:04:36Z", "last"},
  };
  ASSERT_EQ(lines.size(), std::size(want));
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].stderr_stream, want[i].err) << i;
    EXPECT_EQ(lines[i].engine_millis, *ParseIso8601(want[i].stamp)) << i;
    EXPECT_EQ(lines[i].text, want[i].text) << i;
  }
}

TEST(HttpEngineTest, LogsDemultiplexAWholeBody) {
  FakeEngineServer server([](const RecordedRequest&) { return Whole(200, MultiplexedLogs()); });
  auto engine = EngineAt(server);
  Status status;
  auto lines = ReadLogs(*engine, &status);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectMultiplexedLines(lines);
  EXPECT_EQ(server.requests()[0].target, "/v1.41/containers/c1/logs?stdout=1&stderr=1&timestamps=1");
}

TEST(HttpEngineTest, LogsDemultiplexWhenEveryByteArrivesAlone) {
  std::string body = MultiplexedLogs();
  std::vector<std::string> bytes;
  for (char c : body) {
    bytes.emplace_back(1, c);
  }
  // A pause between chunks makes each byte a separate read: headers, timestamps and text split
  // at every possible place.
  FakeEngineServer server([&](const RecordedRequest&) { return Chunked(200, bytes, 1); });
  auto engine = EngineAt(server);
  Status status;
  auto lines = ReadLogs(*engine, &status, /*follow=*/true, /*since=*/1796209000);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectMultiplexedLines(lines);
  EXPECT_EQ(server.requests()[0].target,
            "/v1.41/containers/c1/logs?stdout=1&stderr=1&timestamps=1&follow=1&since=1796209000");
}

TEST(HttpEngineTest, LogsOfATtyAreRawAndMayEndWithTheConnection) {
  // A TTY's output has no frames; this answer has neither Content-Length nor chunks: it ends when
  // the engine closes the connection.
  FakeEngineServer server([](const RecordedRequest&) {
    return Script{{"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n",
                   "2026-12-02T11:04:28Z hello\r\n2026-12-02T11:", "04:29.5Z world\n2026-12-02T11:04:30Z end"},
                  5};
  });
  auto engine = EngineAt(server);
  Status status;
  auto lines = ReadLogs(*engine, &status);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].text, "hello");
  EXPECT_EQ(lines[1].text, "world");
  EXPECT_EQ(lines[1].engine_millis, *ParseIso8601("2026-12-02T11:04:29.500Z"));
  EXPECT_EQ(lines[2].text, "end");
  for (const LogLine& line : lines) {
    EXPECT_FALSE(line.stderr_stream);
  }
}

TEST(HttpEngineTest, LogsDeliverLongLinesInPieces) {
  // Docker splits a long line into 16 KiB entries, each with its own timestamp: 600 KiB of 'x'
  // followed by a short line.
  const size_t kTotal = 600 * 1024;
  std::string body;
  for (size_t done = 0; done < kTotal; done += 16 * 1024) {
    std::string stamp = done == 0 ? "2026-12-02T11:04:28.5Z " : "2026-12-02T11:04:29Z ";
    body += Frame(1, stamp + std::string(std::min<size_t>(16 * 1024, kTotal - done), 'x'));
  }
  body += Frame(1, "\n") + Frame(1, "2026-12-02T11:04:30Z next\n");
  FakeEngineServer server([&](const RecordedRequest&) { return Whole(200, body); });
  auto engine = EngineAt(server);
  Status status;
  auto lines = ReadLogs(*engine, &status);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].text.size(), 256u * 1024);
  EXPECT_EQ(lines[1].text.size(), 256u * 1024);
  EXPECT_EQ(lines[2].text.size(), kTotal - 512u * 1024);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i].engine_millis, *ParseIso8601("2026-12-02T11:04:28.500Z")) << i;
    EXPECT_EQ(lines[i].text.find_first_not_of('x'), std::string::npos) << i;
  }
  EXPECT_EQ(lines[3].text, "next");
}

TEST(HttpEngineTest, LogsReportTheEnginesOwnErrorStream) {
  FakeEngineServer server([](const RecordedRequest&) {
    return Whole(200, Frame(1, "2026-12-02T11:04:28Z ok\n") + Frame(3, "error from daemon in stream: log file gone"));
  });
  auto engine = EngineAt(server);
  Status status;
  auto lines = ReadLogs(*engine, &status);
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("log file gone"), std::string::npos);
  ASSERT_EQ(lines.size(), 1u);
}

TEST(HttpEngineTest, LogsOfAMissingContainerAreNotFound) {
  FakeEngineServer server([](const RecordedRequest&) { return Whole(404, EngineError("No such container: c1")); });
  auto engine = EngineAt(server);
  Status status;
  auto lines = ReadLogs(*engine, &status);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "No such container: c1");
  EXPECT_TRUE(lines.empty());
}

TEST(HttpEngineTest, AStalledCallTimesOut) {
  // One engine says nothing at all; the other stops in the middle of its head.
  FakeEngineServer silent([](const RecordedRequest&) { return Script{{}, 0, 10000}; });
  FakeEngineServer halfway([](const RecordedRequest&) { return Script{{"HTTP/1.1 200 OK\r\nContent-"}, 0, 10000}; });
  for (FakeEngineServer* server : {&silent, &halfway}) {
    auto engine = EngineAt(*server, /*timeout_ms=*/300);
    auto start = SteadyClock::now();
    auto state = engine->InspectContainer("c1");
    int64_t took = ElapsedMs(start);
    ASSERT_FALSE(state.ok());
    EXPECT_EQ(state.status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(state.status().message().find("did not answer GET /v1.41/containers/c1/json within 300 ms"),
              std::string::npos)
        << state.status().message();
    EXPECT_GE(took, 290);
    EXPECT_LT(took, 5000);  // far below the 10 s the engine stays quiet
  }
}

TEST(HttpEngineTest, ACutAnswerIsUnavailable) {
  FakeEngineServer server(
      [](const RecordedRequest&) { return Script{{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"Id\":"}}; });
  auto engine = EngineAt(server);
  auto state = engine->InspectContainer("c1");
  EXPECT_EQ(state.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(state.status().message().find("is unreachable: the connection closed before the whole answer"),
            std::string::npos)
      << state.status().message();
  FakeEngineServer garbage([](const RecordedRequest&) { return Script{{"SSH-2.0-OpenSSH\r\n\r\n"}}; });
  EXPECT_EQ(EngineAt(garbage)->Version().status().code(), StatusCode::kInternal);
}

TEST(HttpEngineTest, AnEngineThatDiesWhileFollowingIsUnavailable) {
  FakeEngineServer server([](const RecordedRequest&) {
    Script script = Chunked(200, {Frame(1, "2026-12-02T11:04:28Z first\n")});
    script.pieces.pop_back();  // the connection closes without the last chunk
    return script;
  });
  auto engine = EngineAt(server);
  std::vector<std::string> texts;
  Status status = engine->ContainerLogs(
      "c1", true, 0, [&](const LogLine& line) { texts.push_back(line.text); }, Never());
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_EQ(texts, std::vector<std::string>{"first"});
}

TEST(HttpEngineTest, CancelStopsAFollowedLogThatIsQuiet) {
  FakeEngineServer server([](const RecordedRequest&) {
    Script script = Chunked(200, {Frame(1, "2026-12-02T11:04:28Z first\n")});
    script.pieces.pop_back();  // no last chunk: the container keeps running, silent
    script.hold_ms = 20000;
    return script;
  });
  auto engine = EngineAt(server);
  std::atomic<bool> stop{false};
  std::vector<std::string> texts;
  std::thread canceller;
  SteadyClock::time_point cancelled_at;
  Status status = engine->ContainerLogs(
      "c1", true, 0,
      [&](const LogLine& line) {
        texts.push_back(line.text);
        canceller = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          cancelled_at = SteadyClock::now();
          stop = true;
        });
      },
      [&] { return stop.load(); });
  int64_t after_cancel = ElapsedMs(cancelled_at);
  if (canceller.joinable()) {
    canceller.join();
  }
  EXPECT_EQ(status.code(), StatusCode::kAborted) << status.ToString();
  EXPECT_EQ(texts, std::vector<std::string>{"first"});
  // engine.h: asked at least every 200 ms; the bound leaves room for a loaded machine and is still
  // far below the 20 s the engine stays quiet.
  EXPECT_LE(after_cancel, 3000);
}

TEST(HttpEngineTest, CancelStopsAPullThatKeepsTalking) {
  // The engine sends progress every 10 ms for ever: the stream never waits long, and still stops.
  std::vector<std::string> messages(2000, R"({"status":"Downloading","id":"abc"})"
                                          "\n");
  FakeEngineServer server([&](const RecordedRequest&) { return Chunked(200, messages, 10); });
  auto engine = EngineAt(server);
  int seen = 0;
  Status status = engine->PullImage(
      "byo:1", "", [&](const PullProgress&) { ++seen; }, [&] { return seen >= 5; });
  EXPECT_EQ(status.code(), StatusCode::kAborted) << status.ToString();
  EXPECT_GE(seen, 5);
  EXPECT_LT(seen, 50);
}

TEST(HttpEngineTest, StatsReadCpuAndMemory) {
  FakeEngineServer server([](const RecordedRequest&) {
    return Whole(200, R"({"cpu_stats":{"cpu_usage":{"total_usage":123456789}},
                          "memory_stats":{"usage":1048576,"limit":2147483648}})");
  });
  auto engine = EngineAt(server);
  auto stats = engine->Stats("c1");
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->cpu_total_usec, 123456u);
  EXPECT_EQ(stats->memory_bytes, 1048576u);
  EXPECT_EQ(stats->memory_limit_bytes, 2147483648u);
  EXPECT_EQ(server.requests()[0].target, "/v1.41/containers/c1/stats?stream=false&one-shot=true");
}

TEST(HttpEngineTest, ClientCallsMayRunAtOnce) {
  FakeEngineServer server([](const RecordedRequest& request) { return Whole(200, "\"" + request.target + "\""); });
  EngineClient client(server.socket());
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 10; ++j) {
        std::string target = "/t" + std::to_string(i) + "-" + std::to_string(j);
        EngineHttpRequest request;
        request.target = target;
        auto response = client.Call(request, 5000);
        if (response.ok() && response->status == 200 && response->body == "\"" + target + "\"") {
          ++good;
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(good.load(), 40);
}

// --- Live: Podman's Docker-compatible socket ----------------------------------------------------

constexpr char kPodmanSocket[] = "/run/podman/podman.sock";
constexpr char kBaseImage[] = "localhost/kiln-unit-base:latest";

class PodmanLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kPodmanSocket)) {
      GTEST_SKIP() << "no Podman socket at " << kPodmanSocket;
    }
    HttpEngineOptions options;
    options.socket = std::string("unix://") + kPodmanSocket;
    engine_ = OpenHttpEngine(options);
    auto images = engine_->ListImages();
    ASSERT_TRUE(images.ok()) << images.status().ToString();
    bool found = false;
    for (const ImageInfo& image : *images) {
      for (const std::string& tag : image.repo_tags) {
        found = found || tag == kBaseImage;
      }
    }
    if (!found) {
      GTEST_SKIP() << kBaseImage << " (an image with /bin/sh) is not in Podman";
    }
  }

  void TearDown() override {
    for (const std::string& name : created_) {
      if (engine_) {
        (void)engine_->RemoveContainer(name);
      }
    }
  }

  // A container of the base image running `script` under sh, removed at TearDown.
  std::string Create(const std::string& suffix, const std::string& script) {
    std::string name = "kiln-h1-" + std::to_string(::getpid()) + "-" + suffix;
    created_.push_back(name);
    json body = {{"Image", kBaseImage}, {"Cmd", {"sh", "-c", script}}, {"Labels", {{"kiln.h1", name}}}};
    auto id = engine_->CreateContainer(name, body);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : name;
  }

  Result<ContainerState> WaitExited(const std::string& id) {
    for (int i = 0; i < 200; ++i) {
      auto state = engine_->InspectContainer(id);
      if (!state.ok() || !state->running) {
        return state;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return Status::DeadlineExceeded("container " + id + " still runs after 10 s");
  }

  std::unique_ptr<Engine> engine_;
  std::vector<std::string> created_;
};

TEST_F(PodmanLiveTest, VersionSaysPodman) {
  auto version = engine_->Version();
  ASSERT_TRUE(version.ok()) << version.status().ToString();
  EXPECT_TRUE(version->podman);
  EXPECT_NE(version->name.find("Podman"), std::string::npos);
  EXPECT_FALSE(version->api_version.empty());
}

TEST_F(PodmanLiveTest, InspectImageByANameWithSlashAndColon) {
  auto image = engine_->InspectImage(kBaseImage);
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  EXPECT_EQ(image->id.rfind("sha256:", 0), 0u);
  EXPECT_GT(image->size_bytes, 0);
  EXPECT_GT(image->created_seconds, 1600000000);
  EXPECT_EQ(engine_->InspectImage("localhost/kiln-h1-no-such-image:1").status().code(), StatusCode::kNotFound);
}

TEST_F(PodmanLiveTest, RunsAContainerAndReadsItsExitAndLogs) {
  int64_t before = NowMillis();
  std::string id = Create("run", "echo out; echo err >&2; exit 3");
  ASSERT_TRUE(engine_->StartContainer(id).ok());
  auto state = WaitExited(id);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->status, "exited");
  EXPECT_EQ(state->exit_code, 3);
  EXPECT_FALSE(state->oom_killed);
  EXPECT_EQ(state->name, created_.back());
  EXPECT_EQ(state->labels.at("kiln.h1"), created_.back());
  EXPECT_GE(state->started_millis, before - 2000);
  // Podman 4.3 may record FinishedAt a few ms before StartedAt for a command this short.
  EXPECT_GE(state->finished_millis, state->started_millis - 1000);

  std::vector<LogLine> lines;
  // follow=1 on an exited container: the stream ends by itself.
  Status logs = engine_->ContainerLogs(
      id, true, 0, [&](const LogLine& line) { lines.push_back(line); }, Never());
  ASSERT_TRUE(logs.ok()) << logs.ToString();
  ASSERT_EQ(lines.size(), 2u);
  std::map<std::string, bool> stderr_of;
  for (const LogLine& line : lines) {
    stderr_of[line.text] = line.stderr_stream;
    EXPECT_GE(line.engine_millis, before - 2000);  // whole seconds on Podman 4.3
    EXPECT_LE(line.engine_millis, NowMillis() + 1000);
  }
  EXPECT_EQ(stderr_of.count("out"), 1u);
  EXPECT_FALSE(stderr_of["out"]);
  EXPECT_TRUE(stderr_of["err"]);

  auto listed = engine_->ListContainers("kiln.h1=" + created_.back());
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, created_.back());
  EXPECT_EQ((*listed)[0].state, "exited");

  ASSERT_TRUE(engine_->RemoveContainer(id).ok());
  EXPECT_EQ(engine_->InspectContainer(id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->RemoveContainer(id).code(), StatusCode::kNotFound);
}

TEST_F(PodmanLiveTest, FollowsLogsWhileTheContainerRuns) {
  std::string id = Create("follow", "echo a; sleep 1; echo b");
  ASSERT_TRUE(engine_->StartContainer(id).ok());
  std::vector<std::string> texts;
  auto start = SteadyClock::now();
  Status logs = engine_->ContainerLogs(
      id, true, 0, [&](const LogLine& line) { texts.push_back(line.text); }, [&] { return ElapsedMs(start) > 20000; });
  ASSERT_TRUE(logs.ok()) << logs.ToString();
  EXPECT_EQ(texts, (std::vector<std::string>{"a", "b"}));
}

TEST_F(PodmanLiveTest, JoinsALongLineTheEngineSplit) {
  // 300,000 bytes without a newline but the last: the engine's log stores it in parts; Kiln gives
  // it back as one 256 KiB piece and the rest, then the next line.
  std::string id = Create("long", "python3 -c \"import sys; sys.stdout.write('x' * 300000 + '\\nnext\\n')\"");
  ASSERT_TRUE(engine_->StartContainer(id).ok());
  auto state = WaitExited(id);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(state->exit_code, 0) << state->error;
  std::vector<LogLine> lines;
  Status logs = engine_->ContainerLogs(
      id, false, 0, [&](const LogLine& line) { lines.push_back(line); }, Never());
  ASSERT_TRUE(logs.ok()) << logs.ToString();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].text, std::string(256 * 1024, 'x'));
  EXPECT_EQ(lines[1].text, std::string(300000 - 256 * 1024, 'x'));
  EXPECT_EQ(lines[1].engine_millis, lines[0].engine_millis);
  EXPECT_EQ(lines[2].text, "next");
}

TEST_F(PodmanLiveTest, APullFromAnUnreachableRegistryFailsWithTheEnginesWords) {
  // Nothing listens on port 1: Podman answers 200 and then an error message in the stream.
  Status pulled = engine_->PullImage("localhost:1/kiln-h1/none:1", "", nullptr, Never());
  EXPECT_EQ(pulled.code(), StatusCode::kInternal) << pulled.ToString();
  EXPECT_NE(pulled.message().find("localhost:1"), std::string::npos) << pulled.ToString();
}

TEST_F(PodmanLiveTest, RemovesARunningContainerThatIgnoresTermWithinTheCallTimeout) {
  // sh as PID 1 ignores SIGTERM: the engine's own forced remove would wait its StopTimeout (30 s)
  // before SIGKILL and outlast a 10 s call timeout; RemoveContainer kills it first.
  std::string name = "kiln-h1-" + std::to_string(::getpid()) + "-termdeaf";
  created_.push_back(name);
  json body = {{"Image", kBaseImage}, {"Cmd", {"sh", "-c", "sleep 60"}}, {"StopTimeout", 30}};
  auto id = engine_->CreateContainer(name, body);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(engine_->StartContainer(*id).ok());
  HttpEngineOptions options;
  options.socket = std::string("unix://") + kPodmanSocket;
  options.timeout_ms = 10000;
  Status removed = OpenHttpEngine(options)->RemoveContainer(*id);
  ASSERT_TRUE(removed.ok()) << removed.ToString();
  EXPECT_EQ(engine_->InspectContainer(*id).status().code(), StatusCode::kNotFound);
}

TEST_F(PodmanLiveTest, KillStatsAndADuplicateName) {
  std::string id = Create("kill", "sleep 30");
  ASSERT_TRUE(engine_->StartContainer(id).ok());
  auto running = engine_->InspectContainer(id);
  ASSERT_TRUE(running.ok()) << running.status().ToString();
  EXPECT_TRUE(running->running);
  EXPECT_GT(running->pid, 0);
  EXPECT_EQ(running->finished_millis, 0);
  auto stats = engine_->Stats(id);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_GT(stats->memory_bytes, 0u);

  json body = {{"Image", kBaseImage}, {"Cmd", {"true"}}};
  auto duplicate = engine_->CreateContainer(created_.back(), body);
  EXPECT_EQ(duplicate.status().code(), StatusCode::kAlreadyExists) << duplicate.status().ToString();

  ASSERT_TRUE(engine_->KillContainer(id, 9).ok());
  auto state = WaitExited(id);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->exit_code, 137);
  EXPECT_EQ(engine_->KillContainer(id, 9).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine_->RemoveContainer(id).ok());
  EXPECT_EQ(engine_->KillContainer(id, 9).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln::runtime::docker
