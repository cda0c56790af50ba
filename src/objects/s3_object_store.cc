#include "objects/s3_object_store.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <pugixml.hpp>
#include <utility>

#include "aws/sigv4.h"
#include "base/encoding.h"
#include "base/fs.h"
#include "base/hash.h"
#include "base/strings.h"
#include "base/time.h"
#include "objects/validation.h"

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

// Idle easy handles, so that consecutive requests reuse connections.
class S3ObjectStore::HandlePool {
 public:
  explicit HandlePool(size_t max_idle) : max_idle_(max_idle) {}
  ~HandlePool() {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }
  CURL* Acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
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
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() < max_idle_) {
      idle_.push_back(h);
    } else {
      curl_easy_cleanup(h);
    }
  }

 private:
  size_t max_idle_;
  std::mutex mutex_;
  std::vector<CURL*> idle_;  // guarded by mutex_
};

namespace {

constexpr size_t kMaxResponseBody = 32 << 20;  // XML answers; object bodies never land here

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string StripQuotes(std::string_view etag) {
  etag = Trim(etag);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

// Maps an S3 error response to a Status with the ObjectStore contract's prefixes.
Status MapError(long http_status, const std::string& body, const std::string& fallback_404) {
  std::string code;
  std::string message;
  pugi::xml_document doc;
  if (!body.empty() && doc.load_buffer(body.data(), body.size())) {
    pugi::xml_node err = doc.child("Error");
    code = err.child_value("Code");
    message = err.child_value("Message");
  }
  if (code.empty()) {
    switch (http_status) {
      case 404: code = fallback_404; break;
      case 412: code = "PreconditionFailed"; break;
      case 403: code = "AccessDenied"; break;
      case 416: code = "InvalidRange"; break;
      case 409: code = "Conflict"; break;
      default: code = http_status >= 500 ? "InternalError" : "InvalidRequest"; break;
    }
  }
  std::string text = code + ": " + (message.empty() ? "HTTP " + std::to_string(http_status) : message);
  if (code == "NoSuchBucket") return Status(StatusCode::kNotFound, text, ErrorReason::kNoSuchBucket);
  if (code == "NoSuchKey") return Status(StatusCode::kNotFound, text, ErrorReason::kNoSuchKey);
  if (code == "NoSuchUpload") return Status(StatusCode::kNotFound, text, ErrorReason::kNoSuchUpload);
  if (code == "NotFound") return Status::NotFound(text);
  if (code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists") return Status::AlreadyExists(text);
  if (code == "BucketNotEmpty") return Status(StatusCode::kFailedPrecondition, text, ErrorReason::kBucketNotEmpty);
  if (code == "PreconditionFailed") {
    return Status(StatusCode::kFailedPrecondition, text, ErrorReason::kPreconditionFailed);
  }
  if (code == "Conflict") return Status::FailedPrecondition(text);
  if (code == "EntityTooLarge") return Status::ResourceExhausted(text);
  if (code == "BadDigest" || code == "XAmzContentSHA256Mismatch" || code == "InvalidDigest") {
    return Status::DataLoss("BadDigest: " + (message.empty() ? code : message));
  }
  if (code == "AccessDenied" || code == "AllAccessDisabled") return Status::PermissionDenied(text);
  if (code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "ExpiredToken" ||
      code == "InvalidToken" || code == "RequestTimeTooSkewed") {
    return Status::Unauthenticated(text);
  }
  if (code == "SlowDown" || code == "ServiceUnavailable" || code == "InternalError" || http_status >= 500) {
    return Status::Unavailable(text);
  }
  return Status::InvalidArgument(text);
}

size_t HeaderCallback(char* data, size_t size, size_t nitems, void* user) {
  auto* headers = static_cast<std::pair<HeaderMap*, bool*>*>(user);
  size_t n = size * nitems;
  std::string_view line(data, n);
  if (StartsWith(line, "HTTP/")) {
    headers->first->clear();  // a new response (after 100 Continue or a redirect)
    *headers->second = false;
    return n;
  }
  std::string_view trimmed = Trim(line);
  if (trimmed.empty()) {
    *headers->second = true;
    return n;
  }
  size_t colon = trimmed.find(':');
  if (colon != std::string_view::npos) {
    headers->first->emplace(ToLower(Trim(trimmed.substr(0, colon))), std::string(Trim(trimmed.substr(colon + 1))));
  }
  return n;
}

size_t CollectBody(char* data, size_t size, size_t nmemb, void* user) {
  auto* body = static_cast<std::string*>(user);
  size_t n = size * nmemb;
  if (body->size() + n > kMaxResponseBody) return 0;  // aborts the transfer
  body->append(data, n);
  return n;
}

size_t ReadBody(char* buf, size_t size, size_t nitems, void* user) {
  auto* req = static_cast<S3ObjectStore::Request*>(user);
  size_t want = size * nitems;
  Result<size_t> n = req->body->Read(buf, want);
  if (!n.ok()) {
    req->body_error = n.status();
    return CURL_READFUNC_ABORT;
  }
  for (auto& [name, hasher] : req->compute) hasher.Update(std::string_view(buf, *n));
  return *n;
}

// Metadata headers S3 stores and returns (object_store.h, ObjectInfo::headers).
bool IsStoredHeader(const std::string& lower) {
  static const char* kNames[] = {"content-type",  "content-encoding", "content-disposition",
                                 "content-language", "cache-control", "expires", "x-amz-tagging-count"};
  for (const char* n : kNames) {
    if (lower == n) return true;
  }
  return StartsWith(lower, "x-amz-meta-");
}

ObjectInfo InfoFromHeaders(const std::string& bucket, const std::string& key, const HeaderMap& headers) {
  ObjectInfo info;
  info.bucket = bucket;
  info.key = key;
  if (const std::string* v = FindHeader(headers, "content-range")) {
    // bytes a-b/total
    size_t slash = v->rfind('/');
    if (slash != std::string::npos) info.size = ParseUint64(v->substr(slash + 1)).value_or(0);
  } else if (const std::string* len = FindHeader(headers, "content-length")) {
    info.size = ParseUint64(*len).value_or(0);
  }
  if (const std::string* v = FindHeader(headers, "etag")) info.etag = StripQuotes(*v);
  if (const std::string* v = FindHeader(headers, "last-modified")) {
    info.last_modified_millis = ParseRfc1123(*v).value_or(0);
  }
  if (const std::string* v = FindHeader(headers, "x-amz-storage-class")) info.storage_class = *v;
  for (const auto& [name, value] : headers) {
    std::string lower = ToLower(name);
    if (IsStoredHeader(lower)) info.headers[lower] = value;
    if (StartsWith(lower, "x-amz-checksum-") && lower != "x-amz-checksum-type") {
      info.checksums[lower.substr(strlen("x-amz-checksum-"))] = value;
    }
  }
  return info;
}

// Reads a region of a file by pread (spooled bodies).
class FileSource final : public ByteSource {
 public:
  FileSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  Result<size_t> Read(char* buf, size_t n) override {
    if (pos_ >= size_) return size_t{0};
    ASSIGN_OR_RETURN(size_t got, PreadSome(fd_, buf, std::min<uint64_t>(n, size_ - pos_), pos_));
    if (got == 0) return Status::Internal("spool file shrank");
    pos_ += got;
    return got;
  }
  std::optional<uint64_t> size_hint() const override { return size_ - pos_; }

 private:
  int fd_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Copies a source of unknown length into an anonymous temp file so it can be sent with a
// Content-Length.
Result<std::pair<UniqueFd, uint64_t>> Spool(ByteSource& data) {
  const char* dir = std::getenv("TMPDIR");
  std::string tmp = dir != nullptr ? dir : "/tmp";
  UniqueFd fd(::open(tmp.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus("create spool file in " + tmp, errno);
  std::string buf(1 << 20, '\0');
  uint64_t total = 0;
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, data.Read(buf.data(), buf.size()));
    if (n == 0) break;
    RETURN_IF_ERROR(WriteAll(fd.get(), std::string_view(buf.data(), n)));
    total += n;
  }
  return std::make_pair(std::move(fd), total);
}

// An upload body with a known length, as S3 requires: the source itself when it knows its size,
// otherwise a spooled copy. Not movable: `file` reads `spooled`'s descriptor.
struct SizedBody {
  std::optional<std::pair<UniqueFd, uint64_t>> spooled;
  std::optional<FileSource> file;
  uint64_t size = 0;
  ByteSource* source = nullptr;

  SizedBody() = default;
  SizedBody(const SizedBody&) = delete;
  SizedBody& operator=(const SizedBody&) = delete;

  Status Prepare(ByteSource& data) {
    if (data.size_hint().has_value()) {
      size = *data.size_hint();
      source = &data;
      return Status::Ok();
    }
    ASSIGN_OR_RETURN(auto sp, Spool(data));
    spooled.emplace(std::move(sp));
    size = spooled->second;
    file.emplace(spooled->first.get(), spooled->second);
    source = &*file;
    return Status::Ok();
  }
};

}  // namespace

// ---- Construction ----

S3ObjectStore::S3ObjectStore(const Options& options)
    : options_(options), pool_(std::make_unique<HandlePool>(options.max_idle_handles)) {}

S3ObjectStore::~S3ObjectStore() = default;

Result<std::unique_ptr<S3ObjectStore>> S3ObjectStore::Open(const Options& options) {
  GlobalInit();
  std::string_view ep = options.endpoint;
  size_t sep = ep.find("://");
  if (sep == std::string_view::npos) return Status::InvalidArgument("s3 endpoint must be an http(s) URL: " + options.endpoint);
  std::string scheme = ToLower(ep.substr(0, sep));
  if (scheme != "http" && scheme != "https") {
    return Status::InvalidArgument("s3 endpoint must be an http(s) URL: " + options.endpoint);
  }
  std::string_view rest = ep.substr(sep + 3);
  size_t slash = rest.find('/');
  std::string authority(rest.substr(0, slash));
  std::string path = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (authority.empty()) return Status::InvalidArgument("s3 endpoint has no host: " + options.endpoint);
  std::unique_ptr<S3ObjectStore> store(new S3ObjectStore(options));
  store->scheme_ = scheme;
  store->authority_ = authority;
  store->base_path_ = path;
  return store;
}

namespace {
struct Prepared {
  std::string url;
  curl_slist* headers = nullptr;
  ~Prepared() { curl_slist_free_all(headers); }
};
}  // namespace

Result<S3ObjectStore::Response> S3ObjectStore::Perform(Request& request) {
  // ---- URL and signature ----
  std::string host = authority_;
  std::string path = base_path_;
  if (request.bucket.empty()) {
    path += "/";
  } else if (options_.path_style) {
    path += "/" + request.bucket;
    if (!request.key.empty()) path += "/" + UriEncode(request.key, /*keep_slash=*/true);
  } else {
    host = request.bucket + "." + authority_;
    path += "/" + UriEncode(request.key, /*keep_slash=*/true);
  }
  std::vector<std::pair<std::string, std::string>> q = request.query;
  std::sort(q.begin(), q.end());
  std::string raw_query;
  for (const auto& [k, v] : q) {
    if (!raw_query.empty()) raw_query += '&';
    raw_query += UriEncode(k) + "=" + UriEncode(v);
  }
  aws::OwnedSignable signable;
  signable.method = request.method;
  signable.raw_path = path;
  signable.raw_query = raw_query;
  signable.headers.emplace("host", host);
  for (const auto& [k, v] : request.headers) signable.headers.emplace(k, v);
  if (request.payload.has_value()) signable.headers.emplace("content-length", std::to_string(request.payload->size()));
  aws::SignOptions sign;
  sign.access_key_id = options_.access_key_id;
  sign.secret_access_key = options_.secret_access_key;
  sign.session_token = options_.session_token;
  sign.region = options_.region;
  sign.service = "s3";
  sign.s3 = true;
  if (request.body != nullptr) {
    sign.payload_hash = std::string(aws::kUnsignedPayload);
  } else if (request.payload.has_value()) {
    sign.payload_hash = Sha256Hex(*request.payload);
  } else {
    sign.payload_hash = std::string(aws::kEmptySha256);
  }
  aws::SignRequest(signable, sign);

  Prepared prep;
  prep.url = scheme_ + "://" + host + path + (raw_query.empty() ? "" : "?" + raw_query);
  bool has_content_type = false;
  for (const auto& [k, v] : signable.headers) {
    if (EqualsIgnoreCase(k, "content-length")) continue;  // curl sets it from the body size
    if (EqualsIgnoreCase(k, "content-type")) has_content_type = true;
    prep.headers = curl_slist_append(prep.headers, (k + ": " + v).c_str());
  }
  // Suppress curl's defaults: no 100-continue round trip, no form content type on POST.
  prep.headers = curl_slist_append(prep.headers, "Expect:");
  if (!has_content_type) prep.headers = curl_slist_append(prep.headers, "Content-Type:");

  // ---- Transfer ----
  std::unique_ptr<CURL, std::function<void(CURL*)>> handle(pool_->Acquire(),
                                                           [this](CURL* h) { pool_->Release(h); });
  if (!handle) return Status::Internal("curl_easy_init failed");
  CURL* h = handle.get();
  Response response;
  bool headers_done = false;
  std::pair<HeaderMap*, bool*> header_sink(&response.headers, &headers_done);
  char errbuf[CURL_ERROR_SIZE] = {0};
  std::optional<StringByteSource> payload_source;
  curl_easy_setopt(h, CURLOPT_URL, prep.url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, prep.headers);
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // keys like "a/./b" and "../x" are literal
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.stall_timeout_s));
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, HeaderCallback);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &header_sink);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, CollectBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &response.body);
  if (request.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    // PUT without a streamed body sends `payload` (or nothing) through the same read callback.
    if (request.body == nullptr) {
      payload_source.emplace(request.payload.has_value() ? std::string_view(*request.payload) : std::string_view());
      request.body = &*payload_source;
    }
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(h, CURLOPT_READDATA, &request);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body->size_hint().value_or(0)));
  } else if (request.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    const std::string& p = request.payload.has_value() ? *request.payload : std::string();
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(p.size()));
    curl_easy_setopt(h, CURLOPT_COPYPOSTFIELDS, p.c_str());
  } else if (request.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  CURLcode rc = curl_easy_perform(h);
  if (payload_source.has_value()) request.body = nullptr;
  if (rc != CURLE_OK) {
    if (!request.body_error.ok()) return request.body_error;
    return Status::Unavailable(std::string("s3 request to ") + authority_ + " failed: " +
                               (errbuf[0] != 0 ? errbuf : curl_easy_strerror(rc)));
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

// ---- Buckets ----

Status S3ObjectStore::CreateBucket(const std::string& bucket, const std::string& region) {
  // Same rules as the fs backend, checked here so that a bad name never reaches a URL.
  RETURN_IF_ERROR(ValidateBucketName(bucket));
  Request req;
  req.method = "PUT";
  req.bucket = bucket;
  std::string r = region.empty() ? options_.region : region;
  if (r != "us-east-1") {
    req.payload = "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>" +
                  XmlEscape(r) + "</LocationConstraint></CreateBucketConfiguration>";
    req.headers["content-type"] = "application/xml";
  }
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  return Status::Ok();
}

Status S3ObjectStore::DeleteBucket(const std::string& bucket) {
  Request req;
  req.method = "DELETE";
  req.bucket = bucket;
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  return Status::Ok();
}

Result<BucketInfo> S3ObjectStore::HeadBucket(const std::string& bucket) {
  Request req;
  req.method = "HEAD";
  req.bucket = bucket;
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  BucketInfo info;
  info.name = bucket;
  const std::string* region = FindHeader(resp.headers, "x-amz-bucket-region");
  info.region = region != nullptr ? *region : options_.region;
  // HEAD carries no creation date; ListBuckets does.
  auto all = ListBuckets();
  if (all.ok()) {
    for (const auto& b : *all) {
      if (b.name == bucket) info.creation_millis = b.creation_millis;
    }
  }
  return info;
}

Result<std::vector<BucketInfo>> S3ObjectStore::ListBuckets() {
  Request req;
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  pugi::xml_document doc;
  if (!doc.load_buffer(resp.body.data(), resp.body.size())) return Status::Unavailable("s3: unparsable ListBuckets");
  std::vector<BucketInfo> out;
  for (pugi::xml_node b : doc.child("ListAllMyBucketsResult").child("Buckets").children("Bucket")) {
    BucketInfo info;
    info.name = b.child_value("Name");
    info.creation_millis = ParseIso8601(b.child_value("CreationDate")).value_or(0);
    info.region = options_.region;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const BucketInfo& a, const BucketInfo& b) { return a.name < b.name; });
  return out;
}

// ---- Objects ----

namespace {

// Adds the checksum and metadata headers of `options` to `req`.
Status AddPutHeaders(S3ObjectStore::Request& req, const PutOptions& options) {
  for (const auto& [name, value] : options.headers) {
    std::string lower = ToLower(name);
    if (lower == "x-amz-tagging-count") continue;  // response-only
    req.headers[lower] = value;
  }
  for (const auto& [name, value] : options.expected_checksums) {
    std::string lower = ToLower(name);
    if (lower == "md5") {
      req.headers["content-md5"] = value;
    } else {
      req.headers["x-amz-checksum-" + lower] = value;
    }
  }
  for (const auto& [name, value] : options.verified_checksums) req.headers["x-amz-checksum-" + ToLower(name)] = value;
  for (const auto& name : options.compute_checksums) {
    S3Checksum::Algorithm algorithm;
    if (!S3Checksum::ParseAlgorithm(name, &algorithm)) {
      return Status::InvalidArgument("InvalidArgument: unsupported checksum algorithm: " + name);
    }
    req.compute.emplace(std::string(S3Checksum::Name(algorithm)), S3Checksum(algorithm));
  }
  if (options.if_match.has_value()) {
    std::string etag = StripQuotes(*options.if_match);
    req.headers["if-match"] = "\"" + etag + "\"";
  }
  if (options.if_none_match_star) req.headers["if-none-match"] = "*";
  return Status::Ok();
}

}  // namespace

Result<ObjectInfo> S3ObjectStore::PutObject(const std::string& bucket, const std::string& key, ByteSource& data,
                                            const PutOptions& options) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  Request req;
  req.method = "PUT";
  req.bucket = bucket;
  req.key = key;
  RETURN_IF_ERROR(AddPutHeaders(req, options));
  SizedBody body;
  RETURN_IF_ERROR(body.Prepare(data));
  req.body = body.source;
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  ObjectInfo info;
  info.bucket = bucket;
  info.key = key;
  if (const std::string* e = FindHeader(resp.headers, "etag")) info.etag = StripQuotes(*e);
  info.size = body.size;
  info.last_modified_millis = NowMillis();
  info.headers = options.headers;
  for (auto& [name, hasher] : req.compute) info.checksums[name] = hasher.FinalBase64();
  for (const auto& [name, value] : options.expected_checksums) {
    if (ToLower(name) != "md5") info.checksums[ToLower(name)] = value;
  }
  for (const auto& [name, value] : options.verified_checksums) info.checksums[ToLower(name)] = value;
  // The authoritative size and time come from the service.
  auto head = HeadObject(bucket, key);
  if (head.ok() && head->etag == info.etag) {
    info.size = head->size;
    info.last_modified_millis = head->last_modified_millis;
  }
  return info;
}

