#include "cli/remote_command.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <libssh/libssh.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <sstream>
#include <thread>

#include "base/encoding.h"

namespace kiln::cli {
namespace {

using nlohmann::json;

SshSettings Settings() {
  SshSettings s;
  s.kiln_path = "/opt/kiln/bin/kiln";
  s.endpoint_url = "http://10.0.0.5:5456";
  s.key_path = "/home/me/.ssh/sagemaker-ssh-gw";
  s.known_hosts = "/home/me/.ssh/kiln_known_hosts";
  s.host_key_alias = "kiln-10.0.0.5-5456";
  return s;
}

TEST(RemoteCommandTest, ParsesEndpoints) {
  auto e = ParseEndpoint("http://127.0.0.1:5456/");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->url, "http://127.0.0.1:5456");
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 5456);
  EXPECT_EQ(e->authority, "127.0.0.1:5456");
  auto v6 = ParseEndpoint("http://[::1]:9000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9000);
  EXPECT_EQ(v6->authority, "[::1]:9000");
  auto plain = ParseEndpoint("http://kiln.example/base");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->port, 80);
  EXPECT_EQ(plain->authority, "kiln.example");
  EXPECT_EQ(ParseEndpoint("https://kiln.example").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEndpoint("127.0.0.1:5456").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEndpoint("http://h:70000").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEndpoint("http://h:x1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEndpoint("http://:80").status().code(), StatusCode::kInvalidArgument);
}

TEST(RemoteCommandTest, QuotesForTheShellOnlyWhenNeeded) {
  EXPECT_EQ(ShellQuote("/usr/bin/kiln"), "/usr/bin/kiln");
  EXPECT_EQ(ShellQuote("http://h:1"), "http://h:1");
  EXPECT_EQ(ShellQuote("/my dir/kiln"), "'/my dir/kiln'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote("$(x);y"), "'$(x);y'");
  EXPECT_EQ(ShellQuote(""), "''");
}

TEST(RemoteCommandTest, AliasesAreSafeHostNames) {
  EXPECT_EQ(DefaultAlias("training-job/my-job/algo-1"), "training-job-my-job-algo-1");
  EXPECT_EQ(DefaultAlias("sagemaker-training-job:J_algo-2"), "sagemaker-training-job-J_algo-2");
  EXPECT_EQ(DefaultAlias("algo-2.job.training.kiln"), "algo-2.job.training.kiln");
  EXPECT_EQ(DefaultAlias("a//b/"), "a-b");
  EXPECT_EQ(DefaultAlias("///"), "kiln");
  RemoteEndpoint e;
  e.host = "::1";
  e.port = 5456;
  EXPECT_EQ(HostKeyAlias(e), "kiln---1-5456");
  e.host = "kiln.example.com";
  EXPECT_EQ(HostKeyAlias(e), "kiln-kiln.example.com-5456");
}

TEST(RemoteCommandTest, ProxyCommandQuotesWordsAndDoublesPercent) {
  SshSettings s = Settings();
  EXPECT_EQ(ProxyCommandLine(s, "training-job/j/algo-1"),
            "/opt/kiln/bin/kiln ssh-proxy --endpoint-url http://10.0.0.5:5456 --key /home/me/.ssh/sagemaker-ssh-gw "
            "training-job/j/algo-1");
  EXPECT_EQ(ProxyCommandLine(s, "%h"),
            "/opt/kiln/bin/kiln ssh-proxy --endpoint-url http://10.0.0.5:5456 --key /home/me/.ssh/sagemaker-ssh-gw %h");
  s.kiln_path = "/a b/100%/kiln";
  s.proxy_flags = {"--config", "/etc/kiln.json"};
  EXPECT_EQ(ProxyCommandLine(s, "j%x"),
            "'/a b/100%%/kiln' ssh-proxy --config /etc/kiln.json --endpoint-url http://10.0.0.5:5456 --key "
            "/home/me/.ssh/sagemaker-ssh-gw j%%x");
}

TEST(RemoteCommandTest, SshArgvForAShell) {
  SshCommand c;
  c.target = "training-job/j/algo-1";
  c.tty = true;
  std::vector<std::string> want = {"ssh",
                                   "-o",
                                   "ProxyCommand=/opt/kiln/bin/kiln ssh-proxy --endpoint-url http://10.0.0.5:5456 "
                                   "--key /home/me/.ssh/sagemaker-ssh-gw training-job/j/algo-1",
                                   "-o",
                                   "HostKeyAlias=kiln-10.0.0.5-5456",
                                   "-o",
                                   "UserKnownHostsFile=/home/me/.ssh/kiln_known_hosts",
                                   "-o",
                                   "StrictHostKeyChecking=accept-new",
                                   "-o",
                                   "ServerAliveInterval=30",
                                   "-i",
                                   "/home/me/.ssh/sagemaker-ssh-gw",
                                   "-o",
                                   "IdentitiesOnly=yes",
                                   "-t",
                                   "--",
                                   "root@training-job-j-algo-1"};
  EXPECT_EQ(SshArgv(Settings(), c), want);
}

TEST(RemoteCommandTest, SshArgvWithForwardsAndACommand) {
  SshCommand c;
  c.target = "J";
  c.local_forwards = {"6006:localhost:6006", "6007:algo-2:6006"};
  c.remote_forwards = {"12345:localhost:12345"};
  c.command = {"ls", "-la", "/opt/ml"};
  std::vector<std::string> argv = SshArgv(Settings(), c);
  std::vector<std::string> tail(argv.begin() + 15, argv.end());
  std::vector<std::string> want = {"-L",     "6006:localhost:6006",
                                   "-L",     "6007:algo-2:6006",
                                   "-R",     "12345:localhost:12345",
                                   "--",     "root@J",
                                   "ls",     "-la",
                                   "/opt/ml"};
  EXPECT_EQ(tail, want);
  EXPECT_EQ(argv[2].substr(argv[2].size() - 2), " J");  // the target goes to the proxy as typed (case kept)
}

TEST(RemoteCommandTest, SshArgvForPortForward) {
  SshCommand c;
  c.target = "j";
  c.no_command = true;
  c.local_forwards = {"8080:localhost:6006"};
  std::vector<std::string> argv = SshArgv(Settings(), c);
  std::vector<std::string> tail(argv.begin() + 15, argv.end());
  std::vector<std::string> want = {"-N", "-o", "ExitOnForwardFailure=yes", "-L", "8080:localhost:6006", "--", "root@j"};
  EXPECT_EQ(tail, want);
}

TEST(RemoteCommandTest, SshConfigBlock) {
  std::string block = SshConfigBlock(Settings(), "training-job/j/algo-1", "sagemaker-training");
  std::string want =
      "# Kiln remote access to training-job/j/algo-1 (http://10.0.0.5:5456). Add to ~/.ssh/config, then: ssh "
      "sagemaker-training\n"
      "Host sagemaker-training\n"
      "  User root\n"
      "  ProxyCommand /opt/kiln/bin/kiln ssh-proxy --endpoint-url http://10.0.0.5:5456 --key "
      "/home/me/.ssh/sagemaker-ssh-gw training-job/j/algo-1\n"
      "  IdentityFile /home/me/.ssh/sagemaker-ssh-gw\n"
      "  IdentitiesOnly yes\n"
      "  UserKnownHostsFile ~/.ssh/kiln_known_hosts\n"
      "  StrictHostKeyChecking accept-new\n"
      "  HostKeyAlias kiln-10.0.0.5-5456\n"
      "  ServerAliveInterval 30\n"
      "\n"
      "# Or any host of any training job, as `ssh algo-<n>.<job>.training.kiln`:\n"
      "# Host *.training.kiln\n"
      "#   User root\n"
      "#   ProxyCommand /opt/kiln/bin/kiln ssh-proxy --endpoint-url http://10.0.0.5:5456 --key "
      "/home/me/.ssh/sagemaker-ssh-gw %h\n"
      "#   IdentityFile /home/me/.ssh/sagemaker-ssh-gw\n"
      "#   IdentitiesOnly yes\n"
      "#   UserKnownHostsFile ~/.ssh/kiln_known_hosts\n"
      "#   StrictHostKeyChecking accept-new\n"
      "#   HostKeyAlias kiln-10.0.0.5-5456\n"
      "#   ServerAliveInterval 30\n";
  EXPECT_EQ(block, want);
}

TEST(RemoteCommandTest, ResourceOfEveryTargetForm) {
  EXPECT_EQ(ResourceOfTarget("training-job/j/algo-2"), "training-job/j");
  EXPECT_EQ(ResourceOfTarget("training-job/j"), "training-job/j");
  EXPECT_EQ(ResourceOfTarget("sagemaker-training-job:my-job_algo-3"), "training-job/my-job");
  EXPECT_EQ(ResourceOfTarget("algo-2.my-job.training.kiln"), "training-job/my-job");
  EXPECT_EQ(ResourceOfTarget("my-job"), "my-job");
  EXPECT_EQ(ResourceOfTarget("endpoint/ep/AllTraffic/i-1"), "endpoint/ep");
  EXPECT_EQ(ResourceOfTarget("endpoint/ep"), "endpoint/ep");
  EXPECT_EQ(ResourceOfTarget("arn:aws:sagemaker:us-east-1:000000000000:training-job/j"),
            "arn:aws:sagemaker:us-east-1:000000000000:training-job/j");
}

json TwoHosts(const std::string& state1, const std::string& state2) {
  return json{{"ResourceArn", "arn:aws:sagemaker:us-east-1:000000000000:training-job/j"},
              {"ResourceStatus", "InProgress"},
              {"SecondaryStatus", "Training"},
              {"AccessEnabled", true},
              {"Targets",
               {{{"Target", "training-job/j/algo-1"},
                 {"Alias", "sagemaker-training-job:j_algo-1"},
                 {"InstanceId", "training-j-algo-1"},
                 {"Hostname", "algo-1"},
                 {"State", state1}},
                {{"Target", "training-job/j/algo-2"},
                 {"Alias", "sagemaker-training-job:j_algo-2"},
                 {"InstanceId", "training-j-algo-2"},
                 {"Hostname", "algo-2"},
                 {"State", state2}}}}};
}

TEST(RemoteCommandTest, FindsTheTargetEntryByAnyForm) {
  json answer = TwoHosts("Ready", "Pending");
  auto host_of = [&](std::string_view t) {
    const json* e = FindTargetEntry(answer, t);
    return e == nullptr ? std::string("none") : (*e)["Hostname"].get<std::string>();
  };
  EXPECT_EQ(host_of("training-job/j/algo-2"), "algo-2");
  EXPECT_EQ(host_of("sagemaker-training-job:j_algo-2"), "algo-2");
  EXPECT_EQ(host_of("algo-2.j.training.kiln"), "algo-2");
  EXPECT_EQ(host_of("training-job/j"), "algo-1");
  EXPECT_EQ(host_of("j"), "algo-1");
  EXPECT_EQ(host_of("training-job/j/algo-7"), "none");
  EXPECT_EQ(FindTargetEntry(json{{"Targets", json::array()}}, "j"), nullptr);
}

struct FakeTargets {
  std::deque<Result<json>> answers;
  int calls = 0;
  TargetsFetch fetch() {
    return [this]() -> Result<json> {
      ++calls;
      Result<json> next = answers.front();
      if (answers.size() > 1) answers.pop_front();
      return next;
    };
  }
};

TEST(RemoteCommandTest, WaitPollsUntilTheTargetIsReady) {
  FakeTargets fake;
  json pending = TwoHosts("Pending", "Pending");
  pending["SecondaryStatus"] = "Starting";
  fake.answers = {pending, pending, TwoHosts("Pending", "Ready"), TwoHosts("Ready", "Ready")};
  std::vector<int> sleeps;
  std::ostringstream progress;
  Status s = WaitForTarget(fake.fetch(), "training-job/j/algo-2", 900, 5, progress,
                           [&](int seconds) { sleeps.push_back(seconds); });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(fake.calls, 3);
  EXPECT_EQ(sleeps, (std::vector<int>{5, 5}));
  // One line per change of state, not per poll.
  EXPECT_EQ(progress.str(), "kiln connect: waiting for training-job/j/algo-2: InProgress (Starting), target Pending\n");
}

TEST(RemoteCommandTest, WaitFailsFastWithTheFailureReason) {
  FakeTargets fake;
  json failed = TwoHosts("Gone", "Gone");
  failed["ResourceStatus"] = "Failed";
  failed["FailureReason"] = "AlgorithmError: exit 1";
  fake.answers = {TwoHosts("Pending", "Pending"), failed};
  std::ostringstream progress;
  Status s = WaitForTarget(fake.fetch(), "j", 900, 5, progress, [](int) {});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("is Failed: AlgorithmError: exit 1"), std::string::npos) << s.message();
}

TEST(RemoteCommandTest, WaitFailsFastWhenAccessIsNotEnabled) {
  FakeTargets fake;
  json off = TwoHosts("Ready", "Ready");
  off["AccessEnabled"] = false;
  fake.answers = {off};
  std::ostringstream progress;
  Status s = WaitForTarget(fake.fetch(), "j", 900, 5, progress, [](int) {});
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("RemoteDebugConfig={EnableRemoteDebug=true}"), std::string::npos) << s.message();
  EXPECT_EQ(fake.calls, 1);
}

TEST(RemoteCommandTest, WaitTimesOutAndPassesFetchErrorsOn) {
  FakeTargets fake;
  fake.answers = {TwoHosts("Pending", "Pending")};
  std::ostringstream progress;
  int slept = 0;
  Status s = WaitForTarget(fake.fetch(), "j", 12, 5, progress, [&](int seconds) { slept += seconds; });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(slept, 12);  // 5 + 5 + 2: never past the timeout
  FakeTargets missing;
  missing.answers = {Result<json>(Status::NotFound("ResourceNotFound: no training job j"))};
  EXPECT_EQ(WaitForTarget(missing.fetch(), "j", 900, 5, progress, [](int) {}).code(), StatusCode::kNotFound);
}

class TempHome : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-remote-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(RemoveAll(dir_).ok()); }
  std::string dir_;
};

