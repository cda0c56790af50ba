#include "objects/fs_object_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/encoding.h"
#include "base/fs.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "objects/hash_pipeline.h"
#include "objects/validation.h"

namespace kiln::objects {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint32_t kMaxPartNumber = 10000;
// Retries of "read the row, open its file" when a concurrent overwrite unlinks the file between
// the two steps. Each retry sees a newer commit, so a handful always suffices in practice.
constexpr int kOpenRetries = 32;
// Buffers of options.buffer_size in flight per upload between receiving and hashing (Stage):
// enough to absorb jitter between the two threads, few enough to keep memory per upload small.
constexpr size_t kHashBuffers = 4;
// Bytes written between hints to the kernel to start writing back (sync_file_range) while an
// upload streams in, when the store fsyncs.
constexpr uint64_t kWritebackBytes = 8ull << 20;

std::string ToJson(const std::map<std::string, std::string>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = v;
  // Header values are meant to be ASCII; invalid UTF-8 is replaced rather than failing the write.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ToJson(const std::vector<uint64_t>& v) { return json(v).dump(); }

Result<std::map<std::string, std::string>> MapFromJson(const std::string& text) {
  try {
    std::map<std::string, std::string> out;
    json j = json::parse(text);
    for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value().get<std::string>();
    return out;
  } catch (const std::exception& e) {
    return Status::DataLoss(std::string("corrupt metadata JSON: ") + e.what());
  }
}

Result<std::vector<uint64_t>> VectorFromJson(const std::string& text) {
  try {
    return json::parse(text).get<std::vector<uint64_t>>();
  } catch (const std::exception& e) {
    return Status::DataLoss(std::string("corrupt metadata JSON: ") + e.what());
  }
}

Result<ObjectInfo> InfoFromRow(const store::ObjectRow& row, bool full) {
  ObjectInfo info;
  info.bucket = row.bucket;
  info.key = row.key;
  info.size = row.size;
  info.etag = row.etag;
  info.last_modified_millis = row.last_modified_millis;
  info.storage_class = row.storage_class;
  if (full) {
    ASSIGN_OR_RETURN(info.headers, MapFromJson(row.headers_json));
    ASSIGN_OR_RETURN(info.checksums, MapFromJson(row.checksums_json));
    ASSIGN_OR_RETURN(info.part_sizes, VectorFromJson(row.part_sizes_json));
  }
  return info;
}

std::string StripQuotes(std::string_view etag) {
  etag = Trim(etag);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return ToLower(etag);
}

// One open piece of an object: `length` bytes of `fd` from `offset`.
struct OpenExtent {
  UniqueFd fd;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Reads the object bytes [pos, end) from its extents. `extents` are the object's extents that
// overlap the range, in order; `pos` is relative to the first of them. Every file was opened when
// the object was opened, so later unlinks do not affect the reader.
class FsObjectReader final : public ObjectReader {
 public:
  FsObjectReader(std::vector<OpenExtent> extents, ObjectInfo info, uint64_t pos, uint64_t length)
      : extents_(std::move(extents)), info_(std::move(info)), pos_(pos), remaining_(length), length_(length) {}

  Result<size_t> Read(char* buf, size_t n) override {
    // Skip exhausted extents (and empty ones: a zero-byte last part).
    while (remaining_ > 0 && index_ < extents_.size() && pos_ >= extents_[index_].length) {
      pos_ -= extents_[index_].length;
      ++index_;
    }
    if (remaining_ == 0 || n == 0) return size_t{0};
    if (index_ >= extents_.size()) return Status::DataLoss("object extents are shorter than its recorded size");
    const OpenExtent& e = extents_[index_];
    // One pread per call, never across an extent boundary; callers loop until 0.
    size_t want = static_cast<size_t>(std::min<uint64_t>({n, remaining_, e.length - pos_}));
    ASSIGN_OR_RETURN(size_t got, PreadSome(e.fd.get(), buf, want, e.offset + pos_));
    if (got == 0) return Status::DataLoss("object data file is shorter than its recorded size");
    pos_ += got;
    remaining_ -= got;
    return got;
  }
  std::optional<uint64_t> size_hint() const override { return length_; }
  const ObjectInfo& info() const override { return info_; }

  std::optional<FileSpan> NextFileSpan() override {
    while (remaining_ > 0 && index_ < extents_.size() && pos_ >= extents_[index_].length) {
      pos_ -= extents_[index_].length;
      ++index_;
    }
    if (remaining_ == 0 || index_ >= extents_.size()) return std::nullopt;
    const OpenExtent& e = extents_[index_];
    return FileSpan{e.fd.get(), e.offset + pos_, std::min<uint64_t>(remaining_, e.length - pos_)};
  }
  void Skip(uint64_t n) override {
    n = std::min(n, remaining_);
    pos_ += n;
    remaining_ -= n;
  }

 private:
  std::vector<OpenExtent> extents_;
  ObjectInfo info_;
  size_t index_ = 0;
  uint64_t pos_;        // offset within extents_[index_]
  uint64_t remaining_;  // bytes left to return
  uint64_t length_;
};

}  // namespace

// What Stage() produced: a published data file not yet referenced by any row.
struct FsObjectStore::StagedFile {
  std::string file_id;
  uint64_t size = 0;
  std::string md5;                               // raw 16 bytes
  std::map<std::string, std::string> checksums;  // to store (verified or computed)
};

struct FsObjectStore::StageOptions {
  const PutOptions* put = nullptr;  // may be null: no checksums requested
  std::vector<std::string> extra_checksums;
};

namespace {

// The columns a row (store::ObjectRow or store::PartRow) takes from the file it names, freshly
// staged (a FsObjectStore::StagedFile) at `now_millis`.
template <typename Row, typename Staged>
void SetStagedColumns(Row& row, const Staged& staged, int64_t now_millis) {
  row.file_id = staged.file_id;
  row.size = staged.size;
  row.etag = HexEncode(staged.md5);
  row.last_modified_millis = now_millis;
  row.checksums_json = ToJson(staged.checksums);
}

}  // namespace

FsObjectStore::FsObjectStore(const Options& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : &Clock::System()),
      data_dir_(options.root + "/data"),
      tmp_dir_(options.root + "/tmp"),
      repo_(options.database) {}

Result<std::unique_ptr<FsObjectStore>> FsObjectStore::Open(const Options& options) {
  if (options.root.empty()) return Status::InvalidArgument("FsObjectStore: root directory is required");
  if (options.database == nullptr) return Status::InvalidArgument("FsObjectStore: database is required");
  if (options.buffer_size == 0) return Status::InvalidArgument("FsObjectStore: buffer_size must be > 0");
  std::unique_ptr<FsObjectStore> store(new FsObjectStore(options));
  RETURN_IF_ERROR(MakeDirs(store->data_dir_));
  // Anything in tmp/ is an upload that never finished; nothing refers to it.
  RETURN_IF_ERROR(RemoveAll(store->tmp_dir_));
  RETURN_IF_ERROR(MakeDirs(store->tmp_dir_));
  RETURN_IF_ERROR(store->CollectGarbage());
  return store;
}

Status FsObjectStore::CollectGarbage() {
  ASSIGN_OR_RETURN(auto referenced, repo_.AllFileIds());
  std::error_code ec;
  int removed = 0;
  for (auto it = fs::recursive_directory_iterator(data_dir_, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    std::string name = it->path().filename().string();
    if (referenced.count(name) != 0) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  if (ec) return ErrnoStatus("scan " + data_dir_, ec.value());
  if (removed > 0) {
    std::string n = std::to_string(removed);
    KLOG(info, "removed unreferenced object data files", {{"count", n}, {"root", options_.root}});
  }
  return Status::Ok();
}

std::string FsObjectStore::DataPath(const std::string& file_id) const {
  return data_dir_ + "/" + file_id.substr(0, 2) + "/" + file_id.substr(2, 2) + "/" + file_id;
}

Status FsObjectStore::Publish(const std::string& tmp_path, const std::string& file_id) {
  std::string shard1 = data_dir_ + "/" + file_id.substr(0, 2);
  std::string shard2 = shard1 + "/" + file_id.substr(2, 2);
  bool created = false;
  if (!PathExists(shard2)) {
    RETURN_IF_ERROR(MakeDirs(shard2));
    created = true;
  }
  std::string path = shard2 + "/" + file_id;
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) return ErrnoStatus("rename to " + path, errno);
  if (options_.sync) {
    Status s = FsyncDir(shard2);
    if (s.ok() && created) s = FsyncDir(shard1);
    if (s.ok() && created) s = FsyncDir(data_dir_);
    if (!s.ok()) {
      ::unlink(path.c_str());
      return s;
    }
  }
  return Status::Ok();
}

Result<FsObjectStore::StagedFile> FsObjectStore::Stage(ByteSource& data, const StageOptions& stage) {
  // Which checksums to compute: expected ones (to verify) plus requested ones.
  std::map<std::string, S3Checksum> hashers;
  std::optional<std::string> expected_md5;
  auto add_hasher = [&](const std::string& name) -> Status {
    S3Checksum::Algorithm algorithm;
    if (!S3Checksum::ParseAlgorithm(name, &algorithm)) {
      return Status::InvalidArgument("InvalidArgument: unsupported checksum algorithm: " + name)
          .WithReason(ErrorReason::kInvalidArgument);
    }
    std::string lower(S3Checksum::Name(algorithm));
    if (hashers.count(lower) == 0) hashers.emplace(lower, S3Checksum(algorithm));
    return Status::Ok();
  };
  if (stage.put != nullptr) {
    for (const auto& [name, value] : stage.put->expected_checksums) {
      if (ToLower(name) == "md5") {
        expected_md5 = value;
      } else {
        RETURN_IF_ERROR(add_hasher(name));
      }
    }
    for (const auto& name : stage.put->compute_checksums) RETURN_IF_ERROR(add_hasher(name));
  }
  for (const auto& name : stage.extra_checksums) RETURN_IF_ERROR(add_hasher(name));
  std::optional<uint64_t> hint = data.size_hint();
  if (hint.has_value() && *hint > options_.max_object_size) {
    return Status::ResourceExhausted("EntityTooLarge: your proposed upload exceeds the maximum allowed size")
        .WithReason(ErrorReason::kEntityTooLarge);
  }

  std::string tmp_path = tmp_dir_ + "/" + RandomHex(16);
  UniqueFd fd(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("create " + tmp_path, errno);
  // From here on every failure must remove the temp file.
  auto fail = [&](Status s) -> Status {
    ::unlink(tmp_path.c_str());
    return s;
  };

  StagedFile staged;
  Digest md5(Digest::Algorithm::kMd5);
  // Declared before `pipeline`, whose thread runs this until Finish() or its destruction.
  auto hash = [&md5, &hashers](std::string_view chunk) {
    md5.Update(chunk);
    for (auto& [name, hasher] : hashers) hasher.Update(chunk);
  };
  HashPipeline pipeline(kHashBuffers, options_.buffer_size, hash);
  uint64_t writeback_from = 0;  // start of the bytes written but not yet handed to writeback
  for (bool eof = false; !eof;) {
    // Fill the buffer before writing so that small reads from the source become large writes.
    char* buffer = pipeline.NextBuffer();
    size_t filled = 0;
    while (filled < pipeline.buffer_size()) {
      Result<size_t> n = data.Read(buffer + filled, pipeline.buffer_size() - filled);
      if (!n.ok()) return fail(n.status());
      if (*n == 0) {
        eof = true;
        break;
      }
      filled += *n;
    }
    if (filled == 0) continue;
    std::string_view chunk(buffer, filled);
    staged.size += filled;
    if (staged.size > options_.max_object_size) {
      return fail(Status::ResourceExhausted("EntityTooLarge: your proposed upload exceeds the maximum allowed size")
                      .WithReason(ErrorReason::kEntityTooLarge));
    }
    // Hashed on the pipeline's thread while this one writes the chunk and receives the next.
    pipeline.Submit(filled, eof);
    Status w = WriteAll(fd.get(), chunk);
    if (!w.ok()) return fail(w);
    if (options_.sync && staged.size - writeback_from >= kWritebackBytes) {
      // Start writing back what is in the page cache now, so that the fsync before the commit
      // waits for the last few MiB rather than the whole object. Only a hint: durability still
      // comes from that fsync, which also reports any write error.
      ::sync_file_range(fd.get(), static_cast<off_t>(writeback_from), static_cast<off_t>(staged.size - writeback_from),
                        SYNC_FILE_RANGE_WRITE);
      writeback_from = staged.size;
    }
  }
  pipeline.Finish();
  staged.md5 = md5.Final();
  for (auto& [name, hasher] : hashers) staged.checksums[name] = hasher.FinalBase64();

  // Verify what the client promised before anything becomes visible.
  if (expected_md5.has_value() && Base64Encode(staged.md5) != *expected_md5) {
    return fail(Status::DataLoss("BadDigest: the Content-MD5 you specified did not match what we received")
                    .WithReason(ErrorReason::kBadDigest));
  }
  if (stage.put != nullptr) {
    for (const auto& [name, value] : stage.put->expected_checksums) {
      std::string lower = ToLower(name);
      if (lower == "md5") continue;
      auto it = staged.checksums.find(lower);
      if (it == staged.checksums.end() || it->second != value) {
        return fail(Status::DataLoss("BadDigest: the " + lower + " you specified did not match the calculated checksum")
                        .WithReason(ErrorReason::kBadDigest));
      }
    }
    for (const auto& [name, value] : stage.put->verified_checksums) staged.checksums[ToLower(name)] = value;
  }

  if (options_.sync && ::fsync(fd.get()) != 0) return fail(ErrnoStatus("fsync " + tmp_path, errno));
  fd.Reset();
  staged.file_id = RandomHex(16);
  Status s = Publish(tmp_path, staged.file_id);
  if (!s.ok()) return fail(s);
  return staged;
}

void FsObjectStore::RemoveDataFiles(const std::vector<std::string>& file_ids) {
  for (const std::string& id : file_ids) {
    std::string path = DataPath(id);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      std::string err = ErrnoStatus("unlink", errno).message();
      KLOG(warn, "could not remove replaced object data file; it is collected at next start",
           {{"path", path}, {"error", err}});
    }
  }
}

// ---- Buckets ----

Status FsObjectStore::CreateBucket(const std::string& bucket, const std::string& region) {
  RETURN_IF_ERROR(ValidateBucketName(bucket));
  Status s = repo_.CreateBucket({bucket, region.empty() ? "us-east-1" : region, Now()});
  if (s.IsAlreadyExists()) {
    return Status::AlreadyExists(
        "BucketAlreadyOwnedByYou: your previous request to create the named bucket "
        "succeeded and you already own it: " +
        bucket);
  }
  return s;
}

Status FsObjectStore::DeleteBucket(const std::string& bucket) { return repo_.DeleteBucket(bucket); }

Result<BucketInfo> FsObjectStore::HeadBucket(const std::string& bucket) {
  ASSIGN_OR_RETURN(auto row, repo_.GetBucket(bucket));
  return BucketInfo{row.name, row.created_millis, row.region};
}

Result<std::vector<BucketInfo>> FsObjectStore::ListBuckets() {
  ASSIGN_OR_RETURN(auto rows, repo_.ListBuckets());
  std::vector<BucketInfo> out;
  for (auto& r : rows) out.push_back(BucketInfo{r.name, r.created_millis, r.region});
  return out;
}

// ---- Objects ----

Result<ObjectInfo> FsObjectStore::PutObject(const std::string& bucket, const std::string& key, ByteSource& data,
                                            const PutOptions& options) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  // Fail fast (before streaming a large body) when the bucket is missing; the commit re-checks.
  RETURN_IF_ERROR(repo_.GetBucket(bucket));
  StageOptions stage;
  stage.put = &options;
  ASSIGN_OR_RETURN(StagedFile staged, Stage(data, stage));

  store::ObjectRow row;
  row.bucket = bucket;
  row.key = key;
  SetStagedColumns(row, staged, Now());
  row.headers_json = ToJson(options.headers);
  store::WriteCondition condition;
  if (options.if_match.has_value()) condition.if_match = StripQuotes(*options.if_match);
  condition.if_none_match_star = options.if_none_match_star;
  auto old = repo_.PutObject(row, condition);
  if (!old.ok()) {
    RemoveDataFiles({staged.file_id});
    return old.status();
  }
  RemoveDataFiles(*old);
  return InfoFromRow(row, true);
}

Result<ObjectInfo> FsObjectStore::HeadObject(const std::string& bucket, const std::string& key) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  ASSIGN_OR_RETURN(auto row, repo_.GetObject(bucket, key));
  return InfoFromRow(row, true);
}

Result<std::unique_ptr<ObjectReader>> FsObjectStore::GetObject(const std::string& bucket, const std::string& key,
                                                               std::optional<ByteRange> range) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  for (int attempt = 0; attempt < kOpenRetries; ++attempt) {
    ASSIGN_OR_RETURN(auto row, repo_.GetObject(bucket, key));
    ASSIGN_OR_RETURN(ObjectInfo info, InfoFromRow(row, true));
    uint64_t first = 0;
    uint64_t end = info.size;
    if (range.has_value()) {
      if (range->first > range->last || range->first >= info.size) {
        return Status::InvalidArgument("InvalidRange: the requested range is not satisfiable")
            .WithReason(ErrorReason::kInvalidRange);
      }
      first = range->first;
      end = std::min<uint64_t>(range->last + 1, info.size);
    }
    // Open every file the range touches now (only those: a small range of a 10000-part object
    // should not cost 10000 descriptors).
    std::vector<OpenExtent> open;
    uint64_t extent_start = 0;  // object offset of the current extent
    uint64_t skip = 0;          // offset of `first` within the first opened extent
    bool replaced = false;
    for (const store::Extent& e : row.Layout()) {
      uint64_t extent_end = extent_start + e.length;
      bool overlaps = extent_end > first && extent_start < end;
      if (overlaps) {
        if (open.empty()) skip = first - extent_start;
        std::string path = DataPath(e.file_id);
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd.valid()) {
          // A writer replaced or deleted the object after we read the row and unlinked its
          // files: read the row again.
          if (errno == ENOENT) {
            replaced = true;
            break;
          }
          return ErrnoStatus("open " + path, errno);
        }
        open.push_back(OpenExtent{std::move(fd), e.offset, e.length});
      }
      extent_start = extent_end;
      if (extent_start >= end) break;
    }
    if (replaced) continue;
    if (open.empty() && end > first) return Status::DataLoss("object extents are shorter than its recorded size");
    return std::unique_ptr<ObjectReader>(new FsObjectReader(std::move(open), std::move(info), skip, end - first));
  }
  return Status::Aborted("object kept changing while being opened; retry");
}

