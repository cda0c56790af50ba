#include "cli/remote_command.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <libssh/libssh.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "base/encoding.h"
#include "base/mutex.h"
#include "base/strings.h"

namespace kiln::cli {
namespace {

using nlohmann::json;

constexpr int kHandshakeTimeoutSeconds = 30;

std::string ParentDir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool SafeShellChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./:@%+=,-", c) != nullptr;
}

std::string DoublePercent(std::string_view s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '%') out += '%';
  }
  return out;
}

// Writes all of `data` to a socket or pipe; false when the reader is gone (EPIPE, ECONNRESET).
Result<bool> WriteOut(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) return false;
      return ErrnoStatus("write", errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string FormatTime(double epoch_seconds) {
  if (epoch_seconds <= 0) return "-";
  time_t t = static_cast<time_t>(epoch_seconds);
  tm utc{};
  gmtime_r(&t, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &utc);
  return buf;
}

std::string FormatDuration(double seconds) {
  long s = static_cast<long>(seconds);
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m" + std::to_string(s % 60) + "s";
  return std::to_string(s / 3600) + "h" + std::to_string(s % 3600 / 60) + "m";
}

// Left-aligned columns, two spaces apart.
void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

std::string JsonString(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "kiln";
  return std::string(buf, static_cast<size_t>(n));
}

std::string HomeDir() {
  const char* home = std::getenv("HOME");
  return home != nullptr && *home != '\0' ? home : "/root";
}

SshSettings SettingsFor(const RemoteClient& client, const std::string& key_path,
                        const std::vector<std::string>& proxy_flags) {
  SshSettings s;
  s.kiln_path = SelfPath();
  s.proxy_flags = proxy_flags;
  s.endpoint_url = client.endpoint.url;
  s.key_path = key_path;
  s.known_hosts = HomeDir() + "/.ssh/kiln_known_hosts";
  s.host_key_alias = HostKeyAlias(client.endpoint);
  return s;
}

// `kiln connect` names a file here for the ssh-proxy that its ssh starts: the proxy appends
// "<connection id> <target>" on each 101, and leaves telling the user why Kiln closed a connection
// to `kiln connect` (ssh may end before its proxy can say it: it hangs up on its ProxyCommand).
constexpr char kConnectionFileEnv[] = "KILN_CONNECTION_FILE";

pid_t ssh_child = -1;  // for the forwarding handler only
void ForwardSignal(int sig) {
  if (ssh_child > 0) kill(ssh_child, sig);
}

// Runs ssh as a child and returns its exit status (128+n for a signal, 255 when it cannot run).
// When ssh fails, the last connection its proxy opened is looked up in the audit and a reason
// Kiln gave for closing it (job ended, access disabled, idle timeout, ...) is printed.
int RunSsh(const RemoteClient& client, const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln-connect-XXXXXX";
  UniqueFd file(mkstemp(path.data()));
  if (file.valid()) setenv(kConnectionFileEnv, path.c_str(), 1);
  std::cout.flush();
  std::cerr.flush();
  pid_t pid = fork();
  if (pid == 0) {
    execvp(args[0], args.data());
    std::cerr << "kiln: cannot run the OpenSSH client `ssh`: " << std::strerror(errno)
              << " (install openssh-client, or serve the tunnel for another SSH client with --local-port)\n";
    std::cerr.flush();
    _exit(255);
  }
  if (pid < 0) {
    std::cerr << "kiln: fork: " << std::strerror(errno) << "\n";
    if (file.valid()) unlink(path.c_str());
    return 255;
  }
  // The terminal's SIGINT/SIGQUIT reach ssh too (same process group): ssh decides. A SIGTERM or
  // SIGHUP sent to kiln alone is passed on.
  ssh_child = pid;
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  signal(SIGTERM, ForwardSignal);
  signal(SIGHUP, ForwardSignal);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (file.valid()) {
    std::string text;
    auto content = ReadFile(path);
    unlink(path.c_str());
    if (content.ok()) text = *content;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    std::string last = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    size_t space = last.find(' ');
    if (code != 0 && space != std::string::npos) {
      std::string reason = ServerCloseReason(client, last.substr(space + 1), last.substr(0, space));
      if (!reason.empty()) std::cerr << "kiln: Kiln closed the connection: " << reason << "\n";
    }
  }
  return code;
}

}  // namespace