TEST_F(TempHome, CreatesAnEd25519PairOnceWithPrivateModes) {
  std::string key = dir_ + "/.ssh/sagemaker-ssh-gw";
  std::ostringstream notice;
  auto line = EnsureKeyPair(key, notice);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_EQ(line->rfind("ssh-ed25519 AAAA", 0), 0u) << *line;
  EXPECT_NE(notice.str().find("created the SSH key pair " + key), std::string::npos);
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/.ssh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // OpenSSH-format private key that libssh (and so ssh) reads back, matching the public line.
  ssh_key parsed = nullptr;
  ASSERT_EQ(ssh_pki_import_privkey_file(key.c_str(), nullptr, nullptr, nullptr, &parsed), SSH_OK);
  char* b64 = nullptr;
  ASSERT_EQ(ssh_pki_export_pubkey_base64(parsed, &b64), SSH_OK);
  EXPECT_NE(line->find(b64), std::string::npos);
  ssh_string_free_char(b64);
  ssh_key_free(parsed);

  std::ostringstream again;
  auto second = EnsureKeyPair(key, again);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *line);
  EXPECT_EQ(again.str(), "");
  // A lost .pub is derived from the private key.
  ASSERT_EQ(unlink((key + ".pub").c_str()), 0);
  auto derived = EnsureKeyPair(key, again);
  ASSERT_TRUE(derived.ok()) << derived.status().ToString();
  EXPECT_EQ(derived->substr(0, derived->rfind(' ')), line->substr(0, line->rfind(' ')));
  EXPECT_TRUE(PathExists(key + ".pub"));
}