Result<ObjectInfo> S3ObjectStore::HeadObject(const std::string& bucket, const std::string& key) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  Request req;
  req.method = "HEAD";
  req.bucket = bucket;
  req.key = key;
  req.headers["x-amz-checksum-mode"] = "ENABLED";
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status == 404) {
    // HEAD has no body to say which is missing: ask about the bucket.
    Request breq;
    breq.method = "HEAD";
    breq.bucket = bucket;
    ASSIGN_OR_RETURN(Response bresp, Perform(breq));
    if (bresp.status == 404) return Status::NotFound("NoSuchBucket: the specified bucket does not exist").WithReason(ErrorReason::kNoSuchBucket);
    return Status::NotFound("NoSuchKey: the specified key does not exist").WithReason(ErrorReason::kNoSuchKey);
  }
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchKey");
  return InfoFromHeaders(bucket, key, resp.headers);
}

namespace {

// Streams a GET response: the transfer runs on the reader's thread through a private multi
// handle and pauses whenever `limit` bytes are waiting to be read.
class S3ObjectReader final : public ObjectReader {
 public:
  S3ObjectReader(CURL* easy, std::function<void(CURL*)> release, size_t limit)
      : easy_(easy), release_(std::move(release)), limit_(limit), multi_(curl_multi_init()) {}
  ~S3ObjectReader() override {
    if (multi_ != nullptr) {
      curl_multi_remove_handle(multi_, easy_);
      curl_multi_cleanup(multi_);
    }
    // A transfer abandoned mid-body leaves its connection unusable; curl closes it on reset.
    release_(easy_);
    curl_slist_free_all(headers_list_);
  }

