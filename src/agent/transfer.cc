#include "agent/transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "agent/errors.h"
#include "base/ids.h"
#include "base/strings.h"

namespace kiln::agent {

namespace {
constexpr std::string_view kTempMarker = ".kiln-tmp-";
}  // namespace

Result<S3Location> ParseS3Uri(std::string_view uri) {
  auto bad = [&](std::string_view why) {
    return ClientError("\"" + std::string(uri) + "\" is not a valid S3 URI (" + std::string(why) +
                       "). Please use the form s3://bucket/key-or-prefix.");
  };
  size_t scheme_end = uri.find("://");
  if (scheme_end == std::string_view::npos) return bad("no scheme");
  if (!EqualsIgnoreCase(uri.substr(0, scheme_end), "s3")) return bad("only the s3:// scheme is supported");
  std::string_view rest = uri.substr(scheme_end + 3);
  size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) loc.key = std::string(rest.substr(slash + 1));
  if (loc.bucket.empty()) return bad("the bucket name is empty");
  return loc;
}

std::string JoinKey(std::string_view prefix, std::string_view rel) {
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  if (prefix.empty()) return std::string(rel);
  return std::string(prefix) + "/" + std::string(rel);
}

Status ObjectError(const Status& status, std::string_view what, const std::string& bucket, const std::string& key) {
  std::string uri = "s3://" + bucket + "/" + key;
  if (status.IsNotFound()) {
    if (status.Is(ErrorReason::kNoSuchBucket)) {
      return ClientError(std::string(what) + " \"" + uri + "\" failed: bucket \"" + bucket +
                         "\" does not exist. Please ensure that the bucket exists in the selected "
                         "region and that the URI is spelled correctly.");
    }
    return ClientError(std::string(what) + " \"" + uri +
                       "\" failed: the object does not exist. Please ensure that the object exists "
                       "and that the URI is spelled correctly.");
  }
  if (status.code() == StatusCode::kPermissionDenied || status.code() == StatusCode::kUnauthenticated) {
    return ClientError(std::string(what) + " \"" + uri +
                       "\" failed: access denied. Please ensure that the role has permission to "
                       "access bucket \"" +
                       bucket + "\".");
  }
  if (status.code() == StatusCode::kAborted) return status;
  if (IsFailureReason(status)) return status;
  return InternalServerError(std::string(what) + " \"" + uri + "\" failed: " + status.ToString(),
                             status.code() == StatusCode::kInvalidArgument ? StatusCode::kInternal : status.code());
}

Result<std::vector<objects::ObjectInfo>> ListAllObjects(objects::ObjectStore& store, const std::string& bucket,
                                                        const std::string& prefix) {
  std::vector<objects::ObjectInfo> out;
  objects::ListOptions options;
  options.prefix = prefix;
  options.max_keys = 1000;
  while (true) {
    ASSIGN_OR_RETURN(auto page, store.ListObjects(bucket, options));
    for (auto& o : page.objects) out.push_back(std::move(o));
    if (!page.truncated || page.next_marker.empty()) break;
    options.start_after = page.next_marker;
  }
  return out;
}

Result<std::string> ConfinedRelativePath(std::string_view rel, std::string_view origin) {
  if (rel.find('\0') != std::string_view::npos) {
    return ClientError(std::string(origin) +
                       " contains a NUL byte and cannot be stored as a local file. Please rename it.");
  }
  std::vector<std::string> parts;
  for (std::string_view part : Split(rel, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      return ClientError(std::string(origin) +
                         " contains a \"..\" path component, which would place a file outside its "
                         "destination directory. Please rename it.");
    }
    parts.emplace_back(part);
  }
  if (parts.empty()) {
    return ClientError(std::string(origin) + " does not name a file (empty relative path). Please rename it.");
  }
  return Join(parts, "/");
}

Result<std::string> PrepareConfinedPath(const std::string& root, const std::string& rel) {
  std::string cur = root;
  auto parts = Split(rel, '/');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    cur += "/";
    cur += parts[i];
    struct stat st;
    if (lstat(cur.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      return ClientError("cannot create \"" + rel + "\": \"" + std::string(cur.substr(root.size() + 1)) +
                         "\" already exists and is not a directory (a file or symlink). Please make "
                         "sure no name is used both as a file and as a folder.");
    }
    if (errno != ENOENT) return ErrnoStatus("lstat " + cur, errno);
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus("mkdir " + cur, errno);
  }
  return root + "/" + rel;
}

bool IsTempFileName(std::string_view name) { return name.find(kTempMarker) != std::string_view::npos; }

