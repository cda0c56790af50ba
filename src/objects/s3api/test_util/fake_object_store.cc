#include "objects/s3api/test_util/fake_object_store.h"

#include <algorithm>
#include <tuple>

#include "base/encoding.h"
#include "base/hash.h"

namespace kiln::objects {

namespace {

class StringReader final : public ObjectReader {
 public:
  StringReader(ObjectInfo info, std::string data) : info_(std::move(info)), data_(std::move(data)) {}
  const ObjectInfo& info() const override { return info_; }
  Result<size_t> Read(char* buf, size_t n) override {
    size_t take = std::min(n, data_.size() - pos_);
    std::copy_n(data_.data() + pos_, take, buf);
    pos_ += take;
    return take;
  }
  std::optional<uint64_t> size_hint() const override { return data_.size(); }

 private:
  ObjectInfo info_;
  std::string data_;
  size_t pos_ = 0;
};

Result<std::string> Slurp(ByteSource& data) {
  std::string out;
  char buf[65536];
  while (true) {
    ASSIGN_OR_RETURN(size_t n, data.Read(buf, sizeof buf));
    if (n == 0) return out;
    out.append(buf, n);
  }
}

std::string ChecksumOf(const std::string& alg, const std::string& data) {
  if (alg == "md5") return Base64Encode(Md5(data));
  S3Checksum::Algorithm parsed;
  if (!S3Checksum::ParseAlgorithm(alg, &parsed)) return "";
  S3Checksum checksum(parsed);
  checksum.Update(data);
  return checksum.FinalBase64();
}

// Applies PutOptions checksum rules to `data`; fills `out` with what to store.
Status Checksums(const PutOptions& options, const std::string& data, std::map<std::string, std::string>* out) {
  for (const auto& [alg, expected] : options.expected_checksums) {
    if (ChecksumOf(alg, data) != expected) {
      return Status::DataLoss("BadDigest: " + alg + " mismatch").WithReason(ErrorReason::kBadDigest);
    }
    if (alg != "md5") (*out)[alg] = expected;
  }
  for (const auto& [alg, value] : options.verified_checksums) (*out)[alg] = value;
  for (const std::string& alg : options.compute_checksums) (*out)[alg] = ChecksumOf(alg, data);
  return Status::Ok();
}

Status NoSuchBucket(const std::string& b) {
  return Status::NotFound("NoSuchBucket: " + b).WithReason(ErrorReason::kNoSuchBucket);
}
Status NoSuchKey(const std::string& k) {
  return Status::NotFound("NoSuchKey: " + k).WithReason(ErrorReason::kNoSuchKey);
}

std::string StripQuotes(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

}  // namespace

void FakeObjectStore::SetNowForTest(int64_t millis) {
  MutexLock lock(mu_);
  now_millis_ = millis;
}

void FakeObjectStore::SetMinPartSizeForTest(uint64_t bytes) {
  MutexLock lock(mu_);
  min_part_size_ = bytes;
}

std::optional<std::string> FakeObjectStore::DataForTest(const std::string& bucket, const std::string& key) {
  MutexLock lock(mu_);
  auto object = FindObjectLocked(bucket, key);
  if (!object.ok()) return std::nullopt;
  return (*object)->data;
}

Status FakeObjectStore::CreateBucket(const std::string& bucket, const std::string& region) {
  MutexLock lock(mu_);
  if (buckets_.count(bucket)) return Status::AlreadyExists("bucket exists: " + bucket);
  Bucket& b = buckets_[bucket];
  b.info = BucketInfo{bucket, now_millis_, region};
  return Status::Ok();
}

Status FakeObjectStore::DeleteBucket(const std::string& bucket) {
  MutexLock lock(mu_);
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return NoSuchBucket(bucket);
  if (!it->second.objects.empty())
    return Status::FailedPrecondition("BucketNotEmpty: " + bucket).WithReason(ErrorReason::kBucketNotEmpty);
  buckets_.erase(it);
  return Status::Ok();
}

Result<BucketInfo> FakeObjectStore::HeadBucket(const std::string& bucket) {
  MutexLock lock(mu_);
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return NoSuchBucket(bucket);
  return it->second.info;
}

Result<std::vector<BucketInfo>> FakeObjectStore::ListBuckets() {
  MutexLock lock(mu_);
  std::vector<BucketInfo> out;
  for (const auto& [name, b] : buckets_) out.push_back(b.info);
  return out;
}

Result<FakeObjectStore::Object*> FakeObjectStore::FindObjectLocked(const std::string& bucket, const std::string& key) {
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return NoSuchBucket(bucket);
  auto obj = it->second.objects.find(key);
  if (obj == it->second.objects.end()) return NoSuchKey(key);
  return &obj->second;
}

Result<ObjectInfo> FakeObjectStore::PutObject(const std::string& bucket, const std::string& key, ByteSource& data,
                                              const PutOptions& options) {
  ASSIGN_OR_RETURN(std::string bytes, Slurp(data));
  MutexLock lock(mu_);
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return NoSuchBucket(bucket);
  auto existing = it->second.objects.find(key);
  if (options.if_none_match_star && existing != it->second.objects.end()) {
    return Status::FailedPrecondition("PreconditionFailed: key exists").WithReason(ErrorReason::kPreconditionFailed);
  }
  if (options.if_match) {
    if (existing == it->second.objects.end()) return NoSuchKey(key);
    if (existing->second.info.etag != StripQuotes(*options.if_match)) {
      return Status::FailedPrecondition("PreconditionFailed: etag differs")
          .WithReason(ErrorReason::kPreconditionFailed);
    }
  }
  Object object;
  RETURN_IF_ERROR(Checksums(options, bytes, &object.info.checksums));
  object.info.bucket = bucket;
  object.info.key = key;
  object.info.size = bytes.size();
  object.info.etag = HexEncode(Md5(bytes));
  object.info.last_modified_millis = now_millis_;
  object.info.headers = options.headers;
  object.data = std::move(bytes);
  it->second.objects[key] = object;
  return object.info;
}

Result<ObjectInfo> FakeObjectStore::HeadObject(const std::string& bucket, const std::string& key) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Object * object, FindObjectLocked(bucket, key));
  return object->info;
}

