#pragma once
// ObjectStore: buckets of keyed objects with S3 semantics, the one interface through which Kiln
// stages datasets, code and model artifacts (DESIGN.md §3, §4).
//
// Backends: `fs` (embedded default: metadata in SQLite, bytes in files named by internal id under
// the data dir) and `s3` (an external S3-compatible service). Both are thread-safe: any number of
// threads may call any method concurrently. A write is durable and visible to every reader once
// the call returns OK; a failed or interrupted write leaves no trace (no torn or half-listed
// object). Data always streams through bounded buffers.
//
// Keys are arbitrary byte strings up to 1024 bytes, stored literally ("../x", "a//b/./c" are keys
// like any other). Errors use Status codes with these meanings:
//   NotFound            no such bucket / key / upload: reason kNoSuchBucket, kNoSuchKey or
//                       kNoSuchUpload (base/status.h), which fronts test to tell them apart; the
//                       message starts with the same name ("NoSuchKey: ...") for people
//   AlreadyExists       bucket exists (CreateBucket)
//   FailedPrecondition  bucket not empty (reason kBucketNotEmpty, "BucketNotEmpty:"); conditional
//                       request failed (reason kPreconditionFailed, "PreconditionFailed:")
//   InvalidArgument     bad name (kInvalidBucketName, kKeyTooLong), bad part list (kInvalidPart,
//                       kInvalidPartOrder, kEntityTooSmall), bad range (kInvalidRange), another
//                       S3 InvalidArgument / InvalidRequest (kInvalidArgument, kInvalidRequest);
//                       the message starts with the S3 code ("InvalidPart: ...") and what follows
//                       the colon is the detail the S3 front shows for the last three
//   ResourceExhausted   disk full, object too large (kEntityTooLarge, "EntityTooLarge: ...")
//   DataLoss            the source's bytes failed a checksum while streaming in (message from source);
//                       the data did not match the expected checksums (kBadDigest, "BadDigest: ...")
//   Unavailable         backend unreachable (s3 backend)

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"

namespace kiln::objects {

struct BucketInfo {
  std::string name;
  int64_t creation_millis = 0;
  std::string region;
};

// Stored metadata of an object. `headers` holds the HTTP headers S3 stores and returns verbatim:
// Content-Type, Content-Encoding, Content-Disposition, Content-Language, Cache-Control, Expires,
// and every x-amz-meta-* (names lower-cased), plus x-amz-tagging-count when tagged.
struct ObjectInfo {
  std::string bucket;
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without quotes: hex md5, or "<hex>-<parts>" for multipart objects
  int64_t last_modified_millis = 0;
  std::map<std::string, std::string> headers;
  // Checksums the writer supplied and the store verified: lower-case algorithm → base64.
  std::map<std::string, std::string> checksums;
  // For multipart objects: each part's size in order (GetObject partNumber=n). Empty otherwise.
  std::vector<uint64_t> part_sizes;
  std::string storage_class = "STANDARD";
};

struct PutOptions {
  std::map<std::string, std::string> headers;  // as ObjectInfo::headers
  // Checksums the data must match (lower-case algorithm → base64; "md5" → base64 Content-MD5).
  // A mismatch fails the put with DataLoss("BadDigest: ...") and stores nothing.
  std::map<std::string, std::string> expected_checksums;
  // Checksums already verified by the caller's decoder, to store and return as-is.
  std::map<std::string, std::string> verified_checksums;
  // Algorithms to compute and store (e.g. "crc32" when the client asked for one).
  std::vector<std::string> compute_checksums;
  std::optional<std::string> if_match;  // conditional write: current etag must match
  bool if_none_match_star = false;      // conditional write: key must not exist
};

struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;  // inclusive
};

// A readable object. Read() streams the (ranged) bytes; info() is the metadata at open time.
class ObjectReader : public ByteSource {
 public:
  virtual const ObjectInfo& info() const = 0;

