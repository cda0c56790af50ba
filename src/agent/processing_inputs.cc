#include "agent/processing_inputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "agent/errors.h"
#include "base/fs.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/mutex.h"

namespace kiln::agent {

using nlohmann::json;

json ProcessingInputChannel(const json& input, const std::string& channel_name) {
  json channel = {{"ChannelName", channel_name}};
  if (!input.is_object() || !input.contains("S3Input") || !input["S3Input"].is_object()) return channel;
  const json& s3 = input["S3Input"];
  channel["InputMode"] = s3.value("S3InputMode", "File");
  channel["CompressionType"] = s3.value("S3CompressionType", "None");
  channel["DataSource"] = {{"S3DataSource",
                            {{"S3DataType", s3.value("S3DataType", "S3Prefix")},
                             {"S3Uri", s3.value("S3Uri", "")},
                             {"S3DataDistributionType", s3.value("S3DataDistributionType", "FullyReplicated")}}}};
  return channel;
}

namespace {

// Streams the decompressed bytes of a gzip object into `path` (temp file, renamed when complete).
Result<uint64_t> DownloadGunzipped(objects::ObjectStore& store, const SelectedObject& object, const std::string& path,
                                   const CancelFlag& cancel, size_t buffer_size) {
  auto reader = store.GetObject(object.bucket, object.key, std::nullopt);
  if (!reader.ok()) return ObjectError(reader.status(), "Downloading", object.bucket, object.key);
  const std::string uri = "s3://" + object.bucket + "/" + object.key;
  GzipSource gunzip(**reader, uri);
  const std::string tmp = path + ".kiln-tmp-" + RandomHex(6);
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("create " + tmp, errno);
  auto fail = [&](Status s) {
    unlink(tmp.c_str());
    return s;
  };
  std::unique_ptr<char[]> buf(new char[buffer_size]);
  uint64_t total = 0;
  while (true) {
    if (cancel.cancelled()) return fail(Status::Aborted("download of " + uri + " cancelled"));
    auto n = gunzip.Read(buf.get(), buffer_size);
    if (!n.ok()) {
      if (n.status().code() == StatusCode::kDataLoss) {
        return fail(ClientError("The object " + uri +
                                " could not be decompressed with S3CompressionType Gzip: " + n.status().message() +
                                ". Please make sure every object of the input is gzip-compressed, or set "
                                "S3CompressionType to None."));
      }
      return fail(ObjectError(n.status(), "Downloading", object.bucket, object.key));
    }
    if (*n == 0) break;
    if (Status w = WriteAll(fd.get(), std::string_view(buf.get(), *n)); !w.ok()) return fail(w);
    total += *n;
  }
  if (close(fd.Release()) != 0) return fail(ErrnoStatus("close " + tmp, errno));
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail(ErrnoStatus("rename " + tmp, errno));
  return total;
}

}  // namespace

Result<InputStagingReport> StageProcessingInput(objects::ObjectStore& store, const json& input,
                                                const std::string& role_arn, int host_index, int host_count,
                                                const std::string& local_dir, const CancelFlag& cancel,
                                                const StageOptions& options) {
  const std::string name = input.value("InputName", "input");
  const json channel = ProcessingInputChannel(input, name);
  ASSIGN_OR_RETURN(std::vector<SelectedObject> selected, SelectChannelObjects(store, channel, role_arn));
  const std::string distribution = channel["DataSource"]["S3DataSource"].value("S3DataDistributionType", "");
  const bool gzip = channel.value("CompressionType", "None") == "Gzip";
  std::vector<SelectedObject> share = ShardObjects(selected, distribution, host_index, host_count);
  RETURN_IF_ERROR(MakeDirs(local_dir));
  if (share.empty()) {
    KLOG(warn, "processing input share is empty",
         {{"input", name}, {"host_index", std::to_string(host_index)}, {"objects", std::to_string(selected.size())}});
  }

  // Workers take the objects in order; the first error (or `cancel`) stops them all. Locals
  // cannot carry GUARDED_BY: mu guards next, first_error and report.
  Mutex mu;
  size_t next = 0;
  Status first_error;
  InputStagingReport report;
  CancelFlag abort;
  auto worker = [&] {
    while (true) {
      const SelectedObject* object = nullptr;
      {
        MutexLock lock(mu);
        if (next < share.size() && !abort.cancelled() && !cancel.cancelled()) object = &share[next++];
      }
      if (object == nullptr) return;
      auto path = PrepareConfinedPath(local_dir, object->rel_path);
      Result<uint64_t> bytes = !path.ok() ? Result<uint64_t>(path.status())
                               : gzip     ? DownloadGunzipped(store, *object, *path, cancel, options.buffer_size)
                                      : DownloadObjectToFile(store, object->bucket, object->key, *path, object->size,
                                                             &cancel, options.buffer_size);
      MutexLock lock(mu);
      if (!bytes.ok()) {
        if (first_error.ok()) first_error = bytes.status();
        abort.Cancel();
        return;
      }
      report.objects++;
      report.bytes += *bytes;
    }
  };
  const int n = std::max(1, std::min<int>(options.parallelism, static_cast<int>(share.size())));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  if (cancel.cancelled()) return Status::Aborted("input data download stopped");
  if (!first_error.ok()) return first_error;
  return report;
}

}  // namespace kiln::agent