TEST_F(TempHome, AnUnreadableKeyIsAnErrorNotReplaced) {
  std::string key = dir_ + "/k";
  ASSERT_TRUE(WriteFileAtomic(key, "not a key\n", 0600).ok());
  std::ostringstream notice;
  auto line = EnsureKeyPair(key, notice);
  EXPECT_EQ(line.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ReadFile(key), "not a key\n");
}

class FixedCredentials final : public aws::CredentialProvider {
 public:
  std::optional<aws::Credential> Lookup(std::string_view id) const override {
    if (id != "AKIDKILN") return std::nullopt;
    aws::Credential c;
    c.access_key_id = "AKIDKILN";
    c.secret_access_key = "secret";
    return c;
  }
};

RemoteClient Client() {
  RemoteClient client;
  client.endpoint = *ParseEndpoint("http://127.0.0.1:5456");
  client.credential.access_key_id = "AKIDKILN";
  client.credential.secret_access_key = "secret";
  client.region = "us-east-1";
  client.time_millis = 1'796'212'800'000;
  return client;
}

TEST(RemoteCommandTest, TheUpgradeRequestIsSignedWithTheKeyHeader) {
  const std::string key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE kiln";
  aws::OwnedSignable request = ConnectRequest(Client(), "training-job/J/algo-1", key);
  EXPECT_EQ(request.raw_path, "/_kiln/remote/connect");
  EXPECT_EQ(request.raw_query, "target=training-job%2FJ%2Falgo-1");
  EXPECT_EQ(*FindHeader(request.headers, "Connection"), "Upgrade");
  EXPECT_EQ(*FindHeader(request.headers, "Upgrade"), "kiln-ssh");
  EXPECT_EQ(*FindHeader(request.headers, "X-Kiln-Ssh-Public-Key"), key);
  EXPECT_EQ(*FindHeader(request.headers, "Host"), "127.0.0.1:5456");
  const std::string& auth = *FindHeader(request.headers, "Authorization");
  EXPECT_NE(auth.find("Credential=AKIDKILN/20261202/us-east-1/sagemaker/aws4_request"), std::string::npos) << auth;
  EXPECT_NE(auth.find("SignedHeaders=host;x-amz-date;x-kiln-ssh-public-key,"), std::string::npos) << auth;
  // The server's verifier accepts it, and a swapped key breaks the signature.
  FixedCredentials credentials;
  aws::VerifyOptions verify;
  verify.expected_service = "sagemaker";
  verify.regions = {"us-east-1"};
  auto ok = aws::VerifyRequest(request, credentials, verify, Client().time_millis, aws::kEmptySha256);
  EXPECT_TRUE(std::holds_alternative<aws::VerifiedRequest>(ok));
  request.headers.find("X-Kiln-Ssh-Public-Key")->second = "ssh-ed25519 AAAAother";
  auto bad = aws::VerifyRequest(request, credentials, verify, Client().time_millis, aws::kEmptySha256);
  ASSERT_TRUE(std::holds_alternative<aws::AuthError>(bad));
  EXPECT_EQ(std::get<aws::AuthError>(bad).failure, aws::AuthFailure::kBadSignature);
  std::string wire = SerializeRequest(request);
  EXPECT_EQ(wire.rfind("GET /_kiln/remote/connect?target=training-job%2FJ%2Falgo-1 HTTP/1.1\r\n", 0), 0u);
  EXPECT_EQ(wire.substr(wire.size() - 4), "\r\n\r\n");
}