  // Starts the transfer and waits for the response headers.
  Status Start(curl_slist* headers_list) {
    headers_list_ = headers_list;
    curl_easy_setopt(easy_, CURLOPT_HEADERFUNCTION, HeaderCallback);
    curl_easy_setopt(easy_, CURLOPT_HEADERDATA, &header_sink_);
    curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &S3ObjectReader::Write);
    curl_easy_setopt(easy_, CURLOPT_WRITEDATA, this);
    curl_multi_add_handle(multi_, easy_);
    while (!headers_done_ && !finished_) RETURN_IF_ERROR(Pump());
    curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &status_);
    return Status::Ok();
  }
  long status() const { return status_; }
  const HeaderMap& headers() const { return headers_; }
  // For error responses: the whole (small) body.
  Result<std::string> DrainBody() {
    while (!finished_) RETURN_IF_ERROR(Pump());
    RETURN_IF_ERROR(result_);
    return buffer_.substr(offset_);
  }
  void set_info(ObjectInfo info, uint64_t length) {
    info_ = std::move(info);
    length_ = length;
  }

  Result<size_t> Read(char* buf, size_t n) override {
    while (offset_ == buffer_.size()) {
      if (finished_) {
        RETURN_IF_ERROR(result_);
        if (delivered_ != length_) return Status::Unavailable("s3: object body ended early");
        return size_t{0};
      }
      RETURN_IF_ERROR(Pump());
    }
    size_t take = std::min(n, buffer_.size() - offset_);
    std::memcpy(buf, buffer_.data() + offset_, take);
    offset_ += take;
    if (offset_ == buffer_.size()) {
      buffer_.clear();
      offset_ = 0;
    }
    return take;
  }
  std::optional<uint64_t> size_hint() const override { return length_; }
  const ObjectInfo& info() const override { return info_; }

 private:
  static size_t Write(char* data, size_t size, size_t nmemb, void* user) {
    auto* self = static_cast<S3ObjectReader*>(user);
    size_t n = size * nmemb;
    if (self->buffer_.size() - self->offset_ >= self->limit_) {
      self->paused_ = true;
      return CURL_WRITEFUNC_PAUSE;
    }
    self->buffer_.append(data, n);
    self->delivered_ += n;
    return n;
  }

  Status Pump() {
    if (paused_ && buffer_.size() - offset_ < limit_) {
      paused_ = false;
      curl_easy_pause(easy_, CURLPAUSE_CONT);
    }
    int running = 0;
    CURLMcode mc = curl_multi_perform(multi_, &running);
    if (mc != CURLM_OK) return Status::Unavailable(std::string("s3: ") + curl_multi_strerror(mc));
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &queued)) {
      if (msg->msg == CURLMSG_DONE) {
        finished_ = true;
        if (msg->data.result != CURLE_OK) {
          result_ = Status::Unavailable(std::string("s3 transfer failed: ") + curl_easy_strerror(msg->data.result));
        }
      }
    }
    if (!finished_ && running > 0 && !(paused_ && buffer_.size() - offset_ >= limit_)) {
      curl_multi_poll(multi_, nullptr, 0, 1000, nullptr);
    }
    return Status::Ok();
  }

  CURL* easy_;
  std::function<void(CURL*)> release_;
  size_t limit_;
  CURLM* multi_;
  curl_slist* headers_list_ = nullptr;
  HeaderMap headers_;
  bool headers_done_ = false;
  std::pair<HeaderMap*, bool*> header_sink_{&headers_, &headers_done_};
  std::string buffer_;
  size_t offset_ = 0;
  bool paused_ = false;
  bool finished_ = false;
  Status result_;
  long status_ = 0;
  uint64_t delivered_ = 0;
  uint64_t length_ = 0;
  ObjectInfo info_;
};

}  // namespace