Result<std::unique_ptr<ObjectReader>> FakeObjectStore::GetObject(const std::string& bucket, const std::string& key,
                                                                 std::optional<ByteRange> range) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Object * object, FindObjectLocked(bucket, key));
  std::string data = object->data;
  if (range) {
    if (range->first > range->last || range->last >= data.size()) {
      return Status::InvalidArgument("InvalidRange: outside the object").WithReason(ErrorReason::kInvalidRange);
    }
    data = data.substr(range->first, range->last - range->first + 1);
  }
  return std::unique_ptr<ObjectReader>(new StringReader(object->info, std::move(data)));
}

Status FakeObjectStore::DeleteObject(const std::string& bucket, const std::string& key) {
  MutexLock lock(mu_);
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return NoSuchBucket(bucket);
  it->second.objects.erase(key);
  return Status::Ok();
}

Result<ListResult> FakeObjectStore::ListObjects(const std::string& bucket, const ListOptions& options) {
  MutexLock lock(mu_);
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return NoSuchBucket(bucket);
  ListResult out;
  uint32_t count = 0;
  for (auto obj = it->second.objects.upper_bound(options.start_after); obj != it->second.objects.end(); ++obj) {
    const std::string& key = obj->first;
    if (key.compare(0, options.prefix.size(), options.prefix) != 0) continue;
    std::string entry;
    bool is_prefix = false;
    if (!options.delimiter.empty()) {
      size_t d = key.find(options.delimiter, options.prefix.size());
      if (d != std::string::npos) {
        entry = key.substr(0, d + options.delimiter.size());
        is_prefix = true;
      }
    }
    if (is_prefix) {
      if (entry <= options.start_after) continue;
      if (!out.common_prefixes.empty() && out.common_prefixes.back() == entry) continue;
    }
    if (count == options.max_keys) {
      out.truncated = true;
      break;
    }
    ++count;
    if (is_prefix) {
      out.common_prefixes.push_back(entry);
      out.next_marker = entry;
    } else {
      ObjectInfo info = obj->second.info;
      info.headers.clear();
      info.checksums.clear();
      info.part_sizes.clear();
      out.objects.push_back(std::move(info));
      out.next_marker = key;
    }
  }
  return out;
}

