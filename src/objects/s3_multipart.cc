#include <cstring>
#include <pugixml.hpp>
#include <string>
#include <utility>

#include "base/encoding.h"
#include "base/strings.h"
#include "base/time.h"
#include "objects/s3_object_store.h"
#include "objects/s3_object_store_internal.h"
#include "objects/validation.h"

// S3ObjectStore's multipart uploads (see s3_object_store_internal.h for the file map).

namespace kiln::objects {

using s3_internal::MapError;
using s3_internal::StripQuotes;

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
  uint64_t size = 0;
  ASSIGN_OR_RETURN(Response resp, SendBody(req, data, options, "NoSuchUpload", &size));
  PartInfo part;
  part.part_number = part_number;
  part.size = size;
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
    return Status::InvalidArgument("InvalidArgument: part number must be an integer between 1 and 10000")
        .WithReason(ErrorReason::kInvalidArgument);
  }
  return SendPart(bucket, key, upload_id, part_number, data, options);
}

Result<PartInfo> S3ObjectStore::UploadPartCopy(const std::string& bucket, const std::string& key,
                                               const std::string& upload_id, uint32_t part_number,
                                               const std::string& src_bucket, const std::string& src_key,
                                               std::optional<ByteRange> range) {
  if (part_number < 1 || part_number > 10000) {
    return Status::InvalidArgument("InvalidArgument: part number must be an integer between 1 and 10000")
        .WithReason(ErrorReason::kInvalidArgument);
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
