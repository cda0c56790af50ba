#pragma once
// File-system helpers with Status errors. Durable writes follow temp file + fsync + rename +
// fsync(dir), so a crash leaves either the old or the new content, never a torn file.

#include <sys/types.h>

#include <string>
#include <string_view>

#include "base/status.h"

namespace kiln {

Status MakeDirs(const std::string& path, mode_t mode = 0755);
Result<std::string> ReadFile(const std::string& path);
// Writes `content` to `path` atomically and durably with the given mode.
Status WriteFileAtomic(const std::string& path, std::string_view content, mode_t mode = 0644);
// The same without fsync: the file is whole under its name even if this process dies at any
// point, but a power loss may lose it. For progress records that only have to outlive the
// process (e.g. state an adopting server reads back).
Status ReplaceFile(const std::string& path, std::string_view content, mode_t mode = 0644);
Status FsyncDir(const std::string& dir);
bool PathExists(const std::string& path);
Status RemoveAll(const std::string& path);
// "~/x" -> "$HOME/x"; other paths unchanged.
std::string ExpandHome(const std::string& path);
// Status from errno with context: "<what>: <strerror>"; ENOSPC/EDQUOT map to ResourceExhausted,
// ENOENT to NotFound, EACCES/EPERM to PermissionDenied, everything else to Internal.
Status ErrnoStatus(std::string_view what, int err);

// A file descriptor that closes itself.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Writes all of `data`, retrying on EINTR and short writes.
Status WriteAll(int fd, std::string_view data);
// Reads up to n bytes at offset (pread); returns bytes read (0 at EOF).
Result<size_t> PreadSome(int fd, char* buf, size_t n, uint64_t offset);

}  // namespace kiln