Result<RemoteEndpoint> ParseEndpoint(std::string_view url) {
  RemoteEndpoint e;
  while (!url.empty() && url.back() == '/') url.remove_suffix(1);
  e.url = std::string(url);
  constexpr std::string_view kHttp = "http://";
  if (!StartsWith(url, kHttp)) {
    return Status::InvalidArgument("the endpoint must be an http:// URL (Kiln's front door), got '" + e.url +
                                   "'; pass --endpoint-url http://host:port");
  }
  std::string_view rest = url.substr(kHttp.size());
  rest = rest.substr(0, rest.find('/'));
  e.authority = std::string(rest);
  std::string_view port;
  if (StartsWith(rest, "[")) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return Status::InvalidArgument("bad IPv6 address in endpoint " + e.url);
    e.host = std::string(rest.substr(1, close - 1));
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    e.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
  }
  if (e.host.empty()) return Status::InvalidArgument("no host in endpoint " + e.url);
  if (!port.empty()) {
    int p = 0;
    for (char c : port) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || p > 65535) {
        return Status::InvalidArgument("bad port in endpoint " + e.url);
      }
      p = p * 10 + (c - '0');
    }
    if (p <= 0 || p > 65535) return Status::InvalidArgument("bad port in endpoint " + e.url);
    e.port = p;
  }
  return e;
}

std::string DefaultKeyPath() { return HomeDir() + "/.ssh/sagemaker-ssh-gw"; }

Result<std::string> EnsureKeyPair(const std::string& private_key_path, std::ostream& notice) {
  const std::string public_path = private_key_path + ".pub";
  auto public_line = [](const std::string& text) { return std::string(Trim(text.substr(0, text.find('\n')))); };
  if (PathExists(private_key_path)) {
    if (PathExists(public_path)) {
      ASSIGN_OR_RETURN(std::string text, ReadFile(public_path));
      std::string line = public_line(text);
      if (line.empty()) return Status::InvalidArgument(public_path + " is empty; delete it to have it derived again");
      return line;
    }
    ssh_key key = nullptr;
    if (ssh_pki_import_privkey_file(private_key_path.c_str(), nullptr, nullptr, nullptr, &key) != SSH_OK) {
      return Status::InvalidArgument("cannot read the private key " + private_key_path + " and " + public_path +
                                     " is missing; restore the .pub file or pass another --key");
    }
    char* b64 = nullptr;
    int rc = ssh_pki_export_pubkey_base64(key, &b64);
    std::string line = rc == SSH_OK ? std::string(ssh_key_type_to_char(ssh_key_type(key))) + " " + b64 + " kiln" : "";
    ssh_string_free_char(b64);
    ssh_key_free(key);
    if (rc != SSH_OK) return Status::Internal("cannot export the public key of " + private_key_path);
    RETURN_IF_ERROR(WriteFileAtomic(public_path, line + "\n", 0644));
    return line;
  }
  std::string dir = ParentDir(private_key_path);
  if (!PathExists(dir)) RETURN_IF_ERROR(MakeDirs(dir, 0700));
  ssh_key key = nullptr;
  if (ssh_pki_generate(SSH_KEYTYPE_ED25519, 0, &key) != SSH_OK) {
    return Status::Internal("cannot generate an Ed25519 key (libssh)");
  }
  char* private_b64 = nullptr;
  char* public_b64 = nullptr;
  int rc1 = ssh_pki_export_privkey_base64(key, nullptr, nullptr, nullptr, &private_b64);
  int rc2 = ssh_pki_export_pubkey_base64(key, &public_b64);
  std::string private_text = rc1 == SSH_OK ? private_b64 : "";
  std::string line = rc2 == SSH_OK ? std::string("ssh-ed25519 ") + public_b64 + " kiln" : "";
  if (private_b64 != nullptr) ssh_string_free_char(private_b64);
  if (public_b64 != nullptr) ssh_string_free_char(public_b64);
  ssh_key_free(key);
  if (rc1 != SSH_OK || rc2 != SSH_OK) return Status::Internal("cannot export the generated key (libssh)");
  if (private_text.empty() || private_text.back() != '\n') private_text += '\n';
  // The public half first: a pair whose private key exists is taken as complete.
  RETURN_IF_ERROR(WriteFileAtomic(public_path, line + "\n", 0644));
  RETURN_IF_ERROR(WriteFileAtomic(private_key_path, private_text, 0600));
  notice << "kiln: created the SSH key pair " << private_key_path << " and " << public_path
         << " (Ed25519); the server accepts it for the tunnels this client opens\n";
  return line;
}

aws::OwnedSignable ConnectRequest(const RemoteClient& client, std::string_view target, std::string_view public_key) {
  aws::OwnedSignable request;
  request.method = "GET";
  request.raw_path = "/_kiln/remote/connect";
  request.raw_query = "target=" + UriEncode(target);
  request.headers.emplace("Host", client.endpoint.authority);
  request.headers.emplace("X-Kiln-Ssh-Public-Key", std::string(public_key));
  aws::SignOptions sign;
  sign.access_key_id = client.credential.access_key_id;
  sign.secret_access_key = client.credential.secret_access_key;
  sign.session_token = client.credential.session_token;
  sign.region = client.region;
  sign.service = "sagemaker";
  sign.time_millis = client.time_millis;
  sign.payload_hash = std::string(aws::kEmptySha256);
  aws::SignRequest(request, sign);
  request.headers.emplace("Connection", "Upgrade");
  request.headers.emplace("Upgrade", "kiln-ssh");
  return request;
}