// A one-shot server on loopback: reads a request head, answers `reply`, then echoes until EOF.
class OneShotServer {
 public:
  explicit OneShotServer(std::string reply) : reply_(std::move(reply)) {
    listener_ = UniqueFd(socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listener_.get(), 1), 0);
    socklen_t len = sizeof(addr);
    getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      UniqueFd conn(accept(listener_.get(), nullptr, nullptr));
      char c;
      while (request_.find("\r\n\r\n") == std::string::npos && read(conn.get(), &c, 1) == 1) request_ += c;
      (void)WriteAll(conn.get(), reply_);
      char buf[4096];
      ssize_t n;
      while ((n = read(conn.get(), buf, sizeof(buf))) > 0) (void)WriteAll(conn.get(), std::string_view(buf, n));
    });
  }
  ~OneShotServer() { thread_.join(); }
  RemoteEndpoint endpoint() const { return *ParseEndpoint("http://127.0.0.1:" + std::to_string(port_)); }
  std::string request_;

 private:
  std::string reply_;
  UniqueFd listener_;
  int port_ = 0;
  std::thread thread_;
};

TEST(RemoteCommandTest, OpenUpgradeKeepsBytesThatCameWithTheHead) {
  OneShotServer server(
      "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: kiln-ssh\r\n"
      "X-Kiln-Connection-Id: c-1\r\n\r\nSSH-2.0-libssh\r\n");
  RemoteClient client = Client();
  client.endpoint = server.endpoint();
  auto answer = OpenUpgrade(client.endpoint, ConnectRequest(client, "j", "ssh-ed25519 AAAA"));
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(answer->status, 101);
  EXPECT_EQ(*FindHeader(answer->headers, "x-kiln-connection-id"), "c-1");
  EXPECT_EQ(answer->buffered, "SSH-2.0-libssh\r\n");
  ASSERT_TRUE(WriteAll(answer->fd.get(), "ping").ok());
  char buf[4];
  ASSERT_EQ(read(answer->fd.get(), buf, 4), 4);
  EXPECT_EQ(std::string(buf, 4), "ping");
  shutdown(answer->fd.get(), SHUT_WR);
  EXPECT_NE(server.request_.find("X-Kiln-Ssh-Public-Key: ssh-ed25519 AAAA\r\n"), std::string::npos);
}

