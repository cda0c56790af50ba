#include "agent/staging.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <thread>
#include <tuple>

#include "agent/errors.h"
#include "agent/training_layout.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/strings.h"

namespace kiln::agent {

using nlohmann::json;

namespace {

constexpr size_t kMaxManifestBytes = 256u << 20;

std::string NoObjectsMessage(const std::string& uri, const std::string& bucket, const std::string& role_arn) {
  return "No S3 objects found under S3 URL \"" + uri +
         "\" given in input data source. Please ensure that the bucket exists in the selected region, that "
         "objects exist under that S3 prefix, and that the role \"" +
         role_arn + "\" has \"s3:ListBucket\" permissions on bucket \"" + bucket + "\".";
}

Status BadManifest(const std::string& uri, const std::string& why) {
  return ClientError("The manifest file \"" + uri + "\" is invalid: " + why +
                     ". Please provide a JSON array whose first element is {\"prefix\": "
                     "\"s3://bucket/prefix/\"} followed by the object keys relative to that prefix.");
}

Result<std::vector<SelectedObject>> SelectPrefix(objects::ObjectStore& store, const std::string& uri,
                                                 const std::string& role_arn) {
  ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(uri));
  auto listed = ListAllObjects(store, loc.bucket, loc.key);
  if (!listed.ok()) {
    if (listed.status().IsNotFound()) {
      return ClientError(NoObjectsMessage(uri, loc.bucket, role_arn));
    }
    return ObjectError(listed.status(), "Listing", loc.bucket, loc.key);
  }
  std::vector<SelectedObject> out;
  for (const auto& o : *listed) {
    if (EndsWith(o.key, "/")) continue;  // folder marker
    ASSIGN_OR_RETURN(std::string rel, ConfinedRelativePath(PrefixRelativePath(o.key, loc.key),
                                                           "S3 object key \"s3://" + loc.bucket + "/" + o.key + "\""));
    out.push_back({loc.bucket, o.key, std::move(rel), o.size, o.etag});
  }
  if (out.empty()) return ClientError(NoObjectsMessage(uri, loc.bucket, role_arn));
  return out;
}

Result<std::vector<SelectedObject>> SelectManifest(objects::ObjectStore& store, const std::string& uri) {
  ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(uri));
  auto reader = store.GetObject(loc.bucket, loc.key, std::nullopt);
  if (!reader.ok()) return ObjectError(reader.status(), "Reading the manifest file", loc.bucket, loc.key);
  auto text = ReadAll(**reader, kMaxManifestBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kResourceExhausted) return BadManifest(uri, "it is larger than 256 MiB");
    return ObjectError(text.status(), "Reading the manifest file", loc.bucket, loc.key);
  }
  json manifest;
  try {
    manifest = json::parse(*text);
  } catch (const json::exception& e) {
    return BadManifest(uri, std::string("it is not valid JSON (") + e.what() + ")");
  }
  if (!manifest.is_array() || manifest.empty()) return BadManifest(uri, "it is not a non-empty JSON array");
  const json& first = manifest[0];
  if (!first.is_object() || !first.contains("prefix") || !first["prefix"].is_string()) {
    return BadManifest(uri, "its first element is not an object with a \"prefix\" string");
  }
  std::string prefix_uri = first["prefix"].get<std::string>();
  auto prefix = ParseS3Uri(prefix_uri);
  if (!prefix.ok()) return BadManifest(uri, "its prefix \"" + prefix_uri + "\" is not an s3:// URI");
  std::vector<SelectedObject> out;
  for (size_t i = 1; i < manifest.size(); ++i) {
    if (!manifest[i].is_string()) {
      return BadManifest(uri, "element " + std::to_string(i) + " is not a string");
    }
    std::string rel = manifest[i].get<std::string>();
    std::string key = prefix->key + rel;
    ASSIGN_OR_RETURN(std::string path, ConfinedRelativePath(rel, "manifest entry \"" + rel + "\" of \"" + uri + "\""));
    out.push_back({prefix->bucket, std::move(key), std::move(path), std::nullopt, ""});
  }
  if (out.empty()) return BadManifest(uri, "it lists no objects after the prefix");
  std::sort(out.begin(), out.end(), [](const SelectedObject& a, const SelectedObject& b) { return a.key < b.key; });
  return out;
}

}  // namespace