std::string SerializeRequest(const aws::OwnedSignable& request) {
  std::string text = request.method + " " + request.raw_path;
  if (!request.raw_query.empty()) text += "?" + request.raw_query;
  text += " HTTP/1.1\r\n";
  for (const auto& [name, value] : request.headers) text += name + ": " + value + "\r\n";
  text += "\r\n";
  return text;
}

Result<UpgradeAnswer> OpenUpgrade(const RemoteEndpoint& endpoint, const aws::OwnedSignable& request) {
  net::UpgradeRequest upgrade;
  upgrade.host = endpoint.host;
  upgrade.port = static_cast<uint16_t>(endpoint.port);
  upgrade.target = request.raw_path + (request.raw_query.empty() ? "" : "?" + request.raw_query);
  upgrade.headers = request.headers;  // Host as signed (the URL's authority)
  upgrade.response_timeout_ms = kHandshakeTimeoutSeconds * 1000;
  auto answer = net::OpenUpgrade(upgrade);
  if (!answer.ok() && answer.status().code() == StatusCode::kUnavailable) {
    return Status::Unavailable("cannot reach Kiln at " + endpoint.url + ": " + answer.status().message() +
                               " (is `kiln server` running?)");
  }
  return answer;
}

std::string DescribeErrorAnswer(const UpgradeAnswer& answer) {
  json decoded = json::parse(answer.body, nullptr, false);
  std::string code;
  std::string message;
  if (decoded.is_object()) {
    code = JsonString(decoded, "__type");
    message = JsonString(decoded, "message");
    if (message.empty()) message = JsonString(decoded, "Message");
  }
  if (code.empty()) {
    if (const std::string* type = FindHeader(answer.headers, "x-amzn-ErrorType")) code = *type;
  }
  if (size_t hash = code.rfind('#'); hash != std::string::npos) code = code.substr(hash + 1);
  if (size_t colon = code.find(':'); colon != std::string::npos) code = code.substr(0, colon);
  if (code.empty()) code = "HTTP " + std::to_string(answer.status);
  if (message.empty()) message = decoded.is_object() ? "(no message)" : std::string(Trim(answer.body.substr(0, 300)));
  return code + ": " + message;
}

Result<UpgradeAnswer> OpenTunnel(const RemoteClient& client, std::string_view target, std::string_view public_key) {
  ASSIGN_OR_RETURN(UpgradeAnswer answer, OpenUpgrade(client.endpoint, ConnectRequest(client, target, public_key)));
  if (answer.status != 101) return Status::FailedPrecondition(DescribeErrorAnswer(answer));
  return answer;
}

Status SpliceStreams(int in_fd, int out_fd, int sock, std::string_view buffered, bool* server_closed) {
  if (server_closed != nullptr) *server_closed = false;
  ASSIGN_OR_RETURN(bool open, WriteOut(out_fd, buffered));
  if (!open) return Status::Ok();
  bool in_open = true;
  std::vector<char> buf(64 * 1024);
  while (true) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {in_fd, POLLIN, 0}};
    int n = poll(fds, in_open ? 2 : 1, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll", errno);
    }
    if (fds[0].revents != 0) {
      ssize_t got = recv(sock, buf.data(), buf.size(), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        if (errno == ECONNRESET) return Status::Unavailable("the tunnel was reset");
        return ErrnoStatus("recv from the tunnel", errno);
      }
      if (got == 0) {
        if (server_closed != nullptr) *server_closed = in_open;
        return Status::Ok();
      }
      ASSIGN_OR_RETURN(bool reader, WriteOut(out_fd, std::string_view(buf.data(), static_cast<size_t>(got))));
      if (!reader) return Status::Ok();
    }
    if (in_open && fds[1].revents != 0) {
      ssize_t got = read(in_fd, buf.data(), buf.size());
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {  // EOF, or an error on our input: no more bytes for the server either way
        in_open = false;
        shutdown(sock, SHUT_WR);
        continue;
      }
      ASSIGN_OR_RETURN(bool peer, WriteOut(sock, std::string_view(buf.data(), static_cast<size_t>(got))));
      if (!peer) return Status::Unavailable("the tunnel was closed by Kiln");
    }
  }
}

