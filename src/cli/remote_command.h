#pragma once
// The client side of remote access (spec/remote-access.md §3.5, notes' "The client"):
//   kiln ssh-proxy <target>      one SigV4-signed `GET /_kiln/remote/connect` upgraded to a raw
//                                byte stream, spliced to stdin/stdout (OpenSSH's ProxyCommand);
//   kiln connect <target>        runs OpenSSH `ssh` through that proxy, or with --local-port
//                                serves the tunnel on 127.0.0.1:<port> for any SSH client;
//   kiln port-forward, kiln ssh-config, kiln targets, kiln connections.
// The server parses targets; the client passes the user's text through (only `--wait` needs to
// know which resource a target belongs to, see ResourceOfTarget).
//
// Wire protocol (must match access::TunnelService): request headers Host, Connection: Upgrade,
// Upgrade: kiln-ssh, X-Kiln-Ssh-Public-Key, X-Amz-Date, Authorization (service `sagemaker`,
// payload hash of ""; host and x-kiln-ssh-public-key signed). 101 → raw SSH bytes; anything else is
// an AWS JSON error ({"__type", "message"}).

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "aws/credentials.h"
#include "aws/sigv4.h"
#include "base/fs.h"
#include "base/io.h"
#include "base/status.h"
#include "net/upgrade_client.h"

