#include "access/agent_session.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <tuple>
#include <algorithm>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <libssh/callbacks.h>
#include <libssh/libssh.h>
#include <libssh/server.h>

#include "base/fs.h"
#include "access/sftp_handler.h"

namespace kiln::access {
namespace {

using Clock = std::chrono::steady_clock;

// Client input held for a child (or socket) that is not reading: past this the data callback
// leaves bytes in libssh's buffer, which stops growing the client's window (flow control).
constexpr size_t kMaxPendingInput = 1 << 20;
// Poll tick while some input waits for its reader (short, so a slow reader is refilled quickly)
// and otherwise (only timers: reaping, keep-alives, the login grace).
constexpr int kBusyTickMs = 2;
constexpr int kIdleTickMs = 100;
// How long a direct-tcpip connect may take before the channel open is refused.
constexpr int kConnectTimeoutMs = 10000;
// Failed public-key attempts (including keys merely offered) before the agent disconnects.
constexpr int kMaxAuthFailures = 20;

// Deleters for libssh's handles.
struct SessionFree {
  void operator()(ssh_session s) const { ssh_free(s); }
};
struct BindFree {
  void operator()(ssh_bind b) const { ssh_bind_free(b); }
};
struct EventFree {
  void operator()(ssh_event e) const { ssh_event_free(e); }
};
struct KeyFree {
  void operator()(ssh_key k) const { ssh_key_free(k); }
};
using KeyPtr = std::unique_ptr<ssh_key_struct, KeyFree>;

std::string PublicLine(ssh_key key) {
  char* b64 = nullptr;
  if (ssh_pki_export_pubkey_base64(key, &b64) != SSH_OK) return "";
  std::string line = std::string(ssh_key_type_to_char(ssh_key_type(key))) + " " + b64;
  ssh_string_free_char(b64);
  return line;
}

// The signal names of RFC 4254 §6.10 ("INT", not "SIGINT").
int SignalFromName(const std::string& name) {
  static const std::map<std::string, int> kSignals = {
      {"ABRT", SIGABRT}, {"ALRM", SIGALRM}, {"FPE", SIGFPE},   {"HUP", SIGHUP},   {"ILL", SIGILL},
      {"INT", SIGINT},   {"KILL", SIGKILL}, {"PIPE", SIGPIPE}, {"QUIT", SIGQUIT}, {"SEGV", SIGSEGV},
      {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
  auto it = kSignals.find(name);
  return it == kSignals.end() ? 0 : it->second;
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGABRT: return "ABRT";
    case SIGALRM: return "ALRM";
    case SIGFPE: return "FPE";
    case SIGHUP: return "HUP";
    case SIGILL: return "ILL";
    case SIGINT: return "INT";
    case SIGKILL: return "KILL";
    case SIGPIPE: return "PIPE";
    case SIGQUIT: return "QUIT";
    case SIGSEGV: return "SEGV";
    case SIGTERM: return "TERM";
    case SIGUSR1: return "USR1";
    case SIGUSR2: return "USR2";
    default: return "SIG" + std::to_string(sig);
  }
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Connects to host:port (blocking); -1 with errno on failure.
int ConnectTcp(const std::string& host, int port) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0) {
    errno = EHOSTUNREACH;
    return -1;
  }
  int fd = -1;
  for (struct addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    // Non-blocking with a deadline: an unreachable host must not stall the connection's loop
    // for the kernel's SYN timeout (minutes). The loop still waits up to kConnectTimeoutMs.
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd pfd = {fd, POLLOUT, 0};
      int err = ETIMEDOUT;
      if (poll(&pfd, 1, kConnectTimeoutMs) == 1) {
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      rc = err == 0 ? 0 : -1;
    }
    if (rc == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  return fd;
}

// Listens on loopback:port for a tcpip-forward to `address` (port 0: any); returns the fd and
// sets *bound_port, or -1.
int ListenTcp(const std::string& address, int port, int* bound_port) {
  // Loopback only, whatever the client asks (sshd's default GatewayPorts=no): a -R forward must
  // not open a port to the instance's network (R-9's spirit: nothing listens beyond the instance).
  std::string host = address == "::1" ? "::1" : "127.0.0.1";
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (struct addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 16) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) return -1;
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

class Connection;

// One SSH channel and what it is connected to: a child (session channels), a TCP socket
// (direct-tcpip / forwarded-tcpip) or the sftp handler.
struct Channel {
  enum class Kind { kSession, kTcp };
  Connection* connection = nullptr;
  ssh_channel channel = nullptr;
  Kind kind = Kind::kSession;
  ssh_channel_callbacks_struct callbacks;
  // Session state set by requests before shell/exec.
  std::vector<std::string> env;
  bool want_pty = false;
  std::string term;
  struct winsize size {};
  // The child (session) or socket (tcp); -1 when none.
  pid_t pid = -1;
  int out_fd = -1;  // child's stdout (or the PTY master) / the socket; read into the channel
  int err_fd = -1;  // child's stderr (no PTY)
  int in_fd = -1;   // child's stdin (or the PTY master again) / the socket; written from the channel
  // Client data accepted but not yet written to in_fd (at most kMaxPendingInput before the data
  // callback stops taking more), and whether the client sent EOF (in_fd is closed / shut down
  // once pending_in is written).
  std::string pending_in;
  // The data callback left client bytes in libssh's channel buffer (pending_in was full).
  bool input_in_libssh = false;
  bool input_eof = false;
  bool input_closed = false;
  bool out_open = false;
  bool err_open = false;
  // The fd reached EOF inside a poll callback; the loop unwatches it (RetireEofFds).
  bool out_eof = false;
  bool err_eof = false;
  // The client's window is closed: CopyOut asked for a pause; the loop took the output fds out of
  // the event (output_paused) until the window reopens.
  bool pause_requested = false;
  bool output_paused = false;
  bool child_exited = false;
  int wait_status = 0;
  std::unique_ptr<SftpHandler> sftp;
  // What the child runs, for events: the exec request's command; is_shell for a shell request.
  std::string command;
  bool is_shell = false;
  bool closed_by_peer = false;  // the client sent CLOSE
  bool finished = false;        // we closed it; the entry is freed by the loop
};

// A tcpip-forward listener.
struct Forward {
  Connection* connection = nullptr;
  std::string address;
  int port = 0;
  int fd = -1;
  bool cancelled = false;  // cancel-tcpip-forward came; RetireEofFds closes it
};

// The state of one connection; lives on Serve()'s stack.
class Connection {
 public:
  Connection(const AgentSession& agent, ssh_session session, ssh_event event)
      : options_(agent.options()), session_(session), event_(event) {}
  ~Connection() { Shutdown(); }

  bool authenticated() const { return authenticated_; }
  std::vector<KeyPtr>& keys() { return keys_; }
  void Run();

  // libssh callbacks (userdata is the Connection or the Channel).
  static int OnAuthPubkey(ssh_session, const char* user, ssh_key key, char state, void* self);
  static ssh_channel OnSessionOpen(ssh_session, void* self);
  static int OnMessage(ssh_session, ssh_message msg, void* self);
  static int OnData(ssh_session, ssh_channel, void* data, uint32_t len, int is_stderr, void* ch);
  static void OnEof(ssh_session, ssh_channel, void* ch);
  static void OnClose(ssh_session, ssh_channel, void* ch);
  static void OnSignal(ssh_session, ssh_channel, const char* name, void* ch);
  static int OnPty(ssh_session, ssh_channel, const char* term, int w, int h, int pw, int ph, void* ch);
  static int OnWindowChange(ssh_session, ssh_channel, int w, int h, int pw, int ph, void* ch);
  static int OnEnv(ssh_session, ssh_channel, const char* name, const char* value, void* ch);
  static int OnShell(ssh_session, ssh_channel, void* ch);
  static int OnExec(ssh_session, ssh_channel, const char* command, void* ch);
  static int OnSubsystem(ssh_session, ssh_channel, const char* name, void* ch);
  static int OnFdReadable(socket_t fd, int revents, void* ch);
  static int OnForwardAcceptable(socket_t fd, int revents, void* self);

 private:
  Channel* AddChannel(ssh_channel channel, Channel::Kind kind);
  int StartChild(Channel* ch, const char* command);
  void WatchFd(Channel* ch, int fd);
  void UnwatchFd(Channel* ch, int* fd, bool* open);
  // Copies what `fd` has into the channel, within the client's window: kDrained when the fd has
  // no more for now, kMore when it stopped after a bounded amount (fairness), kPaused when the
  // window is closed (pause_requested is set), kEnd at EOF or error.
  enum class Copied { kDrained, kMore, kPaused, kEnd };
  Copied CopyOut(Channel* ch, int fd, bool is_stderr);
  // Takes paused channels' fds out of the event, and puts them back once the window reopens.
  void PauseAndResumeOutput();
  void Reap();
  void FinishChannels();
  void Finish(Channel* ch);
  void OpenPendingForwards();
  // Unwatches the fds that reached EOF in callbacks and closes cancelled forwards: removing a
  // poll handle is only safe outside ssh_event_dopoll.
  void RetireEofFds();
  // Writes pending_in to in_fd without blocking; drops it (and later input) once the reader is
  // gone; closes or shuts down in_fd after the client's EOF.
  void FlushInput(Channel* ch);
  // FlushInput, then takes bytes the data callback left in libssh's buffer while pending_in was full.
  void PumpInput(Channel* ch);
  void Shutdown();
  void Emit(const AgentEvent& event) const {
    if (options_.on_event) options_.on_event(event);
  }
  // The *Ended event of a session channel's child that was reaped with `wait_status`.
  void EmitChildEnded(const Channel& ch, int wait_status) const;

  const AgentOptions& options_;
  ssh_session session_;
  ssh_event event_;
  std::vector<KeyPtr> keys_;
  bool authenticated_ = false;
  int auth_failures_ = 0;
  bool transport_gone_ = false;  // set by Shutdown(): channels are freed without messages
  std::list<Channel> channels_;  // list: Channel addresses are userdata for libssh
  std::list<Forward> forwards_;
  // Connections accepted on a forward, waiting for their forwarded-tcpip channel to be opened
  // outside the poll callback: (socket, forward).
  std::vector<std::pair<int, Forward*>> pending_accepts_;
  // The process group of every child started (each is its group's leader), killed when the
  // connection ends: also the groups whose leader already exited but left background jobs.
  std::vector<pid_t> groups_;
};

int Connection::OnAuthPubkey(ssh_session, const char* user, ssh_key key, char state, void* self) {
  auto* conn = static_cast<Connection*>(self);
  bool known = false;
  for (const KeyPtr& allowed : conn->keys_) {
    if (ssh_key_cmp(allowed.get(), key, SSH_KEY_CMP_PUBLIC) == 0) known = true;
  }
  if (!known) {
    ++conn->auth_failures_;
    return SSH_AUTH_DENIED;
  }
  // STATE_NONE is the client asking whether the key would do; only a valid signature logs in.
  if (state == SSH_PUBLICKEY_STATE_NONE) return SSH_AUTH_SUCCESS;
  if (state != SSH_PUBLICKEY_STATE_VALID) {
    ++conn->auth_failures_;
    return SSH_AUTH_DENIED;
  }
  conn->authenticated_ = true;
  AgentEvent event;
  event.kind = AgentEvent::Kind::kAuthenticated;
  event.user = user != nullptr ? user : "";
  conn->Emit(event);
  return SSH_AUTH_SUCCESS;
}

Channel* Connection::AddChannel(ssh_channel channel, Channel::Kind kind) {
  Channel& ch = channels_.emplace_back();
  ch.connection = this;
  ch.channel = channel;
  ch.kind = kind;
  memset(&ch.callbacks, 0, sizeof(ch.callbacks));
  ch.callbacks.userdata = &ch;
  ch.callbacks.channel_data_function = OnData;
  ch.callbacks.channel_eof_function = OnEof;
  ch.callbacks.channel_close_function = OnClose;
  if (kind == Channel::Kind::kSession) {
    ch.callbacks.channel_signal_function = OnSignal;
    ch.callbacks.channel_pty_request_function = OnPty;
    ch.callbacks.channel_pty_window_change_function = OnWindowChange;
    ch.callbacks.channel_env_request_function = OnEnv;
    ch.callbacks.channel_shell_request_function = OnShell;
    ch.callbacks.channel_exec_request_function = OnExec;
    ch.callbacks.channel_subsystem_request_function = OnSubsystem;
  }
  ssh_callbacks_init(&ch.callbacks);
  ssh_set_channel_callbacks(channel, &ch.callbacks);
  return &ch;
}

ssh_channel Connection::OnSessionOpen(ssh_session session, void* self) {
  auto* conn = static_cast<Connection*>(self);
  if (!conn->authenticated_) return nullptr;
  ssh_channel channel = ssh_channel_new(session);
  if (channel == nullptr) return nullptr;
  conn->AddChannel(channel, Channel::Kind::kSession);
  return channel;
}

int Connection::OnMessage(ssh_session, ssh_message msg, void* self) {
  auto* conn = static_cast<Connection*>(self);
  if (!conn->authenticated_) return 1;  // default reply: refused
  int type = ssh_message_type(msg);
  int subtype = ssh_message_subtype(msg);
  if (type == SSH_REQUEST_CHANNEL_OPEN && subtype == SSH_CHANNEL_DIRECT_TCPIP) {
    // -L: connect from here (the agent's network namespace), then accept the channel.
    std::string host = ssh_message_channel_request_open_destination(msg);
    int port = ssh_message_channel_request_open_destination_port(msg);
    int fd = ConnectTcp(host, port);
    if (fd < 0) return 1;
    ssh_channel channel = ssh_message_channel_request_open_reply_accept(msg);
    if (channel == nullptr) {
      close(fd);
      return 0;
    }
    Channel* ch = conn->AddChannel(channel, Channel::Kind::kTcp);
    ch->in_fd = fd;
    ch->out_fd = fd;
    conn->WatchFd(ch, fd);
    ch->out_open = true;
    AgentEvent event;
    event.kind = AgentEvent::Kind::kDirectTcpip;
    event.host = host;
    event.port = port;
    conn->Emit(event);
    return 0;
  }
  if (type == SSH_REQUEST_GLOBAL && subtype == SSH_GLOBAL_REQUEST_TCPIP_FORWARD) {
    // -R: listen here; each accepted connection becomes a forwarded-tcpip channel.
    std::string address = ssh_message_global_request_address(msg) ? ssh_message_global_request_address(msg) : "";
    int bound = 0;
    int fd = ListenTcp(address, ssh_message_global_request_port(msg), &bound);
    if (fd < 0) return 1;
    Forward& fwd = conn->forwards_.emplace_back();
    fwd.address = address;
    fwd.port = bound;
    fwd.fd = fd;
    fwd.connection = conn;
    ssh_event_add_fd(conn->event_, fd, POLLIN, OnForwardAcceptable, &fwd);
    ssh_message_global_request_reply_success(msg, static_cast<uint16_t>(bound));
    AgentEvent event;
    event.kind = AgentEvent::Kind::kTcpipForward;
    event.host = address;
    event.port = bound;
    conn->Emit(event);
    return 0;
  }
  if (type == SSH_REQUEST_GLOBAL && subtype == SSH_GLOBAL_REQUEST_CANCEL_TCPIP_FORWARD) {
    std::string address = ssh_message_global_request_address(msg) ? ssh_message_global_request_address(msg) : "";
    int port = ssh_message_global_request_port(msg);
    for (Forward& fwd : conn->forwards_) {
      if (!fwd.cancelled && fwd.address == address && fwd.port == port) {
        fwd.cancelled = true;  // closed by the loop, outside libssh's poll dispatch
        ssh_message_global_request_reply_success(msg, 0);
        return 0;
      }
    }
    return 1;
  }
  return 1;
}

int Connection::OnForwardAcceptable(socket_t fd, int, void* fwd_ptr) {
  auto* fwd = static_cast<Forward*>(fwd_ptr);
  if (fwd->cancelled) return 0;
  int client = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (client < 0) return 0;
  // Opening a channel waits for the client's answer, which must not happen inside the poll
  // callback: the loop opens it (OpenPendingForwards).
  fwd->connection->pending_accepts_.emplace_back(client, fwd);
  return 0;
}

void Connection::OpenPendingForwards() {
  auto pending = std::move(pending_accepts_);
  pending_accepts_.clear();
  for (auto [fd, fwd] : pending) {
    if (fwd->cancelled) {
      close(fd);
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char peer[INET6_ADDRSTRLEN] = "127.0.0.1";
    int peer_port = 0;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      if (ss.ss_family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &sin->sin_addr, peer, sizeof(peer));
        peer_port = ntohs(sin->sin_port);
      } else if (ss.ss_family == AF_INET6) {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &sin6->sin6_addr, peer, sizeof(peer));
        peer_port = ntohs(sin6->sin6_port);
      }
    }
    ssh_channel channel = ssh_channel_new(session_);
    if (channel == nullptr ||
        ssh_channel_open_reverse_forward(channel, fwd->address.c_str(), fwd->port, peer, peer_port) != SSH_OK) {
      if (channel != nullptr) ssh_channel_free(channel);
      close(fd);
      continue;
    }
    Channel* ch = AddChannel(channel, Channel::Kind::kTcp);
    ch->in_fd = fd;
    ch->out_fd = fd;
    WatchFd(ch, fd);
    ch->out_open = true;
  }
}

void Connection::PauseAndResumeOutput() {
  for (Channel& ch : channels_) {
    if (ch.finished) continue;
    if (ch.pause_requested && !ch.output_paused) {
      if (ch.out_open) ssh_event_remove_fd(event_, ch.out_fd);
      if (ch.err_open) ssh_event_remove_fd(event_, ch.err_fd);
      ch.output_paused = true;
    }
    if (ch.output_paused && ssh_channel_window_size(ch.channel) > 0) {
      if (ch.out_open) ssh_event_add_fd(event_, ch.out_fd, POLLIN, OnFdReadable, &ch);
      if (ch.err_open) ssh_event_add_fd(event_, ch.err_fd, POLLIN, OnFdReadable, &ch);
      ch.output_paused = false;
      ch.pause_requested = false;
    }
  }
}

void Connection::RetireEofFds() {
  for (Channel& ch : channels_) {
    if (ch.out_eof && ch.out_open) UnwatchFd(&ch, &ch.out_fd, &ch.out_open);
    if (ch.err_eof && ch.err_open) UnwatchFd(&ch, &ch.err_fd, &ch.err_open);
  }
  for (auto it = forwards_.begin(); it != forwards_.end();) {
    if (!it->cancelled) {
      ++it;
      continue;
    }
    // Connections it accepted meanwhile (in a nested poll) die with it.
    std::erase_if(pending_accepts_, [&](const std::pair<int, Forward*>& pending) {
      if (pending.second != &*it) return false;
      close(pending.first);
      return true;
    });
    ssh_event_remove_fd(event_, it->fd);
    close(it->fd);
    it = forwards_.erase(it);
  }
}

void Connection::WatchFd(Channel* ch, int fd) {
  SetNonBlocking(fd);
  ssh_event_add_fd(event_, fd, POLLIN, OnFdReadable, ch);
}

void Connection::UnwatchFd(Channel* ch, int* fd, bool* open) {
  if (*fd < 0 || !*open) return;
  ssh_event_remove_fd(event_, *fd);
  *open = false;
  // A socket is both in and out: shut down reading only; the write side closes with the channel.
  if (ch->kind == Channel::Kind::kTcp) {
    shutdown(*fd, SHUT_RD);
    return;
  }
  if (*fd == ch->in_fd) return;  // the PTY master stays open for input until Finish()
  close(*fd);
  *fd = -1;
}

Connection::Copied Connection::CopyOut(Channel* ch, int fd, bool is_stderr) {
  char buf[32 * 1024];
  for (int rounds = 0; rounds < 8; ++rounds) {
    // Read no more than the client's window takes: ssh_channel_write would otherwise block (in a
    // nested poll) until the client reads. At 0 the loop takes the fds out of the event until the
    // window reopens, and the child blocks on its full pipe, as under sshd.
    uint32_t window = ssh_channel_window_size(ch->channel);
    if (window == 0) {
      ch->pause_requested = true;
      return Copied::kPaused;
    }
    ssize_t n = read(fd, buf, std::min<size_t>(sizeof(buf), window));
    if (n > 0) {
      int rc = is_stderr ? ssh_channel_write_stderr(ch->channel, buf, static_cast<uint32_t>(n))
                         : ssh_channel_write(ch->channel, buf, static_cast<uint32_t>(n));
      if (rc == SSH_ERROR) return Copied::kEnd;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return Copied::kDrained;
    return Copied::kEnd;  // EOF, or EIO from a PTY master whose slave side is gone
  }
  return Copied::kMore;
}

int Connection::OnFdReadable(socket_t fd, int revents, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  Connection* conn = ch->connection;
  if (ch->finished || ch->closed_by_peer) return 0;
  bool is_stderr = fd == ch->err_fd;
  bool& at_eof = is_stderr ? ch->err_eof : ch->out_eof;
  if (at_eof) return 0;
  if ((revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) == 0) return 0;
  if (conn->CopyOut(ch, fd, is_stderr) != Copied::kEnd) return 0;
  // Not removed from the event here: libssh's dispatch loop touches this fd's poll slot after the
  // callback returns (and a nested poll's removal would shift the outer loop's slots), so the
  // loop removes it (RetireEofFds) once dopoll has returned.
  at_eof = true;
  // A socket's EOF is the end of what it sends: pass it on. A child's channel ends when it exits.
  if (ch->kind == Channel::Kind::kTcp) ssh_channel_send_eof(ch->channel);
  return 0;
}

int Connection::OnData(ssh_session, ssh_channel, void* data, uint32_t len, int, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  // sftp reads its requests from the channel's buffer itself (SftpHandler::Pump).
  if (ch->sftp != nullptr) return 0;
  if (ch->in_fd < 0 || ch->input_closed) return static_cast<int>(len);  // nobody to give it to: drop
  // Full: leave the bytes in libssh's buffer (PumpInput takes them later); the client's window
  // stops growing meanwhile.
  if (ch->pending_in.size() >= kMaxPendingInput) {
    ch->input_in_libssh = true;
    return 0;
  }
  ch->input_in_libssh = false;  // the callback gets the whole buffer, older bytes first
  ch->pending_in.append(static_cast<const char*>(data), len);
  ch->connection->FlushInput(ch);
  return static_cast<int>(len);
}

void Connection::FlushInput(Channel* ch) {
  while (!ch->pending_in.empty() && ch->in_fd >= 0 && !ch->input_closed) {
    ssize_t n = write(ch->in_fd, ch->pending_in.data(), ch->pending_in.size());
    if (n > 0) {
      ch->pending_in.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // EPIPE (SIGPIPE is blocked in Serve's thread), EIO, a reset socket: the reader is gone.
    ch->pending_in.clear();
    ch->input_closed = true;
  }
  if (!ch->pending_in.empty() || !ch->input_eof || ch->in_fd < 0) return;
  // Bytes the data callback left in libssh's buffer (pending_in was full) come before the EOF.
  if (!ch->input_closed && ch->input_in_libssh) return;
  if (ch->kind == Channel::Kind::kTcp) {
    if (!ch->input_closed) shutdown(ch->in_fd, SHUT_WR);
    ch->input_closed = true;
  } else if (!ch->want_pty && ch->in_fd != ch->out_fd) {
    // The child's stdin pipe; a PTY has no EOF of its own (the shell sees ^D if the client sends it).
    close(ch->in_fd);
    ch->in_fd = -1;
    ch->input_closed = true;
  }
}

void Connection::PumpInput(Channel* ch) {
  FlushInput(ch);
  // Only when bytes are known to sit in libssh's buffer: then ssh_channel_poll just measures it.
  // (Polling an empty buffer would handle packets here, nested in the loop: a subsystem request
  // and its first data could arrive inside it and the data be taken for a child's stdin.)
  char buf[32 * 1024];
  while (ch->input_in_libssh && ch->pending_in.size() < kMaxPendingInput) {
    int available = ssh_channel_poll(ch->channel, 0);
    if (available <= 0) {
      ch->input_in_libssh = false;
      break;
    }
    int n = ssh_channel_read_nonblocking(ch->channel, buf, sizeof(buf), 0);
    if (n <= 0) break;
    if (ch->in_fd >= 0 && !ch->input_closed) ch->pending_in.append(buf, static_cast<size_t>(n));
    if (n == available) ch->input_in_libssh = false;
  }
  FlushInput(ch);
}

void Connection::OnEof(ssh_session, ssh_channel, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  if (ch->sftp != nullptr) return;
  ch->input_eof = true;
  ch->connection->FlushInput(ch);
}

void Connection::OnClose(ssh_session, ssh_channel, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  ch->closed_by_peer = true;
}

void Connection::OnSignal(ssh_session, ssh_channel, const char* name, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  int sig = SignalFromName(name != nullptr ? name : "");
  if (sig != 0 && ch->pid > 0 && !ch->child_exited) kill(-ch->pid, sig);
}

int Connection::OnPty(ssh_session, ssh_channel, const char* term, int w, int h, int pw, int ph, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  if (ch->pid > 0) return -1;
  ch->want_pty = true;
  ch->term = term != nullptr ? term : "xterm";
  ch->size.ws_col = static_cast<unsigned short>(w);
  ch->size.ws_row = static_cast<unsigned short>(h);
  ch->size.ws_xpixel = static_cast<unsigned short>(pw);
  ch->size.ws_ypixel = static_cast<unsigned short>(ph);
  return 0;
}

int Connection::OnWindowChange(ssh_session, ssh_channel, int w, int h, int pw, int ph, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  ch->size.ws_col = static_cast<unsigned short>(w);
  ch->size.ws_row = static_cast<unsigned short>(h);
  ch->size.ws_xpixel = static_cast<unsigned short>(pw);
  ch->size.ws_ypixel = static_cast<unsigned short>(ph);
  if (ch->want_pty && ch->in_fd >= 0) ioctl(ch->in_fd, TIOCSWINSZ, &ch->size);
  return 0;
}

int Connection::OnEnv(ssh_session, ssh_channel, const char* name, const char* value, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  if (name == nullptr || *name == '\0' || strchr(name, '=') != nullptr) return -1;
  ch->env.push_back(std::string(name) + "=" + (value != nullptr ? value : ""));
  return 0;
}

int Connection::OnShell(ssh_session, ssh_channel, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  if (ch->connection->StartChild(ch, nullptr) != 0) return -1;
  ch->is_shell = true;
  AgentEvent event;
  event.kind = AgentEvent::Kind::kShellStarted;
  ch->connection->Emit(event);
  return 0;
}

int Connection::OnExec(ssh_session, ssh_channel, const char* command, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  if (ch->connection->StartChild(ch, command != nullptr ? command : "") != 0) return -1;
  ch->command = command != nullptr ? command : "";
  AgentEvent event;
  event.kind = AgentEvent::Kind::kExecStarted;
  event.command = ch->command;
  ch->connection->Emit(event);
  return 0;
}

int Connection::OnSubsystem(ssh_session session, ssh_channel channel, const char* name, void* ch_ptr) {
  auto* ch = static_cast<Channel*>(ch_ptr);
  if (name == nullptr || strcmp(name, "sftp") != 0 || ch->pid > 0 || ch->sftp != nullptr) return -1;
  const AgentOptions& options = ch->connection->options_;
  ch->sftp = std::make_unique<SftpHandler>(session, channel, options.working_directory, options.uid, options.gid);
  return 0;
}

// Forks the shell (command == nullptr) or `shell -c command` for a session channel. Everything
// the child needs is prepared before fork(): the agent may share its process with other threads,
// so the child only calls async-signal-safe functions before execve.
int Connection::StartChild(Channel* ch, const char* command) {
  if (ch->pid > 0 || ch->sftp != nullptr) return -1;
  std::vector<std::string> env = options_.environment;
  std::string shell = options_.shell;
  for (const std::string& var : env) {
    if (shell.empty() && var.rfind("SHELL=", 0) == 0) shell = var.substr(6);
  }
  if (shell.empty()) shell = "/bin/sh";
  for (const std::string& var : ch->env) env.push_back(var);
  if (ch->want_pty) env.push_back("TERM=" + ch->term);
  std::vector<char*> envp;
  for (std::string& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);
  // Not a login shell ("-l"): /etc/profile and ~/.profile would replace the workload's
  // environment (Debian's and Ubuntu's reset PATH, losing e.g. a conda PATH from the image), and
  // the shell must see what the workload sees. With a PTY it is interactive (~/.bashrc).
  std::string arg_c = "-c", cmd = command != nullptr ? command : "";
  std::vector<char*> argv = {shell.data()};
  if (command != nullptr) {
    argv.push_back(arg_c.data());
    argv.push_back(cmd.data());
  }
  argv.push_back(nullptr);
  std::string cwd = options_.working_directory.empty() ? "/" : options_.working_directory;
  const int uid = options_.uid, gid = options_.gid;
  // Run in the child between fork and exec.
  auto exec_child = [&]() {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (chdir(cwd.c_str()) != 0 && chdir("/") != 0) _exit(126);
    if (gid >= 0 && (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(gid)) != 0)) _exit(126);
    if (uid >= 0 && setuid(static_cast<uid_t>(uid)) != 0) _exit(126);
    execve(shell.c_str(), argv.data(), envp.data());
    _exit(127);
  };

  if (ch->want_pty) {
    int master = -1;
    pid_t pid = forkpty(&master, nullptr, nullptr, &ch->size);
    if (pid < 0) return -1;
    if (pid == 0) exec_child();  // forkpty made it a session leader with the PTY as its terminal
    fcntl(master, F_SETFD, FD_CLOEXEC);
    ch->pid = pid;
    groups_.push_back(pid);
    ch->in_fd = master;
    ch->out_fd = master;
    ch->out_open = true;
    WatchFd(ch, master);
    return 0;
  }
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) return -1;
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    close(in_pipe[0]);
    close(in_pipe[1]);
    return -1;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]}) close(fd);
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return -1;
  }
  if (pid == 0) {
    // Its own session and process group: the agent kills the group when the connection ends.
    setsid();
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    exec_child();
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  ch->pid = pid;
  groups_.push_back(pid);
  ch->in_fd = in_pipe[1];
  SetNonBlocking(ch->in_fd);
  ch->out_fd = out_pipe[0];
  ch->err_fd = err_pipe[0];
  ch->out_open = true;
  ch->err_open = true;
  WatchFd(ch, ch->out_fd);
  WatchFd(ch, ch->err_fd);
  return 0;
}

