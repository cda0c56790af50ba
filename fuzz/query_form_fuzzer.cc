// Fuzzes the AWS Query protocol path (STS) through the front door: the query-string and
// application/x-www-form-urlencoded body decoding in src/api/front_door.cc (ParseForm, its
// percent-decoding, repeated and empty names) and api::HandleSts, plus the routing that decides a
// request is Query at all (Action= in the query, form content type, an "sts" SigV4 scope).
//
// Input layout: byte 0 = flags:
//   bit 0   GET instead of POST
//   bit 1   Content-Type "text/plain" instead of the form type (bit 2 picks the case variant
//           "Application/X-WWW-Form-Urlencoded; charset=utf-8" when bit 1 is clear)
//   bit 3   add an Authorization header signed for "sts" (with a key the provider does not
//           know: exercises the Query-protocol authentication errors)
// then the first line = the query string (without '?'), the rest = the body.
// The front door is unsigned (listener auth "off"), with an empty in-memory S3 behind it for the
// requests that are not Query.
//
// Checks besides "no crash, no sanitizer report": a response is finished, never 500; an XML body
// (everything STS and S3 answer here) is well-formed; an STS error is <ErrorResponse> with a
// non-empty <Code>; a 200 STS answer is <GetCallerIdentityResponse> with the account.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <pugixml.hpp>

#include "api/front_door.h"
#include "aws/credentials.h"
#include "base/io.h"
#include "fuzz_support.h"
#include "net/test_util/fake_response_writer.h"
#include "objects/s3api/s3_api.h"
#include "objects/s3api/test_util/fake_object_store.h"

namespace {

using kiln::fuzz::Check;

class NoCredentials : public kiln::aws::CredentialProvider {
 public:
  std::optional<kiln::aws::Credential> Lookup(std::string_view) const override { return std::nullopt; }
};

struct World {
  kiln::objects::FakeObjectStore objects;
  kiln::objects::S3Api s3{kiln::objects::S3ApiOptions{}, &objects};
  NoCredentials credentials;
  kiln::api::FrontDoor door{[] {
                              kiln::api::FrontDoorOptions o;
                              o.auth_enabled = false;
                              o.account_id = "123456789012";
                              return o;
                            }(),
                            &credentials, &s3};
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static World world;  // stateless for Query requests; S3 sees only reads of an empty store or errors
  const uint8_t flags = data[0];
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto [query, body] = kiln::fuzz::FirstLine(input);

  kiln::net::HttpRequest request;
  request.method = (flags & 1) ? "GET" : "POST";
  request.raw_path = "/";
  request.raw_query = std::string(query);
  request.target = query.empty() ? "/" : "/?" + request.raw_query;
  request.headers.emplace("Host", "localhost:5456");
  request.headers.emplace("Content-Type", (flags & 2)   ? "text/plain"
                                          : (flags & 4) ? "Application/X-WWW-Form-Urlencoded; charset=utf-8"
                                                        : "application/x-www-form-urlencoded");
  request.headers.emplace("Content-Length", std::to_string(body.size()));
  if (flags & 8) {
    request.headers.emplace("X-Amz-Date", "20130524T000000Z");
    request.headers.emplace("Authorization",
                            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20130524/us-east-1/sts/aws4_request, "
                            "SignedHeaders=host;x-amz-date, "
                            "Signature=0000000000000000000000000000000000000000000000000000000000000000");
  }
  request.remote_address = "127.0.0.1:40000";
  kiln::StringByteSource source(body);
  request.body = &source;

  kiln::net::FakeResponseWriter writer;
  world.door.Handle(request, writer);
  if (kiln::fuzz::Debug()) std::fprintf(stderr, "%d %s\n", writer.status(), writer.body().substr(0, 2000).c_str());

  Check(writer.finished());
  Check(writer.status() >= 200 && writer.status() <= 599 && writer.status() != 500);
  const std::string& out = writer.body();
  if (out.empty()) return 0;  // S3 answers some requests with no body (204, HEAD-like)
  pugi::xml_document doc;
  Check(doc.load_buffer(out.data(), out.size()));
  pugi::xml_node root = doc.document_element();
  Check(!root.empty());
  const bool sts =
      std::string_view(root.attribute("xmlns").value()).find("sts.amazonaws.com") != std::string_view::npos;
  if (!sts) return 0;
  if (writer.status() == 200) {
    Check(std::string_view(root.name()) == "GetCallerIdentityResponse");
    Check(std::string_view(root.child("GetCallerIdentityResult").child_value("Account")) == "123456789012");
  } else {
    Check(std::string_view(root.name()) == "ErrorResponse");
    Check(*root.child("Error").child_value("Code") != '\0');
  }
  return 0;
}