  // Zero-copy access for callers that write to local files (staging a channel): where the next
  // bytes of the object lie in a local file (the fs backend), the file, offset and length of
  // that contiguous span; nullopt otherwise (the s3 backend, or at the end). The caller copies
  // any number n ≤ length of those bytes itself (copy_file_range, sendfile) and then calls
  // Skip(n). The fd stays valid while the reader lives; Read() and the spans may be mixed.
  struct FileSpan {
    int fd = -1;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  virtual std::optional<FileSpan> NextFileSpan() { return std::nullopt; }
  // Advances past `n` bytes obtained through NextFileSpan().
  virtual void Skip(uint64_t n) { (void)n; }
};

struct ListOptions {
  std::string prefix;
  std::string delimiter;     // empty: no grouping
  std::string start_after;   // exclusive; list keys (and prefixes) strictly greater
  uint32_t max_keys = 1000;  // 0 allowed (returns nothing, truncated if anything matches)
};

struct ListResult {
  // Only bucket/key/size/etag/last_modified_millis/storage_class are filled.
  std::vector<ObjectInfo> objects;
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  // The last key or common prefix returned: where the next page starts (exclusive).
  std::string next_marker;
};

struct MultipartUpload {
  std::string bucket;
  std::string key;
  std::string upload_id;
  int64_t initiated_millis = 0;
  std::map<std::string, std::string> headers;  // from CreateMultipartUpload
  std::string checksum_algorithm;              // lower-case or empty
};

struct PartInfo {
  uint32_t part_number = 0;
  uint64_t size = 0;
  std::string etag;  // hex md5, no quotes
  int64_t last_modified_millis = 0;
  std::map<std::string, std::string> checksums;
};

struct CompletedPart {
  uint32_t part_number = 0;
  std::string etag;  // as the client sent it; quotes tolerated
};

struct ListUploadsOptions {
  std::string prefix;
  std::string key_marker;
  std::string upload_id_marker;
  uint32_t max_uploads = 1000;
};

struct ListUploadsResult {
  std::vector<MultipartUpload> uploads;
  bool truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // Buckets
  virtual Status CreateBucket(const std::string& bucket, const std::string& region) = 0;
  virtual Status DeleteBucket(const std::string& bucket) = 0;  // FailedPrecondition if not empty
  virtual Result<BucketInfo> HeadBucket(const std::string& bucket) = 0;
  virtual Result<std::vector<BucketInfo>> ListBuckets() = 0;  // sorted by name

  // Objects
  // Streams `data` into a new version of `key`, replacing any existing object atomically.
  virtual Result<ObjectInfo> PutObject(const std::string& bucket, const std::string& key, ByteSource& data,
                                       const PutOptions& options) = 0;
  virtual Result<ObjectInfo> HeadObject(const std::string& bucket, const std::string& key) = 0;
  // Opens the object (or `range` of it; the caller has validated the range against the size from
  // HeadObject or passes nullopt). The reader sees the object as it was when opened, even if it
  // is overwritten or deleted meanwhile.
  virtual Result<std::unique_ptr<ObjectReader>> GetObject(const std::string& bucket, const std::string& key,
                                                          std::optional<ByteRange> range) = 0;
  // OK when the key is absent (S3 semantics); NotFound only for a missing bucket.
  virtual Status DeleteObject(const std::string& bucket, const std::string& key) = 0;
  // Keys in UTF-8 byte order.
  virtual Result<ListResult> ListObjects(const std::string& bucket, const ListOptions& options) = 0;
  // Copies source to destination. `replace_headers` set: the destination gets those headers
  // (REPLACE directive); unset: the source's (COPY).
  virtual Result<ObjectInfo> CopyObject(const std::string& src_bucket, const std::string& src_key,
                                        const std::string& dst_bucket, const std::string& dst_key,
                                        const std::optional<std::map<std::string, std::string>>& replace_headers) = 0;

  // Multipart uploads
  virtual Result<MultipartUpload> CreateMultipartUpload(const std::string& bucket, const std::string& key,
                                                        const std::map<std::string, std::string>& headers,
                                                        const std::string& checksum_algorithm) = 0;
  // Stores a part (replacing an earlier upload of the same number). part_number 1..10000.
  virtual Result<PartInfo> UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                      uint32_t part_number, ByteSource& data, const PutOptions& options) = 0;
  // Stores `range` (or all) of an existing object as a part.
  virtual Result<PartInfo> UploadPartCopy(const std::string& bucket, const std::string& key,
                                          const std::string& upload_id, uint32_t part_number,
                                          const std::string& src_bucket, const std::string& src_key,
                                          std::optional<ByteRange> range) = 0;
  // Assembles the listed parts (ascending, known, all but the last >= 5 MiB) into the object,
  // with ETag md5-of-part-md5s "-N", and removes the upload.
  virtual Result<ObjectInfo> CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                                     const std::string& upload_id,
                                                     const std::vector<CompletedPart>& parts) = 0;
  virtual Status AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) = 0;
  // Parts with number > part_number_marker, ascending, at most max_parts; `truncated` set when more.
  virtual Result<std::vector<PartInfo>> ListParts(const std::string& bucket, const std::string& key,
                                                  const std::string& upload_id, uint32_t part_number_marker,
                                                  uint32_t max_parts, bool* truncated) = 0;
  virtual Result<MultipartUpload> GetMultipartUpload(const std::string& bucket, const std::string& key,
                                                     const std::string& upload_id) = 0;
  virtual Result<ListUploadsResult> ListMultipartUploads(const std::string& bucket,
                                                         const ListUploadsOptions& options) = 0;
};

}  // namespace kiln::objects