TEST(RemoteCommandTest, ARefusalIsDescribedByItsCodeAndMessage) {
  std::string body = R"({"__type":"AccessDeniedException","message":"remote access is not enabled on training job j"})";
  OneShotServer server("HTTP/1.1 403 Forbidden\r\nContent-Type: application/x-amz-json-1.1\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nx-amzn-ErrorType: AccessDeniedException\r\n\r\n" + body);
  RemoteClient client = Client();
  client.endpoint = server.endpoint();
  auto tunnel = OpenTunnel(client, "j", "ssh-ed25519 AAAA");
  EXPECT_EQ(tunnel.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(tunnel.status().message(), "AccessDeniedException: remote access is not enabled on training job j");
  // Nothing more to read after the body: the server thread ends when the client closes.
}

TEST(RemoteCommandTest, DescribesChunkedAndNonJsonAnswers) {
  UpgradeAnswer a;
  a.status = 502;
  a.body = "bad gateway";
  EXPECT_EQ(DescribeErrorAnswer(a), "HTTP 502: bad gateway");
  a.status = 409;
  a.body = R"({"__type":"com.amazon#ConflictException","message":"j is Pending"})";
  EXPECT_EQ(DescribeErrorAnswer(a), "ConflictException: j is Pending");
}

TEST(RemoteCommandTest, OpenUpgradeReadsAChunkedRefusal) {
  OneShotServer server(
      "HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10\r\n{\"__type\":\"Confl\r\n1f\r\nictException\",\"message\":\"wait\"}\r\n0\r\n\r\n");
  auto answer = OpenUpgrade(server.endpoint(), ConnectRequest(Client(), "j", "k"));
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(answer->status, 409);
  EXPECT_EQ(DescribeErrorAnswer(*answer), "ConflictException: wait");
}

TEST(RemoteCommandTest, OpenUpgradeToNothingIsUnavailable) {
  UniqueFd probe(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(probe.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  auto endpoint = ParseEndpoint("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  auto answer = OpenUpgrade(*endpoint, ConnectRequest(Client(), "j", "k"));  // bound, not listening
  EXPECT_EQ(answer.status().code(), StatusCode::kUnavailable);
}

std::string JsonReply(const json& body) {
  std::string text = body.dump();
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) +
         "\r\n\r\n" + text;
}

TEST(RemoteCommandTest, TheServersCloseReasonIsLookedUpByConnectionId) {
  json audit = {{"Connections",
                 {{{"ConnectionId", "rc-2"}, {"CloseReason", "job ended"}},
                  {{"ConnectionId", "rc-1"}, {"CloseReason", "client disconnected"}}}}};
  {
    OneShotServer server(JsonReply(audit));
    RemoteClient client = Client();
    client.endpoint = server.endpoint();
    EXPECT_EQ(ServerCloseReason(client, "training-job/j/algo-1", "rc-2"), "job ended");
    EXPECT_EQ(server.request_.rfind("GET /_kiln/remote/connections?max-results=100&resource=training-job%2Fj ", 0), 0u)
        << server.request_;
  }
  {
    OneShotServer server(JsonReply(audit));
    RemoteClient client = Client();
    client.endpoint = server.endpoint();
    EXPECT_EQ(ServerCloseReason(client, "training-job/j/algo-1", "rc-1"), "");  // the user's own doing
  }
}

// stdin/stdout as pipes, the tunnel as one end of a socketpair.
struct SpliceRig {
  int in[2], out[2], tunnel[2];
  SpliceRig() {
    EXPECT_EQ(pipe(in), 0);
    EXPECT_EQ(pipe(out), 0);
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, tunnel), 0);
  }
  ~SpliceRig() {
    for (int fd : {in[0], in[1], out[0], out[1], tunnel[0], tunnel[1]}) {
      if (fd >= 0) close(fd);
    }
  }
  static std::string ReadAll(int fd) {
    std::string all;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) all.append(buf, n);
    return all;
  }
};

