#include "access/sftp_handler.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

namespace kiln::access {

struct SftpHandler::Handle {
  int fd = -1;
  DIR* dir = nullptr;
  std::string path;
  ~Handle() {
    if (fd >= 0) close(fd);
    if (dir != nullptr) closedir(dir);
  }
};

namespace {

// Largest READ answered at once: OpenSSH asks for 32 KiB (more only after limits@openssh.com,
// which libssh does not advertise); the cap only bounds a hostile request.
constexpr uint32_t kMaxRead = 256 * 1024;

uint32_t ErrnoToFx(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR: return SSH_FX_NO_SUCH_FILE;
    case EACCES:
    case EPERM: return SSH_FX_PERMISSION_DENIED;
    case EEXIST: return SSH_FX_FILE_ALREADY_EXISTS;
    default: return SSH_FX_FAILURE;
  }
}

int ReplyErrno(sftp_client_message msg, int err) { return sftp_reply_status(msg, ErrnoToFx(err), strerror(err)); }

int ReplyResult(sftp_client_message msg, int rc) {
  if (rc != 0) return ReplyErrno(msg, errno);
  return sftp_reply_status(msg, SSH_FX_OK, nullptr);
}

// Fills `attr` (whose strings stay null) from `st`.
void ToAttributes(const struct stat& st, sftp_attributes_struct* attr) {
  memset(attr, 0, sizeof(*attr));
  attr->flags =
      SSH_FILEXFER_ATTR_SIZE | SSH_FILEXFER_ATTR_UIDGID | SSH_FILEXFER_ATTR_PERMISSIONS | SSH_FILEXFER_ATTR_ACMODTIME;
  attr->size = static_cast<uint64_t>(st.st_size);
  attr->uid = st.st_uid;
  attr->gid = st.st_gid;
  attr->permissions = st.st_mode;
  attr->atime = static_cast<uint32_t>(st.st_atime);
  attr->mtime = static_cast<uint32_t>(st.st_mtime);
}

// The `ls -l` line that clients print for `ls -l` (OpenSSH's sftp shows it verbatim).
std::string LongName(const std::string& name, const struct stat& st) {
  char mode[11] = "----------";
  if (S_ISDIR(st.st_mode)) mode[0] = 'd';
  if (S_ISLNK(st.st_mode)) mode[0] = 'l';
  const char* rwx = "rwxrwxrwx";
  for (int bit = 0; bit < 9; ++bit) {
    if (st.st_mode & (1 << (8 - bit))) mode[bit + 1] = rwx[bit];
  }
  char when[32] = "";
  struct tm tm_buf;
  time_t mtime = st.st_mtime;
  if (localtime_r(&mtime, &tm_buf) != nullptr) strftime(when, sizeof(when), "%b %e %H:%M", &tm_buf);
  char line[512];
  snprintf(line, sizeof(line), "%s %3lu %-8u %-8u %8lld %s ", mode, static_cast<unsigned long>(st.st_nlink), st.st_uid,
           st.st_gid, static_cast<long long>(st.st_size), when);
  return line + name;
}

// Applies the attributes a SETSTAT/FSETSTAT carries, by path or (fd >= 0) by descriptor.
int ApplyAttributes(const std::string& path, int fd, sftp_attributes attr) {
  if (attr == nullptr) return 0;
  if (attr->flags & SSH_FILEXFER_ATTR_SIZE) {
    int rc = fd >= 0 ? ftruncate(fd, static_cast<off_t>(attr->size))
                     : truncate(path.c_str(), static_cast<off_t>(attr->size));
    if (rc != 0) return rc;
  }
  if (attr->flags & SSH_FILEXFER_ATTR_PERMISSIONS) {
    mode_t mode = attr->permissions & 07777;
    int rc = fd >= 0 ? fchmod(fd, mode) : chmod(path.c_str(), mode);
    if (rc != 0) return rc;
  }
  if (attr->flags & SSH_FILEXFER_ATTR_UIDGID) {
    int rc = fd >= 0 ? fchown(fd, attr->uid, attr->gid) : chown(path.c_str(), attr->uid, attr->gid);
    if (rc != 0) return rc;
  }
  if (attr->flags & SSH_FILEXFER_ATTR_ACMODTIME) {
    struct timeval times[2] = {{static_cast<time_t>(attr->atime), 0}, {static_cast<time_t>(attr->mtime), 0}};
    int rc = fd >= 0 ? futimes(fd, times) : utimes(path.c_str(), times);
    if (rc != 0) return rc;
  }
  return 0;
}

// realpath(3) for absolute paths that may not exist yet (the target of a put): the longest
// existing prefix resolved, the rest appended lexically.
std::string ResolvePath(const std::string& input) {
  char buf[PATH_MAX];
  if (realpath(input.c_str(), buf) != nullptr) return buf;
  size_t slash = input.find_last_of('/');
  if (slash == std::string::npos) return input;
  std::string parent = slash == 0 ? "/" : ResolvePath(input.substr(0, slash));
  std::string leaf = input.substr(slash + 1);
  if (leaf.empty() || leaf == ".") return parent;
  return parent == "/" ? "/" + leaf : parent + "/" + leaf;
}

}  // namespace