Result<ObjectInfo> FakeObjectStore::CopyObject(const std::string& src_bucket, const std::string& src_key,
                                               const std::string& dst_bucket, const std::string& dst_key,
                                               const std::optional<std::map<std::string, std::string>>& replace) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Object * source, FindObjectLocked(src_bucket, src_key));
  auto dst = buckets_.find(dst_bucket);
  if (dst == buckets_.end()) return NoSuchBucket(dst_bucket);
  Object copy = *source;
  copy.info.bucket = dst_bucket;
  copy.info.key = dst_key;
  copy.info.last_modified_millis = now_millis_;
  if (replace) copy.info.headers = *replace;
  dst->second.objects[dst_key] = copy;
  return copy.info;
}

Result<MultipartUpload> FakeObjectStore::CreateMultipartUpload(const std::string& bucket, const std::string& key,
                                                               const std::map<std::string, std::string>& headers,
                                                               const std::string& checksum_algorithm) {
  MutexLock lock(mu_);
  if (!buckets_.count(bucket)) return NoSuchBucket(bucket);
  Upload upload;
  upload.info = MultipartUpload{bucket,      key,     "upload-" + std::to_string(next_upload_++),
                                now_millis_, headers, checksum_algorithm};
  uploads_[upload.info.upload_id] = upload;
  return upload.info;
}

Result<FakeObjectStore::Upload*> FakeObjectStore::FindUploadLocked(const std::string& bucket, const std::string& key,
                                                                   const std::string& upload_id) {
  if (!buckets_.count(bucket)) return NoSuchBucket(bucket);
  auto it = uploads_.find(upload_id);
  if (it == uploads_.end() || it->second.info.bucket != bucket || it->second.info.key != key) {
    return Status::NotFound("NoSuchUpload: " + upload_id).WithReason(ErrorReason::kNoSuchUpload);
  }
  return &it->second;
}

Result<PartInfo> FakeObjectStore::UploadPart(const std::string& bucket, const std::string& key,
                                             const std::string& upload_id, uint32_t part_number, ByteSource& data,
                                             const PutOptions& options) {
  if (part_number < 1 || part_number > 10000) return Status::InvalidArgument("part number out of range");
  ASSIGN_OR_RETURN(std::string bytes, Slurp(data));
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Upload * upload, FindUploadLocked(bucket, key, upload_id));
  Part part;
  RETURN_IF_ERROR(Checksums(options, bytes, &part.info.checksums));
  part.info.part_number = part_number;
  part.info.size = bytes.size();
  part.info.etag = HexEncode(Md5(bytes));
  part.info.last_modified_millis = now_millis_;
  part.data = std::move(bytes);
  upload->parts[part_number] = part;
  return part.info;
}

Result<PartInfo> FakeObjectStore::UploadPartCopy(const std::string& bucket, const std::string& key,
                                                 const std::string& upload_id, uint32_t part_number,
                                                 const std::string& src_bucket, const std::string& src_key,
                                                 std::optional<ByteRange> range) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Object * source, FindObjectLocked(src_bucket, src_key));
  ASSIGN_OR_RETURN(Upload * upload, FindUploadLocked(bucket, key, upload_id));
  std::string bytes = source->data;
  if (range) {
    if (range->first > range->last || range->last >= bytes.size()) {
      return Status::InvalidArgument("InvalidRange: outside the source").WithReason(ErrorReason::kInvalidRange);
    }
    bytes = bytes.substr(range->first, range->last - range->first + 1);
  }
  Part part;
  part.info.part_number = part_number;
  part.info.size = bytes.size();
  part.info.etag = HexEncode(Md5(bytes));
  part.info.last_modified_millis = now_millis_;
  part.data = std::move(bytes);
  upload->parts[part_number] = part;
  return part.info;
}

