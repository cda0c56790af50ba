#pragma once
// The `sftp` subsystem of the agent (agent_session.h): answers SFTP v3 requests on one SSH channel
// with libssh's sftp server messages, against the agent's file system. Covers what OpenSSH's sftp
// and scp (which speaks sftp since OpenSSH 9) send: open/read/write/close, stat/lstat/fstat,
// setstat/fsetstat, opendir/readdir, mkdir/rmdir/remove, rename (and posix-rename@openssh.com),
// realpath, readlink/symlink.
//
// Not thread-safe: owned and driven by one connection's loop.

#include <memory>
#include <string>
#include <vector>

#include <libssh/libssh.h>
#include <libssh/sftp.h>

#include "base/status.h"

namespace kiln::access {

class SftpHandler {
 public:
  // `channel` must outlive the handler. Nothing is read until Pump(). Relative paths are taken
  // from `working_directory` (the workload's, as for shells; realpath(".") answers it). With
  // uid/gid >= 0 every file operation runs under that file-system identity (setfsuid/setfsgid on
  // the calling thread, restored after each request), so files are owned and permission-checked
  // as the workload's user; supplementary groups stay the agent's.
  SftpHandler(ssh_session session, ssh_channel channel, std::string working_directory, int uid, int gid);
  SftpHandler(const SftpHandler&) = delete;
  SftpHandler& operator=(const SftpHandler&) = delete;
  ~SftpHandler();  // closes every open file and directory handle

  // Answers the requests whose bytes have arrived on the channel (the first one must be INIT).
  // Returns OK while the subsystem goes on; OutOfRange when the client closed it (EOF); another
  // error when the stream is broken. Reads of a request that has only partly arrived block until
  // the rest comes (libssh's sftp reader is blocking); the client sends whole requests.
  Status Pump();

 private:
  struct Handle;
  void Answer(sftp_client_message msg);
  std::string Absolute(const char* path) const;  // `path` against working_directory_

  ssh_channel channel_;
  const std::string working_directory_;
  const int uid_;
  const int gid_;
  sftp_session sftp_ = nullptr;
  bool initialized_ = false;
  // Open files and directories; libssh's handle table holds raw pointers to these.
  std::vector<std::unique_ptr<Handle>> handles_;
};

}  // namespace kiln::access
