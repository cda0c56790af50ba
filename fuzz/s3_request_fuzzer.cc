// Fuzzes the S3 front (src/objects/s3api/): one whole objects::S3Api::Handle call per input,
// against a fresh in-memory store, so addressing, query parsing, Range / conditional headers,
// checksum headers and the XML request bodies (CompleteMultipartUpload, DeleteObjects,
// CreateBucketConfiguration, ...) all see fuzzed bytes; plus the pure helpers of s3_request.h
// called directly on the same bytes.
//
// Input layout: byte 0 = method (% 6), then lines up to the first empty line ("\n\n"):
//   request target ("/b/k?uploads"), then headers "Name: value" (Host defaults to
//   localhost:5456, Content-Length to the body size); the rest is the body.
// The store starts with bucket "b" holding "k" (10 bytes) and "dir/x", and bucket "b" has
// multipart upload "upload-1" for key "mp" with parts 1 and 2, so Complete/ListParts/UploadPart
// reach real state.
//
// Checks besides "no crash, no sanitizer report": Handle always finishes a response with a valid
// status; a satisfiable Range lies inside the object.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "aws/request_context.h"
#include "base/io.h"
#include "base/strings.h"
#include "net/http_server.h"
#include "net/test_util/fake_response_writer.h"
#include "objects/s3api/s3_api.h"
#include "objects/s3api/s3_request.h"
#include "objects/s3api/test_util/fake_object_store.h"

namespace {

namespace s3 = kiln::objects::s3;

void Check(bool condition) {
  if (!condition) std::abort();
}

void Populate(kiln::objects::FakeObjectStore& store) {
  store.SetMinPartSizeForTest(1);
  Check(store.CreateBucket("b", "us-east-1").ok());
  kiln::StringByteSource k("0123456789");
  Check(store.PutObject("b", "k", k, kiln::objects::PutOptions{}).ok());
  kiln::StringByteSource x("x");
  Check(store.PutObject("b", "dir/x", x, kiln::objects::PutOptions{}).ok());
  auto upload = store.CreateMultipartUpload("b", "mp", {}, "");
  Check(upload.ok() && upload->upload_id == "upload-1");
  for (uint32_t part = 1; part <= 2; ++part) {
    kiln::StringByteSource data(part == 1 ? "part one" : "part two");
    Check(store.UploadPart("b", "mp", "upload-1", part, data, kiln::objects::PutOptions{}).ok());
  }
}

// The pure helpers, straight on the fuzzed strings.
void FuzzHelpers(const kiln::net::HttpRequest& request, uint64_t size) {
  const std::string host = request.HeaderOr("Host", "");
  (void)s3::ResolveAddress(host, request.raw_path, {"localhost", "s3.kiln.test"});
  s3::QueryParams query = s3::QueryParams::Parse(request.raw_query);
  for (const auto& [name, value] : query.all()) {
    (void)s3::ParseQueryUint(value, 1000);
    (void)s3::IsValidBucketName(value);
    (void)s3::ListEncode(value);
  }
  if (const std::string* range = request.Header("Range")) {
    s3::RangeSpec spec = s3::ParseRange(*range, size);
    if (spec.kind == s3::RangeSpec::kSatisfiable) {
      Check(spec.range.first <= spec.range.last && spec.range.last < size);
    }
    (void)s3::ParseCopySourceRange(*range);
  }
  s3::ConditionHeaders conditions;
  conditions.if_match = request.Header("If-Match");
  conditions.if_none_match = request.Header("If-None-Match");
  conditions.if_modified_since = request.Header("If-Modified-Since");
  conditions.if_unmodified_since = request.Header("If-Unmodified-Since");
  std::string failed;
  (void)s3::EvaluateConditions(conditions, "\"0123456789abcdef0123456789abcdef\"", 1714557600000, &failed);
  if (conditions.if_match != nullptr) (void)s3::EtagListMatches(*conditions.if_match, "\"abc\"");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const char* const kMethods[] = {"GET", "PUT", "POST", "HEAD", "DELETE", "OPTIONS"};
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

  kiln::net::HttpRequest request;
  request.method = kMethods[data[0] % 6];
  size_t head_end = input.find("\n\n");
  std::string_view head = head_end == std::string_view::npos ? input : input.substr(0, head_end);
  // The body view points into the input even when empty (an empty default view once made
  // StringByteSource memcpy from nullptr; see README.md, findings).
  std::string_view body = input.substr(head_end == std::string_view::npos ? input.size() : head_end + 2);
  std::vector<std::string_view> lines = kiln::Split(head, '\n');
  request.target = lines.empty() || lines[0].empty() ? "/" : std::string(lines[0]);
  size_t q = request.target.find('?');
  request.raw_path = request.target.substr(0, q);
  request.raw_query = q == std::string::npos ? "" : request.target.substr(q + 1);
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string_view::npos || colon == 0) continue;
    request.headers.emplace(std::string(kiln::Trim(lines[i].substr(0, colon))),
                            std::string(kiln::Trim(lines[i].substr(colon + 1))));
  }
  if (request.Header("Host") == nullptr) request.headers.emplace("Host", "localhost:5456");
  if (request.Header("Content-Length") == nullptr) {
    request.headers.emplace("Content-Length", std::to_string(body.size()));
  }
  request.remote_address = "127.0.0.1:40000";
  kiln::StringByteSource source(body);
  request.body = &source;

  FuzzHelpers(request, body.size() % 64);

  kiln::objects::FakeObjectStore store;
  Populate(store);
  kiln::objects::S3ApiOptions options;
  options.virtual_host_suffixes = {"localhost", "s3.kiln.test"};
  kiln::objects::S3Api api(options, &store);
  kiln::aws::RequestContext context;
  context.request_id = "FUZZREQ";
  context.protocol = kiln::aws::Protocol::kRestXml;
  context.service = "s3";
  context.region = "us-east-1";
  kiln::net::FakeResponseWriter writer;
  api.Handle(context, request, writer);
  Check(writer.finished());
  Check(writer.status() >= 200 && writer.status() <= 599);
  return 0;
}
