#include "agent/artifacts.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "agent/errors.h"
#include "agent/tar_extract.h"
#include "base/fs.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::agent {

using nlohmann::json;

namespace {

constexpr size_t kBufferSize = 1 << 20;

struct Entry {
  std::string path;  // absolute source path
  struct stat st;
  size_t host = 0;
};

// Walks `root` (not following symlinks) adding every entry below it under `rel_base`.
Status Walk(const std::string& root, const std::string& rel_base, size_t host, std::map<std::string, Entry>* out,
            std::vector<std::string>* clashes) {
  DIR* d = opendir(root.c_str());
  if (d == nullptr) {
    if (errno == ENOENT && rel_base.empty()) return Status::Ok();  // a missing dir is empty
    return ErrnoStatus("opendir " + root, errno);
  }
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    std::string abs = root + "/" + n;
    std::string rel = rel_base.empty() ? n : rel_base + "/" + n;
    struct stat st;
    if (lstat(abs.c_str(), &st) != 0) continue;  // vanished
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) continue;
    auto it = out->find(rel);
    if (it != out->end()) {
      bool both_dirs = S_ISDIR(st.st_mode) && S_ISDIR(it->second.st.st_mode);
      if (!both_dirs) {
        clashes->push_back(rel + " (algo-" + std::to_string(host + 1) + ")");
        continue;
      }
    } else {
      (*out)[rel] = Entry{abs, st, host};
    }
    if (S_ISDIR(st.st_mode)) RETURN_IF_ERROR(Walk(abs, rel, host, out, clashes));
  }
  return Status::Ok();
}

Result<std::map<std::string, Entry>> Merge(const std::vector<std::string>& dirs, std::vector<std::string>* clashes) {
  std::map<std::string, Entry> entries;
  for (size_t i = 0; i < dirs.size(); ++i) RETURN_IF_ERROR(Walk(dirs[i], "", i, &entries, clashes));
  return entries;
}

std::string TempArchivePath(const std::vector<std::string>& dirs, const std::string& name) {
  std::string dir;
  if (!dirs.empty()) {
    dir = std::filesystem::path(dirs[0]).lexically_normal().parent_path().string();
    struct stat st;
    if (dir.empty() || stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || access(dir.c_str(), W_OK) != 0) {
      dir.clear();
    }
  }
  if (dir.empty()) dir = std::filesystem::temp_directory_path().string();
  return dir + "/.kiln-" + name + "-" + RandomHex(6) + ".tmp";
}

Status ArchiveError(struct archive* a, const std::string& what) {
  const char* m = archive_error_string(a);
  return Status::Internal(what + ": " + (m != nullptr ? m : "libarchive error"));
}

Result<S3Location> OutputLocation(const json& output_data_config, const std::string& job_name,
                                  const std::string& file) {
  std::string base = output_data_config.value("S3OutputPath", "");
  auto loc = ParseS3Uri(base);
  if (!loc.ok()) return loc.status();
  loc->key = JoinKey(loc->key, job_name + "/output/" + file);
  return loc;
}

bool Uncompressed(const json& output_data_config) {
  return EqualsIgnoreCase(output_data_config.value("CompressionType", "GZIP"), "NONE");
}

// Archives `dirs` and uploads the archive to `loc`. Returns uploaded bytes.
Result<uint64_t> ArchiveAndUpload(objects::ObjectStore& store, const std::vector<std::string>& dirs,
                                  const S3Location& loc, const std::string& what, std::vector<std::string>* clashes,
                                  uint64_t* files) {
  std::string tmp = TempArchivePath(dirs, what);
  auto written = WriteTarGz(dirs, tmp, files);
  if (!written.ok()) {
    unlink(tmp.c_str());
    return written.status();
  }
  *clashes = std::move(written).value();
  auto put = UploadFile(store, loc.bucket, loc.key, tmp);
  unlink(tmp.c_str());
  if (!put.ok()) return ObjectError(put.status(), "Uploading " + what + " to", loc.bucket, loc.key);
  return put->size;
}

}  // namespace

