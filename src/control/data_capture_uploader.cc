#include "control/data_capture_uploader.h"

#include <chrono>
#include <thread>

#include "base/io.h"

namespace kiln::control {

Status ObjectStoreCaptureUploader::Upload(const std::string& bucket, const std::string& key,
                                          const std::string& content) {
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
    StringByteSource source(content);
    objects::PutOptions put;
    put.headers["Content-Type"] = "application/jsonlines";
    auto written = objects_->PutObject(bucket, key, source, put);
    if (written.ok()) return Status::Ok();
    last = written.status();
    if (last.code() == StatusCode::kNotFound || last.code() == StatusCode::kInvalidArgument) break;
  }
  return last;
}

}  // namespace kiln::control