Result<ObjectInfo> FakeObjectStore::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                                            const std::string& upload_id,
                                                            const std::vector<CompletedPart>& parts) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Upload * upload, FindUploadLocked(bucket, key, upload_id));
  if (parts.empty()) return Status::InvalidArgument("InvalidPart: no parts").WithReason(ErrorReason::kInvalidPart);
  std::string data, md5s;
  Object object;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0 && parts[i].part_number <= parts[i - 1].part_number) {
      return Status::InvalidArgument("InvalidPartOrder: not ascending").WithReason(ErrorReason::kInvalidPartOrder);
    }
    auto it = upload->parts.find(parts[i].part_number);
    if (it == upload->parts.end() || it->second.info.etag != StripQuotes(parts[i].etag)) {
      return Status::InvalidArgument("InvalidPart: " + std::to_string(parts[i].part_number))
          .WithReason(ErrorReason::kInvalidPart);
    }
    if (i + 1 < parts.size() && it->second.info.size < min_part_size_) {
      return Status::InvalidArgument("EntityTooSmall: part " + std::to_string(parts[i].part_number))
          .WithReason(ErrorReason::kEntityTooSmall);
    }
    data += it->second.data;
    md5s += Md5(it->second.data);
    object.info.part_sizes.push_back(it->second.info.size);
  }
  object.info.bucket = bucket;
  object.info.key = key;
  object.info.size = data.size();
  object.info.etag = HexEncode(Md5(md5s)) + "-" + std::to_string(parts.size());
  object.info.last_modified_millis = now_millis_;
  object.info.headers = upload->info.headers;
  object.data = std::move(data);
  buckets_[bucket].objects[key] = object;
  uploads_.erase(upload_id);
  return object.info;
}

Status FakeObjectStore::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                             const std::string& upload_id) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Upload * upload, FindUploadLocked(bucket, key, upload_id));
  (void)upload;
  uploads_.erase(upload_id);
  return Status::Ok();
}

Result<std::vector<PartInfo>> FakeObjectStore::ListParts(const std::string& bucket, const std::string& key,
                                                         const std::string& upload_id, uint32_t part_number_marker,
                                                         uint32_t max_parts, bool* truncated) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Upload * upload, FindUploadLocked(bucket, key, upload_id));
  std::vector<PartInfo> out;
  *truncated = false;
  for (auto it = upload->parts.upper_bound(part_number_marker); it != upload->parts.end(); ++it) {
    if (out.size() == max_parts) {
      *truncated = true;
      break;
    }
    out.push_back(it->second.info);
  }
  return out;
}

Result<MultipartUpload> FakeObjectStore::GetMultipartUpload(const std::string& bucket, const std::string& key,
                                                            const std::string& upload_id) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(Upload * upload, FindUploadLocked(bucket, key, upload_id));
  return upload->info;
}

Result<ListUploadsResult> FakeObjectStore::ListMultipartUploads(const std::string& bucket,
                                                                const ListUploadsOptions& options) {
  MutexLock lock(mu_);
  if (!buckets_.count(bucket)) return NoSuchBucket(bucket);
  std::vector<MultipartUpload> all;
  for (const auto& [id, upload] : uploads_) {
    if (upload.info.bucket == bucket && upload.info.key.compare(0, options.prefix.size(), options.prefix) == 0) {
      all.push_back(upload.info);
    }
  }
  std::sort(all.begin(), all.end(), [](const MultipartUpload& a, const MultipartUpload& b) {
    return std::tie(a.key, a.upload_id) < std::tie(b.key, b.upload_id);
  });
  ListUploadsResult out;
  for (const MultipartUpload& upload : all) {
    if (!options.key_marker.empty()) {
      if (upload.key < options.key_marker) continue;
      if (upload.key == options.key_marker &&
          (options.upload_id_marker.empty() || upload.upload_id <= options.upload_id_marker)) {
        continue;
      }
    }
    if (out.uploads.size() == options.max_uploads) {
      out.truncated = true;
      break;
    }
    out.uploads.push_back(upload);
  }
  if (out.truncated && !out.uploads.empty()) {
    out.next_key_marker = out.uploads.back().key;
    out.next_upload_id_marker = out.uploads.back().upload_id;
  }
  return out;
}

}  // namespace kiln::objects