Result<std::unique_ptr<ObjectReader>> S3ObjectStore::GetObject(const std::string& bucket, const std::string& key,
                                                               std::optional<ByteRange> range) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  // Sign like Perform does, but run the transfer through the streaming reader.
  std::string host = options_.path_style ? authority_ : bucket + "." + authority_;
  std::string path = base_path_ + (options_.path_style ? "/" + bucket : "") + "/" + UriEncode(key, true);
  aws::OwnedSignable signable;
  signable.method = "GET";
  signable.raw_path = path;
  signable.headers.emplace("host", host);
  signable.headers.emplace("x-amz-checksum-mode", "ENABLED");
  if (range.has_value()) {
    signable.headers.emplace("range", "bytes=" + std::to_string(range->first) + "-" + std::to_string(range->last));
  }
  aws::SignOptions sign;
  sign.access_key_id = options_.access_key_id;
  sign.secret_access_key = options_.secret_access_key;
  sign.session_token = options_.session_token;
  sign.region = options_.region;
  sign.service = "s3";
  sign.s3 = true;
  sign.payload_hash = std::string(aws::kEmptySha256);
  aws::SignRequest(signable, sign);
  curl_slist* list = nullptr;
  for (const auto& [k, v] : signable.headers) list = curl_slist_append(list, (k + ": " + v).c_str());

  CURL* h = pool_->Acquire();
  if (h == nullptr) {
    curl_slist_free_all(list);
    return Status::Internal("curl_easy_init failed");
  }
  std::string url = scheme_ + "://" + host + path;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());  // curl copies the string
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
  auto reader = std::make_unique<S3ObjectReader>(h, [this](CURL* c) { pool_->Release(c); },
                                                 std::max<size_t>(options_.read_buffer_bytes, 64 * 1024));
  RETURN_IF_ERROR(reader->Start(list));
  if (reader->status() >= 300) {
    ASSIGN_OR_RETURN(std::string body, reader->DrainBody());
    return MapError(reader->status(), body, "NoSuchKey");
  }
  ObjectInfo info = InfoFromHeaders(bucket, key, reader->headers());
  uint64_t length = info.size;
  if (const std::string* len = FindHeader(reader->headers(), "content-length")) {
    length = ParseUint64(*len).value_or(length);
  }
  reader->set_info(std::move(info), length);
  return std::unique_ptr<ObjectReader>(std::move(reader));
}

