#pragma once
// Shared plumbing of the node agent: S3 URIs, cancellation, confined local paths and streaming
// copies between the ObjectStore and local files. Used by staging.h, pipe_feeder.h,
// checkpoints.h and artifacts.h; the training controller may use ParseS3Uri and CancelFlag.
//
// Error convention of the whole agent module: a Status whose message starts with "ClientError: "
// is the user's fault (missing bucket/object, bad manifest, unsafe key, bad archive) and its
// message is meant to become the job's FailureReason verbatim (code InvalidArgument); a message
// starting with "InternalServerError: " is Kiln's fault (code Internal or the store's code);
// a cancelled operation returns code Aborted.
//
// Every copy streams through a fixed-size buffer; no object or file is ever held whole in memory.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/fs.h"
#include "base/io.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

// "s3://bucket/key-or-prefix" split into its parts. `key` may be empty (the whole bucket).
struct S3Location {
  std::string bucket;
  std::string key;
  std::string ToUri() const { return "s3://" + bucket + "/" + key; }
};

// Parses an S3 URI. The scheme must be "s3" (any case); the bucket must be non-empty.
// Errors: InvalidArgument "ClientError: ..." naming the URI and the expected form.
Result<S3Location> ParseS3Uri(std::string_view uri);

// `prefix` and `rel` joined with exactly one '/' (trailing slashes of prefix and leading
// slashes of rel collapse); an empty prefix yields rel unchanged.
std::string JoinKey(std::string_view prefix, std::string_view rel);

// A stop request shared between the controller and a running agent operation. Thread-safe.
class CancelFlag {
 public:
  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> cancelled_{false};
};

// The ClientError for `status` of an operation on s3://bucket/key: NotFound / PermissionDenied
// become "ClientError: <what> ... Please ..."; other codes become "InternalServerError: ...".
Status ObjectError(const Status& status, std::string_view what, const std::string& bucket, const std::string& key);

// Every object under `prefix` (all pages), in key order. Errors: the store's (NotFound for a
// missing bucket, reason ErrorReason::kNoSuchBucket).
Result<std::vector<objects::ObjectInfo>> ListAllObjects(objects::ObjectStore& store, const std::string& bucket,
                                                        const std::string& prefix);

// Validates a relative path taken from an S3 key, manifest entry or archive member and returns
// it normalised: empty components and "./" removed. Rejects (InvalidArgument "ClientError: ...",
// naming `origin`) paths that are empty after normalisation, contain a ".." component, or a NUL.
// Leading '/' are dropped first (the path is always relative to the destination).
Result<std::string> ConfinedRelativePath(std::string_view rel, std::string_view origin);

// Creates every missing directory of `root`/`rel`'s parent, refusing to pass through an
// existing symlink or non-directory (InvalidArgument "ClientError: ..."). `rel` must come from
// ConfinedRelativePath. Returns root + "/" + rel.
Result<std::string> PrepareConfinedPath(const std::string& root, const std::string& rel);

// Streams the object into `path`: writes "<path>.kiln-tmp-<random>" and renames it over `path`
// when complete, so `path` is either absent/old or complete. Verifies that the byte count
// equals the object's size (and `expected_size` when given). Retries transient store errors
// (Unavailable/Internal) up to 3 times. Returns the bytes written. `cancel` (may be null) is
// checked between buffers: Aborted. Errors: ObjectError(...) for the object; file errors.
Result<uint64_t> DownloadObjectToFile(objects::ObjectStore& store, const std::string& bucket, const std::string& key,
                                      const std::string& path, std::optional<uint64_t> expected_size,
                                      const CancelFlag* cancel, size_t buffer_size = 1 << 20);

// True for names DownloadObjectToFile uses for its temporary files (scans skip them).
bool IsTempFileName(std::string_view name);

// A ByteSource over an open file (from its current offset), with the file size as size hint.
class FileByteSource final : public ByteSource {
 public:
  // Errors: NotFound, PermissionDenied, Internal.
  static Result<std::unique_ptr<FileByteSource>> Open(const std::string& path);
  // Reads at most `limit` bytes starting at `offset` (for multipart parts).
  static Result<std::unique_ptr<FileByteSource>> OpenRange(const std::string& path, uint64_t offset, uint64_t limit);
  Result<size_t> Read(char* buf, size_t n) override;
  std::optional<uint64_t> size_hint() const override { return remaining_; }

 private:
  FileByteSource(UniqueFd fd, uint64_t offset, uint64_t remaining)
      : fd_(std::move(fd)), offset_(offset), remaining_(remaining) {}
  UniqueFd fd_;
  uint64_t offset_;
  uint64_t remaining_;
};

// Uploads the file at `path` to bucket/key: one PutObject up to `single_put_limit` bytes,
// multipart with `part_size` parts above it. Returns the stored object's info.
Result<objects::ObjectInfo> UploadFile(objects::ObjectStore& store, const std::string& bucket, const std::string& key,
                                       const std::string& path, uint64_t single_put_limit = 5ull << 30,
                                       uint64_t part_size = 512ull << 20);

// Decompresses a gzip stream (one or more concatenated members) read from `inner` while it is
// read. Malformed input: DataLoss naming `what`.
class GzipSource final : public ByteSource {
 public:
  GzipSource(ByteSource& inner, std::string what);
  ~GzipSource() override;
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;
  Result<size_t> Read(char* buf, size_t n) override;

 private:
  struct State;
  ByteSource& inner_;
  std::string what_;
  std::unique_ptr<State> state_;
};

}  // namespace kiln::agent