TEST(RemoteCommandTest, SpliceCopiesBothWaysAndHalfClosesOnInputEof) {
  SpliceRig rig;
  Status result = Status::Internal("not run");
  bool server_closed = true;
  std::thread splice([&] { result = SpliceStreams(rig.in[0], rig.out[1], rig.tunnel[0], "early ", &server_closed); });
  const std::string up(300 * 1024, 'u');  // more than one buffer and the pipe's capacity
  std::thread writer([&] {
    (void)WriteAll(rig.in[1], up);
    close(rig.in[1]);
    rig.in[1] = -1;
  });
  // The server side: reads everything up to the half-close, then answers and closes.
  std::string got_up = SpliceRig::ReadAll(rig.tunnel[1]);
  writer.join();
  EXPECT_EQ(got_up, up);
  ASSERT_TRUE(WriteAll(rig.tunnel[1], "down").ok());
  shutdown(rig.tunnel[1], SHUT_WR);
  splice.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  close(rig.out[1]);
  rig.out[1] = -1;
  EXPECT_EQ(SpliceRig::ReadAll(rig.out[0]), "early down");
  EXPECT_FALSE(server_closed);  // the client half-closed first
}

TEST(RemoteCommandTest, SpliceEndsWhenTheTunnelEndsEvenWithInputOpen) {
  SpliceRig rig;
  Status result = Status::Internal("not run");
  bool server_closed = false;
  std::thread splice([&] { result = SpliceStreams(rig.in[0], rig.out[1], rig.tunnel[0], "", &server_closed); });
  ASSERT_TRUE(WriteAll(rig.tunnel[1], "bye").ok());
  close(rig.tunnel[1]);
  rig.tunnel[1] = -1;
  splice.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  close(rig.out[1]);
  rig.out[1] = -1;
  EXPECT_EQ(SpliceRig::ReadAll(rig.out[0]), "bye");
  EXPECT_TRUE(server_closed);
}