void Connection::Reap() {
  for (Channel& ch : channels_) {
    if (ch.pid <= 0 || ch.child_exited) continue;
    int status = 0;
    pid_t got = waitpid(ch.pid, &status, WNOHANG);
    if (got != ch.pid) continue;
    ch.child_exited = true;
    ch.wait_status = status;
    EmitChildEnded(ch, status);
  }
}

void Connection::EmitChildEnded(const Channel& ch, int wait_status) const {
  AgentEvent event;
  event.kind = ch.is_shell ? AgentEvent::Kind::kShellEnded : AgentEvent::Kind::kExecEnded;
  event.command = ch.command;
  if (WIFSIGNALED(wait_status)) {
    event.signal = SignalName(WTERMSIG(wait_status));
  } else {
    event.exit_status = WEXITSTATUS(wait_status);
  }
  Emit(event);
}

// Sends a finished child's remaining output, its exit status and the close; closes channels the
// client closed. Children whose channel closed first are killed.
void Connection::FinishChannels() {
  for (Channel& ch : channels_) {
    if (ch.finished) continue;
    if (ch.sftp != nullptr && !ch.closed_by_peer) {
      Status pumped = ch.sftp->Pump();
      if (!pumped.ok()) {
        // Like sshd after sftp-server exits: scp (sftp mode) treats a missing status as failure.
        ssh_channel_request_send_exit_status(ch.channel, pumped.code() == StatusCode::kOutOfRange ? 0 : 1);
        ssh_channel_send_eof(ch.channel);
        Finish(&ch);
      }
      continue;
    }
    if (ch.closed_by_peer) {
      Finish(&ch);
      continue;
    }
    if (ch.kind == Channel::Kind::kTcp) {
      // Done once both directions saw EOF.
      if (!ch.out_open && ssh_channel_is_eof(ch.channel)) Finish(&ch);
      continue;
    }
    if (ch.pid > 0 && ch.child_exited) {
      // Whatever the child wrote before exiting is in the pipe / PTY buffer: send all of it, as
      // the window allows, before the exit status. (Output of grandchildren still running is
      // not waited for, only what is already buffered.)
      if (ch.pause_requested || ch.output_paused) continue;
      bool more = false;
      for (auto [fd, open, is_stderr] :
           {std::tuple{&ch.out_fd, &ch.out_open, false}, std::tuple{&ch.err_fd, &ch.err_open, true}}) {
        if (!*open) continue;
        Copied copied = CopyOut(&ch, *fd, is_stderr);
        if (copied == Copied::kEnd) UnwatchFd(&ch, fd, open);
        if (copied == Copied::kMore || copied == Copied::kPaused) more = true;
      }
      if (more) continue;
      if (WIFSIGNALED(ch.wait_status)) {
        ssh_channel_request_send_exit_signal(ch.channel, SignalName(WTERMSIG(ch.wait_status)).c_str(),
                                             WCOREDUMP(ch.wait_status) ? 1 : 0, "", "");
      } else {
        ssh_channel_request_send_exit_status(ch.channel, WEXITSTATUS(ch.wait_status));
      }
      ssh_channel_send_eof(ch.channel);
      Finish(&ch);
    }
  }
  for (auto it = channels_.begin(); it != channels_.end();) {
    // A child still running (client closed its channel) is killed in Finish; free once reaped.
    if (it->finished && (it->pid <= 0 || it->child_exited)) {
      ssh_remove_channel_callbacks(it->channel, &it->callbacks);
      ssh_channel_free(it->channel);
      it = channels_.erase(it);
    } else {
      ++it;
    }
  }
}

