// Object-level S3 operations: PutObject, GetObject/HeadObject, DeleteObject, CopyObject.

#include <array>
#include <memory>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/query_string.h"
#include "base/strings.h"
#include "base/time.h"
#include "objects/s3api/s3_handlers.h"

namespace kiln::objects::s3 {

namespace {

// If-Match, If-None-Match, If-Modified-Since and If-Unmodified-Since, each under `prefix`
// ("x-amz-copy-source-" for the copy source's; header names are case-insensitive).
ConditionHeaders ReadConditionHeaders(const Call& call, std::string_view prefix) {
  auto header = [&](std::string_view name) { return call.Header(std::string(prefix).append(name)); };
  ConditionHeaders conditions;
  conditions.if_match = header("If-Match");
  conditions.if_none_match = header("If-None-Match");
  conditions.if_modified_since = header("If-Modified-Since");
  conditions.if_unmodified_since = header("If-Unmodified-Since");
  return conditions;
}

constexpr uint64_t kMaxObjectSize = 5ull * 1024 * 1024 * 1024;
constexpr size_t kMaxUserMetadataBytes = 2048;
// Streaming buffer for GetObject: large enough to keep syscalls few, small enough that many
// concurrent downloads stay cheap.
constexpr size_t kStreamBufferBytes = 512 * 1024;

// Headers S3 stores with an object and returns verbatim (besides x-amz-meta-*).
constexpr std::array<std::string_view, 5> kStoredHeaders = {"Content-Disposition", "Content-Language", "Cache-Control",
                                                            "Expires", "Content-Type"};

constexpr std::array<std::string_view, 5> kChecksumAlgorithms = {"crc32", "crc32c", "sha1", "sha256", "crc64nvme"};

std::string ToUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

}  // namespace

std::variant<std::map<std::string, std::string>, aws::AwsError> ObjectHeadersFromRequest(const Call& call) {
  std::map<std::string, std::string> headers;
  for (std::string_view name : kStoredHeaders) {
    if (const std::string* v = call.Header(name)) headers[std::string(name)] = *v;
  }
  if (!headers.count("Content-Type")) headers["Content-Type"] = "binary/octet-stream";
  if (const std::string* encoding = call.Header("Content-Encoding")) {
    // aws-chunked describes the transfer framing, not the object (spec §3.4).
    std::vector<std::string> kept;
    for (std::string_view token : Split(*encoding, ',')) {
      token = Trim(token);
      if (!token.empty() && !EqualsIgnoreCase(token, "aws-chunked")) kept.emplace_back(token);
    }
    if (!kept.empty()) headers["Content-Encoding"] = Join(kept, ", ");
  }
  size_t metadata_bytes = 0;
  for (const auto& [name, value] : call.request.headers) {
    std::string lower = ToLower(name);
    if (!StartsWith(lower, "x-amz-meta-")) continue;
    metadata_bytes += lower.size() - 11 + value.size();
    auto [it, inserted] = headers.emplace(lower, value);
    if (!inserted) it->second += "," + value;  // repeated header: S3 joins with commas
  }
  if (metadata_bytes > kMaxUserMetadataBytes) {
    return aws::AwsError("MetadataTooLarge", "Your metadata headers exceed the maximum allowed metadata size.", 400)
        .With("Size", std::to_string(metadata_bytes))
        .With("MaxSizeAllowed", std::to_string(kMaxUserMetadataBytes));
  }
  if (const std::string* tagging = call.Header("x-amz-tagging")) {
    // The tag set is a query string ("k1=v1&k2=v2"); empty segments are no tags.
    Result<std::vector<QueryParam>> tags = ParseQueryString(*tagging, {.plus_is_space = true});
    if (!tags->empty()) headers["x-amz-tagging-count"] = std::to_string(tags->size());
  }
  return headers;
}

std::optional<aws::AwsError> ChecksumOptions(const Call& call, PutOptions* options) {
  if (const std::string* md5 = call.Header("Content-MD5")) {
    auto raw = Base64Decode(Trim(*md5));
    if (!raw || raw->size() != 16) {
      return aws::AwsError("InvalidDigest", "The Content-MD5 you specified was invalid.", 400)
          .With("Content-MD5", *md5);
    }
    options->expected_checksums["md5"] = std::string(Trim(*md5));
  }
  for (std::string_view alg : kChecksumAlgorithms) {
    S3Checksum::Algorithm parsed;
    if (!S3Checksum::ParseAlgorithm(alg, &parsed)) continue;  // not one Kiln can verify: not stored
    if (const std::string* v = call.Header("x-amz-checksum-" + std::string(alg))) {
      // The payload reader verifies it before reporting the end of the body, so a mismatch
      // fails the put before anything is stored.
      options->verified_checksums[std::string(alg)] = std::string(Trim(*v));
    }
  }
  auto want = [&](std::string_view name) {
    std::string alg = ToLower(Trim(name));
    S3Checksum::Algorithm parsed;
    if (!S3Checksum::ParseAlgorithm(alg, &parsed)) return;
    if (options->verified_checksums.count(alg)) return;
    for (const std::string& existing : options->compute_checksums) {
      if (existing == alg) return;
    }
    options->compute_checksums.push_back(alg);
  };
  if (const std::string* trailer = call.Header("x-amz-trailer")) {
    // A trailing checksum is verified by the decoder at the end; the store computes the same value.
    for (std::string_view name : Split(*trailer, ',')) {
      std::string lower = ToLower(Trim(name));
      if (StartsWith(lower, "x-amz-checksum-")) want(lower.substr(15));
    }
  }
  if (const std::string* sdk = call.Header("x-amz-sdk-checksum-algorithm")) want(*sdk);
  return std::nullopt;
}

Outcome PutObject(Call& call) {
  if (auto e = CheckDeclaredSize(call, kMaxObjectSize)) return e;
  auto headers = ObjectHeadersFromRequest(call);
  if (auto* e = std::get_if<aws::AwsError>(&headers)) return *e;
  PutOptions options;
  options.headers = std::move(std::get<0>(headers));
  if (auto e = ChecksumOptions(call, &options)) return e;
  if (const std::string* inm = call.Header("If-None-Match")) {
    if (Trim(*inm) != "*") {
      return aws::AwsError("NotImplemented", "A header you provided implies functionality that is not implemented", 501)
          .With("Header", "If-None-Match");
    }
    options.if_none_match_star = true;
  }
  if (const std::string* im = call.Header("If-Match")) {
    std::string_view tag = Trim(*im);
    if (tag.size() >= 2 && tag.front() == '"' && tag.back() == '"') tag = tag.substr(1, tag.size() - 2);
    options.if_match = std::string(tag);
  }
  auto payload = OpenBody(call, kMaxObjectSize, /*store_verifies_md5=*/true);
  if (!payload.ok()) return OpenBodyError(payload.status());
  auto info = call.store->PutObject(call.bucket(), call.key(), **payload, options);
  if (!info.ok()) {
    if ((*payload)->error_kind() != aws::PayloadErrorKind::kNone) return BodyError(info.status(), payload->get());
    if (info.status().code() == StatusCode::kFailedPrecondition) {
      return aws::AwsError("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412)
          .With("Condition", options.if_none_match_star ? "If-None-Match" : "If-Match");
    }
    if (info.status().IsNotFound() && options.if_match) {
      return aws::AwsError("NoSuchKey", "The specified key does not exist.", 404).With("Key", call.key());
    }
    if (!call.body.finished() &&
        (info.status().code() == StatusCode::kUnavailable || info.status().code() == StatusCode::kDeadlineExceeded)) {
      return BodyError(info.status(), nullptr);
    }
    return StoreError(call, info.status());
  }
  HeaderMap response_headers = BaseHeaders(call);
  response_headers.emplace("ETag", Quote(info->etag));
  AddChecksumHeaders(info->checksums, &response_headers);
  SendEmpty(call, 200, std::move(response_headers));
  return std::nullopt;
}

namespace {

// The response-* query parameters that override stored headers on GetObject.
constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kResponseOverrides = {{
    {"response-content-type", "Content-Type"},
    {"response-content-language", "Content-Language"},
    {"response-expires", "Expires"},
    {"response-cache-control", "Cache-Control"},
    {"response-content-disposition", "Content-Disposition"},
    {"response-content-encoding", "Content-Encoding"},
}};

HeaderMap ObjectHeaders(const Call& call, const ObjectInfo& info) {
  HeaderMap headers = BaseHeaders(call);
  headers.emplace("ETag", Quote(info.etag));
  headers.emplace("Last-Modified", FormatRfc1123(info.last_modified_millis));
  headers.emplace("Accept-Ranges", "bytes");
  for (const auto& [name, value] : info.headers) {
    bool overridden = false;
    for (const auto& [param, header] : kResponseOverrides) {
      if (EqualsIgnoreCase(name, header) && call.query.Has(param)) overridden = true;
    }
    if (!overridden) headers.emplace(name, value);
  }
  for (const auto& [param, header] : kResponseOverrides) {
    if (const std::string* v = call.query.Get(param)) headers.emplace(std::string(header), *v);
  }
  if (headers.find("Content-Type") == headers.end()) headers.emplace("Content-Type", "binary/octet-stream");
  if (!info.storage_class.empty() && info.storage_class != "STANDARD") {
    headers.emplace("x-amz-storage-class", info.storage_class);
  }
  return headers;
}

// Plans a GetObject/HeadObject against `info`: status, range, extra headers, or an error.
struct ReadPlan {
  int status = 200;
  std::optional<ByteRange> range;
  uint64_t length = 0;
  HeaderMap headers;
  bool not_modified = false;
};

std::variant<ReadPlan, aws::AwsError> PlanRead(const Call& call, const ObjectInfo& info) {
  ReadPlan plan;
  std::string failed;
  switch (EvaluateConditions(ReadConditionHeaders(call, ""), info.etag, info.last_modified_millis, &failed)) {
    case ConditionResult::kPreconditionFailed:
      return aws::AwsError("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412)
          .With("Condition", failed);
    case ConditionResult::kNotModified:
      plan.status = 304;
      plan.not_modified = true;
      plan.headers = BaseHeaders(call);
      plan.headers.emplace("ETag", Quote(info.etag));
      plan.headers.emplace("Last-Modified", FormatRfc1123(info.last_modified_millis));
      return plan;
    case ConditionResult::kProceed: break;
  }
  plan.headers = ObjectHeaders(call, info);
  plan.length = info.size;
  const std::string* range_header = call.Header("Range");
  if (const std::string* part_text = call.query.Get("partNumber")) {
    auto part = ParseQueryUint(*part_text, 10000);
    if (!part || *part < 1) {
      return InvalidArgument("Part number must be an integer between 1 and 10000, inclusive", "partNumber", *part_text);
    }
    if (range_header) {
      return aws::AwsError("InvalidRequest", "Cannot specify both Range header and partNumber query parameter", 400);
    }
    size_t count = info.part_sizes.empty() ? 1 : info.part_sizes.size();
    if (*part > count) {
      return aws::AwsError("InvalidPartNumber", "The requested partnumber is not satisfiable", 416)
          .With("PartNumberRequested", *part_text)
          .With("ActualPartCount", std::to_string(count));
    }
    if (!info.part_sizes.empty()) {
      uint64_t first = 0;
      for (size_t i = 0; i + 1 < *part; ++i) first += info.part_sizes[i];
      uint64_t size = info.part_sizes[*part - 1];
      plan.headers.emplace("x-amz-mp-parts-count", std::to_string(count));
      if (size > 0) {
        plan.range = ByteRange{first, first + size - 1};
        plan.status = 206;
        plan.length = size;
        plan.headers.emplace("Content-Range", "bytes " + std::to_string(first) + "-" +
                                                  std::to_string(first + size - 1) + "/" + std::to_string(info.size));
      } else {
        plan.length = 0;
      }
    }
  } else if (range_header) {
    RangeSpec spec = ParseRange(*range_header, info.size);
    if (spec.kind == RangeSpec::kUnsatisfiable) {
      return aws::AwsError("InvalidRange", "The requested range is not satisfiable", 416)
          .With("RangeRequested", *range_header)
          .With("ActualObjectSize", std::to_string(info.size));
    }
    if (spec.kind == RangeSpec::kSatisfiable) {
      plan.range = spec.range;
      plan.status = 206;
      plan.length = spec.range.last - spec.range.first + 1;
      plan.headers.emplace("Content-Range", "bytes " + std::to_string(spec.range.first) + "-" +
                                                std::to_string(spec.range.last) + "/" + std::to_string(info.size));
    }
  }
  const std::string* mode = call.Header("x-amz-checksum-mode");
  if (mode && EqualsIgnoreCase(Trim(*mode), "ENABLED") && !plan.range) {
    AddChecksumHeaders(info.checksums, &plan.headers);
  }
  return plan;
}

}  // namespace

Outcome GetObject(Call& call) {
  // The object may be replaced between HeadObject (which sizes the range) and GetObject; retry
  // when the opened version differs from the planned one.
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto info = call.store->HeadObject(call.bucket(), call.key());
    if (!info.ok()) return StoreError(call, info.status());
    auto planned = PlanRead(call, *info);
    if (auto* e = std::get_if<aws::AwsError>(&planned)) return *e;
    ReadPlan& plan = std::get<ReadPlan>(planned);
    if (plan.not_modified) {
      SendEmpty(call, 304, std::move(plan.headers));
      return std::nullopt;
    }
    if (call.head) {
      Status s = call.response.Start(plan.status, plan.headers, plan.length);
      if (s.ok()) (void)call.response.Finish();
      return std::nullopt;
    }
    auto reader = call.store->GetObject(call.bucket(), call.key(), plan.range);
    if (!reader.ok()) return StoreError(call, reader.status());
    if ((*reader)->info().etag != info->etag) continue;
    Status s = call.response.Start(plan.status, plan.headers, plan.length);
    if (!s.ok()) return std::nullopt;
    auto buffer = std::make_unique<char[]>(kStreamBufferBytes);
    uint64_t sent = 0;
    while (sent < plan.length) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(kStreamBufferBytes, plan.length - sent));
      auto n = (*reader)->Read(buffer.get(), want);
      if (!n.ok() || *n == 0) break;
      if (!call.response.Write(std::string_view(buffer.get(), *n)).ok()) return std::nullopt;
      sent += *n;
    }
    if (sent != plan.length) {
      // The store failed mid-stream: cut the connection so the client sees a short body.
      call.response.CloseAfterResponse();
    }
    (void)call.response.Finish();
    return std::nullopt;
  }
  return aws::AwsError("InternalError", "The object changed repeatedly while being read; retry.", 500);
}