std::string ShellQuote(std::string_view word) {
  if (!word.empty() && std::all_of(word.begin(), word.end(), SafeShellChar)) return std::string(word);
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string DefaultAlias(std::string_view target) {
  std::string out;
  for (char c : target) {
    bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    if (keep) {
      out += c;
    } else if (out.empty() || out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "kiln" : out;
}

std::string HostKeyAlias(const RemoteEndpoint& endpoint) {
  std::string out = "kiln-";
  for (char c : endpoint.host) out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '-';
  return out + "-" + std::to_string(endpoint.port);
}

std::string ProxyCommandLine(const SshSettings& settings, std::string_view target) {
  std::vector<std::string> words = {settings.kiln_path, "ssh-proxy"};
  words.insert(words.end(), settings.proxy_flags.begin(), settings.proxy_flags.end());
  words.insert(words.end(), {"--endpoint-url", settings.endpoint_url, "--key", settings.key_path});
  std::string line;
  for (const auto& w : words) line += DoublePercent(ShellQuote(w)) + " ";
  line += target == "%h" ? std::string("%h") : DoublePercent(ShellQuote(target));
  return line;
}

std::vector<std::string> SshArgv(const SshSettings& settings, const SshCommand& command) {
  std::vector<std::string> argv = {"ssh",
                                   "-o",
                                   "ProxyCommand=" + ProxyCommandLine(settings, command.target),
                                   "-o",
                                   "HostKeyAlias=" + settings.host_key_alias,
                                   "-o",
                                   "UserKnownHostsFile=" + settings.known_hosts,
                                   "-o",
                                   "StrictHostKeyChecking=accept-new",
                                   "-o",
                                   "ServerAliveInterval=30",
                                   "-i",
                                   settings.key_path,
                                   "-o",
                                   "IdentitiesOnly=yes"};
  if (command.tty) argv.push_back("-t");
  if (command.no_command) argv.insert(argv.end(), {"-N", "-o", "ExitOnForwardFailure=yes"});
  for (const auto& spec : command.local_forwards) argv.insert(argv.end(), {"-L", spec});
  for (const auto& spec : command.remote_forwards) argv.insert(argv.end(), {"-R", spec});
  // "--" ends ssh's options: the command's own "-x" words are not taken for ssh's. The host name
  // is only a label (the ProxyCommand carries the target; ssh would lower-case it in %h).
  argv.insert(argv.end(), {"--", "root@" + DefaultAlias(command.target)});
  argv.insert(argv.end(), command.command.begin(), command.command.end());
  return argv;
}

std::string SshConfigBlock(const SshSettings& settings, std::string_view target, std::string_view alias) {
  auto options = [&](std::string_view proxy_target) {
    std::string s;
    s += "  User root\n";
    s += "  ProxyCommand " + ProxyCommandLine(settings, proxy_target) + "\n";
    s += "  IdentityFile " + DoublePercent(ShellQuote(settings.key_path)) + "\n";
    s += "  IdentitiesOnly yes\n";
    s += "  UserKnownHostsFile ~/.ssh/kiln_known_hosts\n";
    s += "  StrictHostKeyChecking accept-new\n";
    s += "  HostKeyAlias " + settings.host_key_alias + "\n";
    s += "  ServerAliveInterval 30\n";
    return s;
  };
  std::string out = "# Kiln remote access to " + std::string(target) + " (" + settings.endpoint_url +
                    "). Add to ~/.ssh/config, then: ssh " + std::string(alias) + "\n";
  out += "Host " + std::string(alias) + "\n" + options(target);
  out += "\n# Or any host of any training job, as `ssh algo-<n>.<job>.training.kiln`:\n";
  std::istringstream wildcard("Host *.training.kiln\n" + options("%h"));
  for (std::string line; std::getline(wildcard, line);) out += "# " + line + "\n";
  return out;
}

std::string ResourceOfTarget(std::string_view target) {
  if (StartsWith(target, "arn:")) return std::string(target);
  auto first_two = [](std::string_view t) {
    size_t a = t.find('/');
    size_t b = t.find('/', a + 1);
    return std::string(t.substr(0, b));
  };
  if (StartsWith(target, "training-job/") || StartsWith(target, "endpoint/")) return first_two(target);
  constexpr std::string_view kAlias = "sagemaker-training-job:";
  if (StartsWith(target, kAlias)) {
    std::string_view rest = target.substr(kAlias.size());
    return "training-job/" + std::string(rest.substr(0, rest.rfind('_')));
  }
  constexpr std::string_view kDomain = ".training.kiln";
  if (target.size() > kDomain.size() && target.substr(target.size() - kDomain.size()) == kDomain) {
    std::string_view rest = target.substr(0, target.size() - kDomain.size());
    size_t dot = rest.find('.');
    if (dot != std::string_view::npos) return "training-job/" + std::string(rest.substr(dot + 1));
  }
  return std::string(target);
}

const json* FindTargetEntry(const json& answer, std::string_view target) {
  auto it = answer.find("Targets");
  if (it == answer.end() || !it->is_array() || it->empty()) return nullptr;
  for (const json& t : *it) {
    if (JsonString(t, "Target") == target || JsonString(t, "Alias") == target) return &t;
  }
  // The host the text names: "…/algo-2", "…_algo-2", "algo-2.<job>.training.kiln", "endpoint/e/v/<id>".
  std::string host;
  std::string_view text = target;
  constexpr std::string_view kDomain = ".training.kiln";
  if (text.size() > kDomain.size() && text.substr(text.size() - kDomain.size()) == kDomain) {
    host = std::string(text.substr(0, text.find('.')));
  } else if (size_t cut = text.find_last_of("/_"); cut != std::string_view::npos) {
    std::string_view last = text.substr(cut + 1);
    bool training_host = StartsWith(last, "algo-");
    bool endpoint_instance = StartsWith(text, "endpoint/") && std::count(text.begin(), text.end(), '/') == 3;
    if (training_host || endpoint_instance) host = std::string(last);
  }
  if (!host.empty()) {
    for (const json& t : *it) {
      if (JsonString(t, "Hostname") == host || JsonString(t, "InstanceId") == host) return &t;
    }
    return nullptr;
  }
  return &it->front();
}

Status WaitForTarget(const TargetsFetch& fetch, std::string_view target, int timeout_seconds, int poll_seconds,
                     std::ostream& progress, const Sleeper& sleep) {
  int waited = 0;
  std::string last_line;
  while (true) {
    ASSIGN_OR_RETURN(json answer, fetch());
    std::string status = JsonString(answer, "ResourceStatus");
    std::string secondary = JsonString(answer, "SecondaryStatus");
    std::string resource = JsonString(answer, "ResourceArn");
    if (status == "Failed" || status == "Stopped" || status == "Completed") {
      std::string reason = JsonString(answer, "FailureReason");
      return Status::FailedPrecondition(resource + " is " + status + (reason.empty() ? "" : ": " + reason));
    }
    // Waiting would not help a resource that nobody enabled (a Ready target still refuses).
    if (!answer.value("AccessEnabled", true)) {
      return Status::PermissionDenied("remote access is not enabled on " + resource +
                                      "; enable it with UpdateTrainingJob RemoteDebugConfig={EnableRemoteDebug=true}");
    }
    const json* entry = FindTargetEntry(answer, target);
    std::string state = entry != nullptr ? JsonString(*entry, "State") : "";
    if (state == "Ready" || state == "Held") return Status::Ok();
    if (state == "Gone") return Status::FailedPrecondition(std::string(target) + " is gone (" + status + ")");
    std::string line = std::string(target) + ": " + (status.empty() ? "unknown" : status);
    if (!secondary.empty()) line += " (" + secondary + ")";
    line += entry != nullptr ? ", target " + state : ", no such target yet";
    if (line != last_line) {
      progress << "kiln connect: waiting for " << line << "\n" << std::flush;
      last_line = line;
    }
    if (waited >= timeout_seconds) {
      return Status::DeadlineExceeded(std::string(target) + " was not ready after " + std::to_string(timeout_seconds) +
                                      " s (" + line + "); raise --wait-timeout");
    }
    int step = std::min(poll_seconds, timeout_seconds - waited);
    sleep(step);
    waited += step;
  }
}

namespace {
size_t CollectBody(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}
}  // namespace

Result<json> GetJson(const RemoteClient& client, const std::string& path, const std::string& raw_query) {
  return RequestJson(client, "GET", path, raw_query);
}

Result<json> RequestJson(const RemoteClient& client, const std::string& method, const std::string& path,
                         const std::string& raw_query) {
  aws::OwnedSignable request;
  request.method = method;
  request.raw_path = path;
  request.raw_query = raw_query;
  request.headers.emplace("Host", client.endpoint.authority);
  aws::SignOptions sign;
  sign.access_key_id = client.credential.access_key_id;
  sign.secret_access_key = client.credential.secret_access_key;
  sign.session_token = client.credential.session_token;
  sign.region = client.region;
  sign.service = "sagemaker";
  sign.time_millis = client.time_millis;
  sign.payload_hash = std::string(aws::kEmptySha256);
  aws::SignRequest(request, sign);
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return Status::Internal("curl_easy_init failed");
  curl_slist* headers = nullptr;
  for (const auto& [name, value] : request.headers) {
    if (name == "Host") continue;
    headers = curl_slist_append(headers, (name + ": " + value).c_str());
  }
  std::string url = "http://" + client.endpoint.authority + path + (raw_query.empty() ? "" : "?" + raw_query);
  std::string response;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  if (method == "POST") {
    // An empty body, as signed (kEmptySha256).
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, 0L);
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, CollectBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return Status::Unavailable("cannot reach Kiln at " + client.endpoint.url + ": " + curl_easy_strerror(rc) +
                               " (is `kiln server` running?)");
  }
  if (status != 200) {
    UpgradeAnswer answer;
    answer.status = static_cast<int>(status);
    answer.body = response;
    std::string text = DescribeErrorAnswer(answer);
    bool not_found = StartsWith(text, "ResourceNotFound");
    return Status(not_found ? StatusCode::kNotFound : StatusCode::kFailedPrecondition, text);
  }
  json decoded = json::parse(response, nullptr, false);
  if (decoded.is_discarded()) return Status::Internal("unparsable answer from Kiln: " + response.substr(0, 200));
  return decoded;
}

void PrintTargetsTable(const json& answer, std::ostream& out) {
  std::string status = JsonString(answer, "ResourceStatus");
  std::string secondary = JsonString(answer, "SecondaryStatus");
  out << JsonString(answer, "ResourceArn") << "  " << status << (secondary.empty() ? "" : " (" + secondary + ")")
      << "  remote access " << (answer.value("AccessEnabled", false) ? "enabled" : "not enabled") << "\n";
  if (std::string reason = JsonString(answer, "FailureReason"); !reason.empty())
    out << "FailureReason: " << reason << "\n";
  std::vector<std::vector<std::string>> rows = {{"TARGET", "STATE", "HOSTNAME", "INSTANCE", "ALIAS"}};
  for (const json& t : answer.value("Targets", json::array())) {
    rows.push_back({JsonString(t, "Target"), JsonString(t, "State"), JsonString(t, "Hostname"),
                    JsonString(t, "InstanceId"), JsonString(t, "Alias")});
  }
  PrintTable(rows, out);
}

void PrintConnectionsTable(const json& answer, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"CONNECTION", "TARGET", "PRINCIPAL", "SOURCE", "STARTED (UTC)", "DURATION", "IN", "OUT", "EXIT", "CLOSE"}};
  for (const json& c : answer.value("Connections", json::array())) {
    double start = c.value("StartTime", 0.0);
    bool open = !c.contains("EndTime") || c["EndTime"].is_null();
    std::string duration = open ? "open" : FormatDuration(c.value("EndTime", 0.0) - start);
    std::string exits;
    for (const json& e : c.value("ExitStatuses", json::array())) {
      exits += (exits.empty() ? "" : ",") + (e.is_number() ? std::to_string(e.get<int64_t>()) : e.dump());
    }
    rows.push_back({JsonString(c, "ConnectionId"), JsonString(c, "Target"), JsonString(c, "Principal"),
                    JsonString(c, "SourceAddress"), FormatTime(start), duration,
                    std::to_string(c.value("BytesIn", int64_t{0})), std::to_string(c.value("BytesOut", int64_t{0})),
                    exits.empty() ? "-" : exits, open ? "-" : JsonString(c, "CloseReason")});
  }
  PrintTable(rows, out);
}

