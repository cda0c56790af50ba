#pragma once
// The shim's loopback forwards (NetworkAttachment::loopback_forwards): TCP connections accepted on
// listening sockets that live in an instance's network namespace (127.0.0.1:<port> there) are
// relayed to a target address in whatever namespace the relay's caller is in when it connects (the
// node's: the shim runs the relay after switching back), so that AWS_ENDPOINT_URL
// http://127.0.0.1:<port> reaches Kiln unchanged from inside a namespace.
//
// Built for one poll loop that also does other work: the relay never blocks (every socket is
// non-blocking, connects too), appends its descriptors to the caller's pollfd array and handles
// their events afterwards. Per connection each direction has a bounded buffer; a side is not read
// while its buffer is full, so a slow reader slows the writer instead of growing memory. An EOF on
// one side becomes shutdown(SHUT_WR) on the other once the buffered bytes are written (half-close
// works); an error or reset on either side closes both. Writes use MSG_NOSIGNAL. Connections beyond
// max_connections are accepted and closed at once.
//
// Thread-compatibility: not thread-safe; one thread (the shim's loop) owns an instance.

#include <netinet/in.h>
#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kiln::runtime {

class LoopbackRelay {
 public:
  struct Options {
    size_t buffer_bytes = 64 * 1024;  // per direction and connection
    size_t max_connections = 256;     // relayed at once; more are refused (closed on accept)
  };

  LoopbackRelay();
  explicit LoopbackRelay(Options options);
  ~LoopbackRelay();  // closes every socket (CloseAll)
  LoopbackRelay(const LoopbackRelay&) = delete;
  LoopbackRelay& operator=(const LoopbackRelay&) = delete;

  // Takes ownership of `listen_fd`, a listening, non-blocking TCP socket; each connection accepted
  // on it is relayed to `target`. The outbound socket is created in the calling thread's network
  // namespace at the time of HandleEvents.
  void AddListener(int listen_fd, const sockaddr_in& target);

  // Appends the descriptors to poll (and what to poll them for) to `fds`; HandleEvents must get
  // exactly these entries, with the revents poll set, before the next AppendPollFds.
  void AppendPollFds(std::vector<pollfd>* fds);
  // `fds` points at the first entry AppendPollFds appended; `count` is how many it appended.
  void HandleEvents(const pollfd* fds, size_t count);

  // Closes the listeners and every relayed connection (the instance has ended).
  void CloseAll();

  size_t listener_count() const { return listeners_.size(); }
  size_t connection_count() const { return connections_.size(); }
  uint64_t accepted() const { return accepted_; }
  uint64_t refused() const { return refused_; }

 private:
  struct Listener {
    int fd = -1;
    sockaddr_in target{};
  };
  struct Connection;
  // What each appended pollfd belongs to: a listener (connection == -1) or a connection's side.
  struct Slot {
    int listener = -1;
    int connection = -1;
    bool outbound = false;
  };

  void Accept(Listener& listener);
  // Moves bytes as far as possible without blocking; false when the connection is finished (or
  // failed) and must be closed.
  bool Progress(Connection& c, short inbound_revents, short outbound_revents);

  const Options options_;
  std::vector<Listener> listeners_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Slot> slots_;
  uint64_t accepted_ = 0;
  uint64_t refused_ = 0;
};

}  // namespace kiln::runtime