void Connection::Finish(Channel* ch) {
  if (ch->finished) return;
  ch->finished = true;
  ch->sftp.reset();
  if (ch->out_open) UnwatchFd(ch, &ch->out_fd, &ch->out_open);
  if (ch->err_open) UnwatchFd(ch, &ch->err_fd, &ch->err_open);
  for (int* fd : {&ch->in_fd, &ch->out_fd, &ch->err_fd}) {
    if (*fd >= 0) {
      int value = *fd;
      for (int* other : {&ch->in_fd, &ch->out_fd, &ch->err_fd}) {
        if (*other == value) *other = -1;
      }
      close(value);
    }
  }
  if (ch->pid > 0 && !ch->child_exited) kill(-ch->pid, SIGKILL);
  // Also after the client's CLOSE: RFC 4254 §5.3 wants one back, and OpenSSH keeps the channel
  // (a -L connection, say) until it comes. Not once the transport is gone.
  if (!transport_gone_) ssh_channel_close(ch->channel);
}

void Connection::Run() {
  const auto started = Clock::now();
  auto last_activity = started;
  bool input_waiting = false;
  while (true) {
    int rc = ssh_event_dopoll(event_, input_waiting ? kBusyTickMs : kIdleTickMs);
    int status = ssh_get_status(session_);
    if ((status & (SSH_CLOSED | SSH_CLOSED_ERROR)) != 0 || !ssh_is_connected(session_)) break;
    if (rc == SSH_ERROR && errno != EINTR) break;
    if (rc == SSH_OK) last_activity = Clock::now();
    if (!authenticated_ &&
        (auth_failures_ >= kMaxAuthFailures ||
         (options_.login_grace_s > 0 && Clock::now() - started > std::chrono::seconds(options_.login_grace_s)))) {
      ssh_disconnect(session_);
      break;
    }
    OpenPendingForwards();
    RetireEofFds();
    PauseAndResumeOutput();
    input_waiting = false;
    for (Channel& ch : channels_) {
      if (ch.finished || ch.closed_by_peer) continue;
      PumpInput(&ch);
      if (!ch.pending_in.empty()) input_waiting = true;
    }
    Reap();
    FinishChannels();
    if (options_.keepalive_interval_s > 0 &&
        Clock::now() - last_activity > std::chrono::seconds(options_.keepalive_interval_s)) {
      ssh_send_keepalive(session_);
      last_activity = Clock::now();
    }
  }
}