std::string_view PrefixRelativePath(std::string_view key, std::string_view prefix) {
  if (key == prefix) {
    size_t slash = key.rfind('/');
    return slash == std::string_view::npos ? key : key.substr(slash + 1);
  }
  std::string_view rel = key.substr(std::min(prefix.size(), key.size()));
  while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  return rel;
}

Result<std::vector<SelectedObject>> SelectChannelObjects(objects::ObjectStore& store, const json& channel,
                                                         const std::string& role_arn) {
  std::string name = channel.value("ChannelName", "");
  const json* s3 = nullptr;
  if (channel.contains("DataSource") && channel["DataSource"].is_object() &&
      channel["DataSource"].contains("S3DataSource")) {
    s3 = &channel["DataSource"]["S3DataSource"];
  }
  if (s3 == nullptr || !s3->is_object()) {
    return ClientError("channel \"" + name + "\" has no S3DataSource.");
  }
  std::string type = s3->value("S3DataType", "S3Prefix");
  std::string uri = s3->value("S3Uri", "");
  if (type == "S3Prefix") return SelectPrefix(store, uri, role_arn);
  if (type == "ManifestFile") return SelectManifest(store, uri);
  return ClientError("S3DataType \"" + type + "\" of channel \"" + name +
                     "\" is not supported by Kiln. Please use S3Prefix or ManifestFile.");
}

std::vector<SelectedObject> ShardObjects(const std::vector<SelectedObject>& objects, const std::string& distribution,
                                         int host_index, int host_count) {
  if (distribution != "ShardedByS3Key" || host_count <= 1) return objects;
  std::vector<SelectedObject> out;
  for (size_t i = 0; i < objects.size(); ++i) {
    if (static_cast<int>(i % static_cast<size_t>(host_count)) == host_index) out.push_back(objects[i]);
  }
  return out;
}

namespace {

struct Task {
  size_t channel;
  std::string dir;
  SelectedObject object;
};

Status MakeReadOnly(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    struct stat st;
    std::string p = it->path().string();
    if (stat(p.c_str(), &st) != 0) return ErrnoStatus("stat " + p, errno);
    if (chmod(p.c_str(), st.st_mode & ~static_cast<mode_t>(0222)) != 0) return ErrnoStatus("chmod " + p, errno);
  }
  if (ec) return Status::Internal("walking " + dir + ": " + ec.message());
  return Status::Ok();
}

// A kept file for one object: bucket, key, ETag and size must all match.
struct KeptFile {
  std::string path;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
};
using KeptFiles = std::map<std::tuple<std::string, std::string, std::string, uint64_t>, KeptFile>;

int64_t Nanos(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + static_cast<int64_t>(t.tv_nsec);
}

// Fills the file's identity (StagedFile) from the file as it is now; false when it is gone.
bool StatStaged(StagedFile& f) {
  struct stat st;
  if (lstat(f.path.c_str(), &st) != 0) return false;
  f.mtime_ns = Nanos(st.st_mtim);
  f.ctime_ns = Nanos(st.st_ctim);
  f.inode = static_cast<uint64_t>(st.st_ino);
  return true;
}

json StagedFileToJson(const StagedFile& f) {
  return {{"bucket", f.bucket}, {"key", f.key},           {"etag", f.etag},         {"size", f.size},
          {"path", f.path},     {"mtime_ns", f.mtime_ns}, {"ctime_ns", f.ctime_ns}, {"inode", f.inode}};
}

// The kept files of a manifest; empty when there is none or it cannot be read (nothing is reused).
KeptFiles ReadKeptFiles(const std::string& manifest_path) {
  KeptFiles kept;
  if (manifest_path.empty()) return kept;
  // Only files under the manifest's own directory (the pool's host directory) are taken.
  const std::string under = std::filesystem::path(manifest_path).parent_path().string() + "/";
  auto text = ReadFile(manifest_path);
  if (!text.ok()) return kept;
  json doc = json::parse(*text, nullptr, false);
  if (!doc.is_array()) return kept;
  for (const json& e : doc) {
    if (!e.is_object()) continue;
    try {
      KeptFile file{e.at("path").get<std::string>(), e.at("mtime_ns").get<int64_t>(), e.at("ctime_ns").get<int64_t>(),
                    e.at("inode").get<uint64_t>()};
      if (!StartsWith(file.path, under) || file.path.find("/../") != std::string::npos) continue;
      kept[{e.at("bucket").get<std::string>(), e.at("key").get<std::string>(), e.at("etag").get<std::string>(),
            e.at("size").get<uint64_t>()}] = std::move(file);
    } catch (const json::exception&) {
      continue;  // a damaged entry: that object is downloaded
    }
  }
  return kept;
}