SftpHandler::SftpHandler(ssh_session session, ssh_channel channel, std::string working_directory, int uid, int gid)
    : channel_(channel),
      working_directory_(working_directory.empty() ? "/" : std::move(working_directory)),
      uid_(uid),
      gid_(gid) {
  sftp_ = sftp_server_new(session, channel);
}

std::string SftpHandler::Absolute(const char* path) const {
  if (path == nullptr || *path == '\0') return working_directory_;
  if (path[0] == '/') return path;
  return working_directory_ + "/" + path;
}

SftpHandler::~SftpHandler() {
  for (auto& handle : handles_) sftp_handle_remove(sftp_, handle.get());
  handles_.clear();
  // sftp_server_free would also free the channel, which the connection owns: detach it first.
  if (sftp_ != nullptr) {
    sftp_->channel = nullptr;
    sftp_free(sftp_);
  }
}

Status SftpHandler::Pump() {
  if (sftp_ == nullptr) return Status::Internal("sftp: sftp_server_new failed");
  for (;;) {
    int available = ssh_channel_poll(channel_, 0);
    if (available == SSH_EOF) return Status::OutOfRange("sftp: the client closed the subsystem");
    if (available == SSH_ERROR) return Status::Unavailable("sftp: the channel failed");
    if (available <= 0) return Status::Ok();
    if (!initialized_) {
      if (sftp_server_init(sftp_) != SSH_OK) return Status::Unavailable("sftp: no INIT from the client");
      initialized_ = true;
      continue;
    }
    sftp_client_message msg = sftp_get_client_message(sftp_);
    if (msg == nullptr) {
      if (ssh_channel_is_eof(channel_)) return Status::OutOfRange("sftp: the client closed the subsystem");
      return Status::Unavailable("sftp: unreadable request");
    }
    // The workload's identity for this request's file operations; setfs[ug]id return the previous
    // value, which is put back so the agent's thread keeps its own.
    int old_gid = gid_ >= 0 ? setfsgid(static_cast<gid_t>(gid_)) : -1;
    int old_uid = uid_ >= 0 ? setfsuid(static_cast<uid_t>(uid_)) : -1;
    Answer(msg);
    if (old_uid >= 0) setfsuid(static_cast<uid_t>(old_uid));
    if (old_gid >= 0) setfsgid(static_cast<gid_t>(old_gid));
    sftp_client_message_free(msg);
  }
}

