#include "objects/s3_object_store.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <pugixml.hpp>
#include <utility>

#include "base/encoding.h"
#include "base/strings.h"
#include "base/time.h"
#include "objects/s3_object_store_internal.h"
#include "objects/validation.h"

// S3ObjectStore's buckets and objects. Requests, signing and error mapping are in s3_request.cc,
// multipart uploads in s3_multipart.cc.

namespace kiln::objects {

using s3_internal::HeaderCallback;
using s3_internal::InfoFromHeaders;
using s3_internal::MapError;
using s3_internal::StripQuotes;

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

Result<ObjectInfo> S3ObjectStore::PutObject(const std::string& bucket, const std::string& key, ByteSource& data,
                                            const PutOptions& options) {
  RETURN_IF_ERROR(ValidateObjectKey(key));
  Request req;
  req.method = "PUT";
  req.bucket = bucket;
  req.key = key;
  uint64_t size = 0;
  ASSIGN_OR_RETURN(Response resp, SendBody(req, data, options, "NoSuchBucket", &size));
  ObjectInfo info;
  info.bucket = bucket;
  info.key = key;
  if (const std::string* e = FindHeader(resp.headers, "etag")) info.etag = StripQuotes(*e);
  info.size = size;
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
    if (bresp.status == 404)
      return Status::NotFound("NoSuchBucket: the specified bucket does not exist")
          .WithReason(ErrorReason::kNoSuchBucket);
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
  // Signed like every request, but the transfer runs through the streaming reader.
  Request req;
  req.bucket = bucket;
  req.key = key;
  req.headers["x-amz-checksum-mode"] = "ENABLED";
  if (range.has_value()) {
    req.headers["range"] = "bytes=" + std::to_string(range->first) + "-" + std::to_string(range->last);
  }
  Prepared prep;
  Prepare(req, prep);
  CURL* h = pool_->Acquire();
  if (h == nullptr) return Status::Internal("curl_easy_init failed");
  curl_easy_setopt(h, CURLOPT_URL, prep.url.c_str());  // curl copies the string
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, prep.headers);
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
  auto reader = std::make_unique<S3ObjectReader>(
      h, [this](CURL* c) { pool_->Release(c); }, std::max<size_t>(options_.read_buffer_bytes, 64 * 1024));
  RETURN_IF_ERROR(reader->Start(prep.ReleaseHeaders()));
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

}  // namespace kiln::objects