// Moves the kept file of `object` to `path` when it is still what was staged; false otherwise.
bool TakeKeptFile(const KeptFile& kept, const SelectedObject& object, const std::string& path, uint64_t* bytes) {
  struct stat st;
  if (lstat(kept.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (static_cast<uint64_t>(st.st_size) != object.size.value_or(UINT64_MAX) || Nanos(st.st_mtim) != kept.mtime_ns ||
      Nanos(st.st_ctim) != kept.ctime_ns || static_cast<uint64_t>(st.st_ino) != kept.inode) {
    return false;  // changed by the job that kept it
  }
  if (rename(kept.path.c_str(), path.c_str()) != 0) return false;
  (void)chmod(path.c_str(), 0644);  // as downloaded: a FastFile predecessor left it read-only
  *bytes = static_cast<uint64_t>(st.st_size);
  return true;
}

}  // namespace

Status WriteStagedManifest(const std::string& path, const std::vector<StagedFile>& files) {
  json doc = json::array();
  for (const StagedFile& f : files) doc.push_back(StagedFileToJson(f));
  return WriteFileAtomic(path, doc.dump());
}

Status RebaseStagedManifest(const std::string& manifest_path, const std::string& from, const std::string& to) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(manifest_path));
  json doc = json::parse(text, nullptr, false);
  if (!doc.is_array()) return Status::InvalidArgument("not a staged-files manifest: " + manifest_path);
  const std::string prefix = from + "/";
  for (json& e : doc) {
    if (!e.is_object() || !e.contains("path") || !e["path"].is_string()) continue;
    std::string p = e["path"].get<std::string>();
    if (StartsWith(p, prefix)) e["path"] = to + "/" + p.substr(prefix.size());
  }
  return WriteFileAtomic(manifest_path, doc.dump());
}