void SftpHandler::Answer(sftp_client_message msg) {
  const std::string filename = Absolute(msg->filename);
  // The Handle a request names, or null (answered with a failure) when it names none of ours.
  auto find_handle = [&]() -> Handle* {
    if (msg->handle == nullptr) return nullptr;
    void* info = sftp_handle(sftp_, msg->handle);
    for (auto& handle : handles_) {
      if (handle.get() == info) return handle.get();
    }
    return nullptr;
  };
  auto add_handle = [&](std::unique_ptr<Handle> handle) {
    ssh_string id = sftp_handle_alloc(sftp_, handle.get());
    if (id == nullptr) {
      sftp_reply_status(msg, SSH_FX_FAILURE, "too many open handles");
      return;
    }
    handles_.push_back(std::move(handle));
    sftp_reply_handle(msg, id);
    ssh_string_free(id);
  };

  switch (msg->type) {
    case SSH_FXP_OPEN: {
      uint32_t pflags = msg->flags;
      int flags = 0;
      if ((pflags & SSH_FXF_READ) && (pflags & SSH_FXF_WRITE)) {
        flags = O_RDWR;
      } else if (pflags & SSH_FXF_WRITE) {
        flags = O_WRONLY;
      } else {
        flags = O_RDONLY;
      }
      if (pflags & SSH_FXF_APPEND) flags |= O_APPEND;
      if (pflags & SSH_FXF_CREAT) flags |= O_CREAT;
      if (pflags & SSH_FXF_TRUNC) flags |= O_TRUNC;
      if (pflags & SSH_FXF_EXCL) flags |= O_EXCL;
      mode_t mode = 0644;
      if (msg->attr != nullptr && (msg->attr->flags & SSH_FILEXFER_ATTR_PERMISSIONS)) {
        mode = msg->attr->permissions & 07777;
      }
      int fd = open(filename.c_str(), flags | O_CLOEXEC, mode);
      if (fd < 0) {
        ReplyErrno(msg, errno);
        return;
      }
      auto handle = std::make_unique<Handle>();
      handle->fd = fd;
      handle->path = filename;
      add_handle(std::move(handle));
      return;
    }
    case SSH_FXP_OPENDIR: {
      DIR* dir = opendir(filename.c_str());
      if (dir == nullptr) {
        ReplyErrno(msg, errno);
        return;
      }
      auto handle = std::make_unique<Handle>();
      handle->dir = dir;
      handle->path = filename;
      add_handle(std::move(handle));
      return;
    }
    case SSH_FXP_CLOSE: {
      Handle* handle = find_handle();
      if (handle == nullptr) {
        sftp_reply_status(msg, SSH_FX_FAILURE, "no such handle");
        return;
      }
      sftp_handle_remove(sftp_, handle);
      std::erase_if(handles_, [&](const std::unique_ptr<Handle>& h) { return h.get() == handle; });
      sftp_reply_status(msg, SSH_FX_OK, nullptr);
      return;
    }
    case SSH_FXP_READ: {
      Handle* handle = find_handle();
      if (handle == nullptr || handle->fd < 0) {
        sftp_reply_status(msg, SSH_FX_FAILURE, "no such file handle");
        return;
      }
      std::string buf(std::min(msg->len, kMaxRead), '\0');
      ssize_t n = pread(handle->fd, buf.data(), buf.size(), static_cast<off_t>(msg->offset));
      if (n < 0) {
        ReplyErrno(msg, errno);
      } else if (n == 0) {
        sftp_reply_status(msg, SSH_FX_EOF, "end of file");
      } else {
        sftp_reply_data(msg, buf.data(), static_cast<int>(n));
      }
      return;
    }
    case SSH_FXP_WRITE: {
      Handle* handle = find_handle();
      if (handle == nullptr || handle->fd < 0 || msg->data == nullptr) {
        sftp_reply_status(msg, SSH_FX_FAILURE, "no such file handle");
        return;
      }
      const char* data = static_cast<const char*>(ssh_string_data(msg->data));
      size_t left = ssh_string_len(msg->data);
      off_t offset = static_cast<off_t>(msg->offset);
      while (left > 0) {
        ssize_t n = pwrite(handle->fd, data, left, offset);
        if (n < 0) {
          if (errno == EINTR) continue;
          ReplyErrno(msg, errno);
          return;
        }
        data += n;
        offset += n;
        left -= static_cast<size_t>(n);
      }
      sftp_reply_status(msg, SSH_FX_OK, nullptr);
      return;
    }
    case SSH_FXP_READDIR: {
      Handle* handle = find_handle();
      if (handle == nullptr || handle->dir == nullptr) {
        sftp_reply_status(msg, SSH_FX_FAILURE, "no such directory handle");
        return;
      }
      int count = 0;
      while (count < 100) {
        errno = 0;
        struct dirent* entry = readdir(handle->dir);
        if (entry == nullptr) break;
        std::string full = handle->path + "/" + entry->d_name;
        struct stat st;
        if (lstat(full.c_str(), &st) != 0) continue;
        sftp_attributes_struct attr;
        ToAttributes(st, &attr);
        std::string long_name = LongName(entry->d_name, st);
        sftp_reply_names_add(msg, entry->d_name, long_name.c_str(), &attr);
        ++count;
      }
      if (count == 0) {
        sftp_reply_status(msg, SSH_FX_EOF, nullptr);
      } else {
        sftp_reply_names(msg);
      }
      return;
    }
    case SSH_FXP_STAT:
    case SSH_FXP_LSTAT:
    case SSH_FXP_FSTAT: {
      struct stat st;
      int rc;
      if (msg->type == SSH_FXP_FSTAT) {
        Handle* handle = find_handle();
        if (handle == nullptr) {
          sftp_reply_status(msg, SSH_FX_FAILURE, "no such handle");
          return;
        }
        rc = handle->fd >= 0 ? fstat(handle->fd, &st) : stat(handle->path.c_str(), &st);
      } else if (msg->type == SSH_FXP_STAT) {
        rc = stat(filename.c_str(), &st);
      } else {
        rc = lstat(filename.c_str(), &st);
      }
      if (rc != 0) {
        ReplyErrno(msg, errno);
        return;
      }
      sftp_attributes_struct attr;
      ToAttributes(st, &attr);
      sftp_reply_attr(msg, &attr);
      return;
    }
    case SSH_FXP_SETSTAT: ReplyResult(msg, ApplyAttributes(filename, -1, msg->attr)); return;
    case SSH_FXP_FSETSTAT: {
      Handle* handle = find_handle();
      if (handle == nullptr) {
        sftp_reply_status(msg, SSH_FX_FAILURE, "no such handle");
        return;
      }
      ReplyResult(msg, ApplyAttributes(handle->path, handle->fd, msg->attr));
      return;
    }
    case SSH_FXP_MKDIR: {
      mode_t mode = 0755;
      if (msg->attr != nullptr && (msg->attr->flags & SSH_FILEXFER_ATTR_PERMISSIONS)) {
        mode = msg->attr->permissions & 07777;
      }
      ReplyResult(msg, mkdir(filename.c_str(), mode));
      return;
    }
    case SSH_FXP_RMDIR: ReplyResult(msg, rmdir(filename.c_str())); return;
    case SSH_FXP_REMOVE: ReplyResult(msg, unlink(filename.c_str())); return;
    case SSH_FXP_RENAME: {
      const char* data = sftp_client_message_get_data(msg);
      if (data == nullptr) {
        sftp_reply_status(msg, SSH_FX_BAD_MESSAGE, "rename without a new path");
        return;
      }
      const std::string target_path = Absolute(data);
      const char* target = target_path.c_str();
      // SFTP v3 rename must not overwrite (OpenSSH's sftp-server links then unlinks); rename(2)
      // would, so refuse an existing target like OpenSSH does.
      struct stat st;
      if (lstat(target, &st) == 0) {
        sftp_reply_status(msg, SSH_FX_FAILURE, "the target exists");
        return;
      }
      ReplyResult(msg, rename(filename.c_str(), target));
      return;
    }
    case SSH_FXP_REALPATH: {
      std::string resolved = ResolvePath(filename);
      sftp_attributes_struct attr;
      memset(&attr, 0, sizeof(attr));
      sftp_reply_name(msg, resolved.c_str(), &attr);
      return;
    }
    case SSH_FXP_READLINK: {
      char buf[PATH_MAX];
      ssize_t n = readlink(filename.c_str(), buf, sizeof(buf) - 1);
      if (n < 0) {
        ReplyErrno(msg, errno);
        return;
      }
      buf[n] = '\0';
      sftp_attributes_struct attr;
      memset(&attr, 0, sizeof(attr));
      sftp_reply_name(msg, buf, &attr);
      return;
    }
    case SSH_FXP_SYMLINK: {
      // OpenSSH's client sends (linkpath = filename, targetpath = data), reversed from the draft;
      // OpenSSH's server swaps them back, and so do we.
      // The link's content is kept as sent (a relative link is relative to its directory); the
      // link's own path is taken from the working directory.
      const char* data = sftp_client_message_get_data(msg);
      if (data == nullptr || msg->filename == nullptr) {
        sftp_reply_status(msg, SSH_FX_BAD_MESSAGE, "symlink without a target");
        return;
      }
      ReplyResult(msg, symlink(msg->filename, Absolute(data).c_str()));
      return;
    }
    case SSH_FXP_EXTENDED: {
      const char* name = sftp_client_message_get_submessage(msg);
      const char* data = sftp_client_message_get_data(msg);
      const std::string target_path = Absolute(data);
      const char* target = data != nullptr ? target_path.c_str() : nullptr;
      if (name != nullptr && target != nullptr && strcmp(name, "posix-rename@openssh.com") == 0) {
        ReplyResult(msg, rename(filename.c_str(), target));
      } else if (name != nullptr && target != nullptr && strcmp(name, "hardlink@openssh.com") == 0) {
        ReplyResult(msg, link(filename.c_str(), target));
      } else {
        sftp_reply_status(msg, SSH_FX_OP_UNSUPPORTED, "unsupported extension");
      }
      return;
    }
    default: sftp_reply_status(msg, SSH_FX_OP_UNSUPPORTED, "unsupported request"); return;
  }
}

}  // namespace kiln::access
