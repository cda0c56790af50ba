#include "agent/tar_extract.h"

#include <archive_entry.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "agent/errors.h"
#include "base/fs.h"
#include "base/strings.h"

namespace kiln::agent {

namespace {

constexpr size_t kBufferSize = 1 << 20;

// Lexically resolves symlink `target` placed at `rel` (relative to the root); false when it
// climbs above the root or is absolute.
bool LinkTargetInside(const std::string& rel, const std::string& target) {
  if (target.empty() || target.front() == '/') return false;
  std::vector<std::string_view> parts;
  auto rel_parts = Split(rel, '/');
  for (size_t i = 0; i + 1 < rel_parts.size(); ++i) parts.push_back(rel_parts[i]);
  for (std::string_view p : Split(target, '/')) {
    if (p.empty() || p == ".") continue;
    if (p == "..") {
      if (parts.empty()) return false;
      parts.pop_back();
    } else {
      parts.push_back(p);
    }
  }
  return true;
}

std::string_view StripLeadingSlashes(std::string_view name) {
  while (!name.empty() && name.front() == '/') name.remove_prefix(1);
  return name;
}

bool Cancelled(const CancelFlag* cancel) { return cancel != nullptr && cancel->cancelled(); }

Status CancelledStatus(const std::string& dest) {
  return Status::Aborted("extraction into " + dest + " was cancelled");
}

la_ssize_t ObjectRead(struct archive* a, void* client, const void** out) {
  auto* src = static_cast<ObjectArchiveSource*>(client);
  if (Cancelled(src->cancel)) {
    src->error = Status::Aborted("download cancelled");
    archive_set_error(a, ECANCELED, "download cancelled");
    return -1;
  }
  auto n = src->reader->Read(src->buf.get(), kBufferSize);
  if (!n.ok()) {
    src->error = n.status();
    archive_set_error(a, EIO, "%s", n.status().message().c_str());
    return -1;
  }
  *out = src->buf.get();
  return static_cast<la_ssize_t>(*n);
}

// Charges what an archive unpacks to against its UnpackCap (unpack_cap.h).
class CapMeter {
 public:
  explicit CapMeter(const ExtractOptions& options) : options_(options) {}

  // One member read; charges its entry cost.
  Status Entry() {
    const UnpackCap& cap = options_.cap;
    ++entries_;
    if (cap.max_entries != 0 && entries_ > cap.max_entries) {
      return ClientError(options_.archive_name + " has more than " + std::to_string(cap.max_entries) + " members" +
                         Suffix(cap.entries_origin));
    }
    return Charge(UnpackCap::kEntryBytes);
  }

  // `n` more bytes about to be written (or announced by a member header).
  Status Charge(uint64_t n) {
    const UnpackCap& cap = options_.cap;
    if (cap.max_bytes != 0 && (charged_ > cap.max_bytes || n > cap.max_bytes - charged_)) {
      return ClientError(options_.archive_name + " unpacks to more than " + FormatCapBytes(cap.max_bytes) +
                         Suffix(cap.bytes_origin));
    }
    charged_ += n;
    return Status::Ok();
  }

  // Announced sizes are checked without being charged: the bytes are charged as they are written.
  Status Announce(uint64_t n) {
    RETURN_IF_ERROR(Charge(n));
    charged_ -= n;
    return Status::Ok();
  }

  uint64_t entries() const { return entries_; }

 private:
  std::string Suffix(const std::string& origin) const {
    return (origin.empty() ? "" : " " + origin) + ". Extraction stopped there and nothing was kept in " +
           options_.dest_name + ".";
  }