Result<StagingReport> StageChannels(objects::ObjectStore& store, const json& request, int host_index, int host_count,
                                    const std::string& opt_ml, const CancelFlag& cancel, const StageOptions& options) {
  auto start = std::chrono::steady_clock::now();
  StagingReport report;
  std::string role_arn = request.value("RoleArn", "");
  std::vector<Task> tasks;
  std::vector<bool> fast_file;
  if (request.contains("InputDataConfig") && request["InputDataConfig"].is_array()) {
    for (const json& ch : request["InputDataConfig"]) {
      ChannelReport cr;
      cr.name = ch.value("ChannelName", "");
      cr.mode = ChannelInputMode(request, ch);
      const json& ds = ch.contains("DataSource") ? ch["DataSource"] : json::object();
      bool file_system = ds.is_object() && ds.contains("FileSystemDataSource");
      bool other_group = false;
      if (!options.instance_group.empty() && ds.is_object() && ds.contains("S3DataSource") &&
          ds["S3DataSource"].contains("InstanceGroupNames")) {
        const json& groups = ds["S3DataSource"]["InstanceGroupNames"];
        other_group = std::find(groups.begin(), groups.end(), json(options.instance_group)) == groups.end();
      }
      if (cr.mode == "Pipe" || file_system || other_group) {
        report.channels.push_back(cr);
        fast_file.push_back(false);
        continue;
      }
      cr.staged = true;
      ASSIGN_OR_RETURN(auto selected, SelectChannelObjects(store, ch, role_arn));
      std::string distribution = ds["S3DataSource"].value("S3DataDistributionType", "FullyReplicated");
      auto share = ShardObjects(selected, distribution, host_index, host_count);
      std::string dir = opt_ml + "/input/data/" + cr.name;
      RETURN_IF_ERROR(MakeDirs(dir));
      if (share.empty()) {
        KLOG(warn, "channel share is empty",
             {{"channel", cr.name},
              {"host_index", std::to_string(host_index)},
              {"objects", std::to_string(selected.size())},
              {"hosts", std::to_string(host_count)}});
      }
      for (auto& o : share) tasks.push_back({report.channels.size(), dir, std::move(o)});
      report.channels.push_back(cr);
      fast_file.push_back(cr.mode == "FastFile");
    }
  }

  const KeptFiles kept = ReadKeptFiles(options.reuse_manifest);
  // Locals cannot carry GUARDED_BY: mu guards first_error, next, running and report's counts.
  Mutex mu;
  CondVar done_cv;
  Status first_error;
  size_t next = 0;
  int running = 0;
  CancelFlag abort;  // set on the first error or on `cancel`
  auto worker = [&] {
    while (true) {
      Task* task = nullptr;
      {
        MutexLock lock(mu);
        if (next < tasks.size() && !abort.cancelled()) task = &tasks[next++];
      }
      if (task == nullptr) break;
      auto path = PrepareConfinedPath(task->dir, task->object.rel_path);
      bool reused = false;
      uint64_t reused_size = 0;
      if (path.ok() && !task->object.etag.empty() && task->object.size) {
        auto it = kept.find({task->object.bucket, task->object.key, task->object.etag, *task->object.size});
        reused = it != kept.end() && TakeKeptFile(it->second, task->object, *path, &reused_size);
      }
      Result<uint64_t> bytes = reused      ? Result<uint64_t>(reused_size)
                               : path.ok() ? DownloadObjectToFile(store, task->object.bucket, task->object.key, *path,
                                                                  task->object.size, &abort, options.buffer_size)
                                           : Result<uint64_t>(path.status());
      std::optional<StagedFile> staged;
      if (bytes.ok() && !task->object.etag.empty()) {
        staged = StagedFile{task->object.bucket, task->object.key, task->object.etag, *bytes, *path};
        if (!StatStaged(*staged)) staged.reset();
      }
      MutexLock lock(mu);
      if (staged) report.files.push_back(std::move(*staged));
      if (reused) {
        report.reused_objects++;
        report.reused_bytes += reused_size;
      }
      if (!bytes.ok()) {
        if (first_error.ok() && !(abort.cancelled() && bytes.status().code() == StatusCode::kAborted)) {
          first_error = bytes.status();
        }
        abort.Cancel();
        break;
      }
      report.channels[task->channel].objects++;
      report.channels[task->channel].bytes += *bytes;
    }
    MutexLock lock(mu);
    --running;
    done_cv.NotifyAll();
  };
  int n = std::max(1, std::min<int>(options.parallelism, static_cast<int>(tasks.size())));
  std::vector<std::thread> threads;
  running = n;
  for (int i = 0; i < n; ++i) threads.emplace_back(worker);
  {
    MutexLock lock(mu);
    while (running > 0) {
      if (cancel.cancelled()) abort.Cancel();
      done_cv.WaitFor(mu, std::chrono::milliseconds(50));
    }
  }
  for (auto& t : threads) t.join();
  if (cancel.cancelled()) return Status::Aborted("input data download stopped");
  if (!first_error.ok()) return first_error;
  bool any_read_only = false;
  for (size_t i = 0; i < report.channels.size(); ++i) {
    if (fast_file[i]) {
      RETURN_IF_ERROR(MakeReadOnly(opt_ml + "/input/data/" + report.channels[i].name));
      any_read_only = true;
    }
    report.objects += report.channels[i].objects;
    report.bytes += report.channels[i].bytes;
  }
  if (any_read_only) {
    // chmod changed the files' change time: record them as the job will find them.
    std::vector<StagedFile> still;
    for (StagedFile& f : report.files) {
      if (StatStaged(f)) still.push_back(std::move(f));
    }
    report.files = std::move(still);
  }
  report.elapsed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  KLOG(info, "input data staged",
       {{"objects", std::to_string(report.objects)},
        {"bytes", std::to_string(report.bytes)},
        {"reused_objects", std::to_string(report.reused_objects)},
        {"seconds", std::to_string(report.elapsed_seconds)}});
  return report;
}

}  // namespace kiln::agent
