#pragma once
// The remote-access agent's SSH-2 server (spec remote-access.md R-7..R-12): serves one SSH
// connection over a file descriptor that is already connected (one end of a socketpair or a Unix
// socket handed over by the daemon). The agent never listens on a TCP port.
//
//   ASSIGN_OR_RETURN(auto agent, AgentSession::Create(std::move(options)));
//   Status served = agent->Serve(fd);  // blocks until the client disconnects
//
// What a client gets: public-key authentication against AgentOptions::authorized_keys only;
// `session` channels with pty-req (forkpty; window-change resizes the PTY), env, shell (not a
// login shell: the workload's environment stays), exec (exit-status / exit-signal sent back), signal, and the `sftp`
// subsystem (libssh's sftp server messages, enough for OpenSSH's sftp and scp); `direct-tcpip` channels (connected from
// the agent's network namespace) and `tcpip-forward` (listening on the namespace's loopback
// only, like sshd's GatewayPorts=no, with `forwarded-tcpip` channels back); keep-alives. Everything runs in the calling
// thread on one poll loop; children are forked, reaped, and killed (their whole process group, SIGKILL) when the
// connection ends, so no process outlives the connection unless it left its process group.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace kiln::access {

// Something a client did on a connection, for the daemon's audit.
struct AgentEvent {
  enum class Kind {
    kAuthenticated,  // user: the name the client logged in with (ignored otherwise)
    kShellStarted,   // a shell began (with or without a PTY)
    kShellEnded,     // exit_status, or signal when it was killed (also when the connection ended)
    kExecStarted,    // command
    kExecEnded,      // command; exit_status, or signal
    kDirectTcpip,    // host, port: a -L / -W channel connected from the agent's network namespace
    kTcpipForward,   // address, port (the bound one): a -R listener opened
  };
  Kind kind = Kind::kAuthenticated;
  std::string user;
  std::string command;
  int exit_status = -1;  // -1 when the child died of a signal
  std::string signal;    // "KILL", "TERM", ... (RFC 4254 names); empty unless it died of one
  std::string host;      // direct-tcpip's destination, tcpip-forward's bind address
  int port = 0;
};

// "authenticated", "shell-started", "shell", "exec-started", "exec", "direct-tcpip", "tcpip-forward".
const char* AgentEventName(AgentEvent::Kind kind);

struct AgentOptions {
  // Where the Ed25519 host key lives (OpenSSH private-key format, mode 0600). Created on Create()
  // when absent, so a server keeps one host key across connections and restarts. Empty: a fresh
  // key in memory per AgentSession (clients then see a new host key each time).
  std::string host_key_path;
  // OpenSSH public-key lines ("ssh-ed25519 AAAA... comment"); the only keys accepted. Must not be
  // empty: an agent that accepts nobody is a configuration error. The user name a client logs in
  // with is ignored: every session runs as the workload (uid/gid below).
  std::vector<std::string> authorized_keys;
  // The children's whole environment ("NAME=value"), e.g. the workload's PID 1 environ. The agent
  // adds what the client sends with `env` requests, TERM for PTYs, and SSH_CONNECTION-like
  // variables are not added (the transport is not TCP).
  std::vector<std::string> environment;
  // The children's working directory; "/" when empty or missing.
  std::string working_directory = "/";
  // The shell; empty: $SHELL from `environment`, else /bin/sh. Shell requests run it without "-l"
  // (a login shell's profile would replace `environment`, e.g. PATH); exec requests run
  // `<shell> -c <command>`.
  std::string shell;
  // The children's user and group; -1 keeps the agent's. Setting them needs the agent to be root.
  int uid = -1;
  int gid = -1;
  // Seconds between keep-alive requests to an idle client; 0 disables them. Cheap; a dead peer
  // is also noticed when the socket closes.
  int keepalive_interval_s = 15;
  // Seconds a client may take to authenticate before it is disconnected (sshd's LoginGraceTime);
  // 0: no limit. A client is also disconnected after 20 refused public-key attempts.
  int login_grace_s = 60;
  // Called for every AgentEvent, on the thread running Serve(), in the order they happen. Must
  // not block for long (the connection waits) and must not call back into the session. Empty:
  // no events.
  std::function<void(const AgentEvent&)> on_event;
};

// Serves SSH connections with fixed options. Thread-safe: immutable after Create(), and several
// Serve() calls may run at once (each connection keeps its own state).
class AgentSession {
 public:
  // Loads (or creates) the host key and parses the authorized keys. InvalidArgument for an
  // unparsable key line or no authorized keys; an error from reading or writing the host key file.
  static Result<std::unique_ptr<AgentSession>> Create(AgentOptions options);

  AgentSession(const AgentSession&) = delete;
  AgentSession& operator=(const AgentSession&) = delete;
  ~AgentSession();

  // Serves one SSH connection on `fd`, which it takes over (closed on return in every case).
  // SIGPIPE is blocked in the calling thread while it runs (the process's disposition is left
  // alone), so a child that stops reading or a reset socket cannot kill the process.
  // Returns OK when the client disconnected after authenticating, Unauthenticated when it left
  // without a successful authentication, Unavailable when key exchange failed. All children of
  // the connection are killed and reaped, and forwarding listeners closed, before it returns.
  Status Serve(int fd) const;

  // The host key's public half as an OpenSSH line ("ssh-ed25519 AAAA..."), e.g. for known_hosts.
  const std::string& host_public_key() const { return host_public_key_; }

  const AgentOptions& options() const { return options_; }

 private:
  AgentSession() = default;
  Status ServeBlocked(int fd) const;  // Serve() with SIGPIPE blocked in the calling thread

  AgentOptions options_;
  std::string host_key_base64_;  // the private key in OpenSSH format; imported per connection
  std::string host_public_key_;
  // (type name, base64 blob) of each authorized key; imported per connection because libssh keys
  // are not shareable across threads.
  std::vector<std::pair<std::string, std::string>> authorized_;
};

}  // namespace kiln::access