Status S3ObjectStore::DeleteObject(const std::string& bucket, const std::string& key) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  Request req;
  req.method = "DELETE";
  req.bucket = bucket;
  req.key = key;
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status == 404) {
    Status s = MapError(resp.status, resp.body, "NoSuchBucket");
    if (s.Is(ErrorReason::kNoSuchKey)) return Status::Ok();
    return s;
  }
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  return Status::Ok();
}

Result<ListResult> S3ObjectStore::ListObjects(const std::string& bucket, const ListOptions& options) {
  Request req;
  req.bucket = bucket;
  req.query = {{"list-type", "2"}, {"encoding-type", "url"}, {"max-keys", std::to_string(options.max_keys)}};
  if (!options.prefix.empty()) req.query.emplace_back("prefix", options.prefix);
  if (!options.delimiter.empty()) req.query.emplace_back("delimiter", options.delimiter);
  if (!options.start_after.empty()) req.query.emplace_back("start-after", options.start_after);
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  pugi::xml_document doc;
  if (!doc.load_buffer(resp.body.data(), resp.body.size())) return Status::Unavailable("s3: unparsable ListObjectsV2");
  pugi::xml_node root = doc.child("ListBucketResult");
  bool url_encoded = std::string(root.child_value("EncodingType")) == "url";
  auto decode = [&](const char* text) {
    if (!url_encoded) return std::string(text);
    return UriDecode(text, /*plus_is_space=*/true).value_or(std::string(text));
  };
  ListResult result;
  result.truncated = std::string(root.child_value("IsTruncated")) == "true";
  std::string last;
  for (pugi::xml_node c : root.children("Contents")) {
    ObjectInfo info;
    info.bucket = bucket;
    info.key = decode(c.child_value("Key"));
    info.size = ParseUint64(c.child_value("Size")).value_or(0);
    info.etag = StripQuotes(c.child_value("ETag"));
    info.last_modified_millis = ParseIso8601(c.child_value("LastModified")).value_or(0);
    if (*c.child_value("StorageClass") != 0) info.storage_class = c.child_value("StorageClass");
    last = std::max(last, info.key);
    result.objects.push_back(std::move(info));
  }
  for (pugi::xml_node p : root.children("CommonPrefixes")) {
    std::string prefix = decode(p.child_value("Prefix"));
    last = std::max(last, prefix);
    // A service may repeat the prefix that the previous page ended with; it was returned already.
    if (!options.start_after.empty() && prefix <= options.start_after) continue;
    result.common_prefixes.push_back(std::move(prefix));
  }
  result.next_marker = last;
  return result;
}