Outcome DeleteObject(Call& call) {
  Status s = call.store->DeleteObject(call.bucket(), call.key());
  if (!s.ok()) return StoreError(call, s);
  SendEmpty(call, 204, BaseHeaders(call));
  return std::nullopt;
}

std::variant<CopySource, aws::AwsError> ParseCopySource(const std::string& header) {
  std::string_view raw = Trim(header);
  // "?versionId=..." follows the encoded path; a literal '?' in a key arrives as %3F.
  raw = raw.substr(0, raw.find('?'));
  auto decoded = UriDecode(raw, /*plus_is_space=*/false);
  auto invalid = [&] { return InvalidArgument("Invalid copy source object key", "x-amz-copy-source", header); };
  if (!decoded) return invalid();
  std::string_view path = *decoded;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  size_t slash = path.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= path.size()) {
    return InvalidArgument("Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
                           "x-amz-copy-source", header);
  }
  return CopySource{std::string(path.substr(0, slash)), std::string(path.substr(slash + 1))};
}

Outcome CheckCopySourceConditions(const Call& call, const ObjectInfo& source) {
  std::string failed;
  if (EvaluateConditions(ReadConditionHeaders(call, "x-amz-copy-source-"), source.etag, source.last_modified_millis,
                         &failed) != ConditionResult::kProceed) {
    return aws::AwsError("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412)
        .With("Condition", "x-amz-copy-source-" + ToLower(failed));
  }
  return std::nullopt;
}

namespace {

aws::AwsError SourceError(const Status& status, const CopySource& source) {
  if (status.IsNotFound() && status.Is(ErrorReason::kNoSuchKey)) {
    return aws::AwsError("NoSuchKey", "The specified key does not exist.", 404).With("Key", source.key);
  }
  if (status.IsNotFound()) {
    return aws::AwsError("NoSuchBucket", "The specified bucket does not exist.", 404).With("BucketName", source.bucket);
  }
  return aws::ErrorFromStatus(aws::Protocol::kRestXml, status);
}

}  // namespace

Outcome CopyObject(Call& call) {
  auto parsed = ParseCopySource(*call.Header("x-amz-copy-source"));
  if (auto* e = std::get_if<aws::AwsError>(&parsed)) return *e;
  const CopySource& source = std::get<CopySource>(parsed);
  std::string directive = ToUpper(call.request.HeaderOr("x-amz-metadata-directive", "COPY"));
  if (directive != "COPY" && directive != "REPLACE") {
    return InvalidArgument("Unknown metadata directive.", "x-amz-metadata-directive", directive);
  }
  auto info = call.store->HeadObject(source.bucket, source.key);
  if (!info.ok()) return SourceError(info.status(), source);
  if (auto e = CheckCopySourceConditions(call, *info)) return e;
  if (info->size > kMaxObjectSize) {
    return aws::AwsError("InvalidRequest",
                         "The specified copy source is larger than the maximum allowable size for a copy source: " +
                             std::to_string(kMaxObjectSize),
                         400);
  }
  if (source.bucket == call.bucket() && source.key == call.key() && directive == "COPY" &&
      !call.Header("x-amz-storage-class") && !call.Header("x-amz-website-redirect-location")) {
    return aws::AwsError("InvalidRequest",
                         "This copy request is illegal because it is trying to copy an object to itself without "
                         "changing the object's metadata, storage class, website redirect location or encryption "
                         "attributes.",
                         400);
  }
  std::optional<std::map<std::string, std::string>> replace;
  if (directive == "REPLACE") {
    auto headers = ObjectHeadersFromRequest(call);
    if (auto* e = std::get_if<aws::AwsError>(&headers)) return *e;
    replace = std::move(std::get<0>(headers));
  }
  auto copied = call.store->CopyObject(source.bucket, source.key, call.bucket(), call.key(), replace);
  if (!copied.ok()) {
    if (copied.status().IsNotFound() && copied.status().Is(ErrorReason::kNoSuchKey)) {
      return SourceError(copied.status(), source);
    }
    return StoreError(call, copied.status());
  }
  XmlWriter xml("CopyObjectResult");
  xml.Element("LastModified", FormatIso8601Millis(copied->last_modified_millis)).Element("ETag", Quote(copied->etag));
  for (const auto& [alg, value] : copied->checksums) {
    if (alg == "crc32") xml.Element("ChecksumCRC32", value);
    if (alg == "crc32c") xml.Element("ChecksumCRC32C", value);
    if (alg == "sha1") xml.Element("ChecksumSHA1", value);
    if (alg == "sha256") xml.Element("ChecksumSHA256", value);
    if (alg == "crc64nvme") xml.Element("ChecksumCRC64NVME", value);
  }
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

}  // namespace kiln::objects::s3
