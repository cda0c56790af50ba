#include "agent/model_data.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "agent/errors.h"
#include "agent/tar_extract.h"
#include "base/fs.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::agent {

using nlohmann::json;

namespace {

constexpr size_t kBufferSize = 1 << 20;
// How messages name the destination: what the container sees, not the host path.
constexpr const char* kModelDirName = "/opt/ml/model";

enum class SourceKind { kNone, kArchive, kPrefix, kObject };

struct Source {
  SourceKind kind = SourceKind::kNone;
  std::string uri;
  std::string field;  // where the request named it: "ModelDataUrl" or "ModelDataSource"
};

std::string StringField(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Result<Source> SelectSource(const json& container) {
  Source src;
  if (!container.is_object()) return src;
  // Multi-model containers load their models on demand (serving-contract.md §7); /opt/ml/model
  // stays empty.
  if (EqualsIgnoreCase(StringField(container, "Mode"), "MultiModel")) return src;
  auto mds = container.find("ModelDataSource");
  if (mds != container.end() && mds->is_object() && mds->contains("S3DataSource")) {
    const json& s3 = (*mds)["S3DataSource"];
    src.uri = StringField(s3, "S3Uri");
    src.field = "ModelDataSource";
    std::string type = StringField(s3, "S3DataType");
    std::string compression = StringField(s3, "CompressionType");
    bool gzip = EqualsIgnoreCase(compression, "Gzip");
    if (type == "S3Prefix") {
      if (gzip) {
        return ClientError("ModelDataSource " + src.uri +
                           " has S3DataType S3Prefix with CompressionType Gzip. Please use "
                           "CompressionType None for a prefix, or S3Object for one model.tar.gz.");
      }
      if (!EndsWith(src.uri, "/")) {
        return ClientError("The model data prefix " + src.uri + " must end with \"/\" when S3DataType is S3Prefix.");
      }
      src.kind = SourceKind::kPrefix;
    } else {
      // Kiln: an uncompressed S3Object is copied to /opt/ml/model/<its file name>.
      src.kind = gzip ? SourceKind::kArchive : SourceKind::kObject;
    }
    return src;
  }
  src.uri = StringField(container, "ModelDataUrl");
  src.field = "ModelDataUrl";
  if (!src.uri.empty()) src.kind = SourceKind::kArchive;
  return src;
}

Status UnsafeArchive(const std::string& uri, const std::string& why) {
  return ClientError(
      "The model archive " + uri + " cannot be unpacked into " + kModelDirName + ": " + why +
      ". Kiln refuses model archives with members that would land outside " + kModelDirName +
      " (\"..\" components, links that point outside it) or that are device files or FIFOs. Please create "
      "model.tar.gz from inside the model directory (for example: tar -czf model.tar.gz -C <model dir> .).");
}

Status Cancelled(const std::string& uri) {
  return Status::DeadlineExceeded("Downloading the model data " + uri +
                                  " did not finish within ModelDataDownloadTimeoutInSeconds.");
}

// Maps the errors of store reads and local writes to the header's convention.
Status DownloadError(const Status& s, const S3Location& loc) {
  if (s.code() == StatusCode::kAborted) return Cancelled(loc.ToUri());
  if (s.code() == StatusCode::kResourceExhausted) return s;
  return ObjectError(s, "Downloading the model data", loc.bucket, loc.key);
}

std::string SafeComponent(std::string_view s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  if (out.empty() || out.front() == '.') out.insert(out.begin(), '_');
  return out;
}

// cache_dir/<bucket>/<sha256(key)>/<etag>.tar.gz: keys may be long or odd, ETags are hex.
std::string CachePath(const std::string& cache_dir, const S3Location& loc, const std::string& etag) {
  return cache_dir + "/" + SafeComponent(loc.bucket) + "/" + Sha256Hex(loc.key) + "/" + SafeComponent(etag) + ".tar.gz";
}

// Copies the open object into `path` via a temp file renamed into place. The cache entry is named
// by the ETag of the version actually read (reader->info()), never by an earlier HEAD.
Status FillCacheEntry(objects::ObjectReader& reader, const std::string& path, const CancelFlag* cancel) {
  RETURN_IF_ERROR(MakeDirs(std::filesystem::path(path).parent_path().string()));
  std::string tmp = path + ".tmp-" + RandomHex(6);
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("create " + tmp, errno);
  std::unique_ptr<char[]> buf(new char[kBufferSize]);
  uint64_t total = 0;
  Status s;
  while (s.ok()) {
    if (cancel != nullptr && cancel->cancelled()) {
      s = Status::Aborted("cancelled");
      break;
    }
    auto n = reader.Read(buf.get(), kBufferSize);
    if (!n.ok()) {
      s = n.status();
      break;
    }
    if (*n == 0) break;
    s = WriteAll(fd.get(), std::string_view(buf.get(), *n));
    total += *n;
  }
  if (s.ok() && total != reader.info().size) {
    s = Status::Internal("short read: " + std::to_string(total) + " of " + std::to_string(reader.info().size) +
                         " bytes");
  }
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename " + tmp, errno);
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

// Extracts the archive at `uri` into `staging`, through the cache when `cache_dir` is set.
Status FillFromArchive(objects::ObjectStore& store, const Source& src, const std::string& staging,
                       const std::string& cache_dir, const CancelFlag* cancel, const UnpackCap& cap,
                       ModelDataResult* result) {
  const std::string& uri = src.uri;
  ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(uri));
  if (loc.key.empty() || EndsWith(loc.key, "/")) {
    return ClientError("ModelDataUrl " + uri +
                       " must name one gzip-compressed tar object (model.tar.gz), not a prefix.");
  }
  ExtractOptions options;
  options.dest_name = kModelDirName;
  options.refuse_special_files = true;
  options.cancel = cancel;
  options.cap = cap;
  options.archive_name = src.field + " " + uri;
  auto unsafe = [&uri](const std::string& why) { return UnsafeArchive(uri, why); };
  ExtractStats stats;
  ArchiveReadPtr a = NewTarReader();

  std::string cached;
  if (!cache_dir.empty()) {
    auto head = store.HeadObject(loc.bucket, loc.key);
    if (!head.ok()) return DownloadError(head.status(), loc);
    cached = CachePath(cache_dir, loc, head->etag);
    if (PathExists(cached)) {
      result->cache_hit = true;
    } else {
      auto reader = store.GetObject(loc.bucket, loc.key, std::nullopt);
      if (!reader.ok()) return DownloadError(reader.status(), loc);
      cached = CachePath(cache_dir, loc, (*reader)->info().etag);
      Status filled = FillCacheEntry(**reader, cached, cancel);
      if (!filled.ok()) return DownloadError(filled, loc);
    }
  }
  Status s;
  if (!cached.empty()) {
    if (archive_read_open_filename(a.get(), cached.c_str(), kBufferSize) != ARCHIVE_OK) {
      return UnsafeArchive(uri, "it is not a readable tar.gz archive (" + ArchiveErrorText(a.get()) + ")");
    }
    s = ExtractTar(a.get(), staging, options, unsafe, &stats);
  } else {
    auto reader = store.GetObject(loc.bucket, loc.key, std::nullopt);
    if (!reader.ok()) return DownloadError(reader.status(), loc);
    ObjectArchiveSource source;
    source.reader = reader->get();
    source.cancel = cancel;
    if (OpenTarFromObject(a.get(), &source) != ARCHIVE_OK) {
      if (!source.error.ok()) return DownloadError(source.error, loc);
      return UnsafeArchive(uri, "it is not a readable tar.gz archive (" + ArchiveErrorText(a.get()) + ")");
    }
    s = ExtractTar(a.get(), staging, options, unsafe, &stats);
    if (!source.error.ok()) return DownloadError(source.error, loc);
  }
  if (s.code() == StatusCode::kAborted) return Cancelled(uri);
  RETURN_IF_ERROR(s);
  result->files = stats.files;
  result->bytes = stats.bytes;
  return Status::Ok();
}

Status FillFromPrefix(objects::ObjectStore& store, const std::string& uri, const std::string& staging,
                      const CancelFlag* cancel, ModelDataResult* result) {
  ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(uri));
  auto listed = ListAllObjects(store, loc.bucket, loc.key);
  if (!listed.ok()) return DownloadError(listed.status(), loc);
  RETURN_IF_ERROR(MakeDirs(staging));
  for (const auto& o : *listed) {
    if (EndsWith(o.key, "/")) continue;  // folder marker
    std::string object_uri = "s3://" + loc.bucket + "/" + o.key;
    auto rel = ConfinedRelativePath(std::string_view(o.key).substr(loc.key.size()), "S3 object key");
    if (!rel.ok()) {
      return ClientError("The model data object " + object_uri + " would be copied outside " + kModelDirName +
                         ". Please remove \"..\" components from the keys under " + uri + ".");
    }
    auto path = PrepareConfinedPath(staging, *rel);
    if (!path.ok()) {
      return ClientError("The model data object " + object_uri +
                         " clashes with another object used as its directory. Please make sure no key "
                         "under " +
                         uri + " is both a file and a folder.");
    }
    auto n = DownloadObjectToFile(store, loc.bucket, o.key, *path, o.size, cancel);
    if (!n.ok()) return DownloadError(n.status(), S3Location{loc.bucket, o.key});
    result->files++;
    result->bytes += *n;
  }
  if (result->files == 0) {
    return ClientError("No S3 objects found under the model data prefix " + uri +
                       ". Please ensure that the prefix is spelled correctly and holds the model files.");
  }
  return Status::Ok();
}

Status FillFromObject(objects::ObjectStore& store, const std::string& uri, const std::string& staging,
                      const CancelFlag* cancel, ModelDataResult* result) {
  ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(uri));
  std::string name = std::filesystem::path(loc.key).filename().string();
  if (name.empty() || name == "..") {
    return ClientError("The model data object " + uri + " does not name an object.");
  }
  RETURN_IF_ERROR(MakeDirs(staging));
  auto n = DownloadObjectToFile(store, loc.bucket, loc.key, staging + "/" + name, std::nullopt, cancel);
  if (!n.ok()) return DownloadError(n.status(), loc);
  result->files = 1;
  result->bytes = *n;
  return Status::Ok();
}

