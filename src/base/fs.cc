#include "base/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/ids.h"

namespace kiln {

Status ErrnoStatus(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT: return Status::ResourceExhausted(std::move(msg));
    case ENOENT: return Status::NotFound(std::move(msg));
    case EACCES:
    case EPERM: return Status::PermissionDenied(std::move(msg));
    default: return Status::Internal(std::move(msg));
  }
}

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status MakeDirs(const std::string& path, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return ErrnoStatus("create directory " + path, ec.value());
  ::chmod(path.c_str(), mode);
  return Status::Ok();
}

Result<std::string> ReadFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("read " + path, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write", errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Result<size_t> PreadSome(int fd, char* buf, size_t n, uint64_t offset) {
  while (true) {
    ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("read", errno);
    }
    return static_cast<size_t>(r);
  }
}

Status FsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("open directory " + dir, errno);
  if (::fsync(fd.get()) != 0) return ErrnoStatus("fsync directory " + dir, errno);
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, std::string_view content, mode_t mode) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  std::string tmp = path + ".tmp-" + RandomHex(6);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!fd.valid()) return ErrnoStatus("create " + tmp, errno);
  ::fchmod(fd.get(), mode);  // umask must not widen or narrow the requested mode
  Status s = WriteAll(fd.get(), content);
  if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoStatus("fsync " + tmp, errno);
  fd.Reset();
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename to " + path, errno);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDir(dir);
}

Status ReplaceFile(const std::string& path, std::string_view content, mode_t mode) {
  std::string tmp = path + ".tmp-" + RandomHex(6);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!fd.valid()) return ErrnoStatus("create " + tmp, errno);
  ::fchmod(fd.get(), mode);
  Status s = WriteAll(fd.get(), content);
  fd.Reset();
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename to " + path, errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoStatus("remove " + path, ec.value());
  return Status::Ok();
}

std::string ExpandHome(const std::string& path) {
  if (path == "~" || path.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    if (home && *home) return std::string(home) + path.substr(1);
  }
  return path;
}

}  // namespace kiln