namespace kiln::cli {

// The server's URL, split. Only http:// (Kiln's front door speaks plain HTTP).
struct RemoteEndpoint {
  std::string url;   // as given, without a trailing '/'
  std::string host;  // without brackets ("::1")
  int port = 80;
  std::string authority;  // host[:port] as written in the URL: the Host header
};
Result<RemoteEndpoint> ParseEndpoint(std::string_view url);

// Where and as whom the client talks to Kiln (resolved like `kiln logs`).
struct RemoteClient {
  RemoteEndpoint endpoint;
  std::string region = "us-east-1";
  aws::Credential credential;
  int64_t time_millis = 0;  // signing time; 0 = now (tests fix it)
};

// ---- The key pair (R-20) ----
// "$HOME/.ssh/sagemaker-ssh-gw".
std::string DefaultKeyPath();
// Returns the public key line ("ssh-ed25519 AAAA... kiln") of the pair at `private_key_path` (+ ".pub").
// When the private key is absent, creates an Ed25519 pair: the directory 0700 when it has to be
// created, the private key 0600, the public key 0644, and says so on `notice`. When only the .pub
// is missing it is derived from the private key (unencrypted keys only).
Result<std::string> EnsureKeyPair(const std::string& private_key_path, std::ostream& notice);

// ---- The upgrade ----
// The signed request, headers included (Connection/Upgrade are added after signing: proxies may
// rewrite hop-by-hop headers, so they are not covered by the signature).
aws::OwnedSignable ConnectRequest(const RemoteClient& client, std::string_view target, std::string_view public_key);
// HTTP/1.1 wire text of a bodiless request.
std::string SerializeRequest(const aws::OwnedSignable& request);

// The answer to the upgrade request (net/upgrade_client.h). On 101 `fd` is the tunnel and
// `buffered` holds the stream bytes that arrived with the head (they come before anything read
// from `fd`); otherwise `body` is the refusal.
using UpgradeAnswer = net::UpgradeResult;
// Sends `request` on a new connection with net::OpenUpgrade; any HTTP status is a result.
// Errors: Unavailable (cannot connect, connection closed early; the message names the URL),
// DeadlineExceeded (no answer within 30 s), DataLoss/ResourceExhausted (a malformed answer).
Result<UpgradeAnswer> OpenUpgrade(const RemoteEndpoint& endpoint, const aws::OwnedSignable& request);
// "<Code>: <message>" of a non-101 answer (AWS JSON error, else the status and body).
std::string DescribeErrorAnswer(const UpgradeAnswer& answer);
// EnsureKeyPair + ConnectRequest + OpenUpgrade. A non-101 answer is an error (FailedPrecondition,
// DescribeErrorAnswer's text).
Result<UpgradeAnswer> OpenTunnel(const RemoteClient& client, std::string_view target, std::string_view public_key);

// Copies in_fd → sock and sock → out_fd (`buffered` first) until `sock` reaches EOF. EOF on in_fd
// half-closes the socket (shutdown SHUT_WR) and keeps reading it. in_fd may equal out_fd (a
// socket). Returns Ok on the socket's EOF or when out_fd's reader went away; errors on socket
// errors. Blocking fds; writes are whole (one direction stalls while the other side's buffer is full,
// as in any byte pipe; SSH's windows keep that short). `server_closed`, when given, is set when the
// socket ended while in_fd was still open (Kiln closed the connection, not the client).
Status SpliceStreams(int in_fd, int out_fd, int sock, std::string_view buffered, bool* server_closed = nullptr);

// Why Kiln closed connection `connection_id` (its audit row's CloseReason, from the connections
// route for ResourceOfTarget(target)); "" when unknown or not a server-side reason (the client
// disconnected, the session's shell ended). The server writes the reason before it closes.
std::string ServerCloseReason(const RemoteClient& client, std::string_view target, std::string_view connection_id);

// ---- ssh ----
// Quotes `word` for /bin/sh when it holds anything outside [A-Za-z0-9_./:@%+=,-].
std::string ShellQuote(std::string_view word);
// ssh-config-safe alias derived from a target: every run of characters outside [A-Za-z0-9._-]
// becomes one '-' ("training-job/j/algo-1" → "training-job-j-algo-1").
std::string DefaultAlias(std::string_view target);
// One known-hosts name per server (its host key is the same for every target):
// "kiln-<host>-<port>" with characters outside [A-Za-z0-9.-] as '-'.
std::string HostKeyAlias(const RemoteEndpoint& endpoint);

struct SshSettings {
  std::string kiln_path;                 // absolute path of this binary
  std::vector<std::string> proxy_flags;  // --config/--data-dir to pass on to ssh-proxy
  std::string endpoint_url;
  std::string key_path;
  std::string known_hosts;  // UserKnownHostsFile
  std::string host_key_alias;
};
// The ProxyCommand line ssh runs through the shell: `<kiln> ssh-proxy [flags] --endpoint-url U
// --key K <target>`, every word shell-quoted and then '%' doubled for ssh's token expansion, except
// `target` when it is exactly "%h" (the wildcard form).
std::string ProxyCommandLine(const SshSettings& settings, std::string_view target);

struct SshCommand {
  std::string target;
  std::vector<std::string> local_forwards;   // -L specs
  std::vector<std::string> remote_forwards;  // -R specs
  bool tty = false;                          // -t
  bool no_command = false;                   // -N (port-forward)
  std::vector<std::string> command;
};
// The exact argv of the OpenSSH client (argv[0] = "ssh").
std::vector<std::string> SshArgv(const SshSettings& settings, const SshCommand& command);
// The ~/.ssh/config block of `kiln ssh-config`, with the commented `Host *.training.kiln` form.
std::string SshConfigBlock(const SshSettings& settings, std::string_view target, std::string_view alias);

// ---- targets / wait ----
// The `resource` to ask the targets route about for a target text: "training-job/<job>" for
// every training form, "endpoint/<ep>" for endpoint forms, a bare name or an ARN as is.
std::string ResourceOfTarget(std::string_view target);
// The entry of a targets answer that `target` names (by Target/Alias, else by host name, else
// the first); null when none.
const nlohmann::json* FindTargetEntry(const nlohmann::json& answer, std::string_view target);

// Polls `fetch` (the targets answer for ResourceOfTarget) every `poll_seconds` until the target's
// State is Ready or Held. Progress lines go to `progress` when the state changes.
// Errors: FailedPrecondition with the FailureReason when the resource is Failed/Stopped/Completed
// or the target Gone; PermissionDenied when AccessEnabled is false; DeadlineExceeded after
// `timeout_seconds`; fetch's own errors.
using TargetsFetch = std::function<Result<nlohmann::json>()>;
using Sleeper = std::function<void(int seconds)>;
Status WaitForTarget(const TargetsFetch& fetch, std::string_view target, int timeout_seconds, int poll_seconds,
                     std::ostream& progress, const Sleeper& sleep);

// A signed GET of a JSON route (`raw_query` already percent-encoded). Non-200: the answer's
// "<Code>: <message>" (NotFound for ResourceNotFound, else FailedPrecondition).
Result<nlohmann::json> GetJson(const RemoteClient& client, const std::string& path, const std::string& raw_query);
// The same with another method (POST: an empty body).
Result<nlohmann::json> RequestJson(const RemoteClient& client, const std::string& method, const std::string& path,
                                   const std::string& raw_query);

// Tables of `kiln targets` / `kiln connections`.
void PrintTargetsTable(const nlohmann::json& answer, std::ostream& out);
void PrintConnectionsTable(const nlohmann::json& answer, std::ostream& out);

// ---- the commands (return the process exit status) ----
int RunSshProxy(const RemoteClient& client, const std::string& key_path, const std::string& target);

struct ConnectOptions {
  std::string target;
  std::string key_path;
  std::vector<std::string> proxy_flags;
  std::vector<std::string> local_forwards;
  std::vector<std::string> remote_forwards;
  std::vector<std::string> command;
  int local_port = 0;  // 0: exec ssh
  bool wait = false;
  int wait_timeout_seconds = 900;
};
int RunConnect(const RemoteClient& client, const ConnectOptions& options);
int RunPortForward(const RemoteClient& client, const ConnectOptions& options, int remote_port, int local_port);
int RunSshConfig(const RemoteClient& client, const std::string& key_path, const std::vector<std::string>& proxy_flags,
                 const std::string& target, const std::string& alias);
int RunTargets(const RemoteClient& client, const std::string& resource, bool json);
int RunConnections(const RemoteClient& client, const std::string& resource, int max_results, bool json);
// `kiln release <target>`: POST /_kiln/remote/release — a held target's program starts (hold
// before start) or its post-mortem hold ends (hold after exit); control/training_hold.h.
int RunRelease(const RemoteClient& client, const std::string& target);
// `kiln interrupt <job>`: POST /_kiln/training/interrupt?job=<job> — a managed-spot job's
// instances are reclaimed as a spot interruption does (issue 18); it resumes from its checkpoints
// when capacity returns. Errors to stderr as "kiln interrupt: <message>", exit status 1.
int RunInterrupt(const RemoteClient& client, const std::string& job);

}  // namespace kiln::cli
