#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <pugixml.hpp>
#include <utility>

#include "aws/sigv4.h"
#include "base/encoding.h"
#include "base/time.h"
#include "objects/s3_object_store_internal.h"

// S3ObjectStore's requests: construction, URL and signature, the curl transfer, error mapping and
// upload bodies (see s3_object_store_internal.h for the file map).

namespace kiln::objects {

namespace {

constexpr size_t kMaxResponseBody = 32 << 20;  // XML answers; object bodies never land here

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

// Metadata headers S3 stores and returns (object_store.h, ObjectInfo::headers).
bool IsStoredHeader(const std::string& lower) {
  static const char* kNames[] = {"content-type",  "content-encoding", "content-disposition", "content-language",
                                 "cache-control", "expires",          "x-amz-tagging-count"};
  for (const char* n : kNames) {
    if (lower == n) return true;
  }
  return StartsWith(lower, "x-amz-meta-");
}

}  // namespace

namespace s3_internal {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string StripQuotes(std::string_view etag) {
  etag = Trim(etag);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

// The ObjectStore reason (object_store.h) of an S3 error code answered as InvalidArgument.
static ErrorReason InvalidArgumentReason(const std::string& code) {
  if (code == "InvalidPart") return ErrorReason::kInvalidPart;
  if (code == "InvalidPartOrder") return ErrorReason::kInvalidPartOrder;
  if (code == "EntityTooSmall") return ErrorReason::kEntityTooSmall;
  if (code == "InvalidRange") return ErrorReason::kInvalidRange;
  if (code == "InvalidBucketName") return ErrorReason::kInvalidBucketName;
  if (code == "KeyTooLongError") return ErrorReason::kKeyTooLong;
  if (code == "InvalidArgument") return ErrorReason::kInvalidArgument;
  if (code == "InvalidRequest") return ErrorReason::kInvalidRequest;
  return ErrorReason::kNone;
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
  if (code == "EntityTooLarge") return Status(StatusCode::kResourceExhausted, text, ErrorReason::kEntityTooLarge);
  if (code == "BadDigest" || code == "XAmzContentSHA256Mismatch" || code == "InvalidDigest") {
    return Status(StatusCode::kDataLoss, "BadDigest: " + (message.empty() ? code : message), ErrorReason::kBadDigest);
  }
  if (code == "AccessDenied" || code == "AllAccessDisabled") return Status::PermissionDenied(text);
  if (code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "ExpiredToken" ||
      code == "InvalidToken" || code == "RequestTimeTooSkewed") {
    return Status::Unauthenticated(text);
  }
  if (code == "SlowDown" || code == "ServiceUnavailable" || code == "InternalError" || http_status >= 500) {
    return Status::Unavailable(text);
  }
  return Status(StatusCode::kInvalidArgument, text, InvalidArgumentReason(code));
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

Result<size_t> FileSource::Read(char* buf, size_t n) {
  if (pos_ >= size_) return size_t{0};
  ASSIGN_OR_RETURN(size_t got, PreadSome(fd_, buf, std::min<uint64_t>(n, size_ - pos_), pos_));
  if (got == 0) return Status::Internal("spool file shrank");
  pos_ += got;
  return got;
}

Status SizedBody::Prepare(ByteSource& data) {
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
      return Status::InvalidArgument("InvalidArgument: unsupported checksum algorithm: " + name)
          .WithReason(ErrorReason::kInvalidArgument);
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

}  // namespace s3_internal

using s3_internal::GlobalInit;
using s3_internal::HeaderCallback;
using s3_internal::MapError;

// ---- Construction ----

S3ObjectStore::S3ObjectStore(const Options& options)
    : options_(options), pool_(std::make_unique<HandlePool>(options.max_idle_handles)) {}

S3ObjectStore::~S3ObjectStore() = default;

Result<std::unique_ptr<S3ObjectStore>> S3ObjectStore::Open(const Options& options) {
  GlobalInit();
  std::string_view ep = options.endpoint;
  size_t sep = ep.find("://");
  if (sep == std::string_view::npos)
    return Status::InvalidArgument("s3 endpoint must be an http(s) URL: " + options.endpoint);
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

void S3ObjectStore::Prepare(const Request& request, Prepared& out) const {
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

  out.url = scheme_ + "://" + host + path + (raw_query.empty() ? "" : "?" + raw_query);
  bool has_content_type = false;
  for (const auto& [k, v] : signable.headers) {
    if (EqualsIgnoreCase(k, "content-length")) continue;  // curl sets it from the body size
    if (EqualsIgnoreCase(k, "content-type")) has_content_type = true;
    out.headers = curl_slist_append(out.headers, (k + ": " + v).c_str());
  }
  // Suppress curl's defaults: no 100-continue round trip, no form content type on POST.
  out.headers = curl_slist_append(out.headers, "Expect:");
  if (!has_content_type) out.headers = curl_slist_append(out.headers, "Content-Type:");
}

Result<S3ObjectStore::Response> S3ObjectStore::Perform(Request& request) {
  Prepared prep;
  Prepare(request, prep);
  std::unique_ptr<CURL, std::function<void(CURL*)>> handle(pool_->Acquire(), [this](CURL* h) { pool_->Release(h); });
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
    return Status::Unavailable(std::string("s3 request to ") + authority_ +
                               " failed: " + (errbuf[0] != 0 ? errbuf : curl_easy_strerror(rc)));
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

Result<S3ObjectStore::Response> S3ObjectStore::SendBody(Request& request, ByteSource& data, const PutOptions& options,
                                                        const std::string& fallback_404, uint64_t* size) {
  RETURN_IF_ERROR(s3_internal::AddPutHeaders(request, options));
  s3_internal::SizedBody body;
  RETURN_IF_ERROR(body.Prepare(data));
  request.body = body.source;
  Result<Response> resp = Perform(request);
  request.body = nullptr;  // `body` ends here
  if (!resp.ok()) return resp.status();
  if (resp->status >= 300) return MapError(resp->status, resp->body, fallback_404);
  *size = body.size;
  return resp;
}

}  // namespace kiln::objects