Status FsObjectStore::DeleteObject(const std::string& bucket, const std::string& key) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  ASSIGN_OR_RETURN(auto old, repo_.DeleteObject(bucket, key));
  RemoveDataFiles(old);
  return Status::Ok();
}

Result<ListResult> FsObjectStore::ListObjects(const std::string& bucket, const ListOptions& options) {
  RETURN_IF_ERROR(repo_.GetBucket(bucket));
  ListResult result;
  const std::optional<std::string> prefix_end = store::PrefixUpperBound(options.prefix);
  // The scan cursor: keys >= lower (or > lower when !inclusive). Start at the later of the prefix
  // and start_after.
  std::string lower = options.prefix;
  bool inclusive = true;
  if (!options.start_after.empty() && options.start_after >= options.prefix) {
    lower = options.start_after;
    inclusive = false;
  }
  // Fetch rows in batches; each common prefix found makes the cursor jump past every key under it,
  // so a page costs O(page size) row reads however many keys a prefix collapses.
  const uint32_t batch = std::clamp<uint32_t>(options.max_keys + 1, 16, 1001);
  uint32_t returned = 0;
  for (;;) {
    ASSIGN_OR_RETURN(auto rows, repo_.ScanObjects(bucket, lower, inclusive, prefix_end, batch));
    if (rows.empty()) return result;
    bool jumped = false;
    for (auto& row : rows) {
      std::string entry;  // key or common prefix
      bool is_prefix = false;
      if (!options.delimiter.empty()) {
        size_t pos = row.key.find(options.delimiter, options.prefix.size());
        if (pos != std::string::npos) {
          entry = row.key.substr(0, pos + options.delimiter.size());
          is_prefix = true;
        }
      }
      if (!is_prefix) entry = row.key;
      // A common prefix at or before start_after was already returned by an earlier page.
      bool skip = is_prefix && !options.start_after.empty() && entry <= options.start_after;
      if (!skip) {
        if (returned == options.max_keys) {
          result.truncated = true;
          return result;
        }
        ++returned;
        result.next_marker = entry;
        if (is_prefix) {
          result.common_prefixes.push_back(entry);
        } else {
          ASSIGN_OR_RETURN(ObjectInfo info, InfoFromRow(row, false));
          result.objects.push_back(std::move(info));
        }
      }
      if (is_prefix) {
        // Continue after every key that starts with this common prefix.
        std::optional<std::string> next = store::PrefixUpperBound(entry);
        if (!next.has_value()) return result;
        lower = *next;
        inclusive = true;
        jumped = true;
        break;
      }
      lower = row.key;
      inclusive = false;
    }
    if (!jumped && rows.size() < batch) return result;
  }
}

