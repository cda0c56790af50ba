#include "runtime/process/loopback_relay.h"

#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kiln::runtime {

namespace {

// Accepts per listener and HandleEvents call, so that a burst of connections cannot starve the
// rest of the shim's loop.
constexpr int kMaxAcceptsPerEvent = 64;

// Closes `fd` with an RST instead of a FIN, so the peer sees "connection reset" (as for a
// refused connection) rather than an orderly, empty answer.
void CloseWithReset(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// A byte queue of fixed capacity: bytes in [begin, end) of data.
struct Buffer {
  explicit Buffer(size_t capacity) : data(new char[capacity]), capacity(capacity) {}
  bool empty() const { return begin == end; }
  bool full() const { return end - begin == capacity; }
  std::unique_ptr<char[]> data;
  size_t capacity;
  size_t begin = 0;
  size_t end = 0;
};

enum class Io { kProgress, kBlocked, kEof, kError };

// Reads from `fd` into `b` until it would block, b is full, EOF or an error.
Io Fill(int fd, Buffer& b) {
  Io result = Io::kBlocked;
  while (!b.full()) {
    if (b.end == b.capacity) {
      std::memmove(b.data.get(), b.data.get() + b.begin, b.end - b.begin);
      b.end -= b.begin;
      b.begin = 0;
    }
    ssize_t n = recv(fd, b.data.get() + b.end, b.capacity - b.end, 0);
    if (n > 0) {
      b.end += static_cast<size_t>(n);
      result = Io::kProgress;
    } else if (n == 0) {
      return Io::kEof;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return result;
    } else {
      return Io::kError;
    }
  }
  return result;
}

// Writes from `b` to `fd` until b is empty or the socket would block.
Io Drain(int fd, Buffer& b) {
  while (!b.empty()) {
    ssize_t n = send(fd, b.data.get() + b.begin, b.end - b.begin, MSG_NOSIGNAL);
    if (n > 0) {
      b.begin += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Io::kBlocked;
    } else {
      return Io::kError;
    }
  }
  b.begin = b.end = 0;
  return Io::kProgress;
}

}  // namespace

// One relayed connection: `in` was accepted on a listener, `out` connects to its target.
struct LoopbackRelay::Connection {
  explicit Connection(size_t buffer_bytes) : to_out(buffer_bytes), to_in(buffer_bytes) {}
  int in = -1;
  int out = -1;
  bool connecting = true;
  Buffer to_out;  // read from in, to write to out
  Buffer to_in;   // read from out, to write to in
  bool in_eof = false;
  bool out_eof = false;
  bool in_shut = false;   // shutdown(in, SHUT_WR) done
  bool out_shut = false;  // shutdown(out, SHUT_WR) done
};

LoopbackRelay::LoopbackRelay() : LoopbackRelay(Options{}) {}
LoopbackRelay::LoopbackRelay(Options options) : options_(options) {}
LoopbackRelay::~LoopbackRelay() { CloseAll(); }

void LoopbackRelay::AddListener(int listen_fd, const sockaddr_in& target) { listeners_.push_back({listen_fd, target}); }

void LoopbackRelay::CloseAll() {
  for (Listener& l : listeners_) close(l.fd);
  listeners_.clear();
  for (std::unique_ptr<Connection>& c : connections_) {
    close(c->in);
    close(c->out);
  }
  connections_.clear();
  slots_.clear();
}

void LoopbackRelay::AppendPollFds(std::vector<pollfd>* fds) {
  slots_.clear();
  for (size_t i = 0; i < listeners_.size(); ++i) {
    fds->push_back({listeners_[i].fd, POLLIN, 0});
    slots_.push_back({static_cast<int>(i), -1, false});
  }
  for (size_t i = 0; i < connections_.size(); ++i) {
    const Connection& c = *connections_[i];
    short in_events =
        static_cast<short>((!c.in_eof && !c.to_out.full() ? POLLIN : 0) | (!c.to_in.empty() ? POLLOUT : 0));
    short out_events =
        c.connecting
            ? POLLOUT
            : static_cast<short>((!c.out_eof && !c.to_in.full() ? POLLIN : 0) | (!c.to_out.empty() ? POLLOUT : 0));
    // A side with nothing to wait for is left out (fd -1): polling it would report POLLHUP over
    // and over once its peer has closed, and spin the loop. It is looked at again when the other
    // side's progress gives it something to do.
    fds->push_back({in_events != 0 ? c.in : -1, in_events, 0});
    slots_.push_back({-1, static_cast<int>(i), false});
    fds->push_back({out_events != 0 ? c.out : -1, out_events, 0});
    slots_.push_back({-1, static_cast<int>(i), true});
  }
}

void LoopbackRelay::HandleEvents(const pollfd* fds, size_t count) {
  size_t n = std::min(count, slots_.size());
  std::vector<short> in_revents(connections_.size(), 0), out_revents(connections_.size(), 0);
  std::vector<int> ready_listeners;
  for (size_t i = 0; i < n; ++i) {
    if (fds[i].revents == 0) continue;
    const Slot& s = slots_[i];
    if (s.connection < 0) {
      ready_listeners.push_back(s.listener);
    } else if (static_cast<size_t>(s.connection) < connections_.size()) {
      (s.outbound ? out_revents : in_revents)[s.connection] |= fds[i].revents;
    }
  }
  slots_.clear();
  std::vector<std::unique_ptr<Connection>> kept;
  kept.reserve(connections_.size());
  for (size_t i = 0; i < connections_.size(); ++i) {
    std::unique_ptr<Connection>& c = connections_[i];
    if ((in_revents[i] != 0 || out_revents[i] != 0) && !Progress(*c, in_revents[i], out_revents[i])) {
      close(c->in);
      close(c->out);
      continue;
    }
    kept.push_back(std::move(c));
  }
  connections_ = std::move(kept);
  for (int l : ready_listeners) Accept(listeners_[l]);
}

void LoopbackRelay::Accept(Listener& listener) {
  for (int i = 0; i < kMaxAcceptsPerEvent; ++i) {
    int fd = accept4(listener.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or an error the next poll reports again
    ++accepted_;
    if (connections_.size() >= options_.max_connections) {
      ++refused_;
      CloseWithReset(fd);
      continue;
    }
    int out = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (out < 0) {
      ++refused_;
      CloseWithReset(fd);
      continue;
    }
    bool connecting = false;
    if (connect(out, reinterpret_cast<const sockaddr*>(&listener.target), sizeof(listener.target)) != 0) {
      if (errno != EINPROGRESS) {
        // Nothing listens on the node's port (Kiln restarting): the client sees a reset, as it
        // would for a refused connection.
        CloseWithReset(fd);
        close(out);
        continue;
      }
      connecting = true;
    }
    SetNoDelay(fd);
    SetNoDelay(out);
    auto c = std::make_unique<Connection>(options_.buffer_bytes);
    c->in = fd;
    c->out = out;
    c->connecting = connecting;
    connections_.push_back(std::move(c));
  }
}

bool LoopbackRelay::Progress(Connection& c, short in_rev, short out_rev) {
  if ((in_rev & (POLLERR | POLLNVAL)) != 0) return false;
  if (c.connecting) {
    if ((out_rev & (POLLOUT | POLLERR | POLLHUP)) == 0) return true;
    int error = 0;
    socklen_t len = sizeof(error);
    if (getsockopt(c.out, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      // Refused: reset the client's connection (the caller closes the fds; linger first).
      linger l{1, 0};
      setsockopt(c.in, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      return false;
    }
    c.connecting = false;
  } else if ((out_rev & (POLLERR | POLLNVAL)) != 0) {
    return false;
  }
  // in -> out. Read only when poll said so (level-triggered: what is left is reported again).
  if (!c.in_eof && (in_rev & (POLLIN | POLLHUP)) != 0) {
    Io r = Fill(c.in, c.to_out);
    if (r == Io::kError) return false;
    if (r == Io::kEof) c.in_eof = true;
  }
  if (!c.connecting) {
    if (!c.to_out.empty() && Drain(c.out, c.to_out) == Io::kError) return false;
    if (c.in_eof && c.to_out.empty() && !c.out_shut) {
      shutdown(c.out, SHUT_WR);
      c.out_shut = true;
    }
    // out -> in
    if (!c.out_eof && (out_rev & (POLLIN | POLLHUP)) != 0) {
      Io r = Fill(c.out, c.to_in);
      if (r == Io::kError) return false;
      if (r == Io::kEof) c.out_eof = true;
    }
    if (!c.to_in.empty() && Drain(c.in, c.to_in) == Io::kError) return false;
    if (c.out_eof && c.to_in.empty() && !c.in_shut) {
      shutdown(c.in, SHUT_WR);
      c.in_shut = true;
    }
    // A Drain may have made room for the other direction's reader: poll says so next round.
  }
  return !(c.in_shut && c.out_shut);
}

}  // namespace kiln::runtime
