#pragma once
// S3ObjectStore: the ObjectStore backend over an external S3-compatible service (AWS S3, MinIO,
// or another Kiln server), spoken with libcurl and signed with SigV4 (aws/sigv4.h).
//
// Bodies stream both ways: uploads are read from the ByteSource as curl sends them
// (x-amz-content-sha256: UNSIGNED-PAYLOAD), and GetObject returns a reader that drives the
// transfer on the caller's thread, holding about `read_buffer_bytes` of the response.
// Uploads whose size is not known in advance are spooled to an anonymous temp file first,
// because S3 needs a Content-Length.
//
// Differences from the fs backend, inherent to the S3 protocol:
//   - ObjectInfo::part_sizes is left empty (S3 does not list part sizes on HEAD).
//   - `compute_checksums` are computed while streaming and returned by PutObject/UploadPart,
//     but the service only keeps checksums that were sent as x-amz-checksum-* headers
//     (expected or verified ones).
//   - GetMultipartUpload finds the upload through ListMultipartUploads; its headers are empty.
//
// Thread-safe: each call uses its own curl easy handle, taken from a small pool so that
// connections are reused. Readers returned by GetObject must be destroyed before the store.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "objects/object_store.h"

namespace kiln::objects {

class S3ObjectStore final : public ObjectStore {
 public:
  struct Options {
    // Base URL, e.g. "http://127.0.0.1:5456" or "https://s3.us-west-2.amazonaws.com".
    std::string endpoint;
    std::string region = "us-east-1";
    std::string access_key_id;
    std::string secret_access_key;
    std::string session_token;  // empty when the key has none
    // Path style (http://host/bucket/key) vs virtual-hosted (http://bucket.host/key).
    bool path_style = true;
    // Time to establish a connection before failing with Unavailable.
    int connect_timeout_ms = 10000;
    // A request that moves less than 1 byte/s for this long fails with Unavailable. Not applied
    // to a GetObject body, which moves at its reader's pace (the transfer pauses while the
    // buffer is full), so a stalled GET blocks its reader.
    int stall_timeout_s = 120;
    // Response bytes GetObject buffers ahead of ObjectReader::Read before it pauses the transfer
    // (at least 64 KiB; one more curl write, up to 16 KiB, may land past it).
    size_t read_buffer_bytes = 1 << 20;
    // Idle easy handles (and their connections) kept for reuse.
    size_t max_idle_handles = 16;
  };

  // Errors: InvalidArgument when the endpoint is missing or not http(s). Does not contact the
  // service (the first call that fails reports Unavailable).
  static Result<std::unique_ptr<S3ObjectStore>> Open(const Options& options);
  ~S3ObjectStore() override;

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

  // Implementation types (s3_object_store_internal.h), public only so that the .cc files' helpers
  // can name them.
  struct Request;
  struct Response;
  struct Prepared;
  class HandlePool;

 private:
  explicit S3ObjectStore(const Options& options);
  // Builds `request`'s URL and signs it: the URL and curl header list in `out`.
  void Prepare(const Request& request, Prepared& out) const;
  // Runs `request` to completion. Errors: Unavailable when the service cannot be reached, the
  // body's own error when it fails mid-upload; an HTTP error status is a Response, not an error.
  Result<Response> Perform(Request& request);
  // Performs the PUT `request` with `data` as its body (spooled first when its size is unknown)
  // and the headers of `options`; sets `*size` to the bytes sent. HTTP errors map through
  // MapError with `fallback_404`.
  Result<Response> SendBody(Request& request, ByteSource& data, const PutOptions& options,
                            const std::string& fallback_404, uint64_t* size);
  Result<PartInfo> SendPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                            uint32_t part_number, ByteSource& data, const PutOptions& options);

  const Options options_;
  std::string scheme_;     // "http" or "https"
  std::string authority_;  // host[:port]
  std::string base_path_;  // path prefix of the endpoint, without trailing '/'
  std::unique_ptr<HandlePool> pool_;
};

}  // namespace kiln::objects