std::string JobOutputPrefix(const json& output_data_config, const std::string& job_name) {
  std::string base = output_data_config.value("S3OutputPath", "");
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/" + job_name + "/output/";
}

std::string ModelArtifactsUri(const json& output_data_config, const std::string& job_name) {
  return JobOutputPrefix(output_data_config, job_name) + (Uncompressed(output_data_config) ? "model/" : "model.tar.gz");
}

Result<std::vector<std::string>> WriteTarGz(const std::vector<std::string>& dirs, const std::string& archive_path,
                                            uint64_t* files) {
  std::vector<std::string> clashes;
  ASSIGN_OR_RETURN(auto entries, Merge(dirs, &clashes));
  std::unique_ptr<struct archive, int (*)(struct archive*)> a(archive_write_new(), archive_write_free);
  if (archive_write_add_filter_gzip(a.get()) != ARCHIVE_OK ||
      archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "configuring the archive writer");
  }
  if (archive_write_open_filename(a.get(), archive_path.c_str()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "creating " + archive_path);
  }
  std::unique_ptr<char[]> buf(new char[kBufferSize]);
  uint64_t count = 0;
  for (const auto& [rel, e] : entries) {
    std::unique_ptr<struct archive_entry, void (*)(struct archive_entry*)> entry(archive_entry_new(),
                                                                                 archive_entry_free);
    archive_entry_set_pathname(entry.get(), rel.c_str());
    archive_entry_copy_stat(entry.get(), &e.st);
    UniqueFd fd;
    if (S_ISLNK(e.st.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = readlink(e.path.c_str(), target, sizeof(target) - 1);
      if (n < 0) return ErrnoStatus("readlink " + e.path, errno);
      target[n] = '\0';
      archive_entry_set_symlink(entry.get(), target);
    } else if (S_ISREG(e.st.st_mode)) {
      fd = UniqueFd(open(e.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (!fd.valid()) return ErrnoStatus("open " + e.path, errno);
    }
    if (archive_write_header(a.get(), entry.get()) < ARCHIVE_WARN) return ArchiveError(a.get(), "writing " + rel);
    if (S_ISREG(e.st.st_mode)) {
      // Exactly the size in the header: a file that grows is cut, one that shrinks is padded.
      uint64_t left = static_cast<uint64_t>(e.st.st_size);
      uint64_t offset = 0;
      while (left > 0) {
        size_t want = static_cast<size_t>(std::min<uint64_t>(left, kBufferSize));
        ASSIGN_OR_RETURN(size_t got, PreadSome(fd.get(), buf.get(), want, offset));
        if (got == 0) {
          std::fill_n(buf.get(), want, '\0');
          got = want;
        }
        if (archive_write_data(a.get(), buf.get(), got) < 0) return ArchiveError(a.get(), "writing " + rel);
        left -= got;
        offset += got;
      }
      ++count;
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) return ArchiveError(a.get(), "finishing " + archive_path);
  if (files != nullptr) *files = count;
  for (const auto& c : clashes) KLOG(warn, "artifact name clash; the lower-numbered host's file wins", {{"file", c}});
  return clashes;
}

Result<Uploaded> UploadModelArtifacts(objects::ObjectStore& store, const std::vector<std::string>& model_dirs,
                                      const json& output_data_config, const std::string& job_name) {
  Uploaded out;
  out.model_artifacts = ModelArtifactsUri(output_data_config, job_name);
  if (Uncompressed(output_data_config)) {
    ASSIGN_OR_RETURN(S3Location loc, OutputLocation(output_data_config, job_name, "model/"));
    ASSIGN_OR_RETURN(auto entries, Merge(model_dirs, &out.clashes));
    for (const auto& [rel, e] : entries) {
      if (!S_ISREG(e.st.st_mode)) continue;
      std::string key = loc.key + rel;
      auto put = UploadFile(store, loc.bucket, key, e.path);
      if (!put.ok()) return ObjectError(put.status(), "Uploading model artifact to", loc.bucket, key);
      out.files++;
      out.bytes += put->size;
    }
    return out;
  }
  ASSIGN_OR_RETURN(S3Location loc, OutputLocation(output_data_config, job_name, "model.tar.gz"));
  ASSIGN_OR_RETURN(out.bytes, ArchiveAndUpload(store, model_dirs, loc, "model", &out.clashes, &out.files));
  return out;
}

Result<std::string> UploadOutputData(objects::ObjectStore& store, const std::vector<std::string>& output_data_dirs,
                                     const json& output_data_config, const std::string& job_name) {
  std::vector<std::string> ignored;
  ASSIGN_OR_RETURN(auto entries, Merge(output_data_dirs, &ignored));
  if (entries.empty()) return std::string();
  ASSIGN_OR_RETURN(S3Location loc, OutputLocation(output_data_config, job_name, "output.tar.gz"));
  std::vector<std::string> clashes;
  uint64_t files = 0;
  ASSIGN_OR_RETURN(uint64_t bytes, ArchiveAndUpload(store, output_data_dirs, loc, "output", &clashes, &files));
  (void)bytes;
  return loc.ToUri();
}

Result<Uploaded> UploadJobArtifacts(objects::ObjectStore& store, const std::vector<std::string>& opt_ml_dirs,
                                    const json& output_data_config, const std::string& job_name) {
  std::vector<std::string> model_dirs, data_dirs;
  for (const auto& d : opt_ml_dirs) {
    model_dirs.push_back(d + "/model");
    data_dirs.push_back(d + "/output/data");
  }
  ASSIGN_OR_RETURN(Uploaded out, UploadModelArtifacts(store, model_dirs, output_data_config, job_name));
  ASSIGN_OR_RETURN(out.output_data, UploadOutputData(store, data_dirs, output_data_config, job_name));
  return out;
}

// ---- Source directory ----

namespace {

Status SourceError(const std::string& uri, const std::string& why) {
  return ClientError("Failed to extract the source code archive \"" + uri + "\": " + why +
                     ". Please make sure that sagemaker_submit_directory names a gzip-compressed tar "
                     "file (sourcedir.tar.gz) whose members are relative paths inside the archive.");
}

Status CopyTree(const std::string& src, const std::string& dst) {
  RETURN_IF_ERROR(MakeDirs(dst));
  std::error_code ec;
  std::filesystem::copy(src, dst,
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks |
                            std::filesystem::copy_options::overwrite_existing,
                        ec);
  if (ec) return Status::Internal("copying " + src + " to " + dst + ": " + ec.message());
  return Status::Ok();
}

// Extracts the opened archive into a staging directory beside `code_dir` and puts it in
// code_dir's place only when complete; on failure the staging directory is removed.
Status ExtractSourceArchive(struct archive* a, const std::string& code_dir, const ExtractOptions& options,
                            const std::function<Status(const std::string&)>& source_error) {
  std::filesystem::path target = std::filesystem::path(code_dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  std::string parent = target.parent_path().string();
  if (parent.empty()) parent = ".";
  RETURN_IF_ERROR(MakeDirs(parent));
  std::string staging = parent + "/." + target.filename().string() + ".kiln-staging-" + RandomHex(6);
  Status s = ExtractTar(a, staging, options, source_error, nullptr);
  if (s.ok()) {
    struct stat st;
    if (stat(code_dir.c_str(), &st) == 0) {
      chmod(staging.c_str(), st.st_mode & 07777);
      s = RemoveAll(code_dir);
    }
    if (s.ok() && rename(staging.c_str(), code_dir.c_str()) != 0) {
      s = ErrnoStatus("rename " + staging + " to " + code_dir, errno);
    }
  }
  if (!s.ok()) (void)RemoveAll(staging);
  return s;
}

}  // namespace

Status DownloadSourceDir(objects::ObjectStore& store, const std::string& raw_uri, const std::string& code_dir,
                         const UnpackCap& cap) {
  std::string uri = raw_uri;
  if (!uri.empty() && uri.front() == '"') {
    try {
      uri = json::parse(uri).get<std::string>();
    } catch (const json::exception&) {
      return ClientError("sagemaker_submit_directory " + raw_uri +
                         " is not a valid JSON string. Please pass an s3:// URI.");
    }
  }
  ArchiveReadPtr a = NewTarReader();
  ExtractOptions options;
  options.dest_name = "the code directory";
  options.cap = cap;
  options.archive_name = "sagemaker_submit_directory " + uri;
  auto source_error = [&uri](const std::string& why) { return SourceError(uri, why); };
  if (StartsWith(uri, "file://")) {
    std::string path = uri.substr(7);
    struct stat st;
    if (path.empty() || path.front() != '/' || stat(path.c_str(), &st) != 0) {
      return ClientError("the source directory \"" + uri +
                         "\" does not exist on the Kiln node. Please give an absolute file:// path or an "
                         "s3:// URI.");
    }
    if (S_ISDIR(st.st_mode)) return CopyTree(path, code_dir);
    if (archive_read_open_filename(a.get(), path.c_str(), kBufferSize) != ARCHIVE_OK) {
      return SourceError(uri, "it cannot be opened (" + ArchiveErrorText(a.get()) + ")");
    }
    return ExtractSourceArchive(a.get(), code_dir, options, source_error);
  }
  auto loc = ParseS3Uri(uri);
  if (!loc.ok()) return loc.status();
  auto reader = store.GetObject(loc->bucket, loc->key, std::nullopt);
  if (!reader.ok()) return ObjectError(reader.status(), "Downloading the source code", loc->bucket, loc->key);
  ObjectArchiveSource source;
  source.reader = reader->get();
  if (OpenTarFromObject(a.get(), &source) != ARCHIVE_OK) {
    if (!source.error.ok()) return ObjectError(source.error, "Downloading the source code", loc->bucket, loc->key);
    return SourceError(uri, "it is not a readable tar.gz archive (" + ArchiveErrorText(a.get()) + ")");
  }
  Status s = ExtractSourceArchive(a.get(), code_dir, options, source_error);
  if (!source.error.ok()) return ObjectError(source.error, "Downloading the source code", loc->bucket, loc->key);
  return s;
}

std::string ReadFailureReason(const std::string& opt_ml) {
  std::string path = opt_ml + "/output/failure";
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return "";
  char buf[4096];
  size_t len = 0;
  while (len < sizeof(buf)) {
    auto n = PreadSome(fd.get(), buf + len, sizeof(buf) - len, len);
    if (!n.ok() || *n == 0) break;
    len += *n;
  }
  std::string out;
  size_t chars = 0;
  size_t i = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(buf);
  while (i < len && chars < 1024) {
    unsigned char c = s[i];
    size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool valid = need > 0 && i + need <= len;
    for (size_t k = 1; valid && k < need; ++k) valid = (s[i + k] & 0xc0) == 0x80;
    if (valid && need > 1) {
      // Reject overlong forms and surrogates so the result is valid UTF-8 for JSON.
      uint32_t cp = need == 2 ? (c & 0x1f) : need == 3 ? (c & 0x0f) : (c & 0x07);
      for (size_t k = 1; k < need; ++k) cp = (cp << 6) | (s[i + k] & 0x3f);
      static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
      valid = cp >= kMin[need] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (valid) {
      out.append(buf + i, need);
      i += need;
    } else {
      if (i + 4 > len && len == sizeof(buf)) break;  // a character cut by the read limit
      out += "\xef\xbf\xbd";
      i += 1;
    }
    ++chars;
  }
  return out;
}

}  // namespace kiln::agent
