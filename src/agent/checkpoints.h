#pragma once
// Checkpoint synchronisation between CheckpointConfig.LocalPath and CheckpointConfig.S3Uri
// (training-contract.md §9).
//
// Key of a local file = S3Uri's key prefix + '/' + its path relative to LocalPath (exactly one
// '/'; a bucket-only S3Uri uses the relative path alone).
//   Restore()  before the program starts: downloads every object under the prefix (folder
//              markers skipped, keys confined to the local dir) into the local dir.
//   Start()    background sync: a scan every `scan_interval`; a new or changed file (size or
//              mtime differs from what was last uploaded/restored) is uploaded once it has been
//              unchanged for `quiet_period`; a file that was uploaded or restored and is gone
//              locally is deleted from the store. Objects added to the store after Restore are
//              not copied in. (Kiln uses the periodic scan only, no inotify: a file is uploaded
//              at most scan_interval + quiet_period after its last change.)
//   Final()    stops the background sync and runs one last full sync with no quiet period
//              (after the program exited or was killed). Returns the first error seen by any
//              sync, background ones included.
// Only regular files are synced; symlinks and the agent's own temp files are ignored.
//
// Thread-safety: Restore/Start/Final from one controlling thread; on_error is called from the
// sync thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "agent/transfer.h"
#include "base/mutex.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

class CheckpointSync {
 public:
  struct Options {
    std::chrono::milliseconds scan_interval{10'000};  // Kiln: 10 s. Shorter: more stat() calls.
    std::chrono::milliseconds quiet_period{2'000};    // AWS: 2 s. Shorter: more partial uploads.
    // Called for each failed upload/delete in the background (the sync goes on). May be empty.
    std::function<void(const Status&)> on_error;
  };

  struct Stats {
    uint64_t restored_files = 0;
    uint64_t restored_bytes = 0;
    uint64_t uploaded_files = 0;
    uint64_t uploaded_bytes = 0;
    uint64_t deleted_objects = 0;
  };

  // `s3_uri` is CheckpointConfig.S3Uri, `local_dir` the HOST path of LocalPath (see
  // SandboxPathToHost). Errors: ParseS3Uri's. `store` must outlive the object.
  static Result<std::unique_ptr<CheckpointSync>> Create(objects::ObjectStore& store, const std::string& s3_uri,
                                                        const std::string& local_dir, Options options);
  ~CheckpointSync();  // stops the background sync (without a final sync)
  CheckpointSync(const CheckpointSync&) = delete;
  CheckpointSync& operator=(const CheckpointSync&) = delete;

  // Creates local_dir and downloads every object under the prefix into it. Errors: "ClientError:"
  // for a missing bucket or unsafe key; Aborted when `cancel` is set.
  Status Restore(const CancelFlag* cancel = nullptr);
  // Starts the background sync.
  void Start();
  // Stops the background sync and syncs everything once more. Returns the first error of any sync.
  Status Final();

  Stats stats() const;

 private:
  struct FileState {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileState& o) const { return size == o.size && mtime_ns == o.mtime_ns; }
  };
  struct Tracked {
    std::string key;   // the object's key in location_.bucket
    FileState synced;  // what the store holds (valid when in_store)
    bool in_store = false;
  };

  CheckpointSync(objects::ObjectStore& store, S3Location location, std::string local_dir, Options options)
      : store_(store), location_(std::move(location)), local_dir_(std::move(local_dir)), options_(std::move(options)) {}
  // One scan; uploads changed files whose mtime is at least `quiet` old (a file still being
  // written keeps a fresh mtime). Returns the first error of this pass.
  Status SyncPass(std::chrono::milliseconds quiet);
  void Run();
  void RecordError(const Status& s);

  objects::ObjectStore& store_;
  S3Location location_;
  std::string local_dir_;
  Options options_;

  Mutex pass_mu_;                                                // serialises SyncPass (background vs Final)
  std::map<std::string, Tracked> tracked_ GUARDED_BY(pass_mu_);  // by relative path

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  Status first_error_ GUARDED_BY(mu_);
  Stats stats_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kiln::agent
