#pragma once
// UnpackCap: the bound on what one archive may unpack to on an instance's volume (issue 9: a
// 1 MB model.tar.gz filled 1 GiB of /opt/ml/model). The controllers set it from the instance's
// volume size (control/archive_caps.h); ExtractTar applies it to sourcedir.tar.gz
// (DownloadSourceDir) and model.tar.gz (PrepareModelData).
//
// What counts against max_bytes: the bytes actually written (a member header's size is never
// trusted; a sparse member's holes are written out in full and count), plus kEntryBytes for every
// member (a directory, a link or an empty file still takes a block and an inode, so a million
// empty files count as 4 GiB). Every member, of any type, counts against max_entries. Extraction
// stops before the write that would pass either bound, and the caller removes what was written.
//
// Thread-safety: a value.

#include <cstdint>
#include <string>

namespace kiln::agent {

struct UnpackCap {
  static constexpr uint64_t kEntryBytes = 4096;

  uint64_t max_bytes = 0;    // 0: no bound
  uint64_t max_entries = 0;  // 0: no bound
  // Follows the bound in the failure message: where it comes from and how to raise it, e.g.
  // "(the cap from the variant's VolumeSizeInGB 10); raise VolumeSizeInGB of the variant".
  std::string bytes_origin;
  std::string entries_origin;
};

// "10 GiB", "64 MiB", "4 KiB" when exact; otherwise bytes ("1000 bytes"). For messages.
std::string FormatCapBytes(uint64_t bytes);

}  // namespace kiln::agent
