// Multipart upload operations.

#include <pugixml.hpp>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/strings.h"
#include "base/time.h"
#include "objects/s3api/s3_handlers.h"

namespace kiln::objects::s3 {

namespace {

constexpr uint64_t kMaxPartSize = 5ull * 1024 * 1024 * 1024;
constexpr uint64_t kMaxCompleteBody = 1024 * 1024;
constexpr uint32_t kMaxPartNumber = 10000;
constexpr uint32_t kMaxListParts = 1000;

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

// partNumber and uploadId of UploadPart / UploadPartCopy.
std::variant<std::pair<uint32_t, std::string>, aws::AwsError> PartTarget(const Call& call) {
  const std::string* part_text = call.query.Get("partNumber");
  const std::string* upload_id = call.query.Get("uploadId");
  if (!part_text || !upload_id) {
    return aws::AwsError("InvalidRequest", "UploadPart requires both partNumber and uploadId", 400);
  }
  auto part = ParseQueryUint(*part_text, kMaxPartNumber);
  if (!part || *part < 1) {
    return InvalidArgument("Part number must be an integer between 1 and 10000, inclusive", "partNumber", *part_text);
  }
  return std::make_pair(static_cast<uint32_t>(*part), *upload_id);
}

}  // namespace

Outcome CreateMultipartUpload(Call& call) {
  auto headers = ObjectHeadersFromRequest(call);
  if (auto* e = std::get_if<aws::AwsError>(&headers)) return *e;
  std::string algorithm;
  if (const std::string* alg = call.Header("x-amz-checksum-algorithm")) {
    S3Checksum::Algorithm parsed;
    if (!S3Checksum::ParseAlgorithm(Trim(*alg), &parsed)) {
      return InvalidArgument(
          "Checksum algorithm provided is unsupported. Please try again with any of the valid "
          "types: [CRC32, CRC32C, SHA1, SHA256]",
          "x-amz-checksum-algorithm", *alg);
    }
    algorithm = std::string(S3Checksum::Name(parsed));
  }
  auto upload = call.store->CreateMultipartUpload(call.bucket(), call.key(), std::get<0>(headers), algorithm);
  if (!upload.ok()) return StoreError(call, upload.status());
  XmlWriter xml("InitiateMultipartUploadResult");
  xml.Element("Bucket", call.bucket()).Element("Key", call.key()).Element("UploadId", upload->upload_id);
  HeaderMap response_headers = BaseHeaders(call);
  if (!algorithm.empty()) response_headers.emplace("x-amz-checksum-algorithm", Upper(algorithm));
  SendXml(call, 200, std::move(response_headers), xml.Finish());
  return std::nullopt;
}

Outcome UploadPart(Call& call) {
  auto target = PartTarget(call);
  if (auto* e = std::get_if<aws::AwsError>(&target)) return *e;
  auto [part_number, upload_id] = std::get<0>(target);
  if (auto e = CheckDeclaredSize(call, kMaxPartSize)) return e;
  PutOptions options;
  if (auto e = ChecksumOptions(call, &options)) return e;
  auto payload = OpenBody(call, kMaxPartSize, /*store_verifies_md5=*/true);
  if (!payload.ok()) return OpenBodyError(payload.status());
  auto part = call.store->UploadPart(call.bucket(), call.key(), upload_id, part_number, **payload, options);
  if (!part.ok()) {
    if ((*payload)->error_kind() != aws::PayloadErrorKind::kNone) return BodyError(part.status(), payload->get());
    if (!call.body.finished() &&
        (part.status().code() == StatusCode::kUnavailable || part.status().code() == StatusCode::kDeadlineExceeded)) {
      return BodyError(part.status(), nullptr);
    }
    return StoreError(call, part.status(), upload_id);
  }
  HeaderMap headers = BaseHeaders(call);
  headers.emplace("ETag", Quote(part->etag));
  AddChecksumHeaders(part->checksums, &headers);
  SendEmpty(call, 200, std::move(headers));
  return std::nullopt;
}

Outcome UploadPartCopy(Call& call) {
  auto target = PartTarget(call);
  if (auto* e = std::get_if<aws::AwsError>(&target)) return *e;
  auto [part_number, upload_id] = std::get<0>(target);
  auto parsed = ParseCopySource(*call.Header("x-amz-copy-source"));
  if (auto* e = std::get_if<aws::AwsError>(&parsed)) return *e;
  const CopySource& source = std::get<CopySource>(parsed);
  auto info = call.store->HeadObject(source.bucket, source.key);
  if (!info.ok()) {
    if (info.status().IsNotFound() && info.status().Is(ErrorReason::kNoSuchKey)) {
      return aws::AwsError("NoSuchKey", "The specified key does not exist.", 404).With("Key", source.key);
    }
    if (info.status().IsNotFound()) {
      return aws::AwsError("NoSuchBucket", "The specified bucket does not exist.", 404)
          .With("BucketName", source.bucket);
    }
    return StoreError(call, info.status());
  }
  if (auto e = CheckCopySourceConditions(call, *info)) return e;
  std::optional<ByteRange> range;
  if (const std::string* range_text = call.Header("x-amz-copy-source-range")) {
    range = ParseCopySourceRange(*range_text);
    if (!range) {
      return InvalidArgument(
          "The x-amz-copy-source-range value must be of the form bytes=first-last where first "
          "and last are the zero-based offsets of the first and last bytes to copy",
          "x-amz-copy-source-range", *range_text);
    }
    if (range->last >= info->size) {
      return aws::AwsError("InvalidRange", "The requested range is not satisfiable", 416)
          .With("RangeRequested", *range_text)
          .With("ActualObjectSize", std::to_string(info->size));
    }
    if (range->last - range->first + 1 > kMaxPartSize) {
      return InvalidArgument("Part size exceeds the maximum allowed", "x-amz-copy-source-range", *range_text);
    }
  } else if (info->size > kMaxPartSize) {
    return InvalidArgument("The specified copy source is larger than the maximum allowable size for a copy source: " +
                               std::to_string(kMaxPartSize),
                           "x-amz-copy-source", *call.Header("x-amz-copy-source"));
  }
  auto part =
      call.store->UploadPartCopy(call.bucket(), call.key(), upload_id, part_number, source.bucket, source.key, range);
  if (!part.ok()) return StoreError(call, part.status(), upload_id);
  XmlWriter xml("CopyPartResult");
  xml.Element("LastModified", FormatIso8601Millis(part->last_modified_millis)).Element("ETag", Quote(part->etag));
  AddChecksumElements(xml, part->checksums);
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

Outcome CompleteMultipartUpload(Call& call) {
  const std::string upload_id = call.query.GetOr("uploadId", "");
  auto body = ReadSmallBody(call, kMaxCompleteBody);
  if (auto* e = std::get_if<aws::AwsError>(&body)) return *e;
  const std::string& text = std::get<std::string>(body);
  pugi::xml_document doc;
  if (!doc.load_buffer(text.data(), text.size())) return MalformedXml();
  pugi::xml_node root = doc.child("CompleteMultipartUpload");
  if (!root) return MalformedXml();
  std::vector<CompletedPart> parts;
  for (pugi::xml_node node : root.children("Part")) {
    auto number = ParseQueryUint(node.child("PartNumber").text().as_string(), kMaxPartNumber);
    if (!number || *number < 1) return MalformedXml();
    pugi::xml_node etag = node.child("ETag");
    if (!etag) return MalformedXml();
    parts.push_back(CompletedPart{static_cast<uint32_t>(*number), std::string(Trim(etag.text().as_string()))});
  }
  if (parts.empty()) return MalformedXml();
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].part_number <= parts[i - 1].part_number) {
      return aws::AwsError("InvalidPartOrder",
                           "The list of parts was not in ascending order. Parts must be ordered by part number.", 400)
          .With("UploadId", upload_id);
    }
  }
  auto info = call.store->CompleteMultipartUpload(call.bucket(), call.key(), upload_id, parts);
  if (!info.ok()) return StoreError(call, info.status(), upload_id);
  std::string host = call.request.HeaderOr("Host", "localhost");
  std::string location = "http://" + host + "/";
  if (!call.address.virtual_hosted) location += UriEncode(call.bucket()) + "/";
  location += UriEncode(call.key(), /*keep_slash=*/true);
  XmlWriter xml("CompleteMultipartUploadResult");
  xml.Element("Location", location)
      .Element("Bucket", call.bucket())
      .Element("Key", call.key())
      .Element("ETag", Quote(info->etag));
  AddChecksumElements(xml, info->checksums);
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