TEST(RemoteCommandTest, SpliceOverOneSocketForBothDirections) {
  // --local-port: the accepted connection is both input and output.
  int local[2], tunnel[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, local), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, tunnel), 0);
  Status result = Status::Internal("not run");
  std::thread splice([&] { result = SpliceStreams(local[0], local[0], tunnel[0], "SSH-2.0-x\r\n"); });
  ASSERT_TRUE(WriteAll(local[1], "client").ok());
  shutdown(local[1], SHUT_WR);
  std::string at_server = SpliceRig::ReadAll(tunnel[1]);
  EXPECT_EQ(at_server, "client");
  ASSERT_TRUE(WriteAll(tunnel[1], "server").ok());
  close(tunnel[1]);
  splice.join();
  EXPECT_TRUE(result.ok());
  close(local[0]);
  EXPECT_EQ(SpliceRig::ReadAll(local[1]), "SSH-2.0-x\r\nserver");
  close(local[1]);
  close(tunnel[0]);
}

TEST(RemoteCommandTest, SpliceStopsWhenTheOutputReaderIsGone) {
  SpliceRig rig;
  close(rig.out[0]);  // ssh exited
  rig.out[0] = -1;
  signal(SIGPIPE, SIG_IGN);
  ASSERT_TRUE(WriteAll(rig.tunnel[1], "data").ok());
  EXPECT_TRUE(SpliceStreams(rig.in[0], rig.out[1], rig.tunnel[0], "").ok());
}

