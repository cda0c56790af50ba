#pragma once
// Writes data capture files (serving/data_capture.h, spec/serving-contract.md §14) into the
// object store: one PutObject per file, Content-Type application/jsonlines, tried up to three
// times (a missing bucket is not retried: the file is lost, counted and logged by DataCapture).
//
// Thread-safety: as the ObjectStore (called from DataCapture's writer thread only).

#include "objects/object_store.h"
#include "serving/data_capture.h"

namespace kiln::control {

class ObjectStoreCaptureUploader : public serving::CaptureUploader {
 public:
  // `objects` must outlive the uploader.
  explicit ObjectStoreCaptureUploader(objects::ObjectStore* objects) : objects_(objects) {}

  // serving::CaptureUploader
  Status Upload(const std::string& bucket, const std::string& key, const std::string& content) override;

 private:
  objects::ObjectStore* const objects_;
};

}  // namespace kiln::control