// Kills and reaps every child, closes every descriptor and listener.
void Connection::Shutdown() {
  transport_gone_ = true;  // send nothing more
  for (Channel& ch : channels_) Finish(&ch);
  for (Channel& ch : channels_) {
    if (ch.pid > 0 && !ch.child_exited) {
      int status = 0;
      while (waitpid(ch.pid, &status, 0) < 0 && errno == EINTR) {
      }
      ch.child_exited = true;
      EmitChildEnded(ch, status);
    }
    ssh_remove_channel_callbacks(ch.channel, &ch.callbacks);
    ssh_channel_free(ch.channel);
  }
  channels_.clear();
  for (Forward& fwd : forwards_) {
    ssh_event_remove_fd(event_, fwd.fd);
    close(fwd.fd);
  }
  forwards_.clear();
  for (auto& [fd, fwd] : pending_accepts_) close(fd);
  pending_accepts_.clear();
  // What the children left running in their groups (`cmd &` after the shell exited). A group
  // id stays reserved while any member (even a zombie) is in it; an emptied one could only name
  // a stranger's group if the pid space wrapped around during the connection.
  for (pid_t group : groups_) kill(-group, SIGKILL);
  groups_.clear();
}

}  // namespace

const char* AgentEventName(AgentEvent::Kind kind) {
  switch (kind) {
    case AgentEvent::Kind::kAuthenticated: return "authenticated";
    case AgentEvent::Kind::kShellStarted: return "shell-started";
    case AgentEvent::Kind::kShellEnded: return "shell";
    case AgentEvent::Kind::kExecStarted: return "exec-started";
    case AgentEvent::Kind::kExecEnded: return "exec";
    case AgentEvent::Kind::kDirectTcpip: return "direct-tcpip";
    case AgentEvent::Kind::kTcpipForward: return "tcpip-forward";
  }
  return "unknown";
}

