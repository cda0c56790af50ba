#pragma once
// In-memory ObjectStore for unit tests of the S3 front. Implements the whole ObjectStore contract
// simply (objects held whole in memory). Thread-safe (one mutex). Not for production: no bounds on
// memory.

#include <map>
#include <string>

#include "base/mutex.h"
#include "objects/object_store.h"

namespace kiln::objects {

class FakeObjectStore : public ObjectStore {
 public:
  // Time stamped on writes; tests move it to check conditional requests.
  void SetNowForTest(int64_t millis);
  // Minimum size of non-last parts (S3: 5 MiB); tests may lower it.
  void SetMinPartSizeForTest(uint64_t bytes);
  // The stored bytes of an object, or nullopt.
  std::optional<std::string> DataForTest(const std::string& bucket, const std::string& key);

  // ObjectStore
  Status CreateBucket(const std::string& bucket, const std::string& region) override;
  Status DeleteBucket(const std::string& bucket) override;
  Result<BucketInfo> HeadBucket(const std::string& bucket) override;
  Result<std::vector<BucketInfo>> ListBuckets() override;
  Result<ObjectInfo> PutObject(const std::string& bucket, const std::string& key, ByteSource& data,
                               const PutOptions& options) override;
  Result<ObjectInfo> HeadObject(const std::string& bucket, const std::string& key) override;
  Result<std::unique_ptr<ObjectReader>> GetObject(const std::string& bucket, const std::string& key,
                                                  std::optional<ByteRange> range) override;
  Status DeleteObject(const std::string& bucket, const std::string& key) override;
  Result<ListResult> ListObjects(const std::string& bucket, const ListOptions& options) override;
  Result<ObjectInfo> CopyObject(const std::string& src_bucket, const std::string& src_key,
                                const std::string& dst_bucket, const std::string& dst_key,
                                const std::optional<std::map<std::string, std::string>>& replace_headers) override;
  Result<MultipartUpload> CreateMultipartUpload(const std::string& bucket, const std::string& key,
                                                const std::map<std::string, std::string>& headers,
                                                const std::string& checksum_algorithm) override;
  Result<PartInfo> UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                              uint32_t part_number, ByteSource& data, const PutOptions& options) override;
  Result<PartInfo> UploadPartCopy(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                  uint32_t part_number, const std::string& src_bucket, const std::string& src_key,
                                  std::optional<ByteRange> range) override;
  Result<ObjectInfo> CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                             const std::string& upload_id,
                                             const std::vector<CompletedPart>& parts) override;
  Status AbortMultipartUpload(const std::string& bucket, const std::string& key, const std::string& upload_id) override;
  Result<std::vector<PartInfo>> ListParts(const std::string& bucket, const std::string& key,
                                          const std::string& upload_id, uint32_t part_number_marker, uint32_t max_parts,
                                          bool* truncated) override;
  Result<MultipartUpload> GetMultipartUpload(const std::string& bucket, const std::string& key,
                                             const std::string& upload_id) override;
  Result<ListUploadsResult> ListMultipartUploads(const std::string& bucket, const ListUploadsOptions& options) override;

 private:
  struct Object {
    ObjectInfo info;
    std::string data;
  };
  struct Bucket {
    BucketInfo info;
    std::map<std::string, Object> objects;
  };
  struct Part {
    PartInfo info;
    std::string data;
  };
  struct Upload {
    MultipartUpload info;
    std::map<uint32_t, Part> parts;
  };

  Result<Object*> FindObjectLocked(const std::string& bucket, const std::string& key) REQUIRES(mu_);
  Result<Upload*> FindUploadLocked(const std::string& bucket, const std::string& key, const std::string& upload_id)
      REQUIRES(mu_);

  Mutex mu_;
  int64_t now_millis_ GUARDED_BY(mu_) = 1714557600000;  // 2024-05-01T10:00:00Z
  uint64_t min_part_size_ GUARDED_BY(mu_) = 5 * 1024 * 1024;
  int next_upload_ GUARDED_BY(mu_) = 1;
  std::map<std::string, Bucket> buckets_ GUARDED_BY(mu_);
  std::map<std::string, Upload> uploads_ GUARDED_BY(mu_);  // by upload id
};

}  // namespace kiln::objects