  const ExtractOptions& options_;
  uint64_t entries_ = 0;
  uint64_t charged_ = 0;
};

}  // namespace

std::string FormatCapBytes(uint64_t bytes) {
  struct Unit {
    uint64_t size;
    const char* name;
  };
  for (Unit unit :
       {Unit{1ull << 40, "TiB"}, Unit{1ull << 30, "GiB"}, Unit{1ull << 20, "MiB"}, Unit{1ull << 10, "KiB"}}) {
    if (bytes >= unit.size && bytes % unit.size == 0) return std::to_string(bytes / unit.size) + " " + unit.name;
  }
  return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
}

ArchiveReadPtr NewTarReader() {
  ArchiveReadPtr a(archive_read_new(), archive_read_free);
  archive_read_support_filter_gzip(a.get());
  archive_read_support_filter_none(a.get());
  archive_read_support_format_tar(a.get());
  archive_read_support_format_gnutar(a.get());
  return a;
}

std::string ArchiveErrorText(struct archive* a, const char* fallback) {
  const char* m = archive_error_string(a);
  return m != nullptr ? m : fallback;
}

int OpenTarFromObject(struct archive* a, ObjectArchiveSource* source) {
  if (!source->buf) source->buf.reset(new char[kBufferSize]);
  return archive_read_open(a, source, nullptr, ObjectRead, nullptr);
}

namespace {

// Each symlink in `links` (paths under `dest`) must resolve inside `dest`; the first that does
// not is removed and refused with client_error. A dangling link reaches nothing and is kept.
Status CheckLinksResolveInside(const std::string& dest, const std::vector<std::string>& links, const std::string& where,
                               const std::function<Status(const std::string& why)>& client_error) {
  char root_real[PATH_MAX];
  if (realpath(dest.c_str(), root_real) == nullptr) return ErrnoStatus("realpath " + dest, errno);
  std::string root = root_real;
  for (const auto& link_path : links) {
    char resolved[PATH_MAX];
    if (realpath(link_path.c_str(), resolved) == nullptr) continue;  // dangling: nothing to reach
    std::string r = resolved;
    if (r != root && !StartsWith(r, root + "/")) {
      unlink(link_path.c_str());
      return client_error("symlink \"" + link_path.substr(dest.size() + 1) + "\" resolves outside " + where);
    }
  }
  return Status::Ok();
}

}  // namespace

Status ExtractTar(struct archive* a, const std::string& dest, const ExtractOptions& options,
                  const std::function<Status(const std::string& why)>& client_error, ExtractStats* stats) {
  const std::string& where = options.dest_name;
  RETURN_IF_ERROR(MakeDirs(dest));
  ExtractStats counted;
  CapMeter meter(options);
  std::vector<std::string> links;
  std::unique_ptr<char[]> buf(new char[kBufferSize]);
  while (true) {
    if (Cancelled(options.cancel)) return CancelledStatus(dest);
    struct archive_entry* entry = nullptr;
    int rc = archive_read_next_header(a, &entry);
    if (rc == ARCHIVE_EOF) break;
    if (rc < ARCHIVE_WARN) {
      if (Cancelled(options.cancel)) return CancelledStatus(dest);
      return client_error("it is not a readable tar.gz archive (" + ArchiveErrorText(a) + ")");
    }
    RETURN_IF_ERROR(meter.Entry());
    const char* raw = archive_entry_pathname(entry);
    std::string name = raw != nullptr ? raw : "";
    mode_t type = archive_entry_filetype(entry);
    // Leading '/'s are dropped as GNU tar and Python's tarfile do: the SageMaker SDK's
    // repack_model writes tarfile.add(model_dir, arcname="/"), a root member "/" followed by
    // "/code/inference.py" (serving-contract.md §3).
    auto rel = ConfinedRelativePath(StripLeadingSlashes(name), "member \"" + name + "\"");
    if (!rel.ok()) {
      // The root itself ("", "/", "./"): nothing to create.
      if (type == AE_IFDIR && name.find("..") == std::string::npos) continue;
      return client_error("member \"" + name + "\" would be written outside " + where);
    }
    const char* hardlink = archive_entry_hardlink(entry);
    bool special = hardlink == nullptr && type != AE_IFDIR && type != AE_IFREG && type != AE_IFLNK;
    if (special && options.refuse_special_files) {
      return client_error("member \"" + name + "\" is a device file, FIFO or socket");
    }
    auto prepared = PrepareConfinedPath(dest, *rel);
    if (!prepared.ok()) return client_error("member \"" + name + "\" passes through a symlink or a file");
    const std::string& path = *prepared;
    struct stat existing;
    bool exists = lstat(path.c_str(), &existing) == 0;
    if (hardlink != nullptr) {
      // A hard link names another member of the archive, so its target is read like a member
      // name (leading '/'s dropped); one that still climbs out is refused.
      std::string target_name = hardlink;
      auto target = ConfinedRelativePath(StripLeadingSlashes(target_name), "hard link target");
      if (!target.ok()) {
        return client_error("hard link \"" + name + "\" points outside " + where + " (\"" + target_name + "\")");
      }
      std::string target_path = dest + "/" + *target;
      struct stat tst;
      if (lstat(target_path.c_str(), &tst) != 0 || !S_ISREG(tst.st_mode)) {
        return client_error("hard link \"" + name + "\" does not point at an extracted regular file");
      }
      if (exists) unlink(path.c_str());
      if (link(target_path.c_str(), path.c_str()) != 0) return ErrnoStatus("link " + path, errno);
      counted.files++;
      continue;
    }
    if (type == AE_IFDIR) {
      if (exists && !S_ISDIR(existing.st_mode)) {
        return client_error("directory \"" + name + "\" clashes with a file or symlink");
      }
      if (!exists && mkdir(path.c_str(), 0755) != 0) return ErrnoStatus("mkdir " + path, errno);
    } else if (type == AE_IFREG) {
      if (exists) {
        if (S_ISDIR(existing.st_mode)) return client_error("file \"" + name + "\" clashes with a directory");
        unlink(path.c_str());  // never write through an existing symlink
      }
      mode_t mode = archive_entry_perm(entry) & 0777;
      // A header announcing more than the cap leaves is refused before anything is written; the
      // bytes themselves are charged as they arrive (the header may understate them).
      if (archive_entry_size_is_set(entry) && archive_entry_size(entry) > 0) {
        RETURN_IF_ERROR(meter.Announce(static_cast<uint64_t>(archive_entry_size(entry))));
      }
      UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!fd.valid()) return ErrnoStatus("create " + path, errno);
      while (true) {
        if (Cancelled(options.cancel)) return CancelledStatus(dest);
        la_ssize_t n = archive_read_data(a, buf.get(), kBufferSize);
        if (n < 0) {
          if (Cancelled(options.cancel)) return CancelledStatus(dest);
          return client_error("member \"" + name + "\" is damaged (" + ArchiveErrorText(a, "read error") + ")");
        }
        if (n == 0) break;
        RETURN_IF_ERROR(meter.Charge(static_cast<uint64_t>(n)));
        RETURN_IF_ERROR(WriteAll(fd.get(), std::string_view(buf.get(), static_cast<size_t>(n))));
        counted.bytes += static_cast<uint64_t>(n);
      }
      if (fchmod(fd.get(), mode | 0200) != 0) return ErrnoStatus("chmod " + path, errno);
      counted.files++;
    } else if (type == AE_IFLNK) {
      const char* t = archive_entry_symlink(entry);
      std::string target = t != nullptr ? t : "";
      if (!LinkTargetInside(*rel, target)) {
        return client_error("symlink \"" + name + "\" points outside " + where + " (\"" + target + "\")");
      }
      if (exists) {
        if (S_ISDIR(existing.st_mode)) return client_error("symlink \"" + name + "\" clashes with a directory");
        unlink(path.c_str());
      }
      if (symlink(target.c_str(), path.c_str()) != 0) return ErrnoStatus("symlink " + path, errno);
      links.push_back(path);
    }
    // Devices, FIFOs and sockets are skipped (unless refused above).
  }
  // A chain of in-tree links can still climb out physically (a -> ".", b -> "a/.."): check what
  // every link resolves to now that the tree is complete.
  RETURN_IF_ERROR(CheckLinksResolveInside(dest, links, where, client_error));
  counted.entries = meter.entries();
  if (stats != nullptr) *stats = counted;
  return Status::Ok();
}

}  // namespace kiln::agent