Result<ObjectInfo> FsObjectStore::CopyObject(const std::string& src_bucket, const std::string& src_key,
                                             const std::string& dst_bucket, const std::string& dst_key,
                                             const std::optional<std::map<std::string, std::string>>& replace_headers) {
  RETURN_IF_ERROR(ValidateObjectKey(dst_key));
  ASSIGN_OR_RETURN(auto reader, GetObject(src_bucket, src_key, std::nullopt));
  RETURN_IF_ERROR(repo_.GetBucket(dst_bucket));
  const ObjectInfo& src = reader->info();
  PutOptions put;
  put.headers = replace_headers.has_value() ? *replace_headers : src.headers;
  // Whole-object checksums stay valid for the copy; composite multipart ones ("...-N") do not.
  for (const auto& [name, value] : src.checksums) {
    if (value.find('-') == std::string::npos) put.compute_checksums.push_back(name);
  }
  return PutObject(dst_bucket, dst_key, *reader, put);
}

// ---- Multipart ----

Result<MultipartUpload> FsObjectStore::CreateMultipartUpload(const std::string& bucket, const std::string& key,
                                                             const std::map<std::string, std::string>& headers,
                                                             const std::string& checksum_algorithm) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  std::string algorithm;
  if (!checksum_algorithm.empty()) {
    S3Checksum::Algorithm parsed;
    if (!S3Checksum::ParseAlgorithm(checksum_algorithm, &parsed)) {
      return Status::InvalidArgument("InvalidArgument: unsupported checksum algorithm: " + checksum_algorithm)
          .WithReason(ErrorReason::kInvalidArgument);
    }
    algorithm = std::string(S3Checksum::Name(parsed));
  }
  store::UploadRow row;
  row.upload_id = RandomAlnum(48);
  row.bucket = bucket;
  row.key = key;
  row.initiated_millis = Now();
  row.headers_json = ToJson(headers);
  row.checksum_algorithm = algorithm;
  RETURN_IF_ERROR(repo_.CreateUpload(row));
  return MultipartUpload{bucket, key, row.upload_id, row.initiated_millis, headers, algorithm};
}

