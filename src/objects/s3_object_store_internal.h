#pragma once
// Internal to S3ObjectStore, shared by its three source files; nothing outside objects/ includes it.
//   s3_request.cc       requests: URL, SigV4 signing, the curl transfer, error mapping, upload
//                       bodies (Perform and the helpers below)
//   s3_object_store.cc  buckets and objects (the streaming GetObject reader lives there)
//   s3_multipart.cc     multipart uploads

#include <curl/curl.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/fs.h"
#include "base/hash.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "objects/s3_object_store.h"

namespace kiln::objects {

// One HTTP exchange with the service. Headers are lower-case and all signed.
struct S3ObjectStore::Request {
  std::string method = "GET";
  std::string bucket;  // empty: service-level (ListBuckets)
  std::string key;     // empty: bucket-level
  std::vector<std::pair<std::string, std::string>> query;
  std::map<std::string, std::string> headers;
  ByteSource* body = nullptr;          // streamed with UNSIGNED-PAYLOAD; size must be known
  std::optional<std::string> payload;  // small body, signed with its SHA-256
  // Checksums to compute over `body` while sending (lower-case names); results land here.
  std::map<std::string, S3Checksum> compute;
  Status body_error;  // set when `body` failed mid-transfer
};

struct S3ObjectStore::Response {
  long status = 0;
  HeaderMap headers;
  std::string body;
};

// A signed request ready for curl: its URL and header list (owned; freed on destruction unless
// released to whoever takes over the transfer).
struct S3ObjectStore::Prepared {
  std::string url;
  curl_slist* headers = nullptr;

  Prepared() = default;
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
  ~Prepared() { curl_slist_free_all(headers); }
  curl_slist* ReleaseHeaders() { return std::exchange(headers, nullptr); }
};

// Idle easy handles, so that consecutive requests reuse connections.
class S3ObjectStore::HandlePool {
 public:
  explicit HandlePool(size_t max_idle) : max_idle_(max_idle) {}
  ~HandlePool() {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }
  CURL* Acquire() {
    {
      MutexLock lock(mutex_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        curl_easy_reset(h);
        return h;
      }
    }
    return curl_easy_init();
  }
  void Release(CURL* h) {
    if (h == nullptr) return;
    MutexLock lock(mutex_);
    if (idle_.size() < max_idle_) {
      idle_.push_back(h);
    } else {
      curl_easy_cleanup(h);
    }
  }

 private:
  size_t max_idle_;
  Mutex mutex_;
  std::vector<CURL*> idle_ GUARDED_BY(mutex_);
};

namespace s3_internal {

// Once per process, before the first handle.
void GlobalInit();

// An ETag without surrounding whitespace and quotes.
std::string StripQuotes(std::string_view etag);

// Maps an S3 error response to a Status with the ObjectStore contract's codes, reasons and
// message prefixes. `fallback_404` names the error when a 404 has no XML body to say which.
Status MapError(long http_status, const std::string& body, const std::string& fallback_404);

// curl CURLOPT_HEADERFUNCTION collecting into a std::pair<HeaderMap*, bool* headers_done>.
size_t HeaderCallback(char* data, size_t size, size_t nitems, void* user);

// Object metadata from HEAD/GET response headers (size from Content-Range when ranged).
ObjectInfo InfoFromHeaders(const std::string& bucket, const std::string& key, const HeaderMap& headers);

// Adds the checksum, conditional and metadata headers of `options` to `request`.
Status AddPutHeaders(S3ObjectStore::Request& request, const PutOptions& options);

// Reads a region of a file by pread (spooled bodies).
class FileSource final : public ByteSource {
 public:
  FileSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  Result<size_t> Read(char* buf, size_t n) override;
  std::optional<uint64_t> size_hint() const override { return size_ - pos_; }

 private:
  int fd_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// An upload body with a known length, as S3 requires: the source itself when it knows its size,
// otherwise a copy spooled to an anonymous temp file. Not movable: `file` reads `spooled`'s
// descriptor.
struct SizedBody {
  std::optional<std::pair<UniqueFd, uint64_t>> spooled;
  std::optional<FileSource> file;
  uint64_t size = 0;
  ByteSource* source = nullptr;

  SizedBody() = default;
  SizedBody(const SizedBody&) = delete;
  SizedBody& operator=(const SizedBody&) = delete;

  Status Prepare(ByteSource& data);
};

}  // namespace s3_internal
}  // namespace kiln::objects
