#pragma once
// Private to src/net: non-blocking socket I/O with per-operation deadlines, so that no server
// thread can hang forever on a silent peer (slowloris) and Stop() can wake idle readers; and the
// one sendmsg step that the server's and the client's send loops share (SendSome).
//
// Every function takes a non-blocking fd. A timeout of -1 waits forever. Thread-compatible:
// one thread per fd at a time (another thread may shutdown() the fd to wake it).

#include <sys/uio.h>

#include <cstddef>

#include "base/status.h"

namespace kiln::net::internal {

// Reads up to `n` bytes, waiting up to `timeout_ms` for the fd to become readable. While
// waiting, also watches `wake_fd` (an eventfd, or -1): if it fires before data arrives the read
// fails with Aborted. Returns 0 on orderly EOF.
// Errors: DeadlineExceeded (no data in time), Aborted (woken), Unavailable (reset / other).
Result<size_t> RecvSome(int fd, char* buf, size_t n, int timeout_ms, int wake_fd = -1);

// One sendmsg of `iov[0..iovcnt)` with MSG_NOSIGNAL (a vanished peer must not raise SIGPIPE),
// retried on EINTR. On success moves `iov`/`iovcnt` past the bytes sent (a partly sent entry is
// trimmed in place) and returns true; on failure returns false with errno set (EAGAIN or
// EWOULDBLOCK: the socket buffer is full, wait for POLLOUT). Doesn't wait. The loop every sender
// here runs around it (SendAll below, the client's SendAllUntil) decides how to wait.
bool SendSome(int fd, struct iovec*& iov, int& iovcnt);

// Writes every byte of `iov[0..iovcnt)` (the array is modified as it is consumed). Each wait for
// writability may last `timeout_ms`; progress restarts the clock.
// Errors: DeadlineExceeded (peer not reading), Unavailable (peer gone).
Status SendAll(int fd, struct iovec* iov, int iovcnt, int timeout_ms);

}  // namespace kiln::net::internal