namespace {

bool Transient(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kInternal ||
         s.code() == StatusCode::kDeadlineExceeded;
}

// A failed write while staging: a full disk is named as such, with what to do about it (AWS
// reports a full training volume as a ClientError of the data download).
Status WriteError(const Status& error, const std::string& bucket, const std::string& key, const std::string& path) {
  if (error.code() != StatusCode::kResourceExhausted) return error;
  return ClientError("Data download failed: no space left on device while staging s3://" + bucket + "/" + key + " to " +
                         path +
                         ". The disk that holds the Kiln data directory (and with it the job's volume) is full: "
                         "free space there, or make the input data smaller.",
                     StatusCode::kResourceExhausted);
}

Result<uint64_t> DownloadOnce(objects::ObjectStore& store, const std::string& bucket, const std::string& key,
                              const std::string& path, std::optional<uint64_t> expected_size, const CancelFlag* cancel,
                              size_t buffer_size, bool* store_error) {
  *store_error = true;
  ASSIGN_OR_RETURN(auto reader, store.GetObject(bucket, key, std::nullopt));
  uint64_t size = reader->info().size;
  if (expected_size && *expected_size != size) {
    // The object changed between listing and download; take what is there now.
    expected_size = size;
  }
  *store_error = false;
  std::string tmp = path + std::string(kTempMarker) + RandomHex(6);
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    if (errno == ENOTDIR || errno == EISDIR) {
      return ClientError("cannot store s3://" + bucket + "/" + key + " at \"" + path +
                         "\": a file and a folder have the same name. Please rename the objects.");
    }
    return ErrnoStatus("create " + tmp, errno);
  }
  auto fail = [&](Status s) {
    unlink(tmp.c_str());
    return s;
  };
  std::unique_ptr<char[]> buf;
  uint64_t total = 0;
  bool zero_copy = true;
  while (true) {
    if (cancel != nullptr && cancel->cancelled()) {
      return fail(Status::Aborted("download of s3://" + bucket + "/" + key + " cancelled"));
    }
    // The fs backend's bytes are local files: the kernel copies them (copy_file_range), without
    // passing through this process — several times faster than read/write on the same disk.
    if (zero_copy) {
      if (auto span = reader->NextFileSpan()) {
        loff_t in_offset = static_cast<loff_t>(span->offset);
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(span->length, 64ull << 20));
        ssize_t copied = copy_file_range(span->fd, &in_offset, fd.get(), nullptr, chunk, 0);
        if (copied > 0) {
          reader->Skip(static_cast<uint64_t>(copied));
          total += static_cast<uint64_t>(copied);
          continue;
        }
        if (copied == 0) {
          *store_error = true;
          return fail(Status::DataLoss("object data of s3://" + bucket + "/" + key + " is shorter than its size"));
        }
        if (errno == EINTR) continue;
        if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
          return fail(WriteError(ErrnoStatus("copy into " + tmp, errno), bucket, key, path));
        }
        zero_copy = false;  // not supported between these file systems: copy through the buffer
      }
    }
    if (!buf) buf.reset(new char[buffer_size]);
    auto n = reader->Read(buf.get(), buffer_size);
    if (!n.ok()) {
      *store_error = true;
      return fail(n.status());
    }
    if (*n == 0) break;
    Status w = WriteAll(fd.get(), std::string_view(buf.get(), *n));
    if (!w.ok()) return fail(WriteError(w, bucket, key, path));
    total += *n;
  }
  if (total != size) {
    *store_error = true;
    return fail(Status::Unavailable("object s3://" + bucket + "/" + key + " ended after " + std::to_string(total) +
                                    " of " + std::to_string(size) + " bytes"));
  }
  if (close(fd.Release()) != 0) return fail(ErrnoStatus("close " + tmp, errno));
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    if (err == EISDIR || err == ENOTDIR) {
      return fail(ClientError("cannot store s3://" + bucket + "/" + key + " at \"" + path +
                              "\": a file and a folder have the same name. Please rename the objects."));
    }
    return fail(ErrnoStatus("rename " + tmp, err));
  }
  return total;
}

}  // namespace

Result<uint64_t> DownloadObjectToFile(objects::ObjectStore& store, const std::string& bucket, const std::string& key,
                                      const std::string& path, std::optional<uint64_t> expected_size,
                                      const CancelFlag* cancel, size_t buffer_size) {
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200 << attempt));
    bool store_error = false;
    auto r = DownloadOnce(store, bucket, key, path, expected_size, cancel, buffer_size, &store_error);
    if (r.ok()) return r;
    last = r.status();
    if (!store_error) return last;
    if (!Transient(last)) break;
  }
  return ObjectError(last, "Downloading", bucket, key);
}

