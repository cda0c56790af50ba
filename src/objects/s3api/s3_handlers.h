#pragma once
// Internal to s3api/: the per-request state and the operation handlers S3Api::Handle dispatches
// to. Each handler either writes a complete success response and returns nullopt, or returns the
// S3 error to answer (S3Api::Handle serializes it). Handlers never throw.

#include <map>
#include <memory>
#include <optional>
#include <variant>
#include <string>

#include "aws/errors.h"
#include "aws/payload.h"
#include "aws/request_context.h"
#include "net/http_server.h"
#include "objects/object_store.h"
#include "objects/s3api/s3_api.h"
#include "objects/s3api/s3_request.h"

namespace kiln::objects::s3 {

// Wraps the request body and remembers whether it was read to its end, so that error paths know
// whether the connection can be kept (an unread body must be drained or the connection closed).
class TrackingSource final : public ByteSource {
 public:
  explicit TrackingSource(ByteSource* upstream) : upstream_(upstream) {}
  Result<size_t> Read(char* buf, size_t n) override;
  std::optional<uint64_t> size_hint() const override { return upstream_->size_hint(); }
  bool finished() const { return finished_; }

 private:
  ByteSource* upstream_;
  bool finished_ = false;
};

struct Call {
  const S3ApiOptions& options;
  ObjectStore* store;
  const aws::RequestContext& context;
  net::HttpRequest& request;
  net::ResponseWriter& response;
  Address address;
  QueryParams query;
  TrackingSource body;
  bool head = false;

  const std::string& bucket() const { return address.bucket; }
  const std::string& key() const { return address.key; }
  const std::string* Header(std::string_view name) const { return request.Header(name); }
};

using Outcome = std::optional<aws::AwsError>;

// ---- Shared helpers (s3_api.cc) ----

// x-amz-request-id and x-amz-id-2, present on every response.
HeaderMap BaseHeaders(const Call& call);
// Start + Write + Finish of an in-memory body. Connection errors are ignored (nothing to answer).
void SendBody(Call& call, int status, HeaderMap headers, std::string_view body);
void SendXml(Call& call, int status, HeaderMap headers, const std::string& xml);
void SendEmpty(Call& call, int status, HeaderMap headers);

// Maps an ObjectStore failure to the S3 error, adding the Key/BucketName/UploadId fields S3 names.
aws::AwsError StoreError(const Call& call, const Status& status, const std::string& upload_id = "");
// Maps the failure of a body read (through a PayloadReader `payload`, may be null) to S3's error.
aws::AwsError BodyError(const Status& status, const aws::PayloadReader* payload);
aws::AwsError InvalidArgument(std::string message, std::string name = "", std::string value = "");
aws::AwsError MalformedXml();
// Parses a max-keys / max-parts / max-uploads parameter: `limit` when absent, capped at `limit`,
// junk or out of int range → InvalidArgument naming it.
std::variant<uint32_t, aws::AwsError> ParseMax(const Call& call, std::string_view name, uint32_t limit);
// `encoding-type`: absent → false, "url" → true, anything else → InvalidArgument.
std::variant<bool, aws::AwsError> ParseEncodingType(const Call& call);
// ParseMax(`max_name`, `limit`) then ParseEncodingType, as the List* operations read them.
struct ListLimits {
  uint32_t max;
  bool encode;  // encoding-type=url
};
std::variant<ListLimits, aws::AwsError> ParseListLimits(const Call& call, std::string_view max_name, uint32_t limit);
// Refuses a body whose x-amz-decoded-content-length (aws-chunked) or else Content-Length is over
// `max_bytes` (EntityTooLarge), or not a number (InvalidArgument), before any of it is read.
Outcome CheckDeclaredSize(const Call& call, uint64_t max_bytes);
// The Checksum<ALG> elements of a response for `checksums` (lower-case algorithm → base64);
// algorithms S3 has no element for are left out.
void AddChecksumElements(XmlWriter& xml, const std::map<std::string, std::string>& checksums);

// The S3 error for an OpenPayload failure (an invalid Content-MD5 or checksum header, an
// unsupported payload mode).
aws::AwsError OpenBodyError(const Status& status);
// Opens the verifying reader over the request body.
// `store_verifies_md5`: the object store checks Content-MD5 (PutOptions::expected_checksums)
// while computing the ETag, so the payload reader does not hash the bytes a second time.
Result<std::unique_ptr<aws::PayloadReader>> OpenBody(Call& call, uint64_t max_bytes, bool store_verifies_md5 = false);
// Reads a small (XML) request body through the verifying reader. Errors are S3 errors.
std::variant<std::string, aws::AwsError> ReadSmallBody(Call& call, uint64_t max_bytes);

// Owner ID S3 shows (canonical user id form: 64 hex chars derived from the account).
std::string OwnerId(const S3ApiOptions& options);
void WriteOwner(XmlWriter& xml, std::string_view element, const S3ApiOptions& options);

// Object headers S3 stores from a PutObject / CreateMultipartUpload / CopyObject REPLACE request.
std::variant<std::map<std::string, std::string>, aws::AwsError> ObjectHeadersFromRequest(const Call& call);
// Checksum request handling shared by PutObject and UploadPart.
std::optional<aws::AwsError> ChecksumOptions(const Call& call, PutOptions* options);
// Adds x-amz-checksum-<alg> response headers for `checksums`.
void AddChecksumHeaders(const std::map<std::string, std::string>& checksums, HeaderMap* headers);
std::string Quote(std::string_view etag);

// ---- Service and bucket operations (s3_buckets.cc) ----
Outcome ListBuckets(Call& call);
Outcome CreateBucket(Call& call);
Outcome HeadBucket(Call& call);
Outcome DeleteBucket(Call& call);
Outcome GetBucketLocation(Call& call);
Outcome GetBucketVersioning(Call& call);
Outcome ListObjectsV2(Call& call);
Outcome ListObjectsV1(Call& call);
Outcome DeleteObjects(Call& call);

// ---- Object operations (s3_objects.cc) ----
Outcome PutObject(Call& call);
Outcome GetObject(Call& call);  // GET and HEAD
Outcome DeleteObject(Call& call);
Outcome CopyObject(Call& call);

// ---- Multipart uploads (s3_multipart.cc) ----
Outcome CreateMultipartUpload(Call& call);
Outcome UploadPart(Call& call);
Outcome UploadPartCopy(Call& call);
Outcome CompleteMultipartUpload(Call& call);
Outcome AbortMultipartUpload(Call& call);
Outcome ListParts(Call& call);
Outcome ListMultipartUploads(Call& call);

// Parsed x-amz-copy-source.
struct CopySource {
  std::string bucket;
  std::string key;
};
std::variant<CopySource, aws::AwsError> ParseCopySource(const std::string& header);
// Checks x-amz-copy-source-if-* against the source object (any failure is 412).
Outcome CheckCopySourceConditions(const Call& call, const ObjectInfo& source);

}  // namespace kiln::objects::s3