Result<ObjectInfo> S3ObjectStore::CopyObject(const std::string& src_bucket, const std::string& src_key,
                                             const std::string& dst_bucket, const std::string& dst_key,
                                             const std::optional<std::map<std::string, std::string>>& replace_headers) {
  Request req;
  req.method = "PUT";
  req.bucket = dst_bucket;
  req.key = dst_key;
  req.headers["x-amz-copy-source"] = "/" + src_bucket + "/" + UriEncode(src_key, true);
  if (replace_headers.has_value()) {
    req.headers["x-amz-metadata-directive"] = "REPLACE";
    for (const auto& [k, v] : *replace_headers) req.headers[ToLower(k)] = v;
  }
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchKey");
  // S3 may report a late failure as 200 with an <Error> body.
  if (resp.body.find("<Error>") != std::string::npos) return MapError(500, resp.body, "InternalError");
  return HeadObject(dst_bucket, dst_key);
}

// ---- Multipart ----

Result<MultipartUpload> S3ObjectStore::CreateMultipartUpload(const std::string& bucket, const std::string& key,
                                                             const std::map<std::string, std::string>& headers,
                                                             const std::string& checksum_algorithm) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  Request req;
  req.method = "POST";
  req.bucket = bucket;
  req.key = key;
  req.query = {{"uploads", ""}};
  for (const auto& [k, v] : headers) req.headers[ToLower(k)] = v;
  if (!checksum_algorithm.empty()) {
    std::string upper = checksum_algorithm;
    for (char& c : upper) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
    req.headers["x-amz-checksum-algorithm"] = upper;
  }
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  pugi::xml_document doc;
  if (!doc.load_buffer(resp.body.data(), resp.body.size())) return Status::Unavailable("s3: unparsable response");
  MultipartUpload up;
  up.bucket = bucket;
  up.key = key;
  up.upload_id = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
  if (up.upload_id.empty()) return Status::Unavailable("s3: CreateMultipartUpload returned no UploadId");
  up.initiated_millis = NowMillis();
  up.headers = headers;
  up.checksum_algorithm = ToLower(checksum_algorithm);
  return up;
}

