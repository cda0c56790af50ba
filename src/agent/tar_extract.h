#pragma once
// Safe tar extraction shared by the agent's archive readers (internal to the agent module):
// DownloadSourceDir (artifacts.h, sourcedir.tar.gz) and PrepareModelData (model_data.h,
// model.tar.gz). Both keep every member inside the destination; model data is stricter (see
// ExtractOptions).
//
// Rules applied to every member (serving-contract.md §3):
//   leading '/'s                                     dropped, as GNU tar and Python's tarfile do
//                                                     ("/" and "./" are the root, "/code/x.py" is
//                                                     code/x.py: the SDK's repacked model.tar.gz)
//   ".." component (after that)                      refused
//   path through an existing symlink or file          refused (nothing is written through a link)
//   symlink whose target is absolute or climbs out    refused; after the whole tree is written,
//                                                     every symlink is resolved again and one that
//                                                     physically leaves the root (a -> ".",
//                                                     b -> "a/..") is refused too
//   hard link                                         must name an already extracted regular file
//                                                     inside the root (its target's leading '/'s
//                                                     dropped like a member name's)
//   regular file                                      written O_EXCL|O_NOFOLLOW, keeps its
//                                                     permission bits (plus owner write)
//   device, FIFO, socket                              skipped, or refused with
//                                                     ExtractOptions::refuse_special_files
//
// Thread-safety: free functions, no shared state.

#include <archive.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "agent/transfer.h"
#include "agent/unpack_cap.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

using ArchiveReadPtr = std::unique_ptr<struct archive, int (*)(struct archive*)>;

// A libarchive reader for gzip-compressed or plain tar (ustar, pax, GNU).
ArchiveReadPtr NewTarReader();

// libarchive's last error text for `a`, or `fallback`.
std::string ArchiveErrorText(struct archive* a, const char* fallback = "unknown error");

// Streams an open object into a reader: pass to OpenTarFromObject, keep alive while reading.
// After a failure, `error` holds the store's status (or Aborted when `cancel` was raised).
struct ObjectArchiveSource {
  objects::ObjectReader* reader = nullptr;
  const CancelFlag* cancel = nullptr;
  Status error;
  std::unique_ptr<char[]> buf;
};

// archive_read_open over `source`; returns libarchive's result code.
int OpenTarFromObject(struct archive* a, ObjectArchiveSource* source);

struct ExtractOptions {
  // How messages name the destination: "the code directory", "/opt/ml/model".
  std::string dest_name;
  // Device, FIFO and socket members: refuse the archive (true) or skip them (false).
  bool refuse_special_files = false;
  // Checked between members and buffers; when raised the call returns Aborted. May be null.
  const CancelFlag* cancel = nullptr;
  // Bounds on what the archive unpacks to (see unpack_cap.h); the default bounds nothing.
  UnpackCap cap;
  // How the cap message names the archive: "ModelDataUrl s3://b/model.tar.gz".
  std::string archive_name;
};

struct ExtractStats {
  uint64_t files = 0;    // regular files and hard links created
  uint64_t bytes = 0;    // bytes of regular file data written
  uint64_t entries = 0;  // members read, of every type
};

// Extracts every member of the opened archive `a` under `dest` (created when missing). An unsafe
// or unreadable archive returns client_error(why), where `why` is a phrase such as
// `member "../x" would be written outside /opt/ml/model`; the destination may then be partly
// filled (callers that need all-or-nothing extract into a staging directory). An archive that
// passes options.cap returns InvalidArgument "ClientError: <archive_name> unpacks to more than
// <max> <bytes_origin>. ..." (or "has more than <n> members <entries_origin>. ...") before the
// write that would pass it. File-system errors are returned as they are (ResourceExhausted for a
// full disk). `stats` may be null.
Status ExtractTar(struct archive* a, const std::string& dest, const ExtractOptions& options,
                  const std::function<Status(const std::string& why)>& client_error, ExtractStats* stats);

}  // namespace kiln::agent
