#pragma once
// Data capture (spec/serving-contract.md §14): each sampled invocation of an endpoint with a
// DataCaptureConfig becomes one JSON line in a capture file
//   <DestinationS3Uri>/<EndpointName>/<VariantName>/<yyyy>/<mm>/<dd>/<hh>/<mm>-<ss>-<mmm>-<uuid>.jsonl
// (the UTC time of the file's first invocation), written to the object store through a
// CaptureUploader (control/data_capture_uploader.h) when the file is flush_interval old or
// max_file_bytes large, or its hour is over.
//
// Best-effort and off the invoke path: Capture (and Invoked, the router's hook) decides the
// sample with the thread's PRNG and, for a sampled request, copies the bytes it keeps (input
// and/or output, content types, InferenceId) into a bounded buffer under one mutex, and returns.
// Encoding (text or base64), the JSON line, the event id and the upload happen on the writer
// thread. When the buffer holds max_pending_bytes the record is dropped and counted, never waited
// for; an upload that fails drops its file and is counted (and logged).
//
// A line:
//   {"captureData":{"endpointInput":{"observedContentType":"text/csv","mode":"INPUT",
//      "data":"1,2\n","encoding":"CSV"},"endpointOutput":{...,"mode":"OUTPUT",...}},
//    "eventMetadata":{"eventId":"<uuid>","inferenceId":"<id>","inferenceTime":"2024-05-01T10:00:03Z"},
//    "eventVersion":"0"}
// endpointInput only for Input/InputAndOutput, endpointOutput only for Output/InputAndOutput,
// inferenceId only when the client sent X-Amzn-SageMaker-Inference-Id. A content type whose
// media type (before ';', case-insensitive) is one of CsvContentTypes / JsonContentTypes is
// stored as text (encoding CSV / JSON) when the bytes are valid UTF-8; everything else BASE64.
// Only invocations the model answered with 2xx are captured.
//
// Thread-safety: Capture and Invoked may be called from any thread; Start/Stop from one.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/status.h"
#include "serving/router.h"

namespace kiln::serving {

class ShadowVariants;

// An endpoint's DataCaptureConfig as the invoke path uses it (parsed once per published route).
struct DataCaptureSettings {
  int sampling_percentage = 0;  // InitialSamplingPercentage, 0-100
  bool capture_input = false;
  bool capture_output = false;
  std::string bucket;                   // of DestinationS3Uri
  std::string prefix;                   // its key prefix without a trailing '/'; may be empty
  std::vector<std::string> csv_types;   // lower-case media types
  std::vector<std::string> json_types;  // lower-case media types
};

// The settings of a validated DataCaptureConfig (api/endpoint_configs.cc checks it); null when
// EnableCapture is false. InvalidArgument for a config the API would have refused (no s3:// URI,
// no capture option).
Result<std::shared_ptr<const DataCaptureSettings>> ParseDataCaptureConfig(const nlohmann::json& config);

// "CSV", "JSON" or "BASE64": how a body of `content_type` is stored under `settings`.
std::string_view CaptureEncoding(const DataCaptureSettings& settings, std::string_view content_type);

// Where capture files go. Called on the writer thread only.
class CaptureUploader {
 public:
  virtual ~CaptureUploader() = default;
  // Writes one whole capture file; an error drops it (counted in Stats::upload_failures).
  virtual Status Upload(const std::string& bucket, const std::string& key, const std::string& content) = 0;
};

struct DataCaptureOptions {
  // A file is written once its first record is this old (AWS: 60 s; config
  // data_capture.flush_interval_seconds). Shorter: more, smaller objects.
  std::chrono::milliseconds flush_interval{60000};
  // ... or once it holds this many bytes (AWS: 16 MB).
  size_t max_file_bytes = 16 * 1024 * 1024;
  // Copies waiting for the writer (records not yet in a file), in bytes; a record that would go
  // over is dropped. Bounds the memory capture can take when uploads fall behind.
  size_t max_pending_bytes = 64 * 1024 * 1024;
};

// What an endpoint's variant answered, for Capture. Views, valid for the call only.
struct CaptureInput {
  std::string_view endpoint;
  std::string_view variant;
  std::string_view input;
  std::string_view input_content_type;
  std::string_view output;
  std::string_view output_content_type;
  std::string_view inference_id;  // empty: not sent
  int64_t epoch_millis = 0;       // the invocation's time
};

class DataCapture : public InvocationObserver {
 public:
  // `uploader` must outlive the capture.
  DataCapture(DataCaptureOptions options, CaptureUploader* uploader);
  ~DataCapture() override;
  DataCapture(const DataCapture&) = delete;
  DataCapture& operator=(const DataCapture&) = delete;

