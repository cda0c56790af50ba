#include "net/socket_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kiln::net::internal {
namespace {

enum class Wait { kReady, kTimeout, kWoken, kError };

Wait WaitFor(int fd, short events, int timeout_ms, int wake_fd) {
  pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
  const nfds_t count = wake_fd >= 0 ? 2 : 1;
  for (;;) {
    int r = ::poll(fds, count, timeout_ms);
    if (r < 0) {
      if (errno == EINTR) {
        continue;  // A signal: waiting again restarts the timeout, which is harmless.
      }
      return Wait::kError;
    }
    if (r == 0) {
      return Wait::kTimeout;
    }
    // Data that already arrived wins over a stop request, so a request in flight is served.
    if (fds[0].revents != 0) {
      return Wait::kReady;
    }
    return Wait::kWoken;
  }
}

}  // namespace

Result<size_t> RecvSome(int fd, char* buf, size_t n, int timeout_ms, int wake_fd) {
  for (;;) {
    ssize_t r = ::recv(fd, buf, n, 0);
    if (r >= 0) {
      return static_cast<size_t>(r);
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable(std::string("recv: ") + std::strerror(errno));
    }
    switch (WaitFor(fd, POLLIN, timeout_ms, wake_fd)) {
      case Wait::kReady: break;
      case Wait::kTimeout: return Status::DeadlineExceeded("timed out waiting for the peer to send");
      case Wait::kWoken: return Status::Aborted("server stopping");
      case Wait::kError: return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
    }
  }
}

bool SendSome(int fd, struct iovec*& iov, int& iovcnt) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  ssize_t r;
  do {
    r = ::sendmsg(fd, &msg, MSG_NOSIGNAL);  // not writev, which takes no flags
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    return false;
  }
  size_t sent = static_cast<size_t>(r);
  while (iovcnt > 0 && sent >= iov->iov_len) {
    sent -= iov->iov_len;
    ++iov;
    --iovcnt;
  }
  if (iovcnt > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + sent;
    iov->iov_len -= sent;
  }
  return true;
}

Status SendAll(int fd, struct iovec* iov, int iovcnt, int timeout_ms) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    if (SendSome(fd, iov, iovcnt)) {
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable(std::string("send: ") + std::strerror(errno));
    }
    switch (WaitFor(fd, POLLOUT, timeout_ms, -1)) {
      case Wait::kReady:
      case Wait::kWoken: continue;
      case Wait::kTimeout: return Status::DeadlineExceeded("timed out waiting for the peer to read");
      case Wait::kError: return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
    }
  }
  return Status::Ok();
}

}  // namespace kiln::net::internal