Result<PartInfo> FsObjectStore::StorePart(const std::string& bucket, const std::string& key,
                                          const std::string& upload_id, uint32_t part_number, ByteSource& data,
                                          const PutOptions& options) {
  if (part_number < 1 || part_number > kMaxPartNumber) {
    return Status::InvalidArgument("InvalidArgument: part number must be an integer between 1 and 10000")
        .WithReason(ErrorReason::kInvalidArgument);
  }
  ASSIGN_OR_RETURN(auto upload, repo_.GetUpload(bucket, key, upload_id));
  StageOptions stage;
  stage.put = &options;
  if (!upload.checksum_algorithm.empty()) stage.extra_checksums.push_back(upload.checksum_algorithm);
  ASSIGN_OR_RETURN(StagedFile staged, Stage(data, stage));
  store::PartRow row;
  row.upload_id = upload_id;
  row.part_number = part_number;
  SetStagedColumns(row, staged, Now());
  auto old = repo_.PutPart(bucket, key, row);
  if (!old.ok()) {
    RemoveDataFiles({staged.file_id});
    return old.status();
  }
  if (old->has_value()) RemoveDataFiles({**old});
  return PartInfo{part_number, row.size, row.etag, row.last_modified_millis, staged.checksums};
}

Result<PartInfo> FsObjectStore::UploadPart(const std::string& bucket, const std::string& key,
                                           const std::string& upload_id, uint32_t part_number, ByteSource& data,
                                           const PutOptions& options) {
  return StorePart(bucket, key, upload_id, part_number, data, options);
}