TEST(RemoteCommandTest, TablesShowOneRowPerEntry) {
  std::ostringstream out;
  PrintTargetsTable(TwoHosts("Ready", "Pending"), out);
  EXPECT_EQ(out.str(),
            "arn:aws:sagemaker:us-east-1:000000000000:training-job/j  InProgress (Training)  remote access enabled\n"
            "TARGET                 STATE    HOSTNAME  INSTANCE           ALIAS\n"
            "training-job/j/algo-1  Ready    algo-1    training-j-algo-1  sagemaker-training-job:j_algo-1\n"
            "training-job/j/algo-2  Pending  algo-2    training-j-algo-2  sagemaker-training-job:j_algo-2\n");
  json connections = {{"Connections",
                       {{{"ConnectionId", "c-2"},
                         {"Target", "training-job/j/algo-1"},
                         {"Principal", "arn:aws:iam::000000000000:user/kiln-user"},
                         {"SourceAddress", "127.0.0.1:40000"},
                         {"StartTime", 1796212800.5},
                         {"BytesIn", 10},
                         {"BytesOut", 20}},
                        {{"ConnectionId", "c-1"},
                         {"Target", "training-job/j/algo-1"},
                         {"Principal", "p"},
                         {"SourceAddress", "127.0.0.1:39999"},
                         {"StartTime", 1796212000.0},
                         {"EndTime", 1796212125.0},
                         {"BytesIn", 1},
                         {"BytesOut", 2},
                         {"ExitStatuses", {0, 3}},
                         {"CloseReason", "client disconnected"}}}}};
  std::ostringstream table;
  PrintConnectionsTable(connections, table);
  EXPECT_EQ(table.str(),
            "CONNECTION  TARGET                 PRINCIPAL                                 SOURCE           "
            "STARTED (UTC)        DURATION  IN  OUT  EXIT  CLOSE\n"
            "c-2         training-job/j/algo-1  arn:aws:iam::000000000000:user/kiln-user  127.0.0.1:40000  "
            "2026-12-02 12:00:00  open      10  20   -     -\n"
            "c-1         training-job/j/algo-1  p                                         127.0.0.1:39999  "
            "2026-12-02 11:46:40  2m5s      1   2    0,3   client disconnected\n");
}

}  // namespace
}  // namespace kiln::cli