int RunSshProxy(const RemoteClient& client, const std::string& key_path, const std::string& target) {
  signal(SIGPIPE, SIG_IGN);
  auto key = EnsureKeyPair(key_path, std::cerr);
  if (!key.ok()) {
    std::cerr << "kiln: " << key.status().message() << "\n";
    return 255;
  }
  auto answer = OpenUpgrade(client.endpoint, ConnectRequest(client, target, *key));
  if (!answer.ok()) {
    std::cerr << "kiln: " << answer.status().message() << "\n";
    return 255;
  }
  if (answer->status != 101) {
    std::cerr << "kiln: " << DescribeErrorAnswer(*answer) << "\n";
    return 255;
  }
  const std::string* id = FindHeader(answer->headers, "X-Kiln-Connection-Id");
  const std::string* canonical = FindHeader(answer->headers, "X-Kiln-Target");
  const char* connection_file = std::getenv(kConnectionFileEnv);
  const bool parent_reports = connection_file != nullptr && *connection_file != '\0';
  if (parent_reports && id != nullptr) {
    UniqueFd file(open(connection_file, O_WRONLY | O_APPEND | O_CLOEXEC));
    if (file.valid()) (void)WriteAll(file.get(), *id + " " + (canonical != nullptr ? *canonical : target) + "\n");
  }
  bool server_closed = false;
  Status s = SpliceStreams(STDIN_FILENO, STDOUT_FILENO, answer->fd.get(), answer->buffered, &server_closed);
  if (!s.ok()) {
    std::cerr << "kiln: " << s.message() << "\n";
    return 255;
  }
  if (server_closed && !parent_reports) {
    // Tell the user why before ssh reports the lost connection (ssh waits for this process).
    std::string reason = id == nullptr ? "" : ServerCloseReason(client, canonical ? *canonical : target, *id);
    if (!reason.empty()) std::cerr << "kiln: Kiln closed the connection: " << reason << "\n";
  }
  return 0;
}