// True when `dir` is missing or an empty directory.
Result<bool> MissingOrEmpty(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return true;
    return ErrnoStatus("opendir " + dir, errno);
  }
  bool empty = true;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") {
      empty = false;
      break;
    }
  }
  closedir(d);
  return empty;
}

}  // namespace

Result<ModelDataResult> PrepareModelData(objects::ObjectStore& store, const json& container,
                                         const std::string& model_dir, const std::string& cache_dir,
                                         const CancelFlag* cancel, const UnpackCap& cap) {
  ModelDataResult result;
  ASSIGN_OR_RETURN(Source src, SelectSource(container));
  ASSIGN_OR_RETURN(bool empty, MissingOrEmpty(model_dir));
  if (!empty) return Status::FailedPrecondition("model directory " + model_dir + " is not empty");
  if (src.kind == SourceKind::kNone) {
    RETURN_IF_ERROR(MakeDirs(model_dir));
    return result;
  }
  // Everything lands in a staging directory beside model_dir, renamed into place only when
  // complete: a refused or interrupted download never leaves a partial model behind.
  std::filesystem::path target = std::filesystem::path(model_dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  std::string parent = target.parent_path().string();
  if (parent.empty()) parent = ".";
  RETURN_IF_ERROR(MakeDirs(parent));
  std::string staging = parent + "/." + target.filename().string() + ".kiln-staging-" + RandomHex(6);
  Status s;
  switch (src.kind) {
    case SourceKind::kArchive: s = FillFromArchive(store, src, staging, cache_dir, cancel, cap, &result); break;
    case SourceKind::kPrefix: s = FillFromPrefix(store, src.uri, staging, cancel, &result); break;
    case SourceKind::kObject: s = FillFromObject(store, src.uri, staging, cancel, &result); break;
    case SourceKind::kNone: break;
  }
  if (s.ok() && cancel != nullptr && cancel->cancelled()) s = Cancelled(src.uri);
  if (s.ok()) {
    struct stat st;
    if (stat(model_dir.c_str(), &st) == 0) chmod(staging.c_str(), st.st_mode & 07777);
    if (rename(staging.c_str(), model_dir.c_str()) != 0)
      s = ErrnoStatus("rename " + staging + " to " + model_dir, errno);
  }
  if (!s.ok()) {
    (void)RemoveAll(staging);
    if (s.code() == StatusCode::kAborted) s = Cancelled(src.uri);
    return s;
  }
  KLOG(info, "model data ready",
       {{"source", src.uri},
        {"files", std::to_string(result.files)},
        {"bytes", std::to_string(result.bytes)},
        {"cache_hit", result.cache_hit ? "true" : "false"}});
  return result;
}

}  // namespace kiln::agent
