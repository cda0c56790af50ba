// Fuzzes agent::ExtractTar (src/agent/tar_extract.cc), the extraction behind sourcedir.tar.gz
// (training) and model.tar.gz (endpoints): archive bytes from the input, gzip or plain tar
// (ustar, pax, GNU) as agent::NewTarReader accepts them, extracted into a fresh directory.
//
// Input layout: byte 0 = flags:
//   bit 0   ExtractOptions::refuse_special_files
//   bit 1   unused (was refuse_absolute_hardlinks: leading '/'s are now always dropped, issue 10)
//   bit 2   the destination exists beforehand holding a symlink "up" -> "../outside" and a
//           directory link "d" -> "." (paths through existing links must be refused)
//   bit 3   ExtractOptions::cap = {64 KiB, 8 members} (agent/unpack_cap.h)
// the rest = the archive. Seeds (corpus/tar_extract_fuzzer/) are written by make_api_seeds.py:
// plain and gzip tars with files, directories, links, long pax names and unsafe members.
//
// Layout of the scratch directory, fresh per input and removed after it:
//   <scratch>/dest      the destination
//   <scratch>/outside/  a sibling holding one file, "canary"
// Checks besides "no crash, no sanitizer report" (the containment property): whatever the
// archive and whatever ExtractTar returns, nothing is created, changed or removed outside dest —
// the scratch directory still holds exactly {dest, outside}, outside still holds exactly the
// canary with its content; on success every path under dest resolves (symlinks followed) inside
// dest (a dangling link: the directory it names, when that exists). A refusal reported through
// client_error is what ExtractTar returns. With the cap, whatever the outcome, the regular files
// under dest hold at most 64 KiB and there are at most 8 entries; ExtractStats agrees (bytes +
// 4 KiB per member within 64 KiB, members within 8).

#include <archive.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "agent/tar_extract.h"
#include "fuzz_support.h"

namespace {

namespace fs = std::filesystem;
using kiln::fuzz::Check;

constexpr char kCanary[] = "canary contents\n";

std::set<std::string> Names(const fs::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) out.insert(entry.path().filename().string());
  Check(!ec);
  return out;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool Inside(const std::string& path, const std::string& root) {
  return path == root ||
         (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/');
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  kiln::fuzz::ScratchDir scratch;
  const fs::path root = scratch.path();
  const fs::path dest = root / "dest";
  const fs::path outside = root / "outside";
  fs::create_directory(outside);
  { std::ofstream(outside / "canary", std::ios::binary) << kCanary; }
  if (flags & 4) {
    fs::create_directory(dest);
    fs::create_symlink("../outside", dest / "up");
    fs::create_directory_symlink(".", dest / "d");
  }

  kiln::agent::ArchiveReadPtr archive = kiln::agent::NewTarReader();
  Check(archive != nullptr);
  if (archive_read_open_memory(archive.get(), data + 1, size - 1) != ARCHIVE_OK) return 0;

  kiln::agent::ExtractOptions options;
  options.dest_name = "/opt/ml/model";
  options.refuse_special_files = (flags & 1) != 0;
  constexpr uint64_t kCapBytes = 64 * 1024, kCapEntries = 8;
  if (flags & 8) {
    options.cap.max_bytes = kCapBytes;
    options.cap.max_entries = kCapEntries;
    options.archive_name = "ModelDataUrl s3://b/model.tar.gz";
  }
  kiln::Status refusal;
  auto client_error = [&refusal](const std::string& why) {
    refusal = kiln::Status::InvalidArgument(why);
    return refusal;
  };
  kiln::agent::ExtractStats stats;
  kiln::Status result = kiln::agent::ExtractTar(archive.get(), dest.string(), options, client_error, &stats);
  if (kiln::fuzz::Debug()) {
    std::fprintf(stderr, "%s (%llu files)\n", result.ToString().c_str(), static_cast<unsigned long long>(stats.files));
  }

  // Containment, whatever the outcome.
  std::set<std::string> top = Names(root);
  top.erase("dest");  // absent when the archive failed before the first member
  Check(top == std::set<std::string>{"outside"});
  Check(Names(outside) == std::set<std::string>{"canary"});
  Check(!fs::is_symlink(outside / "canary") && ReadFile(outside / "canary") == kCanary);
  if (!refusal.ok()) Check(!result.ok() && result.message() == refusal.message());
  if (flags & 8) {
    Check(stats.entries <= kCapEntries &&
          stats.bytes + stats.entries * kiln::agent::UnpackCap::kEntryBytes <= kCapBytes);
    std::set<ino_t> inodes;
    uint64_t bytes = 0, entries = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dest, fs::directory_options::none, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      ++entries;
      struct stat st;
      if (lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode) && inodes.insert(st.st_ino).second) {
        bytes += static_cast<uint64_t>(st.st_size);
      }
    }
    Check(bytes <= kCapBytes);
    Check(entries <= kCapEntries + ((flags & 4) ? 2 : 0));
  }
  if (!result.ok()) return 0;

  // On success every path under dest stays inside it once links are followed (the links the
  // test itself put there with bit 2 aside).
  char real_dest[PATH_MAX];
  Check(realpath(dest.c_str(), real_dest) != nullptr);
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dest, fs::directory_options::none, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    Check(!ec);
    if ((flags & 4) && (it->path() == dest / "up" || it->path() == dest / "d")) continue;
    char real[PATH_MAX];
    if (realpath(it->path().c_str(), real) != nullptr) {
      Check(Inside(real, real_dest));
      continue;
    }
    // A dangling link: the directory it names must still be inside dest when it exists.
    Check(fs::is_symlink(it->symlink_status()));
    fs::path target = it->path().parent_path() / fs::read_symlink(it->path());
    if (realpath(target.parent_path().c_str(), real) != nullptr) Check(Inside(real, real_dest));
  }
  Check(!ec);
  return 0;
}
