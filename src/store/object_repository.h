#pragma once
// ObjectRepository: the rows behind the embedded object store (objects/fs_object_store.h):
// buckets, objects, multipart uploads and their parts. Bytes are never stored here; each part row
// names the data file that holds its bytes by an internal id (`file_id`). An object is either one
// whole data file (`ObjectRow::file_id`: single PUTs, copies, and every object written before
// migration 2) or an ordered list of extents (`ObjectRow::extents`: a completed multipart upload
// adopts its part files without copying them). No data file is referenced by more than one row.
//
// Errors carry the typed reasons of objects/object_store.h (ErrorReason::kNoSuchBucket, kNoSuchKey,
// kNoSuchUpload, kBucketNotEmpty, kPreconditionFailed) and the matching message prefixes
// ("NoSuchBucket:", ...) so the object store can pass them on unchanged.
// Every mutating method runs in one transaction and, where it replaces or removes rows, returns
// the file ids that are no longer referenced; the caller deletes those files after the call
// returns (after the commit), so a crash in between leaves only orphans that startup collects.
//
// Thread-safe (the Database serialises access). The Database must outlive the repository.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "store/database.h"

namespace kiln::store {

struct BucketRow {
  std::string name;
  std::string region;
  int64_t created_millis = 0;
};

// A byte range of a data file; an object's extents, in order, concatenate to its bytes.
struct Extent {
  std::string file_id;
  uint64_t offset = 0;
  uint64_t length = 0;

  bool operator==(const Extent&) const = default;
};

struct ObjectRow {
  std::string bucket;
  std::string key;  // arbitrary bytes
  // Exactly one of `file_id` (the whole object is this file) and `extents` is set.
  std::string file_id;
  std::vector<Extent> extents;
  uint64_t size = 0;
  std::string etag;
  int64_t last_modified_millis = 0;
  std::string headers_json = "{}";
  std::string checksums_json = "{}";
  std::string part_sizes_json = "[]";
  std::string storage_class = "STANDARD";

  // The object's bytes as extents: `extents`, or the whole of `file_id` as one extent.
  std::vector<Extent> Layout() const {
    if (!extents.empty()) return extents;
    return {Extent{file_id, 0, size}};
  }
};

struct UploadRow {
  std::string upload_id;
  std::string bucket;
  std::string key;
  int64_t initiated_millis = 0;
  std::string headers_json = "{}";
  std::string checksum_algorithm;
};

struct PartRow {
  std::string upload_id;
  uint32_t part_number = 0;
  std::string file_id;
  uint64_t size = 0;
  std::string etag;
  int64_t last_modified_millis = 0;
  std::string checksums_json = "{}";
};

// Conditions checked against the current row inside the write transaction.
struct WriteCondition {
  std::optional<std::string> if_match;  // current etag must equal this
  bool if_none_match_star = false;      // no current row may exist
};

class ObjectRepository {
 public:
  explicit ObjectRepository(Database* db) : db_(db) {}

  // Buckets. CreateBucket: AlreadyExists when taken. DeleteBucket: NotFound("NoSuchBucket: ..."),
  // FailedPrecondition("BucketNotEmpty: ...") when objects or uploads remain.
  Status CreateBucket(const BucketRow& row);
  Status DeleteBucket(const std::string& name);
  Result<BucketRow> GetBucket(const std::string& name);
  Result<std::vector<BucketRow>> ListBuckets();  // by name

  // NotFound "NoSuchBucket:" or "NoSuchKey:". The row and its extents are read in one
  // transaction, so they always describe one version.
  Result<ObjectRow> GetObject(const std::string& bucket, const std::string& key);
  // Inserts or replaces the object row (and its extents). Returns the file ids of the replaced
  // version (empty when there was none).
  // Errors: NoSuchBucket; FailedPrecondition("PreconditionFailed: ...") when `condition` fails.
  Result<std::vector<std::string>> PutObject(const ObjectRow& row, const WriteCondition& condition);
  // Removes the row and its extents; returns its file ids (empty when absent). NoSuchBucket for a
  // missing bucket.
  Result<std::vector<std::string>> DeleteObject(const std::string& bucket, const std::string& key);
  // Rows of `bucket` with lower <(=) key < upper (no upper bound when nullopt), ascending by byte
  // order, at most `limit`. Only listing columns are filled (not headers/checksums/parts/extents).
  Result<std::vector<ObjectRow>> ScanObjects(const std::string& bucket, const std::string& lower, bool lower_inclusive,
                                             const std::optional<std::string>& upper, uint32_t limit);

  // Multipart uploads. CreateUpload: NoSuchBucket. GetUpload: NoSuchBucket / NoSuchUpload (also
  // when the id exists under another bucket or key).
  Status CreateUpload(const UploadRow& row);
  Result<UploadRow> GetUpload(const std::string& bucket, const std::string& key, const std::string& upload_id);
  // Inserts or replaces a part; returns the replaced part's file id. NoSuchUpload when the upload
  // is gone (completed or aborted meanwhile).
  Result<std::optional<std::string>> PutPart(const std::string& bucket, const std::string& key, const PartRow& row);
  // Parts with number > marker, ascending, at most `limit` (all when limit is 0).
  Result<std::vector<PartRow>> ListParts(const std::string& upload_id, uint32_t marker, uint32_t limit);
  // Removes the upload and its parts and stores `object` (replacing any current object) in one
  // transaction; `object` may adopt part files as its extents (or `file_id`). Returns every file
  // id no longer referenced: the part files `object` does not adopt, and the replaced object's
  // files. NoSuchUpload when the upload is gone; Aborted when `object` names a file that is not
  // (any longer) a part of this upload, e.g. because a part was re-uploaded meanwhile.
  Result<std::vector<std::string>> CompleteUpload(const std::string& bucket, const std::string& key,
                                                  const std::string& upload_id, const ObjectRow& object);
  // Removes the upload; returns its parts' file ids.
  Result<std::vector<std::string>> AbortUpload(const std::string& bucket, const std::string& key,
                                               const std::string& upload_id);
  // Uploads of `bucket` whose key starts with `prefix`, ordered by (key, upload_id), after the
  // markers (S3 semantics: key > key_marker, or key == key_marker and upload_id > upload_id_marker
  // when upload_id_marker is set), at most `limit`.
  Result<std::vector<UploadRow>> ListUploads(const std::string& bucket, const std::string& prefix,
                                             const std::string& key_marker, const std::string& upload_id_marker,
                                             uint32_t limit);

  // Every file id referenced by an object, an object extent or a part (for garbage collection at
  // startup).
  Result<std::unordered_set<std::string>> AllFileIds();

 private:
  Status RequireBucket(const std::string& bucket);
  Database* db_;
};

// The smallest byte string greater than every string that starts with `prefix`, or nullopt when
// there is none (empty prefix or all bytes 0xff). Used for range scans over BLOB keys.
std::optional<std::string> PrefixUpperBound(std::string_view prefix);

}  // namespace kiln::store