Result<PartInfo> S3ObjectStore::SendPart(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, uint32_t part_number, ByteSource& data,
                                         const PutOptions& options) {
  Request req;
  req.method = "PUT";
  req.bucket = bucket;
  req.key = key;
  req.query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}};
  RETURN_IF_ERROR(AddPutHeaders(req, options));
  SizedBody body;
  RETURN_IF_ERROR(body.Prepare(data));
  req.body = body.source;
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchUpload");
  PartInfo part;
  part.part_number = part_number;
  part.size = body.size;
  if (const std::string* e = FindHeader(resp.headers, "etag")) part.etag = StripQuotes(*e);
  part.last_modified_millis = NowMillis();
  for (auto& [name, hasher] : req.compute) part.checksums[name] = hasher.FinalBase64();
  for (const auto& [name, value] : resp.headers) {
    std::string lower = ToLower(name);
    if (StartsWith(lower, "x-amz-checksum-")) part.checksums[lower.substr(strlen("x-amz-checksum-"))] = value;
  }
  return part;
}

Result<PartInfo> S3ObjectStore::UploadPart(const std::string& bucket, const std::string& key,
                                           const std::string& upload_id, uint32_t part_number, ByteSource& data,
                                           const PutOptions& options) {
  if (part_number < 1 || part_number > 10000) {
    return Status::InvalidArgument("InvalidArgument: part number must be an integer between 1 and 10000");
  }
  return SendPart(bucket, key, upload_id, part_number, data, options);
}

Result<PartInfo> S3ObjectStore::UploadPartCopy(const std::string& bucket, const std::string& key,
                                               const std::string& upload_id, uint32_t part_number,
                                               const std::string& src_bucket, const std::string& src_key,
                                               std::optional<ByteRange> range) {
  if (part_number < 1 || part_number > 10000) {
    return Status::InvalidArgument("InvalidArgument: part number must be an integer between 1 and 10000");
  }
  Request req;
  req.method = "PUT";
  req.bucket = bucket;
  req.key = key;
  req.query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}};
  req.headers["x-amz-copy-source"] = "/" + src_bucket + "/" + UriEncode(src_key, true);
  uint64_t size = 0;
  if (range.has_value()) {
    req.headers["x-amz-copy-source-range"] =
        "bytes=" + std::to_string(range->first) + "-" + std::to_string(range->last);
    size = range->last - range->first + 1;
  } else {
    ASSIGN_OR_RETURN(ObjectInfo src, HeadObject(src_bucket, src_key));
    size = src.size;
  }
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchUpload");
  pugi::xml_document doc;
  if (!doc.load_buffer(resp.body.data(), resp.body.size())) return Status::Unavailable("s3: unparsable response");
  if (doc.child("Error")) return MapError(500, resp.body, "InternalError");
  PartInfo part;
  part.part_number = part_number;
  part.size = size;
  part.etag = StripQuotes(doc.child("CopyPartResult").child_value("ETag"));
  part.last_modified_millis =
      ParseIso8601(doc.child("CopyPartResult").child_value("LastModified")).value_or(NowMillis());
  return part;
}

Result<ObjectInfo> S3ObjectStore::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                                          const std::string& upload_id,
                                                          const std::vector<CompletedPart>& parts) {
  std::string xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const auto& p : parts) {
    xml += "<Part><PartNumber>" + std::to_string(p.part_number) + "</PartNumber><ETag>\"" +
           XmlEscape(StripQuotes(p.etag)) + "\"</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  Request req;
  req.method = "POST";
  req.bucket = bucket;
  req.key = key;
  req.query = {{"uploadId", upload_id}};
  req.headers["content-type"] = "application/xml";
  req.payload = std::move(xml);
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchUpload");
  if (resp.body.find("<Error>") != std::string::npos) return MapError(500, resp.body, "InternalError");
  return HeadObject(bucket, key);
}