  // Shadow copies of every observed invocation of a route with shadow variants go there (may be
  // null: none sent). Set before serving.
  void SetShadows(ShadowVariants* shadows) { shadows_ = shadows; }

  void Start();
  // Writes every open file, then ends the writer. Records captured afterwards are dropped.
  void Stop();

  // InvocationObserver: captures the production variant's answer (when `settings` has capture
  // and the request is sampled) and hands a copy to the shadows.
  void Invoked(const ObservedInvocation& invocation) override;

  // Samples and, when sampled, queues one record under `settings` (copies what it keeps).
  // Returns true when queued.
  bool Capture(const std::shared_ptr<const DataCaptureSettings>& settings, const CaptureInput& input);

  struct Stats {
    uint64_t captured = 0;         // records queued
    uint64_t dropped = 0;          // sampled but over max_pending_bytes (or after Stop)
    uint64_t files_written = 0;    // uploads that succeeded
    uint64_t upload_failures = 0;  // files lost to a failed upload
  };
  Stats stats() const EXCLUDES(mu_);

  // Writes every open file now (tests; Stop does it too).
  void FlushForTest() EXCLUDES(mu_);

 private:
  // One record on its way to a file. The fields are copied back to back into `data`: one
  // allocation per captured invocation on the invoke path.
  struct Record {
    enum Field { kEndpoint, kVariant, kInput, kInputType, kOutput, kOutputType, kInferenceId, kFields };
    std::shared_ptr<const DataCaptureSettings> settings;
    std::string data;
    size_t ends[kFields] = {};  // end offset of each field in `data`
    int64_t epoch_millis = 0;
    size_t bytes = 0;
    std::string_view Get(Field field) const {
      const size_t begin = field == kEndpoint ? 0 : ends[field - 1];
      return std::string_view(data).substr(begin, ends[field] - begin);
    }
  };
  // One capture file being filled (writer thread only).
  struct OpenFile {
    std::string bucket;
    std::string key;
    std::string content;
    int64_t opened_steady_ms = 0;
    int64_t hour = 0;  // epoch hour of its records
  };

  void Run() EXCLUDES(mu_);
  void Append(const Record& record);
  void WriteFile(OpenFile& file);
  void FlushDue(bool all);

  const DataCaptureOptions options_;
  CaptureUploader* const uploader_;
  ShadowVariants* shadows_ = nullptr;

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<Record> pending_ GUARDED_BY(mu_);
  size_t pending_bytes_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  bool flush_all_ GUARDED_BY(mu_) = false;
  uint64_t flush_requests_ GUARDED_BY(mu_) = 0;
  uint64_t flushes_done_ GUARDED_BY(mu_) = 0;
  Stats stats_ GUARDED_BY(mu_);

  // Writer thread only: by "<bucket>/<prefix>/<endpoint>/<variant>".
  std::map<std::string, OpenFile> files_;
  // Writer thread only: the last batch, emptied, swapped in as pending_ next time (its capacity
  // kept, so the invoke path seldom grows the vector).
  std::vector<Record> spare_;
  std::thread writer_;
};

}  // namespace kiln::serving
