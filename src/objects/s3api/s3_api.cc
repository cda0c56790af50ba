#include "objects/s3api/s3_api.h"

#include <array>
#include <exception>
#include <utility>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/strings.h"
#include "objects/s3api/s3_handlers.h"

namespace kiln::objects {

using s3::Call;
using s3::Outcome;

namespace s3 {

Result<size_t> TrackingSource::Read(char* buf, size_t n) {
  if (finished_) return size_t{0};
  auto r = upstream_->Read(buf, n);
  if (r.ok() && *r == 0) finished_ = true;
  return r;
}

HeaderMap BaseHeaders(const Call& call) {
  HeaderMap headers;
  headers.emplace("x-amz-request-id", call.context.request_id);
  headers.emplace("x-amz-id-2", Base64Encode(Sha256(call.context.request_id)));
  return headers;
}

void SendBody(Call& call, int status, HeaderMap headers, std::string_view body) {
  Status s = call.response.Start(status, headers, body.size());
  if (s.ok() && !body.empty() && !call.head) s = call.response.Write(body);
  if (s.ok()) s = call.response.Finish();
  (void)s;  // the connection is gone; there is no one to tell
}

void SendXml(Call& call, int status, HeaderMap headers, const std::string& xml) {
  headers.emplace("Content-Type", "application/xml");
  SendBody(call, status, std::move(headers), xml);
}

void SendEmpty(Call& call, int status, HeaderMap headers) { SendBody(call, status, std::move(headers), ""); }

aws::AwsError InvalidArgument(std::string message, std::string name, std::string value) {
  aws::AwsError e("InvalidArgument", std::move(message), 400);
  if (!name.empty()) e.With("ArgumentName", std::move(name)).With("ArgumentValue", std::move(value));
  return e;
}

aws::AwsError MalformedXml() {
  return aws::AwsError(
      "MalformedXML", "The XML you provided was not well-formed or did not validate against our published schema", 400);
}

// The detail of an ObjectStore message "<S3 code>: <detail>" (object_store.h) whose code is the
// status's reason; the whole message when it does not start that way.
static std::string StoreDetail(const Status& status) {
  const std::string& m = status.message();
  std::string_view code = ErrorReasonName(status.reason());
  if (StartsWith(m, code) && m.size() > code.size() && m[code.size()] == ':') {
    return std::string(Trim(std::string_view(m).substr(code.size() + 1)));
  }
  return m;
}

aws::AwsError StoreError(const Call& call, const Status& status, const std::string& upload_id) {
  const std::string& m = status.message();
  switch (status.code()) {
    case StatusCode::kNotFound:
      if (status.Is(ErrorReason::kNoSuchUpload)) {
        return aws::AwsError("NoSuchUpload",
                             "The specified upload does not exist. The upload ID may be invalid, or the upload "
                             "may have been aborted or completed.",
                             404)
            .With("UploadId", upload_id);
      }
      if (status.Is(ErrorReason::kNoSuchKey)) {
        return aws::AwsError("NoSuchKey", "The specified key does not exist.", 404).With("Key", call.key());
      }
      return aws::AwsError("NoSuchBucket", "The specified bucket does not exist.", 404)
          .With("BucketName", call.bucket());
    case StatusCode::kAlreadyExists:
      return aws::AwsError("BucketAlreadyOwnedByYou",
                           "Your previous request to create the named bucket succeeded and you already own it.", 409)
          .With("BucketName", call.bucket());
    case StatusCode::kFailedPrecondition:
      if (status.Is(ErrorReason::kPreconditionFailed)) {
        return aws::AwsError("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412)
            .With("Condition", call.Header("If-Match") ? "If-Match" : "If-None-Match");
      }
      return aws::AwsError("BucketNotEmpty", "The bucket you tried to delete is not empty", 409)
          .With("BucketName", call.bucket());
    case StatusCode::kInvalidArgument:
      switch (status.reason()) {
        case ErrorReason::kInvalidPartOrder:
          return aws::AwsError("InvalidPartOrder",
                               "The list of parts was not in ascending order. Parts must be ordered by part number.",
                               400)
              .With("UploadId", upload_id);
        case ErrorReason::kInvalidPart:
          return aws::AwsError("InvalidPart",
                               "One or more of the specified parts could not be found.  The part may not have been "
                               "uploaded, or the specified entity tag may not match the part's entity tag.",
                               400)
              .With("UploadId", upload_id);
        case ErrorReason::kEntityTooSmall:
          return aws::AwsError("EntityTooSmall",
                               "Your proposed upload is smaller than the minimum allowed object size.", 400);
        case ErrorReason::kInvalidRange:
          return aws::AwsError("InvalidRange", "The requested range is not satisfiable", 416);
        case ErrorReason::kInvalidBucketName:
          return aws::AwsError("InvalidBucketName", "The specified bucket is not valid.", 400)
              .With("BucketName", call.bucket());
        case ErrorReason::kKeyTooLong:
        case ErrorReason::kInvalidArgument:
        case ErrorReason::kInvalidRequest:
          // The store wrote S3's words after the code (object_store.h); show them as S3 would.
          return aws::AwsError(std::string(ErrorReasonName(status.reason())), StoreDetail(status), 400);
        default: return aws::AwsError("InvalidArgument", m, 400);
      }
    case StatusCode::kResourceExhausted:
      if (status.Is(ErrorReason::kEntityTooLarge)) {
        return aws::AwsError("EntityTooLarge", "Your proposed upload exceeds the maximum allowed object size.", 400);
      }
      return aws::ErrorFromStatus(aws::Protocol::kRestXml, status);
    case StatusCode::kDataLoss:
      if (status.Is(ErrorReason::kBadDigest)) {
        return aws::AwsError("BadDigest",
                             "The Content-MD5 or checksum value that you specified did not match what "
                             "the server received.",
                             400);
      }
      return aws::ErrorFromStatus(aws::Protocol::kRestXml, status);
    default: return aws::ErrorFromStatus(aws::Protocol::kRestXml, status);
  }
}

aws::AwsError BodyError(const Status& status, const aws::PayloadReader* payload) {
  aws::PayloadErrorKind kind = payload ? payload->error_kind() : aws::PayloadErrorKind::kNone;
  switch (kind) {
    case aws::PayloadErrorKind::kSha256Mismatch:
      return aws::AwsError("XAmzContentSHA256Mismatch",
                           "The provided 'x-amz-content-sha256' header does not match what was computed.", 400);
    case aws::PayloadErrorKind::kBadDigest:
      // S3 answers BadDigest for both Content-MD5 and x-amz-checksum-* mismatches.
      return aws::AwsError("BadDigest",
                           status.message().empty() ? "The Content-MD5 you specified did not match "
                                                      "what we received."
                                                    : status.message(),
                           400);
    case aws::PayloadErrorKind::kSignatureMismatch:
      return aws::AwsError("SignatureDoesNotMatch",
                           "The request signature we calculated does not match the signature you provided. Check "
                           "your key and signing method.",
                           403);
    case aws::PayloadErrorKind::kMalformed: return aws::AwsError("InvalidRequest", status.message(), 400);
    case aws::PayloadErrorKind::kIncomplete:
      return aws::AwsError("IncompleteBody",
                           "You did not provide the number of bytes specified by the "
                           "Content-Length HTTP header",
                           400);
    case aws::PayloadErrorKind::kTooLarge:
      return aws::AwsError("EntityTooLarge", "Your proposed upload exceeds the maximum allowed object size.", 400);
    case aws::PayloadErrorKind::kNone: break;
  }
  switch (status.code()) {
    case StatusCode::kResourceExhausted:
      return aws::AwsError("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size.", 400);
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return aws::AwsError("IncompleteBody",
                           "You did not provide the number of bytes specified by the Content-Length HTTP header", 400);
    case StatusCode::kUnauthenticated: return aws::AwsError("SignatureDoesNotMatch", status.message(), 403);
    case StatusCode::kDataLoss: return aws::AwsError("BadDigest", status.message(), 400);
    case StatusCode::kInvalidArgument: return aws::AwsError("InvalidRequest", status.message(), 400);
    default: return aws::ErrorFromStatus(aws::Protocol::kRestXml, status);
  }
}

std::variant<ListLimits, aws::AwsError> ParseListLimits(const Call& call, std::string_view max_name, uint32_t limit) {
  auto max = ParseMax(call, max_name, limit);
  if (auto* e = std::get_if<aws::AwsError>(&max)) return *e;
  auto encode = ParseEncodingType(call);
  if (auto* e = std::get_if<aws::AwsError>(&encode)) return *e;
  return ListLimits{std::get<uint32_t>(max), std::get<bool>(encode)};
}

Outcome CheckDeclaredSize(const Call& call, uint64_t max_bytes) {
  for (const char* name : {"x-amz-decoded-content-length", "Content-Length"}) {
    const std::string* v = call.Header(name);
    if (!v) continue;
    auto n = ParseUint64(Trim(*v));
    if (!n) return aws::AwsError("InvalidArgument", std::string("Invalid ") + name, 400);
    // For aws-chunked bodies Content-Length includes the framing; the decoded length is what counts.
    if (std::string_view(name) == "Content-Length" && call.Header("x-amz-decoded-content-length")) continue;
    if (*n > max_bytes) {
      return aws::AwsError("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size", 400)
          .With("ProposedSize", std::to_string(*n))
          .With("MaxSizeAllowed", std::to_string(max_bytes));
    }
  }
  return std::nullopt;
}

void AddChecksumElements(XmlWriter& xml, const std::map<std::string, std::string>& checksums) {
  for (const auto& [alg, value] : checksums) {
    std::string_view element = alg == "crc32"       ? "ChecksumCRC32"
                               : alg == "crc32c"    ? "ChecksumCRC32C"
                               : alg == "sha1"      ? "ChecksumSHA1"
                               : alg == "sha256"    ? "ChecksumSHA256"
                               : alg == "crc64nvme" ? "ChecksumCRC64NVME"
                                                    : "";
    if (!element.empty()) xml.Element(std::string(element), value);
  }
}

aws::AwsError OpenBodyError(const Status& status) {
  if (status.Is(ErrorReason::kInvalidDigest)) {
    return aws::AwsError("InvalidDigest", "The Content-MD5 you specified was invalid.", 400);
  }
  return aws::AwsError("InvalidRequest", status.message(), 400);
}

Result<std::unique_ptr<aws::PayloadReader>> OpenBody(Call& call, uint64_t max_bytes, bool store_verifies_md5) {
  aws::PayloadOptions options;
  options.verify_content_md5 = !store_verifies_md5;
  options.verified = call.context.auth;
  options.headers = &call.request.headers;
  options.max_bytes = max_bytes;
  return aws::OpenPayload(call.body, options);
}

std::variant<std::string, aws::AwsError> ReadSmallBody(Call& call, uint64_t max_bytes) {
  auto payload = OpenBody(call, max_bytes);
  if (!payload.ok()) return OpenBodyError(payload.status());
  auto text = ReadAll(**payload, max_bytes);
  if (!text.ok()) {
    if ((*payload)->error_kind() == aws::PayloadErrorKind::kNone &&
        text.status().code() == StatusCode::kResourceExhausted) {
      return MalformedXml();  // S3 rejects oversized XML documents as malformed
    }
    return BodyError(text.status(), payload->get());
  }
  return std::move(*text);
}

std::string OwnerId(const S3ApiOptions& options) { return Sha256Hex("kiln-account:" + options.account_id); }

void WriteOwner(XmlWriter& xml, std::string_view element, const S3ApiOptions& options) {
  xml.Open(element).Element("ID", OwnerId(options)).Element("DisplayName", options.owner_display_name).Close(element);
}

std::string Quote(std::string_view etag) {
  std::string out = "\"";
  out += etag;
  out += '"';
  return out;
}

void AddChecksumHeaders(const std::map<std::string, std::string>& checksums, HeaderMap* headers) {
  for (const auto& [alg, value] : checksums) {
    if (alg == "md5") continue;
    headers->emplace("x-amz-checksum-" + alg, value);
  }
}

}  // namespace s3

namespace {

// Sub-resources S3 has and Kiln does not serve; asking for one gets NotImplemented naming it.
constexpr std::array<std::string_view, 27> kUnsupportedSubresources = {"acl",
                                                                       "policy",
                                                                       "policyStatus",
                                                                       "cors",
                                                                       "lifecycle",
                                                                       "website",
                                                                       "logging",
                                                                       "notification",
                                                                       "replication",
                                                                       "encryption",
                                                                       "ownershipControls",
                                                                       "publicAccessBlock",
                                                                       "accelerate",
                                                                       "requestPayment",
                                                                       "object-lock",
                                                                       "analytics",
                                                                       "metrics",
                                                                       "inventory",
                                                                       "intelligent-tiering",
                                                                       "tagging",
                                                                       "versions",
                                                                       "retention",
                                                                       "legal-hold",
                                                                       "torrent",
                                                                       "restore",
                                                                       "select",
                                                                       "attributes"};

std::string UnsupportedSubresource(const s3::QueryParams& query) {
  for (std::string_view name : kUnsupportedSubresources) {
    if (query.Has(name)) return std::string(name);
  }
  return "";
}

aws::AwsError NotImplemented(std::string what) {
  return aws::AwsError("NotImplemented", "Kiln does not implement this S3 operation: " + what, 501);
}

aws::AwsError MethodNotAllowed(const std::string& method, const char* resource_type) {
  return aws::AwsError("MethodNotAllowed", "The specified method is not allowed against this resource.", 405)
      .With("Method", method)
      .With("ResourceType", resource_type);
}

// Records the operation for the access log, then runs it.
Outcome Run(Call& call, const char* operation, Outcome (*handler)(Call&)) {
  call.context.operation = operation;
  return handler(call);
}

Outcome Dispatch(Call& call) {
  const std::string& method = call.request.method;
  const s3::QueryParams& q = call.query;
  if (call.bucket().empty()) {
    if (method == "GET") return Run(call, "ListBuckets", s3::ListBuckets);
    return MethodNotAllowed(method, "SERVICE");
  }
  if (const std::string* owner = call.Header("x-amz-expected-bucket-owner");
      owner && *owner != call.options.account_id) {
    return aws::AwsError("AccessDenied", "Access Denied", 403);
  }
  std::string unsupported = UnsupportedSubresource(q);
  if (call.key().empty()) {
    if (method == "GET" || method == "HEAD") {
      if (method == "HEAD") return Run(call, "HeadBucket", s3::HeadBucket);
      if (q.Has("location")) return Run(call, "GetBucketLocation", s3::GetBucketLocation);
      if (q.Has("versioning")) return Run(call, "GetBucketVersioning", s3::GetBucketVersioning);
      if (!unsupported.empty()) return NotImplemented("GET ?" + unsupported);
      if (q.Has("uploads")) return Run(call, "ListMultipartUploads", s3::ListMultipartUploads);
      if (q.GetOr("list-type", "") == "2") return Run(call, "ListObjectsV2", s3::ListObjectsV2);
      return Run(call, "ListObjects", s3::ListObjectsV1);
    }
    if (method == "PUT") {
      if (q.Has("versioning")) return NotImplemented("PUT ?versioning");
      if (!unsupported.empty()) return NotImplemented("PUT ?" + unsupported);
      return Run(call, "CreateBucket", s3::CreateBucket);
    }
    if (method == "DELETE") {
      if (!unsupported.empty()) return NotImplemented("DELETE ?" + unsupported);
      return Run(call, "DeleteBucket", s3::DeleteBucket);
    }
    if (method == "POST") {
      if (q.Has("delete")) return Run(call, "DeleteObjects", s3::DeleteObjects);
      return NotImplemented("POST (browser form upload)");
    }
    return MethodNotAllowed(method, "BUCKET");
  }
  if (method == "GET" || method == "HEAD") {
    if (!unsupported.empty()) return NotImplemented(method + " ?" + unsupported);
    if (method == "GET" && q.Has("uploadId")) return Run(call, "ListParts", s3::ListParts);
    return Run(call, call.head ? "HeadObject" : "GetObject", s3::GetObject);
  }
  if (method == "PUT") {
    if (!unsupported.empty()) return NotImplemented("PUT ?" + unsupported);
    if (q.Has("uploadId") || q.Has("partNumber")) {
      if (call.Header("x-amz-copy-source")) return Run(call, "UploadPartCopy", s3::UploadPartCopy);
      return Run(call, "UploadPart", s3::UploadPart);
    }
    if (call.Header("x-amz-copy-source")) return Run(call, "CopyObject", s3::CopyObject);
    return Run(call, "PutObject", s3::PutObject);
  }
  if (method == "DELETE") {
    if (!unsupported.empty()) return NotImplemented("DELETE ?" + unsupported);
    if (q.Has("uploadId")) return Run(call, "AbortMultipartUpload", s3::AbortMultipartUpload);
    return Run(call, "DeleteObject", s3::DeleteObject);
  }
  if (method == "POST") {
    if (!unsupported.empty()) return NotImplemented("POST ?" + unsupported);
    if (q.Has("uploads")) return Run(call, "CreateMultipartUpload", s3::CreateMultipartUpload);
    if (q.Has("uploadId")) return Run(call, "CompleteMultipartUpload", s3::CompleteMultipartUpload);
    return MethodNotAllowed(method, "OBJECT");
  }
  return MethodNotAllowed(method, "OBJECT");
}

// Unread bodies up to this size are cheaper to drain (the server does) than to reconnect for.
constexpr uint64_t kDrainableBodyBytes = 64 * 1024;

// True when the request declared a body too large (or of unknown length) to drain cheaply.
bool HasLargeBody(const net::HttpRequest& request) {
  if (request.Header("Transfer-Encoding")) return true;
  const std::string* length = request.Header("Content-Length");
  if (!length) return false;
  auto n = ParseUint64(Trim(*length));
  return !n || *n > kDrainableBodyBytes;
}

}  // namespace

S3Api::S3Api(S3ApiOptions options, ObjectStore* store) : options_(std::move(options)), store_(store) {}

void S3Api::Handle(const aws::RequestContext& context, net::HttpRequest& request, net::ResponseWriter& response) {
  Call call{options_, store_, context, request, response, {}, {}, s3::TrackingSource(request.body), false};
  call.head = request.method == "HEAD";
  Outcome outcome;
  auto address = s3::ResolveAddress(request.HeaderOr("Host", ""), request.raw_path, options_.virtual_host_suffixes);
  if (!address.ok()) {
    outcome = aws::AwsError("InvalidURI", "Couldn't parse the specified URI.", 400);
  } else {
    call.address = std::move(*address);
    call.query = s3::QueryParams::Parse(request.raw_query);
    // Nothing below throws by design; this guards the contract (no exception leaves Handle)
    // against allocation failures and third-party surprises.
    try {
      outcome = Dispatch(call);
    } catch (const std::exception& e) {
      outcome = aws::AwsError("InternalError", std::string("We encountered an internal error: ") + e.what(), 500);
    }
  }
  if (!outcome) return;
  const aws::AwsError& error = *outcome;
  std::string status_text = std::to_string(error.http_status);
  KLOG(debug, "s3 error",
       {{"request_id", context.request_id},
        {"method", request.method},
        {"bucket", call.bucket()},
        {"code", error.code},
        {"status", status_text}});
  if (HasLargeBody(request) && !call.body.finished()) response.CloseAfterResponse();
  if (response.started()) {
    // Too late for an error document: the only honest signal left is a cut connection.
    response.CloseAfterResponse();
    (void)response.Finish();
    return;
  }
  aws::WireResponse wire = aws::SerializeError(aws::Protocol::kRestXml, error, context.request_id, call.head);
  if (wire.headers.find("x-amz-id-2") == wire.headers.end()) {
    wire.headers.emplace("x-amz-id-2", Base64Encode(Sha256(context.request_id)));
  }
  if (call.head) wire.body.clear();
  Status s = response.Start(wire.status, wire.headers, wire.body.size());
  if (s.ok() && !wire.body.empty()) s = response.Write(wire.body);
  if (s.ok()) s = response.Finish();
  (void)s;
}

}  // namespace kiln::objects