Status S3ObjectStore::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                           const std::string& upload_id) {
  Request req;
  req.method = "DELETE";
  req.bucket = bucket;
  req.key = key;
  req.query = {{"uploadId", upload_id}};
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchUpload");
  return Status::Ok();
}

Result<std::vector<PartInfo>> S3ObjectStore::ListParts(const std::string& bucket, const std::string& key,
                                                       const std::string& upload_id, uint32_t part_number_marker,
                                                       uint32_t max_parts, bool* truncated) {
  Request req;
  req.bucket = bucket;
  req.key = key;
  req.query = {{"uploadId", upload_id}, {"max-parts", std::to_string(max_parts == 0 ? 1000 : max_parts)}};
  if (part_number_marker > 0) req.query.emplace_back("part-number-marker", std::to_string(part_number_marker));
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchUpload");
  pugi::xml_document doc;
  if (!doc.load_buffer(resp.body.data(), resp.body.size())) return Status::Unavailable("s3: unparsable ListParts");
  pugi::xml_node root = doc.child("ListPartsResult");
  if (truncated != nullptr) *truncated = std::string(root.child_value("IsTruncated")) == "true";
  std::vector<PartInfo> out;
  for (pugi::xml_node p : root.children("Part")) {
    PartInfo part;
    part.part_number = static_cast<uint32_t>(ParseUint64(p.child_value("PartNumber")).value_or(0));
    part.size = ParseUint64(p.child_value("Size")).value_or(0);
    part.etag = StripQuotes(p.child_value("ETag"));
    part.last_modified_millis = ParseIso8601(p.child_value("LastModified")).value_or(0);
    for (pugi::xml_node c : p.children()) {
      std::string name = c.name();
      if (StartsWith(name, "Checksum")) part.checksums[ToLower(name.substr(8))] = c.child_value();
    }
    out.push_back(std::move(part));
  }
  return out;
}

Result<MultipartUpload> S3ObjectStore::GetMultipartUpload(const std::string& bucket, const std::string& key,
                                                          const std::string& upload_id) {
  ListUploadsOptions o;
  o.prefix = key;
  for (int guard = 0; guard < 1000; ++guard) {
    ASSIGN_OR_RETURN(auto page, ListMultipartUploads(bucket, o));
    for (auto& u : page.uploads) {
      if (u.key == key && u.upload_id == upload_id) return u;
    }
    if (!page.truncated) break;
    o.key_marker = page.next_key_marker;
    o.upload_id_marker = page.next_upload_id_marker;
  }
  return Status::NotFound("NoSuchUpload: the specified upload does not exist: " + upload_id)
      .WithReason(ErrorReason::kNoSuchUpload);
}

Result<ListUploadsResult> S3ObjectStore::ListMultipartUploads(const std::string& bucket,
                                                              const ListUploadsOptions& options) {
  Request req;
  req.bucket = bucket;
  req.query = {{"uploads", ""},
               {"encoding-type", "url"},
               {"max-uploads", std::to_string(options.max_uploads == 0 ? 1000 : options.max_uploads)}};
  if (!options.prefix.empty()) req.query.emplace_back("prefix", options.prefix);
  if (!options.key_marker.empty()) req.query.emplace_back("key-marker", options.key_marker);
  if (!options.upload_id_marker.empty()) req.query.emplace_back("upload-id-marker", options.upload_id_marker);
  ASSIGN_OR_RETURN(Response resp, Perform(req));
  if (resp.status >= 300) return MapError(resp.status, resp.body, "NoSuchBucket");
  pugi::xml_document doc;
  if (!doc.load_buffer(resp.body.data(), resp.body.size())) {
    return Status::Unavailable("s3: unparsable ListMultipartUploads");
  }
  pugi::xml_node root = doc.child("ListMultipartUploadsResult");
  bool url_encoded = std::string(root.child_value("EncodingType")) == "url";
  auto decode = [&](const char* text) {
    if (!url_encoded) return std::string(text);
    return UriDecode(text, true).value_or(std::string(text));
  };
  ListUploadsResult result;
  result.truncated = std::string(root.child_value("IsTruncated")) == "true";
  result.next_key_marker = decode(root.child_value("NextKeyMarker"));
  result.next_upload_id_marker = root.child_value("NextUploadIdMarker");
  for (pugi::xml_node u : root.children("Upload")) {
    MultipartUpload up;
    up.bucket = bucket;
    up.key = decode(u.child_value("Key"));
    up.upload_id = u.child_value("UploadId");
    up.initiated_millis = ParseIso8601(u.child_value("Initiated")).value_or(0);
    up.checksum_algorithm = ToLower(u.child_value("ChecksumAlgorithm"));
    result.uploads.push_back(std::move(up));
  }
  return result;
}

}  // namespace kiln::objects
