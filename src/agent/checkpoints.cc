#include "agent/checkpoints.h"

#include <sys/stat.h>

#include <ctime>
#include <filesystem>

#include "agent/errors.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::agent {

namespace {

std::string ListPrefix(const std::string& key_prefix) {
  std::string p = key_prefix;
  while (!p.empty() && p.back() == '/') p.pop_back();
  return p.empty() ? p : p + "/";
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

Result<std::unique_ptr<CheckpointSync>> CheckpointSync::Create(objects::ObjectStore& store, const std::string& s3_uri,
                                                               const std::string& local_dir, Options options) {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Uri(s3_uri));
  return std::unique_ptr<CheckpointSync>(new CheckpointSync(store, std::move(location), local_dir, std::move(options)));
}

CheckpointSync::~CheckpointSync() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

CheckpointSync::Stats CheckpointSync::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

Status CheckpointSync::Restore(const CancelFlag* cancel) {
  RETURN_IF_ERROR(MakeDirs(local_dir_));
  std::string prefix = ListPrefix(location_.key);
  auto listed = ListAllObjects(store_, location_.bucket, prefix);
  if (!listed.ok()) return ObjectError(listed.status(), "Restoring checkpoints from", location_.bucket, prefix);
  MutexLock pass(pass_mu_);
  for (const auto& o : *listed) {
    if (cancel != nullptr && cancel->cancelled()) return Status::Aborted("checkpoint restore stopped");
    if (EndsWith(o.key, "/")) continue;
    ASSIGN_OR_RETURN(std::string rel,
                     ConfinedRelativePath(std::string_view(o.key).substr(prefix.size()),
                                          "checkpoint object key \"s3://" + location_.bucket + "/" + o.key + "\""));
    ASSIGN_OR_RETURN(std::string path, PrepareConfinedPath(local_dir_, rel));
    ASSIGN_OR_RETURN(uint64_t bytes, DownloadObjectToFile(store_, location_.bucket, o.key, path, o.size, cancel));
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return ErrnoStatus("stat " + path, errno);
    Tracked& t = tracked_[rel];
    t.key = o.key;
    t.in_store = true;
    t.synced = {static_cast<uint64_t>(st.st_size), MtimeNs(st)};
    MutexLock lock(mu_);
    stats_.restored_files++;
    stats_.restored_bytes += bytes;
  }
  return Status::Ok();
}

void CheckpointSync::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void CheckpointSync::Run() {
  MutexLock lock(mu_);
  while (!stopping_) {
    const auto deadline = std::chrono::steady_clock::now() + options_.scan_interval;
    while (!stopping_ && cv_.WaitUntil(mu_, deadline) == std::cv_status::no_timeout) {
    }
    if (stopping_) break;
    lock.Unlock();
    (void)SyncPass(options_.quiet_period);  // errors are recorded by RecordError
    lock.Lock();
  }
}

void CheckpointSync::RecordError(const Status& s) {
  KLOG(warn, "checkpoint sync failed", {{"error", s.message()}});
  {
    MutexLock lock(mu_);
    if (first_error_.ok()) first_error_ = s;
  }
  if (options_.on_error) options_.on_error(s);
}

Status CheckpointSync::SyncPass(std::chrono::milliseconds quiet) {
  MutexLock pass(pass_mu_);
  Status first;
  auto note = [&](const Status& s) {
    if (first.ok()) first = s;
    RecordError(s);
  };
  std::map<std::string, FileState> local;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(local_dir_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
    if (IsTempFileName(it->path().filename().string())) continue;
    struct stat st;
    if (lstat(it->path().c_str(), &st) != 0) continue;  // removed meanwhile
    std::string rel = std::filesystem::relative(it->path(), local_dir_, ec).generic_string();
    if (ec) break;
    local[rel] = {static_cast<uint64_t>(st.st_size), MtimeNs(st)};
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    note(InternalServerError("scanning checkpoint directory " + local_dir_ + ": " + ec.message()));
  }
  struct timespec now_ts;
  clock_gettime(CLOCK_REALTIME, &now_ts);
  int64_t now_ns = static_cast<int64_t>(now_ts.tv_sec) * 1'000'000'000 + now_ts.tv_nsec;
  int64_t quiet_ns = static_cast<int64_t>(quiet.count()) * 1'000'000;

  for (const auto& [rel, state] : local) {
    Tracked& t = tracked_[rel];
    if (t.key.empty()) t.key = JoinKey(location_.key, rel);
    if (t.in_store && t.synced == state) continue;
    if (now_ns - state.mtime_ns < quiet_ns) continue;  // still being written
    std::string path = local_dir_ + "/" + rel;
    auto put = UploadFile(store_, location_.bucket, t.key, path);
    if (!put.ok()) {
      if (put.status().IsNotFound() && !put.status().Is(ErrorReason::kNoSuchBucket)) continue;  // file gone
      note(ObjectError(put.status(), "Uploading checkpoint to", location_.bucket, t.key));
      continue;
    }
    t.in_store = true;
    t.synced = state;
    MutexLock lock(mu_);
    stats_.uploaded_files++;
    stats_.uploaded_bytes += put->size;
  }
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    if (local.count(it->first) != 0) {
      ++it;
      continue;
    }
    if (it->second.in_store) {
      Status s = store_.DeleteObject(location_.bucket, it->second.key);
      if (!s.ok()) {
        note(ObjectError(s, "Deleting checkpoint", location_.bucket, it->second.key));
        ++it;
        continue;
      }
      MutexLock lock(mu_);
      stats_.deleted_objects++;
    }
    it = tracked_.erase(it);
  }
  return first;
}

Status CheckpointSync::Final() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  (void)SyncPass(std::chrono::milliseconds(0));
  MutexLock lock(mu_);
  return first_error_;
}

}  // namespace kiln::agent