Result<PartInfo> FsObjectStore::UploadPartCopy(const std::string& bucket, const std::string& key,
                                               const std::string& upload_id, uint32_t part_number,
                                               const std::string& src_bucket, const std::string& src_key,
                                               std::optional<ByteRange> range) {
  ASSIGN_OR_RETURN(auto reader, GetObject(src_bucket, src_key, range));
  return StorePart(bucket, key, upload_id, part_number, *reader, PutOptions{});
}

Result<ObjectInfo> FsObjectStore::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                                          const std::string& upload_id,
                                                          const std::vector<CompletedPart>& parts) {
  ASSIGN_OR_RETURN(auto upload, repo_.GetUpload(bucket, key, upload_id));
  if (parts.empty()) {
    return Status::InvalidArgument("InvalidPart: you must specify at least one part")
        .WithReason(ErrorReason::kInvalidPart);
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].part_number <= parts[i - 1].part_number) {
      return Status::InvalidArgument("InvalidPartOrder: the list of parts was not in ascending order")
          .WithReason(ErrorReason::kInvalidPartOrder);
    }
  }
  ASSIGN_OR_RETURN(auto stored, repo_.ListParts(upload_id, 0, 0));
  std::map<uint32_t, const store::PartRow*> by_number;
  for (const auto& p : stored) by_number[p.part_number] = &p;

  std::vector<const store::PartRow*> chosen;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto it = by_number.find(parts[i].part_number);
    if (it == by_number.end() || StripQuotes(parts[i].etag) != it->second->etag) {
      return Status::InvalidArgument(
                 "InvalidPart: one or more of the specified parts could not be found or its "
                 "entity tag did not match (part " +
                 std::to_string(parts[i].part_number) + ")")
          .WithReason(ErrorReason::kInvalidPart);
    }
    if (i + 1 < parts.size() && it->second->size < options_.min_part_size) {
      return Status::InvalidArgument(
                 "EntityTooSmall: your proposed upload is smaller than the minimum allowed "
                 "size (part " +
                 std::to_string(parts[i].part_number) + ")")
          .WithReason(ErrorReason::kEntityTooSmall);
    }
    chosen.push_back(it->second);
  }

  std::string md5_concat;
  std::vector<uint64_t> part_sizes;
  std::vector<store::Extent> extents;
  uint64_t total = 0;
  for (const auto* p : chosen) {
    md5_concat += HexDecode(p->etag).value_or(std::string());
    part_sizes.push_back(p->size);
    extents.push_back(store::Extent{p->file_id, 0, p->size});
    total += p->size;
  }

  // Composite checksum of the upload's algorithm: hash of the parts' raw checksums, "-N".
  std::map<std::string, std::string> checksums;
  if (!upload.checksum_algorithm.empty()) {
    S3Checksum::Algorithm algorithm;
    // CRC-64/NVME exists only as a full-object checksum in S3 (no composite "-N" form); Kiln
    // does not combine part CRCs into one, so such objects carry no checksum.
    if (S3Checksum::ParseAlgorithm(upload.checksum_algorithm, &algorithm) &&
        algorithm != S3Checksum::Algorithm::kCrc64Nvme) {
      S3Checksum composite(algorithm);
      bool all = true;
      for (const auto* p : chosen) {
        ASSIGN_OR_RETURN(auto sums, MapFromJson(p->checksums_json));
        auto it = sums.find(upload.checksum_algorithm);
        std::optional<std::string> raw = it == sums.end() ? std::nullopt : Base64Decode(it->second);
        if (!raw.has_value()) {
          all = false;
          break;
        }
        composite.Update(*raw);
      }
      if (all) {
        checksums[upload.checksum_algorithm] = composite.FinalBase64() + "-" + std::to_string(chosen.size());
      }
    }
  }

  // The part files become the object's extents: no bytes are copied, and each part file was
  // fsynced and published when it was uploaded, so the commit below is the only write. The
  // transaction re-checks that every chosen part still has the file we listed (Aborted if a part
  // was re-uploaded meanwhile) and deletes the upload's rows, so a crash leaves either the upload
  // with its parts or the object.
  store::ObjectRow row;
  row.bucket = bucket;
  row.key = key;
  row.extents = std::move(extents);
  row.size = total;
  row.etag = HexEncode(Md5(md5_concat)) + "-" + std::to_string(chosen.size());
  row.last_modified_millis = Now();
  row.headers_json = upload.headers_json;
  row.checksums_json = ToJson(checksums);
  row.part_sizes_json = ToJson(part_sizes);
  ASSIGN_OR_RETURN(auto unreferenced, repo_.CompleteUpload(bucket, key, upload_id, row));
  RemoveDataFiles(unreferenced);
  return InfoFromRow(row, true);
}

