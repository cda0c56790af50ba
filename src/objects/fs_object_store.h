#pragma once
// FsObjectStore: the embedded ObjectStore backend (DESIGN.md §4). Metadata lives in SQLite
// (store::ObjectRepository); bytes live in files under `root`, one file per single-PUT object,
// copy or part, named by a random internal id and never by key. A completed multipart object is
// the ordered list of its part files (extents): CompleteMultipartUpload adopts them in one
// transaction and copies no bytes.
//
//   <root>/data/<id[0:2]>/<id[2:4]>/<id>   committed object and part data
//   <root>/tmp/<random>                     uploads in progress (removed at Open)
//
// Write protocol (PutObject, UploadPart, Copy*): stream into a temp file through a
// bounded buffer while hashing, verify checksums, fsync, rename to the id path, fsync the
// directory, then commit the metadata row in one transaction, and only then unlink the file of
// the version it replaced. A failure before the commit removes the temp/data file, so nothing
// becomes visible; a crash leaves only files that no row references, which Open deletes.
// Complete only commits: the upload's rows go and the object (naming the chosen parts' files)
// appears in one transaction; the unused parts' files and the replaced version's are unlinked
// after it. Readers open the data files of the range they read when the object is opened (so a
// whole read of an N-part object holds N descriptors) and read them with pread, so an overwrite
// or delete (which unlinks the old files) does not disturb them. Of concurrent writers of one key,
// the last to commit wins and every reader sees one whole version.
//
// No data file is shared between objects (copies get their own file), so an object's files are
// unlinked exactly when its row goes. Thread-safe. Exactly one FsObjectStore may use a given root
// at a time (Open collects files it does not know about). The Database must outlive the store.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/time.h"
#include "objects/object_store.h"
#include "store/database.h"
#include "store/object_repository.h"

namespace kiln::objects {

class FsObjectStore final : public ObjectStore {
 public:
  struct Options {
    // Directory holding data/ and tmp/ (created if missing), e.g. <data-dir>/objects.
    std::string root;
    // The server's database; migrations 1-2 must have been applied (Database::Open does it).
    store::Database* database = nullptr;
    // Copy buffer per transfer. Larger buffers mean fewer syscalls and more memory per stream.
    size_t buffer_size = 1 << 20;
    // Smallest size of every part but the last at CompleteMultipartUpload (S3: 5 MiB).
    uint64_t min_part_size = 5ull << 20;
    // Largest single PutObject / UploadPart body (S3: 5 GiB). Larger: ResourceExhausted.
    uint64_t max_object_size = 5ull << 30;
    // fsync data files and directories before committing. Turning it off makes writes faster and
    // lets a power loss lose acknowledged objects; only tests should do that.
    bool sync = true;
    // Source of Last-Modified and initiation times; nullptr means the system clock.
    const Clock* clock = nullptr;
  };

  // Creates the directories, deletes stale temp files and data files no row references (leftovers
  // of a crash), and returns the store. Errors: InvalidArgument (no root or database), Internal or
  // PermissionDenied when the root cannot be prepared.
  static Result<std::unique_ptr<FsObjectStore>> Open(const Options& options);

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

  // Path of the data file with internal id `file_id` (tests use it to simulate crashes).
  std::string DataPathForTest(const std::string& file_id) const { return DataPath(file_id); }
  std::string TempDirForTest() const { return tmp_dir_; }

 private:
  struct StagedFile;
  struct StageOptions;

  explicit FsObjectStore(const Options& options);
  Status CollectGarbage();
  std::string DataPath(const std::string& file_id) const;
  int64_t Now() const { return clock_->NowMillis(); }
  // Streams `data` into a new data file (not yet referenced by any row).
  Result<StagedFile> Stage(ByteSource& data, const StageOptions& options);
  // Moves a finished temp file to its id path durably.
  Status Publish(const std::string& tmp_path, const std::string& file_id);
  // Unlinks data files that a committed change stopped referencing; failures only log (the next
  // Open collects them).
  void RemoveDataFiles(const std::vector<std::string>& file_ids);
  Result<PartInfo> StorePart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                             uint32_t part_number, ByteSource& data, const PutOptions& options);

  const Options options_;
  const Clock* clock_;
  const std::string data_dir_;
  const std::string tmp_dir_;
  store::ObjectRepository repo_;
};

}  // namespace kiln::objects