Outcome AbortMultipartUpload(Call& call) {
  const std::string upload_id = call.query.GetOr("uploadId", "");
  Status s = call.store->AbortMultipartUpload(call.bucket(), call.key(), upload_id);
  if (!s.ok()) return StoreError(call, s, upload_id);
  SendEmpty(call, 204, BaseHeaders(call));
  return std::nullopt;
}

Outcome ListParts(Call& call) {
  const std::string upload_id = call.query.GetOr("uploadId", "");
  auto max_parts = ParseMax(call, "max-parts", kMaxListParts);
  if (auto* e = std::get_if<aws::AwsError>(&max_parts)) return *e;
  uint32_t marker = 0;
  if (const std::string* text = call.query.Get("part-number-marker")) {
    auto v = ParseQueryUint(*text, kMaxPartNumber);
    if (!v) return InvalidArgument("Provided part-number-marker not an integer", "part-number-marker", *text);
    marker = static_cast<uint32_t>(*v);
  }
  auto encoding = ParseEncodingType(call);
  if (auto* e = std::get_if<aws::AwsError>(&encoding)) return *e;
  bool encode = std::get<bool>(encoding);
  auto upload = call.store->GetMultipartUpload(call.bucket(), call.key(), upload_id);
  if (!upload.ok()) return StoreError(call, upload.status(), upload_id);
  bool truncated = false;
  auto parts =
      call.store->ListParts(call.bucket(), call.key(), upload_id, marker, std::get<uint32_t>(max_parts), &truncated);
  if (!parts.ok()) return StoreError(call, parts.status(), upload_id);
  XmlWriter xml("ListPartsResult");
  xml.Element("Bucket", call.bucket())
      .Element("Key", encode ? ListEncode(call.key()) : call.key())
      .Element("UploadId", upload_id);
  WriteOwner(xml, "Initiator", call.options);
  WriteOwner(xml, "Owner", call.options);
  xml.Element("StorageClass", "STANDARD").Element("PartNumberMarker", std::to_string(marker));
  if (!parts->empty()) xml.Element("NextPartNumberMarker", std::to_string(parts->back().part_number));
  xml.Element("MaxParts", std::to_string(std::get<uint32_t>(max_parts)))
      .Element("IsTruncated", truncated ? "true" : "false");
  if (encode) xml.Element("EncodingType", "url");
  if (!upload->checksum_algorithm.empty()) xml.Element("ChecksumAlgorithm", Upper(upload->checksum_algorithm));
  for (const PartInfo& part : *parts) {
    xml.Open("Part")
        .Element("PartNumber", std::to_string(part.part_number))
        .Element("LastModified", FormatIso8601Millis(part.last_modified_millis))
        .Element("ETag", Quote(part.etag))
        .Element("Size", std::to_string(part.size));
    AddChecksumElements(xml, part.checksums);
    xml.Close("Part");
  }
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

Outcome ListMultipartUploads(Call& call) {
  auto limits = ParseListLimits(call, "max-uploads", 1000);
  if (auto* e = std::get_if<aws::AwsError>(&limits)) return *e;
  const bool encode = std::get<ListLimits>(limits).encode;
  auto enc = [&](const std::string& s) { return encode ? ListEncode(s) : s; };
  ListUploadsOptions options;
  options.prefix = call.query.GetOr("prefix", "");
  options.key_marker = call.query.GetOr("key-marker", "");
  options.upload_id_marker = call.query.GetOr("upload-id-marker", "");
  options.max_uploads = std::get<ListLimits>(limits).max;
  auto result = call.store->ListMultipartUploads(call.bucket(), options);
  if (!result.ok()) return StoreError(call, result.status());
  XmlWriter xml("ListMultipartUploadsResult");
  xml.Element("Bucket", call.bucket())
      .Element("KeyMarker", enc(options.key_marker))
      .Element("UploadIdMarker", options.upload_id_marker);
  if (result->truncated) {
    xml.Element("NextKeyMarker", enc(result->next_key_marker))
        .Element("NextUploadIdMarker", result->next_upload_id_marker);
  }
  xml.Element("Prefix", enc(options.prefix));
  if (encode) xml.Element("EncodingType", "url");
  xml.Element("MaxUploads", std::to_string(options.max_uploads))
      .Element("IsTruncated", result->truncated ? "true" : "false");
  for (const MultipartUpload& upload : result->uploads) {
    xml.Open("Upload").Element("Key", enc(upload.key)).Element("UploadId", upload.upload_id);
    WriteOwner(xml, "Initiator", call.options);
    WriteOwner(xml, "Owner", call.options);
    xml.Element("StorageClass", "STANDARD").Element("Initiated", FormatIso8601Millis(upload.initiated_millis));
    if (!upload.checksum_algorithm.empty()) xml.Element("ChecksumAlgorithm", Upper(upload.checksum_algorithm));
    xml.Close("Upload");
  }
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

}  // namespace kiln::objects::s3