Result<std::unique_ptr<AgentSession>> AgentSession::Create(AgentOptions options) {
  std::unique_ptr<AgentSession> agent(new AgentSession());
  if (options.authorized_keys.empty()) return Status::InvalidArgument("remote agent: no authorized keys");
  for (const std::string& line : options.authorized_keys) {
    size_t type_end = line.find(' ');
    if (type_end == std::string::npos) return Status::InvalidArgument("remote agent: bad public key line: " + line);
    size_t blob_end = line.find(' ', type_end + 1);
    std::string type = line.substr(0, type_end);
    std::string blob =
        line.substr(type_end + 1, blob_end == std::string::npos ? std::string::npos : blob_end - type_end - 1);
    ssh_key key = nullptr;
    if (ssh_pki_import_pubkey_base64(blob.c_str(), ssh_key_type_from_name(type.c_str()), &key) != SSH_OK) {
      return Status::InvalidArgument("remote agent: unparsable public key: " + line);
    }
    ssh_key_free(key);
    agent->authorized_.emplace_back(type, blob);
  }

  const std::string& path = options.host_key_path;
  auto load = [&path]() -> Result<KeyPtr> {
    Result<std::string> text = ReadFile(path);
    if (!text.ok()) return text.status();
    ssh_key key = nullptr;
    if (ssh_pki_import_privkey_base64(text->c_str(), nullptr, nullptr, nullptr, &key) != SSH_OK) {
      return Status::InvalidArgument("remote agent: unreadable host key " + path);
    }
    return KeyPtr(key);
  };
  KeyPtr host_key;
  bool generated = false;
  if (!path.empty() && PathExists(path)) {
    ASSIGN_OR_RETURN(host_key, load());
  } else {
    generated = true;
    ssh_key generated = nullptr;
    if (ssh_pki_generate(SSH_KEYTYPE_ED25519, 0, &generated) != SSH_OK) {
      return Status::Internal("remote agent: cannot generate an Ed25519 host key");
    }
    host_key.reset(generated);
  }
  auto export_key = [](ssh_key key) -> Result<std::string> {
    char* b64 = nullptr;
    if (ssh_pki_export_privkey_base64(key, nullptr, nullptr, nullptr, &b64) != SSH_OK) {
      return Status::Internal("remote agent: cannot export the host key");
    }
    std::string text = b64;
    ssh_string_free_char(b64);
    return text;
  };
  ASSIGN_OR_RETURN(agent->host_key_base64_, export_key(host_key.get()));
  if (!path.empty() && generated) {
    // Several agents may start at once on a server's first connections: each writes its key to
    // a file of its own and links it to the name, which only the first link gets; the others
    // take that key instead of their own, so every connection presents the one saved key. The
    // decision follows whether this agent generated its key, never a second look at the file:
    // another agent may have linked it in between, and this one must then take that key.
    const std::string temp =
        path + ".new." + std::to_string(getpid()) + "." + std::to_string(reinterpret_cast<uintptr_t>(agent.get()));
    RETURN_IF_ERROR(WriteFileAtomic(temp, agent->host_key_base64_, 0600));
    int linked = link(temp.c_str(), path.c_str());
    int link_errno = errno;
    unlink(temp.c_str());
    if (linked != 0) {
      if (link_errno != EEXIST) return ErrnoStatus("remote agent: cannot save the host key as " + path, link_errno);
      ASSIGN_OR_RETURN(host_key, load());
      ASSIGN_OR_RETURN(agent->host_key_base64_, export_key(host_key.get()));
    }
  }
  agent->host_public_key_ = PublicLine(host_key.get());
  agent->options_ = std::move(options);
  return agent;
}