std::string ServerCloseReason(const RemoteClient& client, std::string_view target, std::string_view connection_id) {
  auto answer =
      GetJson(client, "/_kiln/remote/connections", "max-results=100&resource=" + UriEncode(ResourceOfTarget(target)));
  if (!answer.ok()) return "";
  for (const json& c : answer->value("Connections", json::array())) {
    if (JsonString(c, "ConnectionId") != connection_id) continue;
    std::string reason = JsonString(c, "CloseReason");
    if (reason == "client disconnected" || reason == "agent exited") return "";
    return reason;
  }
  return "";
}

namespace {

Status Wait(const RemoteClient& client, const std::string& target, int timeout_seconds) {
  std::string resource = ResourceOfTarget(target);
  TargetsFetch fetch = [&]() { return GetJson(client, "/_kiln/remote/targets", "resource=" + UriEncode(resource)); };
  Sleeper sleeper = [](int seconds) { std::this_thread::sleep_for(std::chrono::seconds(seconds)); };
  return WaitForTarget(fetch, target, timeout_seconds, 5, std::cerr, sleeper);
}

// --local-port: accepts on 127.0.0.1:<port> and tunnels each connection until SIGINT/SIGTERM.
int ServeLocalPort(const RemoteClient& client, const ConnectOptions& options, const std::string& public_key) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before any thread starts: they inherit it
  UniqueFd signals(signalfd(-1, &stop, SFD_CLOEXEC));
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.local_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener.get(), 64) != 0) {
    std::cerr << "kiln connect: cannot listen on 127.0.0.1:" << options.local_port << ": " << std::strerror(errno)
              << " (choose another --local-port)\n";
    return 1;
  }
  std::cout << "kiln connect: tunnel to " << options.target << " on localhost:" << options.local_port
            << "; connect with: ssh -p " << options.local_port << " -i " << options.key_path
            << " root@localhost  (Ctrl-C stops)" << std::endl;

  // Sockets of the live connections (accepted and tunnel), shut down at stop: that ends each
  // splice, and each client's ssh sees EOF.
  struct Active {
    Mutex mu;
    bool stopping GUARDED_BY(mu) = false;
    std::set<int> fds GUARDED_BY(mu);
    // Registers `fd` unless stopping (then the caller drops its connection).
    bool Add(int fd) {
      MutexLock lock(mu);
      if (stopping) return false;
      fds.insert(fd);
      return true;
    }
    void Remove(int fd) {
      MutexLock lock(mu);
      fds.erase(fd);
    }
    void Stop() {
      MutexLock lock(mu);
      stopping = true;
      for (int fd : fds) shutdown(fd, SHUT_RDWR);
    }
  };
  auto active = std::make_shared<Active>();
  std::vector<std::thread> threads;
  while (true) {
    pollfd fds[2] = {{listener.get(), POLLIN, 0}, {signals.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    UniqueFd conn(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid() || !active->Add(conn.get())) continue;
    threads.emplace_back([&client, &options, public_key, active, conn = std::move(conn)]() {
      auto tunnel = OpenTunnel(client, options.target, public_key);
      if (!tunnel.ok()) {
        std::cerr << "kiln connect: " << tunnel.status().message() << "\n";
      } else if (active->Add(tunnel->fd.get())) {
        bool server_closed = false;
        Status s = SpliceStreams(conn.get(), conn.get(), tunnel->fd.get(), tunnel->buffered, &server_closed);
        if (!s.ok()) std::cerr << "kiln connect: " << s.message() << "\n";
        const std::string* id = FindHeader(tunnel->headers, "X-Kiln-Connection-Id");
        std::string reason = server_closed && id != nullptr ? ServerCloseReason(client, options.target, *id) : "";
        if (!reason.empty()) std::cerr << "kiln connect: Kiln closed connection " << *id << ": " << reason << "\n";
        active->Remove(tunnel->fd.get());
      }
      active->Remove(conn.get());  // before the UniqueFds close: Stop never touches a reused number
    });
  }
  active->Stop();
  for (auto& t : threads) t.join();
  return 0;
}

}  // namespace