Status FsObjectStore::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                           const std::string& upload_id) {
  ASSIGN_OR_RETURN(auto files, repo_.AbortUpload(bucket, key, upload_id));
  RemoveDataFiles(files);
  return Status::Ok();
}

Result<std::vector<PartInfo>> FsObjectStore::ListParts(const std::string& bucket, const std::string& key,
                                                       const std::string& upload_id, uint32_t part_number_marker,
                                                       uint32_t max_parts, bool* truncated) {
  RETURN_IF_ERROR(repo_.GetUpload(bucket, key, upload_id));
  if (max_parts == 0) max_parts = 1000;
  ASSIGN_OR_RETURN(auto rows, repo_.ListParts(upload_id, part_number_marker, max_parts + 1));
  if (truncated != nullptr) *truncated = rows.size() > max_parts;
  if (rows.size() > max_parts) rows.resize(max_parts);
  std::vector<PartInfo> out;
  for (const auto& r : rows) {
    ASSIGN_OR_RETURN(auto sums, MapFromJson(r.checksums_json));
    out.push_back(PartInfo{r.part_number, r.size, r.etag, r.last_modified_millis, std::move(sums)});
  }
  return out;
}

Result<MultipartUpload> FsObjectStore::GetMultipartUpload(const std::string& bucket, const std::string& key,
                                                          const std::string& upload_id) {
  ASSIGN_OR_RETURN(auto row, repo_.GetUpload(bucket, key, upload_id));
  ASSIGN_OR_RETURN(auto headers, MapFromJson(row.headers_json));
  return MultipartUpload{
      row.bucket, row.key, row.upload_id, row.initiated_millis, std::move(headers), row.checksum_algorithm};
}

Result<ListUploadsResult> FsObjectStore::ListMultipartUploads(const std::string& bucket,
                                                              const ListUploadsOptions& options) {
  uint32_t limit = options.max_uploads == 0 ? 1000 : options.max_uploads;
  ASSIGN_OR_RETURN(auto rows,
                   repo_.ListUploads(bucket, options.prefix, options.key_marker, options.upload_id_marker, limit + 1));
  ListUploadsResult result;
  result.truncated = rows.size() > limit;
  if (rows.size() > limit) rows.resize(limit);
  for (const auto& r : rows) {
    ASSIGN_OR_RETURN(auto headers, MapFromJson(r.headers_json));
    result.uploads.push_back(
        MultipartUpload{r.bucket, r.key, r.upload_id, r.initiated_millis, std::move(headers), r.checksum_algorithm});
  }
  if (result.truncated && !result.uploads.empty()) {
    result.next_key_marker = result.uploads.back().key;
    result.next_upload_id_marker = result.uploads.back().upload_id;
  }
  return result;
}

}  // namespace kiln::objects
