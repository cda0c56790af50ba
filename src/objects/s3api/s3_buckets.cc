// Service- and bucket-level S3 operations: buckets, listings, DeleteObjects.

#include <pugixml.hpp>

#include "base/encoding.h"
#include "base/strings.h"
#include "base/time.h"
#include "objects/s3api/s3_handlers.h"

namespace kiln::objects::s3 {

namespace {

constexpr uint64_t kMaxCreateBucketBody = 64 * 1024;
constexpr uint64_t kMaxDeleteBody = 2 * 1024 * 1024;
constexpr size_t kMaxDeleteKeys = 1000;
constexpr uint32_t kMaxListKeys = 1000;

void WriteContents(XmlWriter& xml, const ObjectInfo& object, bool url, bool owner, const S3ApiOptions& options) {
  xml.Open("Contents")
      .Element("Key", url ? ListEncode(object.key) : object.key)
      .Element("LastModified", FormatIso8601Millis(object.last_modified_millis))
      .Element("ETag", Quote(object.etag))
      .Element("Size", std::to_string(object.size));
  if (owner) WriteOwner(xml, "Owner", options);
  xml.Element("StorageClass", object.storage_class.empty() ? "STANDARD" : object.storage_class).Close("Contents");
}

}  // namespace

// Parses max-keys / max-uploads style parameters: default and cap `limit`, junk → InvalidArgument.
std::variant<uint32_t, aws::AwsError> ParseMax(const Call& call, std::string_view name, uint32_t limit) {
  const std::string* text = call.query.Get(name);
  if (!text) return limit;
  auto v = ParseInt64(Trim(*text));
  if (!v || *v < 0 || *v > 2147483647) {
    return InvalidArgument("Provided " + std::string(name) + " not an integer or within integer range",
                           std::string(name), *text);
  }
  return static_cast<uint32_t>(std::min<int64_t>(*v, limit));
}

std::variant<bool, aws::AwsError> ParseEncodingType(const Call& call) {
  const std::string* encoding = call.query.Get("encoding-type");
  if (!encoding) return false;
  if (*encoding != "url") {
    return InvalidArgument("Invalid Encoding Method specified in Request", "encoding-type", *encoding);
  }
  return true;
}

Outcome ListBuckets(Call& call) {
  auto buckets = call.store->ListBuckets();
  if (!buckets.ok()) return StoreError(call, buckets.status());
  std::string prefix = call.query.GetOr("prefix", "");
  XmlWriter xml("ListAllMyBucketsResult");
  WriteOwner(xml, "Owner", call.options);
  xml.Open("Buckets");
  for (const BucketInfo& b : *buckets) {
    if (!StartsWith(b.name, prefix)) continue;
    xml.Open("Bucket")
        .Element("Name", b.name)
        .Element("CreationDate", FormatIso8601Millis(b.creation_millis))
        .Element("BucketRegion", b.region.empty() ? call.options.default_region : b.region)
        .Close("Bucket");
  }
  xml.Close("Buckets");
  if (!prefix.empty()) xml.Element("Prefix", prefix);
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

Outcome CreateBucket(Call& call) {
  auto body = ReadSmallBody(call, kMaxCreateBucketBody);
  if (auto* e = std::get_if<aws::AwsError>(&body)) return *e;
  const std::string& text = std::get<std::string>(body);
  // S3 puts a bucket created without a LocationConstraint in us-east-1.
  std::string region = "us-east-1";
  if (!Trim(text).empty()) {
    pugi::xml_document doc;
    if (!doc.load_buffer(text.data(), text.size())) return MalformedXml();
    pugi::xml_node root = doc.child("CreateBucketConfiguration");
    if (!root) return MalformedXml();
    std::string constraint = root.child("LocationConstraint").text().as_string();
    if (constraint == "EU") constraint = "eu-west-1";
    if (!constraint.empty()) region = constraint;
  }
  if (!IsValidBucketName(call.bucket())) {
    return aws::AwsError("InvalidBucketName", "The specified bucket is not valid.", 400)
        .With("BucketName", call.bucket());
  }
  Status s = call.store->CreateBucket(call.bucket(), region);
  if (!s.ok()) return StoreError(call, s);
  HeaderMap headers = BaseHeaders(call);
  headers.emplace("Location", "/" + call.bucket());
  SendEmpty(call, 200, std::move(headers));
  return std::nullopt;
}

Outcome HeadBucket(Call& call) {
  auto info = call.store->HeadBucket(call.bucket());
  if (!info.ok()) return StoreError(call, info.status());
  HeaderMap headers = BaseHeaders(call);
  headers.emplace("x-amz-bucket-region", info->region.empty() ? call.options.default_region : info->region);
  headers.emplace("x-amz-access-point-alias", "false");
  SendEmpty(call, 200, std::move(headers));
  return std::nullopt;
}

Outcome DeleteBucket(Call& call) {
  Status s = call.store->DeleteBucket(call.bucket());
  if (!s.ok()) return StoreError(call, s);
  SendEmpty(call, 204, BaseHeaders(call));
  return std::nullopt;
}

Outcome GetBucketLocation(Call& call) {
  auto info = call.store->HeadBucket(call.bucket());
  if (!info.ok()) return StoreError(call, info.status());
  std::string region = info->region == "us-east-1" ? "" : info->region;
  std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<LocationConstraint xmlns=\"" +
                    std::string(kXmlNamespace) + "\">" + XmlEscape(region) + "</LocationConstraint>";
  SendXml(call, 200, BaseHeaders(call), xml);
  return std::nullopt;
}

Outcome GetBucketVersioning(Call& call) {
  auto info = call.store->HeadBucket(call.bucket());
  if (!info.ok()) return StoreError(call, info.status());
  std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<VersioningConfiguration xmlns=\"" +
                    std::string(kXmlNamespace) + "\"/>";
  SendXml(call, 200, BaseHeaders(call), xml);
  return std::nullopt;
}

Outcome ListObjectsV2(Call& call) {
  auto limits = ParseListLimits(call, "max-keys", kMaxListKeys);
  if (auto* e = std::get_if<aws::AwsError>(&limits)) return *e;
  const bool encode = std::get<ListLimits>(limits).encode;
  const std::string* token = call.query.Get("continuation-token");
  const std::string* start_after = call.query.Get("start-after");
  ListOptions options;
  options.prefix = call.query.GetOr("prefix", "");
  options.delimiter = call.query.GetOr("delimiter", "");
  options.max_keys = std::get<ListLimits>(limits).max;
  if (token) {
    // The token is opaque to clients: base64 of the marker to continue after.
    auto marker = Base64Decode(*token);
    if (!marker || token->empty()) {
      return InvalidArgument("The continuation token provided is incorrect", "continuation-token", *token);
    }
    options.start_after = *marker;
  } else if (start_after) {
    options.start_after = *start_after;
  }
  auto list = call.store->ListObjects(call.bucket(), options);
  if (!list.ok()) return StoreError(call, list.status());
  bool fetch_owner = call.query.GetOr("fetch-owner", "") == "true";
  auto enc = [&](const std::string& s) { return encode ? ListEncode(s) : s; };

  XmlWriter xml("ListBucketResult");
  xml.Element("Name", call.bucket()).Element("Prefix", enc(options.prefix));
  if (!options.delimiter.empty()) xml.Element("Delimiter", enc(options.delimiter));
  xml.Element("MaxKeys", std::to_string(options.max_keys));
  if (encode) xml.Element("EncodingType", "url");
  xml.Element("KeyCount", std::to_string(list->objects.size() + list->common_prefixes.size()));
  xml.Element("IsTruncated", list->truncated ? "true" : "false");
  if (token) xml.Element("ContinuationToken", *token);
  if (list->truncated && !list->next_marker.empty()) {
    xml.Element("NextContinuationToken", Base64Encode(list->next_marker));
  }
  if (start_after) xml.Element("StartAfter", enc(*start_after));
  for (const ObjectInfo& object : list->objects) WriteContents(xml, object, encode, fetch_owner, call.options);
  for (const std::string& prefix : list->common_prefixes) {
    xml.Open("CommonPrefixes").Element("Prefix", enc(prefix)).Close("CommonPrefixes");
  }
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

Outcome ListObjectsV1(Call& call) {
  auto limits = ParseListLimits(call, "max-keys", kMaxListKeys);
  if (auto* e = std::get_if<aws::AwsError>(&limits)) return *e;
  const bool encode = std::get<ListLimits>(limits).encode;
  ListOptions options;
  options.prefix = call.query.GetOr("prefix", "");
  options.delimiter = call.query.GetOr("delimiter", "");
  options.start_after = call.query.GetOr("marker", "");
  options.max_keys = std::get<ListLimits>(limits).max;
  auto list = call.store->ListObjects(call.bucket(), options);
  if (!list.ok()) return StoreError(call, list.status());
  auto enc = [&](const std::string& s) { return encode ? ListEncode(s) : s; };

  XmlWriter xml("ListBucketResult");
  xml.Element("Name", call.bucket()).Element("Prefix", enc(options.prefix)).Element("Marker", enc(options.start_after));
  // As S3: NextMarker only for delimited listings; clients fall back to the last key otherwise.
  if (list->truncated && !options.delimiter.empty() && !list->next_marker.empty()) {
    xml.Element("NextMarker", enc(list->next_marker));
  }
  xml.Element("MaxKeys", std::to_string(options.max_keys));
  if (!options.delimiter.empty()) xml.Element("Delimiter", enc(options.delimiter));
  if (encode) xml.Element("EncodingType", "url");
  xml.Element("IsTruncated", list->truncated ? "true" : "false");
  for (const ObjectInfo& object : list->objects) WriteContents(xml, object, encode, true, call.options);
  for (const std::string& prefix : list->common_prefixes) {
    xml.Open("CommonPrefixes").Element("Prefix", enc(prefix)).Close("CommonPrefixes");
  }
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

Outcome DeleteObjects(Call& call) {
  bool has_digest = call.Header("Content-MD5") != nullptr || call.Header("x-amz-trailer") != nullptr;
  for (const auto& [name, value] : call.request.headers) {
    if (StartsWith(ToLower(name), "x-amz-checksum-") && ToLower(name) != "x-amz-checksum-mode") has_digest = true;
  }
  if (!has_digest) {
    return aws::AwsError("InvalidRequest", "Missing required header for this request: Content-MD5 or x-amz-checksum-*",
                         400);
  }
  auto body = ReadSmallBody(call, kMaxDeleteBody);
  if (auto* e = std::get_if<aws::AwsError>(&body)) return *e;
  const std::string& text = std::get<std::string>(body);
  pugi::xml_document doc;
  if (!doc.load_buffer(text.data(), text.size(), pugi::parse_default | pugi::parse_ws_pcdata_single)) {
    return MalformedXml();
  }
  pugi::xml_node root = doc.child("Delete");
  if (!root) return MalformedXml();
  bool quiet = EqualsIgnoreCase(Trim(root.child("Quiet").text().as_string()), "true");
  std::vector<std::string> keys;
  for (pugi::xml_node object : root.children("Object")) {
    pugi::xml_node key = object.child("Key");
    if (!key) return MalformedXml();
    keys.emplace_back(key.text().as_string());
    if (keys.size() > kMaxDeleteKeys) return MalformedXml();
  }
  if (keys.empty()) return MalformedXml();
  auto bucket = call.store->HeadBucket(call.bucket());
  if (!bucket.ok()) return StoreError(call, bucket.status());

  XmlWriter xml("DeleteResult");
  for (const std::string& key : keys) {
    Status s = call.store->DeleteObject(call.bucket(), key);
    if (s.ok()) {
      if (!quiet) xml.Open("Deleted").Element("Key", key).Close("Deleted");
      continue;
    }
    aws::AwsError error = StoreError(call, s);
    xml.Open("Error").Element("Key", key).Element("Code", error.code).Element("Message", error.message).Close("Error");
  }
  SendXml(call, 200, BaseHeaders(call), xml.Finish());
  return std::nullopt;
}

}  // namespace kiln::objects::s3