int RunConnect(const RemoteClient& client, const ConnectOptions& options) {
  if (options.local_port != 0 &&
      (!options.local_forwards.empty() || !options.remote_forwards.empty() || !options.command.empty())) {
    std::cerr << "kiln connect: with --local-port, -L/-R and a command belong to the ssh you connect with\n";
    return 2;
  }
  auto key = EnsureKeyPair(options.key_path, std::cerr);
  if (!key.ok()) {
    std::cerr << "kiln connect: " << key.status().message() << "\n";
    return 1;
  }
  if (options.wait) {
    Status s = Wait(client, options.target, options.wait_timeout_seconds);
    if (!s.ok()) {
      std::cerr << "kiln connect: " << s.message() << "\n";
      return 255;  // as ssh for a connection that could not be made
    }
  }
  if (options.local_port != 0) {
    signal(SIGPIPE, SIG_IGN);  // a client that went away is a write error (not inherited by ssh below)
    return ServeLocalPort(client, options, *key);
  }
  SshCommand command;
  command.target = options.target;
  command.local_forwards = options.local_forwards;
  command.remote_forwards = options.remote_forwards;
  command.command = options.command;
  command.tty = options.command.empty() && isatty(STDIN_FILENO) == 1;
  return RunSsh(client, SshArgv(SettingsFor(client, options.key_path, options.proxy_flags), command));
}