Result<std::unique_ptr<FileByteSource>> FileByteSource::Open(const std::string& path) {
  return OpenRange(path, 0, UINT64_MAX);
}

Result<std::unique_ptr<FileByteSource>> FileByteSource::OpenRange(const std::string& path, uint64_t offset,
                                                                  uint64_t limit) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t remaining = offset >= size ? 0 : std::min(limit, size - offset);
  return std::unique_ptr<FileByteSource>(new FileByteSource(std::move(fd), offset, remaining));
}

Result<size_t> FileByteSource::Read(char* buf, size_t n) {
  if (remaining_ == 0) return size_t{0};
  size_t want = static_cast<size_t>(std::min<uint64_t>(n, remaining_));
  ASSIGN_OR_RETURN(size_t got, PreadSome(fd_.get(), buf, want, offset_));
  if (got == 0) return Status::DataLoss("file shrank while it was being read");
  offset_ += got;
  remaining_ -= got;
  return got;
}

Result<objects::ObjectInfo> UploadFile(objects::ObjectStore& store, const std::string& bucket, const std::string& key,
                                       const std::string& path, uint64_t single_put_limit, uint64_t part_size) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size <= single_put_limit) {
    ASSIGN_OR_RETURN(auto source, FileByteSource::Open(path));
    return store.PutObject(bucket, key, *source, objects::PutOptions{});
  }
  ASSIGN_OR_RETURN(auto upload, store.CreateMultipartUpload(bucket, key, {}, ""));
  std::vector<objects::CompletedPart> parts;
  Status status;
  for (uint64_t offset = 0; offset < size && status.ok(); offset += part_size) {
    auto source = FileByteSource::OpenRange(path, offset, part_size);
    if (!source.ok()) {
      status = source.status();
      break;
    }
    uint32_t number = static_cast<uint32_t>(parts.size() + 1);
    auto part = store.UploadPart(bucket, key, upload.upload_id, number, **source, objects::PutOptions{});
    if (!part.ok()) {
      status = part.status();
      break;
    }
    parts.push_back({number, part->etag});
  }
  if (status.ok()) {
    auto done = store.CompleteMultipartUpload(bucket, key, upload.upload_id, parts);
    if (done.ok()) return done;
    status = done.status();
  }
  (void)store.AbortMultipartUpload(bucket, key, upload.upload_id);
  return status;
}

struct GzipSource::State {
  z_stream zs{};
  bool initialized = false;
  bool finished = false;  // inner exhausted and the last member ended
  std::vector<char> in = std::vector<char>(256 * 1024);
  bool member_ended = false;
};

GzipSource::GzipSource(ByteSource& inner, std::string what)
    : inner_(inner), what_(std::move(what)), state_(std::make_unique<State>()) {
  if (inflateInit2(&state_->zs, 16 + MAX_WBITS) == Z_OK) state_->initialized = true;
}

GzipSource::~GzipSource() {
  if (state_->initialized) inflateEnd(&state_->zs);
}

Result<size_t> GzipSource::Read(char* buf, size_t n) {
  State& s = *state_;
  if (!s.initialized) return Status::Internal("zlib inflateInit2 failed");
  if (s.finished) return size_t{0};
  s.zs.next_out = reinterpret_cast<Bytef*>(buf);
  s.zs.avail_out = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
  while (s.zs.avail_out > 0) {
    if (s.zs.avail_in == 0) {
      ASSIGN_OR_RETURN(size_t got, inner_.Read(s.in.data(), s.in.size()));
      if (got == 0) {
        if (s.member_ended) {
          s.finished = true;
          break;
        }
        return Status::DataLoss(what_ + " is not complete gzip data (the stream ends in the middle of a member)");
      }
      s.zs.next_in = reinterpret_cast<Bytef*>(s.in.data());
      s.zs.avail_in = static_cast<uInt>(got);
    }
    if (s.member_ended) {
      // Another member follows the previous one (concatenated gzip).
      if (inflateReset(&s.zs) != Z_OK) return Status::Internal("zlib inflateReset failed");
      s.member_ended = false;
    }
    int rc = inflate(&s.zs, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      s.member_ended = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return Status::DataLoss(what_ + " is not valid gzip data (" +
                              std::string(s.zs.msg != nullptr ? s.zs.msg : "inflate failed") + ")");
    }
    if (s.zs.avail_out < n) break;  // return what we have rather than blocking on more input
  }
  return n - s.zs.avail_out;
}

}  // namespace kiln::agent