AgentSession::~AgentSession() = default;

Status AgentSession::Serve(int fd) const {
  // Writes to a child's closed stdin or a reset socket must fail with EPIPE, not kill the
  // process (the daemon's): block SIGPIPE in this thread while serving, and before restoring
  // the mask discard the ones this thread raised (they are thread-directed and stay pending).
  sigset_t sigpipe, old_mask;
  sigemptyset(&sigpipe);
  sigaddset(&sigpipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigpipe, &old_mask);
  Status served = ServeBlocked(fd);
  struct timespec no_wait = {0, 0};
  while (sigtimedwait(&sigpipe, nullptr, &no_wait) == SIGPIPE) {
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return served;
}

Status AgentSession::ServeBlocked(int fd) const {
  std::unique_ptr<ssh_session_struct, SessionFree> session(ssh_new());
  std::unique_ptr<ssh_bind_struct, BindFree> bind(ssh_bind_new());
  if (!session || !bind) {
    close(fd);
    return Status::Internal("remote agent: out of memory");
  }
  ssh_key host_key = nullptr;
  if (ssh_pki_import_privkey_base64(host_key_base64_.c_str(), nullptr, nullptr, nullptr, &host_key) != SSH_OK) {
    close(fd);
    return Status::Internal("remote agent: host key import failed");
  }
  // The bind takes ownership of the imported key.
  ssh_bind_options_set(bind.get(), SSH_BIND_OPTIONS_IMPORT_KEY, host_key);
  // No /etc/ssh/libssh_server_config: after the agent enters a workload's mount namespace that
  // file would be the image's, and nothing in the image may change how the agent behaves.
  bool process_config = false;
  ssh_bind_options_set(bind.get(), SSH_BIND_OPTIONS_PROCESS_CONFIG, &process_config);
  if (ssh_bind_accept_fd(bind.get(), session.get(), fd) != SSH_OK) {
    close(fd);
    return Status::Unavailable(std::string("remote agent: accept failed: ") + ssh_get_error(bind.get()));
  }
  // From here the session owns fd.
  std::unique_ptr<ssh_event_struct, EventFree> event(ssh_event_new());
  Connection conn(*this, session.get(), event.get());
  for (const auto& [type, blob] : authorized_) {
    ssh_key key = nullptr;
    if (ssh_pki_import_pubkey_base64(blob.c_str(), ssh_key_type_from_name(type.c_str()), &key) == SSH_OK) {
      conn.keys().emplace_back(key);
    }
  }
  ssh_server_callbacks_struct server_callbacks;
  memset(&server_callbacks, 0, sizeof(server_callbacks));
  server_callbacks.userdata = &conn;
  server_callbacks.auth_pubkey_function = Connection::OnAuthPubkey;
  server_callbacks.channel_open_request_session_function = Connection::OnSessionOpen;
  ssh_callbacks_init(&server_callbacks);
  ssh_set_server_callbacks(session.get(), &server_callbacks);
  ssh_set_message_callback(session.get(), Connection::OnMessage, &conn);
  ssh_set_auth_methods(session.get(), SSH_AUTH_METHOD_PUBLICKEY);

  // libssh bounds the (blocking) key exchange by SSH_OPTIONS_TIMEOUT (10 s when unset); a client
  // that stalls before authenticating gets the login grace, here and then in Run().
  if (options_.login_grace_s > 0) {
    long grace = options_.login_grace_s;
    ssh_options_set(session.get(), SSH_OPTIONS_TIMEOUT, &grace);
  }
  if (ssh_handle_key_exchange(session.get()) != SSH_OK) {
    return Status::Unavailable(std::string("remote agent: key exchange failed: ") + ssh_get_error(session.get()));
  }
  ssh_event_add_session(event.get(), session.get());
  conn.Run();
  ssh_event_remove_session(event.get(), session.get());
  bool authenticated = conn.authenticated();
  if (!authenticated) return Status::Unauthenticated("remote agent: the client left without authenticating");
  return Status::Ok();
}

}  // namespace kiln::access