int RunPortForward(const RemoteClient& client, const ConnectOptions& options, int remote_port, int local_port) {
  if (remote_port <= 0 || remote_port > 65535 || local_port < 0 || local_port > 65535) {
    std::cerr << "kiln port-forward: ports are 1-65535\n";
    return 2;
  }
  if (local_port == 0) local_port = remote_port;
  auto key = EnsureKeyPair(options.key_path, std::cerr);
  if (!key.ok()) {
    std::cerr << "kiln port-forward: " << key.status().message() << "\n";
    return 1;
  }
  SshCommand command;
  command.target = options.target;
  command.no_command = true;
  command.local_forwards = {std::to_string(local_port) + ":localhost:" + std::to_string(remote_port)};
  std::cerr << "kiln port-forward: http://localhost:" << local_port << " -> " << options.target << " port "
            << remote_port << " (Ctrl-C stops)\n";
  return RunSsh(client, SshArgv(SettingsFor(client, options.key_path, options.proxy_flags), command));
}

int RunSshConfig(const RemoteClient& client, const std::string& key_path, const std::vector<std::string>& proxy_flags,
                 const std::string& target, const std::string& alias) {
  // The block names the key as IdentityFile: it exists before the block is used.
  auto key = EnsureKeyPair(key_path, std::cerr);
  if (!key.ok()) {
    std::cerr << "kiln ssh-config: " << key.status().message() << "\n";
    return 1;
  }
  std::cout << SshConfigBlock(SettingsFor(client, key_path, proxy_flags), target,
                              alias.empty() ? DefaultAlias(target) : alias);
  return 0;
}

int RunTargets(const RemoteClient& client, const std::string& resource, bool as_json) {
  auto answer = GetJson(client, "/_kiln/remote/targets", "resource=" + UriEncode(resource));
  if (!answer.ok()) {
    std::cerr << "kiln targets: " << answer.status().message() << "\n";
    return 1;
  }
  if (as_json) {
    std::cout << answer->dump(2) << "\n";
  } else {
    PrintTargetsTable(*answer, std::cout);
  }
  return 0;
}

int RunRelease(const RemoteClient& client, const std::string& target) {
  auto answer = RequestJson(client, "POST", "/_kiln/remote/release", "target=" + UriEncode(target));
  if (!answer.ok()) {
    std::cerr << "kiln release: " << answer.status().message() << "\n";
    return 1;
  }
  // "Released": "hold before start" (the program starts now) or "hold after exit" (it ends).
  std::cout << "released " << answer->value("Target", target) << " (" << answer->value("Released", "hold") << ")\n";
  return 0;
}

int RunInterrupt(const RemoteClient& client, const std::string& job) {
  auto answer = RequestJson(client, "POST", "/_kiln/training/interrupt", "job=" + UriEncode(job));
  if (!answer.ok()) {
    std::cerr << "kiln interrupt: " << answer.status().message() << "\n";
    return 1;
  }
  std::cout << "interrupted " << answer->value("TrainingJobName", job)
            << ": it resumes from its checkpoints when capacity returns\n";
  return 0;
}

int RunConnections(const RemoteClient& client, const std::string& resource, int max_results, bool as_json) {
  std::string query;
  if (max_results > 0) query = "max-results=" + std::to_string(max_results);
  if (!resource.empty()) query += (query.empty() ? "" : "&") + std::string("resource=") + UriEncode(resource);
  auto answer = GetJson(client, "/_kiln/remote/connections", query);
  if (!answer.ok()) {
    std::cerr << "kiln connections: " << answer.status().message() << "\n";
    return 1;
  }
  if (as_json) {
    std::cout << answer->dump(2) << "\n";
  } else {
    PrintConnectionsTable(*answer, std::cout);
  }
  return 0;
}

}  // namespace kiln::cli
