#include "objects/s3api/s3_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/time.h"
#include "objects/s3api/s3_request.h"
#include "net/test_util/fake_response_writer.h"
#include "objects/s3api/test_util/fake_object_store.h"

namespace kiln::objects {
namespace {

using net::FakeResponseWriter;
using ::testing::HasSubstr;
using ::testing::Not;

struct Reply {
  int status = 0;
  std::string body;
  bool close = false;
  std::optional<uint64_t> content_length;
  FakeResponseWriter writer;
  std::string Header(std::string_view name) const { return writer.header(name); }
  bool HasHeader(std::string_view name) const { return writer.has_header(name); }
};

// The fake store, whose DeleteObject can be made to fail with a chosen Status (to test how the
// front maps store errors).
class TestStore : public FakeObjectStore {
 public:
  Status DeleteObject(const std::string& bucket, const std::string& key) override {
    if (!delete_error.ok()) return delete_error;
    return FakeObjectStore::DeleteObject(bucket, key);
  }
  Status delete_error;
};

class S3ApiTest : public ::testing::Test {
 protected:
  S3ApiTest() : api_(Options(), &store_) {}

  static S3ApiOptions Options() {
    S3ApiOptions options;
    options.virtual_host_suffixes = {"localhost", "s3.kiln.test"};
    options.account_id = "123456789012";
    return options;
  }

  std::unique_ptr<Reply> Do(const std::string& method, const std::string& target, HeaderMap headers = {},
                            const std::string& body = "") {
    net::HttpRequest request;
    request.method = method;
    request.target = target;
    size_t q = target.find('?');
    request.raw_path = target.substr(0, q);
    request.raw_query = q == std::string::npos ? "" : target.substr(q + 1);
    if (headers.find("Host") == headers.end()) headers.emplace("Host", "localhost:5456");
    if (!body.empty() && headers.find("Content-Length") == headers.end()) {
      headers.emplace("Content-Length", std::to_string(body.size()));
    }
    request.headers = headers;
    StringByteSource source(body);
    request.body = &source;
    aws::RequestContext context;
    context.request_id = "REQ123";
    context.protocol = aws::Protocol::kRestXml;
    context.service = "s3";
    auto reply = std::make_unique<Reply>();
    api_.Handle(context, request, reply->writer);
    EXPECT_TRUE(reply->writer.finished()) << method << " " << target;
    EXPECT_EQ(reply->writer.header("x-amz-request-id"), "REQ123");
    EXPECT_TRUE(reply->writer.has_header("x-amz-id-2"));
    reply->status = reply->writer.status();
    reply->body = reply->writer.body();
    reply->close = reply->writer.close();
    reply->content_length = reply->writer.content_length();
    return reply;
  }

  void MakeBucket(const std::string& name) { ASSERT_TRUE(store_.CreateBucket(name, "us-east-1").ok()); }
  void Put(const std::string& bucket, const std::string& key, const std::string& data) {
    StringByteSource source(data);
    ASSERT_TRUE(store_.PutObject(bucket, key, source, PutOptions{}).ok());
  }

  TestStore store_;
  S3Api api_;
};

std::string Crc32Of(const std::string& data) {
  S3Checksum c(S3Checksum::Algorithm::kCrc32);
  c.Update(data);
  return c.FinalBase64();
}

// ---- Pure helpers ----

TEST(S3RequestTest, ResolvesPathStyleAndDecodesKeyOnce) {
  auto a = s3::ResolveAddress("localhost:5456", "/b/a%2F%2Fb/..%2F./c%20d+x%2525", {"localhost"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->bucket, "b");
  EXPECT_EQ(a->key, "a//b/.././c d+x%25");
  EXPECT_FALSE(a->virtual_hosted);
  auto slashes = s3::ResolveAddress("127.0.0.1:5456", "/b//lead//x/", {"localhost"});
  ASSERT_TRUE(slashes.ok());
  EXPECT_EQ(slashes->key, "/lead//x/");
  auto bucket_only = s3::ResolveAddress("localhost", "/b", {"localhost"});
  ASSERT_TRUE(bucket_only.ok());
  EXPECT_EQ(bucket_only->bucket, "b");
  EXPECT_EQ(bucket_only->key, "");
  auto root = s3::ResolveAddress("localhost", "/", {"localhost"});
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->bucket, "");
  EXPECT_FALSE(s3::ResolveAddress("localhost", "/b/bad%zz", {"localhost"}).ok());
}

TEST(S3RequestTest, ResolvesVirtualHostedStyle) {
  auto a = s3::ResolveAddress("My-Bucket.localhost:5456", "/x/%E2%9C%93", {"localhost"});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->virtual_hosted);
  EXPECT_EQ(a->bucket, "my-bucket");
  EXPECT_EQ(a->key, "x/\xE2\x9C\x93");
  auto dotted = s3::ResolveAddress("a.b.s3.kiln.test", "/", {"localhost", "s3.kiln.test"});
  ASSERT_TRUE(dotted.ok());
  EXPECT_EQ(dotted->bucket, "a.b");
  EXPECT_EQ(dotted->key, "");
  // Exactly the suffix, or an unrelated host: path style.
  auto exact = s3::ResolveAddress("s3.kiln.test", "/b/k", {"s3.kiln.test"});
  ASSERT_TRUE(exact.ok());
  EXPECT_FALSE(exact->virtual_hosted);
  EXPECT_EQ(exact->bucket, "b");
  auto other = s3::ResolveAddress("example.com", "/b/k", {"localhost"});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->bucket, "b");
}

TEST(S3RequestTest, ParsesRanges) {
  using s3::ParseRange;
  using s3::RangeSpec;
  auto r = ParseRange("bytes=0-4", 10);
  EXPECT_EQ(r.kind, RangeSpec::kSatisfiable);
  EXPECT_EQ(r.range.first, 0u);
  EXPECT_EQ(r.range.last, 4u);
  r = ParseRange("bytes=5-", 10);
  EXPECT_EQ(r.range.first, 5u);
  EXPECT_EQ(r.range.last, 9u);
  r = ParseRange("bytes=-3", 10);
  EXPECT_EQ(r.range.first, 7u);
  EXPECT_EQ(r.range.last, 9u);
  r = ParseRange("bytes=-30", 10);
  EXPECT_EQ(r.range.first, 0u);
  EXPECT_EQ(r.range.last, 9u);
  r = ParseRange("bytes=8-100", 10);
  EXPECT_EQ(r.range.last, 9u);
  EXPECT_EQ(ParseRange("bytes=10-", 10).kind, RangeSpec::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=-0", 10).kind, RangeSpec::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=0-", 0).kind, RangeSpec::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=0-1,3-4", 10).kind, RangeSpec::kNone);
  EXPECT_EQ(ParseRange("bytes=5-2", 10).kind, RangeSpec::kNone);
  EXPECT_EQ(ParseRange("items=0-1", 10).kind, RangeSpec::kNone);
  EXPECT_EQ(ParseRange("bytes=a-b", 10).kind, RangeSpec::kNone);
  EXPECT_EQ(ParseRange("bytes=99999999999999999999999-", 10).kind, RangeSpec::kNone);
}

TEST(S3RequestTest, ConditionPrecedence) {
  using s3::ConditionResult;
  const int64_t modified = 1714557600000;  // Wed, 01 May 2024 10:00:00 GMT
  std::string etag = "abc";
  std::string match = "\"abc\"", other = "\"zzz\"";
  std::string before = "Wed, 01 May 2024 09:00:00 GMT", after = "Wed, 01 May 2024 11:00:00 GMT";
  s3::ConditionHeaders h;
  h.if_match = &match;
  h.if_unmodified_since = &before;  // would fail alone; If-Match true wins
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, nullptr), ConditionResult::kProceed);
  h = {};
  h.if_match = &other;
  std::string failed;
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, &failed), ConditionResult::kPreconditionFailed);
  EXPECT_EQ(failed, "If-Match");
  h = {};
  h.if_none_match = &other;
  h.if_modified_since = &after;  // would be 304 alone; If-None-Match false wins
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, nullptr), ConditionResult::kProceed);
  h = {};
  h.if_modified_since = &after;
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, nullptr), ConditionResult::kNotModified);
  h = {};
  h.if_modified_since = &before;
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, nullptr), ConditionResult::kProceed);
  h = {};
  h.if_unmodified_since = &before;
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, nullptr), ConditionResult::kPreconditionFailed);
  std::string star = "*";
  h = {};
  h.if_none_match = &star;
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, nullptr), ConditionResult::kNotModified);
  std::string junk = "not a date";
  h = {};
  h.if_modified_since = &junk;
  EXPECT_EQ(s3::EvaluateConditions(h, etag, modified, nullptr), ConditionResult::kProceed);
}

TEST(S3RequestTest, BucketNames) {
  EXPECT_TRUE(s3::IsValidBucketName("sagemaker-us-east-1-123456789012"));
  EXPECT_TRUE(s3::IsValidBucketName("a.b-c"));
  EXPECT_FALSE(s3::IsValidBucketName("ab"));
  EXPECT_FALSE(s3::IsValidBucketName("Upper"));
  EXPECT_FALSE(s3::IsValidBucketName("a..b"));
  EXPECT_FALSE(s3::IsValidBucketName("-ab"));
  EXPECT_FALSE(s3::IsValidBucketName("192.168.1.1"));
  EXPECT_FALSE(s3::IsValidBucketName(std::string(64, 'a')));
}

// Issue 9: every general purpose naming rule of the S3 user guide, each on its own, with names
// just inside every bound still accepted.
TEST(S3RequestTest, BucketNamingRulesOneByOne) {
  struct Case {
    const char* name;
    const char* rule;  // nullptr: valid
  };
  const std::string max_len(63, 'a');
  const std::string too_long(64, 'a');
  const Case cases[] = {
      {"abc", nullptr},
      {max_len.c_str(), nullptr},
      {"ab", "is not 3 to 63 characters long"},
      {too_long.c_str(), "is not 3 to 63 characters long"},
      {"", "is not 3 to 63 characters long"},
      {"my_bucket", "has a character other than a-z, 0-9, '.' and '-'"},
      {"MyBucket", "has a character other than a-z, 0-9, '.' and '-'"},
      {"my bucket", "has a character other than a-z, 0-9, '.' and '-'"},
      {"-abc", "does not begin and end with a letter or digit"},
      {"abc-", "does not begin and end with a letter or digit"},
      {".abc", "does not begin and end with a letter or digit"},
      {"abc.", "does not begin and end with a letter or digit"},
      {"1abc9", nullptr},
      {"a..b", "has two adjacent periods"},
      {"a.b.c", nullptr},
      {"a-.b", "has a '-' next to a '.'"},
      {"a.-b", "has a '-' next to a '.'"},
      {"192.168.5.4", "is formatted as an IP address"},
      {"10.0.0.1", "is formatted as an IP address"},
      {"10.0.0.1a", nullptr},
      {"1.2.3", nullptr},
      {"1.2.3.4.5", nullptr},
      {"xn--bucket", "starts with the reserved prefix xn--"},
      {"xn-bucket", nullptr},
      {"axn--bucket", nullptr},
      {"sthree-bucket", "starts with the reserved prefix sthree-"},
      {"sthree-configurator", "starts with the reserved prefix sthree-"},
      {"sthree-configurator-x", "starts with the reserved prefix sthree-"},
      {"sthreebucket", nullptr},
      {"amzn-s3-demo-bucket", "starts with the reserved prefix amzn-s3-demo-"},
      {"amzn-s3-demobucket", nullptr},
      {"bucket-s3alias", "ends with the reserved suffix -s3alias"},
      {"bucket-s3aliasx", nullptr},
      {"bucket--ol-s3", "ends with the reserved suffix --ol-s3"},
      {"bucket-ol-s3", nullptr},
      {"bucket.mrap", "ends with the reserved suffix .mrap"},
      {"bucketmrap", nullptr},
      {"bucket--usw2-az1--x-s3", "ends with the reserved suffix --x-s3"},
      {"bucket-x-s3", nullptr},
      {"bucket--table-s3", "ends with the reserved suffix --table-s3"},
      {"bucket-table-s3", nullptr},
      {"sagemaker-us-east-1-123456789012", nullptr},
  };
  for (const Case& c : cases) {
    auto violation = s3::BucketNameViolation(c.name);
    if (c.rule == nullptr) {
      EXPECT_FALSE(violation.has_value()) << c.name << ": " << violation.value_or("");
      EXPECT_TRUE(s3::IsValidBucketName(c.name)) << c.name;
    } else {
      EXPECT_EQ(violation.value_or("<valid>"), c.rule) << c.name;
      EXPECT_FALSE(s3::IsValidBucketName(c.name)) << c.name;
    }
  }
}

TEST(S3RequestTest, QueryDecoding) {
  auto q = s3::QueryParams::Parse("prefix=a%2Fb+c&delimiter=%2F&uploads&x=%zz");
  EXPECT_EQ(q.GetOr("prefix", ""), "a/b c");
  EXPECT_EQ(q.GetOr("delimiter", ""), "/");
  EXPECT_TRUE(q.Has("uploads"));
  EXPECT_EQ(q.GetOr("x", ""), "%zz");
  EXPECT_FALSE(q.Has("marker"));
}

// ---- Routing ----

TEST_F(S3ApiTest, OddKeysRoundTripThroughPathStyle) {
  MakeBucket("bkt");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a%2F%2Fb", "a//b"}, {"..%2Fx", "../x"},     {"./.", "./."},     {"a+b", "a+b"},
      {"a%2Bb", "a+b"},     {"sp%20ace", "sp ace"}, {"pct%25", "pct%"}, {"%E2%9C%93/u", "\xE2\x9C\x93/u"},
      {"/lead", "/lead"},
  };
  for (const auto& [raw, key] : cases) {
    auto r = Do("PUT", "/bkt/" + raw, {}, "data:" + key);
    EXPECT_EQ(r->status, 200) << raw;
    EXPECT_EQ(store_.DataForTest("bkt", key).value_or("<missing>"), "data:" + key) << raw;
    auto g = Do("GET", "/bkt/" + raw);
    EXPECT_EQ(g->body, "data:" + key);
  }
}

TEST_F(S3ApiTest, VirtualHostedRequests) {
  MakeBucket("vbucket");
  auto r = Do("PUT", "/dir/file.txt", {{"Host", "vbucket.localhost:5456"}}, "hello");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(store_.DataForTest("vbucket", "dir/file.txt").value_or(""), "hello");
  auto list = Do("GET", "/?list-type=2", {{"Host", "vbucket.localhost"}});
  EXPECT_EQ(list->status, 200);
  EXPECT_THAT(list->body, HasSubstr("<Name>vbucket</Name>"));
  EXPECT_THAT(list->body, HasSubstr("<Key>dir/file.txt</Key>"));
}

TEST_F(S3ApiTest, BadEscapeIsInvalidUri) {
  auto r = Do("GET", "/b/%zz");
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("<Code>InvalidURI</Code>"));
}

TEST_F(S3ApiTest, UnsupportedOperationsAndMethods) {
  MakeBucket("bkt");
  auto acl = Do("GET", "/bkt?acl");
  EXPECT_EQ(acl->status, 501);
  EXPECT_THAT(acl->body, HasSubstr("<Code>NotImplemented</Code>"));
  EXPECT_THAT(acl->body, HasSubstr("acl"));
  auto method = Do("PATCH", "/bkt/key");
  EXPECT_EQ(method->status, 405);
  EXPECT_THAT(method->body, HasSubstr("<Code>MethodNotAllowed</Code>"));
  auto service = Do("PUT", "/");
  EXPECT_EQ(service->status, 405);
  auto versioning = Do("GET", "/bkt?versioning");
  EXPECT_EQ(versioning->status, 200);
  EXPECT_THAT(versioning->body,
              HasSubstr("<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"/>"));
}

// ---- Buckets ----

TEST_F(S3ApiTest, ListBucketsExactXml) {
  MakeBucket("alpha");
  MakeBucket("beta");
  auto r = Do("GET", "/");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->Header("Content-Type"), "application/xml");
  std::string owner = Sha256Hex("kiln-account:123456789012");
  EXPECT_EQ(r->body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<ListAllMyBucketsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
            "<Owner><ID>" +
                owner +
                "</ID><DisplayName>kiln</DisplayName></Owner><Buckets>"
                "<Bucket><Name>alpha</Name><CreationDate>2024-05-01T10:00:00.000Z</CreationDate>"
                "<BucketRegion>us-east-1</BucketRegion></Bucket>"
                "<Bucket><Name>beta</Name><CreationDate>2024-05-01T10:00:00.000Z</CreationDate>"
                "<BucketRegion>us-east-1</BucketRegion></Bucket>"
                "</Buckets></ListAllMyBucketsResult>");
}

TEST_F(S3ApiTest, CreateBucketLifecycle) {
  auto created = Do("PUT", "/new-bucket");
  EXPECT_EQ(created->status, 200);
  EXPECT_EQ(created->Header("Location"), "/new-bucket");
  auto again = Do("PUT", "/new-bucket");
  EXPECT_EQ(again->status, 409);
  EXPECT_THAT(again->body, HasSubstr("<Code>BucketAlreadyOwnedByYou</Code>"));
  EXPECT_THAT(again->body, HasSubstr("<BucketName>new-bucket</BucketName>"));
  auto bad = Do("PUT", "/Bad_Name");
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("<Code>InvalidBucketName</Code>"));
  // Reserved prefixes and suffixes answer exactly as S3 does, and nothing is created.
  for (const char* reserved :
       {"xn--bucket", "sthree-bucket", "sthree-configurator", "amzn-s3-demo-bucket", "bucket-s3alias", "bucket--ol-s3",
        "bucket.mrap", "bucket--use1-az4--x-s3", "bucket--table-s3"}) {
    auto refused = Do("PUT", std::string("/") + reserved);
    EXPECT_EQ(refused->status, 400) << reserved;
    EXPECT_THAT(refused->body, HasSubstr("<Code>InvalidBucketName</Code>")) << reserved;
    EXPECT_THAT(refused->body, HasSubstr("<Message>The specified bucket is not valid.</Message>")) << reserved;
    EXPECT_THAT(refused->body, HasSubstr(std::string("<BucketName>") + reserved + "</BucketName>")) << reserved;
    EXPECT_FALSE(store_.HeadBucket(reserved).ok()) << reserved;
  }

  auto west = Do("PUT", "/west-bucket", {},
                 "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                 "<LocationConstraint>us-west-2</LocationConstraint></CreateBucketConfiguration>");
  EXPECT_EQ(west->status, 200);
  auto loc = Do("GET", "/west-bucket?location");
  EXPECT_EQ(loc->body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<LocationConstraint "
            "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">us-west-2</LocationConstraint>");
  auto east = Do("GET", "/new-bucket?location");
  EXPECT_THAT(east->body, HasSubstr("<LocationConstraint xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"></"));
  auto head = Do("HEAD", "/west-bucket");
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->Header("x-amz-bucket-region"), "us-west-2");

  auto malformed = Do("PUT", "/other-bucket", {}, "<CreateBucketConfiguration><oops");
  EXPECT_EQ(malformed->status, 400);
  EXPECT_THAT(malformed->body, HasSubstr("MalformedXML"));
}

// A bucket whose name a newer rule reserves (made before the rule, or directly in the store) stays
// usable: the rules guard CreateBucket only.
TEST_F(S3ApiTest, ExistingBucketWithReservedNameStaysUsable) {
  MakeBucket("xn--legacy");
  EXPECT_EQ(Do("HEAD", "/xn--legacy")->status, 200);
  EXPECT_EQ(Do("PUT", "/xn--legacy/k", {}, "v")->status, 200);
  auto get = Do("GET", "/xn--legacy/k");
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->body, "v");
  EXPECT_THAT(Do("GET", "/xn--legacy?list-type=2")->body, HasSubstr("<Key>k</Key>"));
  auto again = Do("PUT", "/xn--legacy");
  EXPECT_EQ(again->status, 400);
  EXPECT_THAT(again->body, HasSubstr("<Code>InvalidBucketName</Code>"));
  EXPECT_EQ(Do("DELETE", "/xn--legacy/k")->status, 204);
  EXPECT_EQ(Do("DELETE", "/xn--legacy")->status, 204);
}
// The S3 error of a store failure follows its typed reason (object_store.h), never its text: the
// same message without the reason is a plain InvalidArgument carrying the whole message.
TEST_F(S3ApiTest, StoreErrorsMapByReasonNotMessage) {
  MakeBucket("bkt");
  struct Case {
    Status status;
    int http;
    std::string code;
    std::string message;
  };
  const Case cases[] = {
      {Status::InvalidArgument("KeyTooLongError: your key is too long").WithReason(ErrorReason::kKeyTooLong), 400,
       "KeyTooLongError", "your key is too long"},
      {Status::InvalidArgument("KeyTooLongError: your key is too long"), 400, "InvalidArgument",
       "KeyTooLongError: your key is too long"},
      {Status::InvalidArgument("InvalidArgument:  part number  ").WithReason(ErrorReason::kInvalidArgument), 400,
       "InvalidArgument", "part number"},
      {Status::InvalidArgument("InvalidRequest: HTTP 400").WithReason(ErrorReason::kInvalidRequest), 400,
       "InvalidRequest", "HTTP 400"},
      {Status::InvalidArgument("bad range").WithReason(ErrorReason::kInvalidRange), 416, "InvalidRange",
       "The requested range is not satisfiable"},
      {Status::InvalidArgument("InvalidRange: x"), 400, "InvalidArgument", "InvalidRange: x"},
      {Status::InvalidArgument("no").WithReason(ErrorReason::kInvalidBucketName), 400, "InvalidBucketName",
       "The specified bucket is not valid."},
      {Status::InvalidArgument("no").WithReason(ErrorReason::kEntityTooSmall), 400, "EntityTooSmall",
       "Your proposed upload is smaller than the minimum allowed object size."},
      {Status::ResourceExhausted("big").WithReason(ErrorReason::kEntityTooLarge), 400, "EntityTooLarge",
       "Your proposed upload exceeds the maximum allowed object size."},
      {Status::DataLoss("BadDigest: x").WithReason(ErrorReason::kBadDigest), 400, "BadDigest",
       "The Content-MD5 or checksum value that you specified did not match what the server received."},
  };
  for (const Case& c : cases) {
    store_.delete_error = c.status;
    auto reply = Do("DELETE", "/bkt/k");
    EXPECT_EQ(reply->status, c.http) << c.status.ToString();
    EXPECT_THAT(reply->body, HasSubstr("<Code>" + c.code + "</Code>")) << c.status.ToString();
    EXPECT_THAT(reply->body, HasSubstr("<Message>" + c.message + "</Message>")) << c.status.ToString();
  }
  // Mapped without a reason: the DataLoss is not a BadDigest.
  store_.delete_error = Status::DataLoss("BadDigest: x");
  EXPECT_THAT(Do("DELETE", "/bkt/k")->body, Not(HasSubstr("<Code>BadDigest</Code>")));
}

TEST_F(S3ApiTest, HeadBucketErrorsHaveEmptyBodies) {
  auto missing = Do("HEAD", "/nope-bucket");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, "");
  MakeBucket("mine");
  auto owner = Do("HEAD", "/mine", {{"x-amz-expected-bucket-owner", "999999999999"}});
  EXPECT_EQ(owner->status, 403);
  EXPECT_EQ(owner->body, "");
  auto ok_owner = Do("HEAD", "/mine", {{"x-amz-expected-bucket-owner", "123456789012"}});
  EXPECT_EQ(ok_owner->status, 200);
}

TEST_F(S3ApiTest, DeleteBucket) {
  MakeBucket("full");
  Put("full", "k", "v");
  auto not_empty = Do("DELETE", "/full");
  EXPECT_EQ(not_empty->status, 409);
  EXPECT_THAT(not_empty->body, HasSubstr("<Code>BucketNotEmpty</Code>"));
  auto missing = Do("DELETE", "/ghost");
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("<Code>NoSuchBucket</Code>"));
  EXPECT_THAT(missing->body, HasSubstr("<BucketName>ghost</BucketName>"));
  EXPECT_EQ(Do("DELETE", "/full/k")->status, 204);
  EXPECT_EQ(Do("DELETE", "/full")->status, 204);
}

// ---- Objects ----

TEST_F(S3ApiTest, PutStoresHeadersAndGetReturnsThem) {
  MakeBucket("bkt");
  auto put = Do("PUT", "/bkt/obj",
                {{"Content-Type", "text/plain"},
                 {"Content-Encoding", "aws-chunked,gzip"},
                 {"Content-Disposition", "attachment"},
                 {"Cache-Control", "no-cache"},
                 {"X-Amz-Meta-Owner", "Alice"},
                 {"x-amz-tagging", "a=1&b=2"}},
                "hello world");
  EXPECT_EQ(put->status, 200);
  EXPECT_EQ(put->Header("ETag"), "\"" + HexEncode(Md5("hello world")) + "\"");
  auto get = Do("GET", "/bkt/obj");
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->body, "hello world");
  EXPECT_EQ(get->content_length, 11u);
  EXPECT_EQ(get->Header("Content-Type"), "text/plain");
  EXPECT_EQ(get->Header("Content-Encoding"), "gzip");
  EXPECT_EQ(get->Header("Content-Disposition"), "attachment");
  EXPECT_EQ(get->Header("Cache-Control"), "no-cache");
  EXPECT_EQ(get->Header("x-amz-meta-owner"), "Alice");
  EXPECT_EQ(get->Header("x-amz-tagging-count"), "2");
  EXPECT_EQ(get->Header("Accept-Ranges"), "bytes");
  EXPECT_EQ(get->Header("Last-Modified"), "Wed, 01 May 2024 10:00:00 GMT");
  EXPECT_EQ(get->Header("ETag"), put->Header("ETag"));

  Do("PUT", "/bkt/plain", {{"Content-Encoding", "aws-chunked"}}, "x");
  auto plain = Do("HEAD", "/bkt/plain");
  EXPECT_EQ(plain->Header("Content-Type"), "binary/octet-stream");
  EXPECT_FALSE(plain->HasHeader("Content-Encoding"));
  EXPECT_EQ(plain->body, "");
  EXPECT_EQ(plain->content_length, 1u);

  auto overridden = Do("GET", "/bkt/obj?response-content-type=application%2Fjson&response-cache-control=max-age%3D5");
  EXPECT_EQ(overridden->Header("Content-Type"), "application/json");
  EXPECT_EQ(overridden->Header("Cache-Control"), "max-age=5");
}

TEST_F(S3ApiTest, MissingObjectAndBucket) {
  MakeBucket("bkt");
  auto get = Do("GET", "/bkt/no/such key");
  EXPECT_EQ(get->status, 404);
  EXPECT_THAT(get->body, HasSubstr("<Code>NoSuchKey</Code>"));
  EXPECT_THAT(get->body, HasSubstr("<Key>no/such key</Key>"));
  EXPECT_THAT(get->body, HasSubstr("<RequestId>REQ123</RequestId>"));
  auto head = Do("HEAD", "/bkt/missing");
  EXPECT_EQ(head->status, 404);
  EXPECT_EQ(head->body, "");
  auto put = Do("PUT", "/ghost/k", {}, "data");
  EXPECT_EQ(put->status, 404);
  EXPECT_THAT(put->body, HasSubstr("<Code>NoSuchBucket</Code>"));
  auto del = Do("DELETE", "/bkt/never-existed");
  EXPECT_EQ(del->status, 204);
}

TEST_F(S3ApiTest, Ranges) {
  MakeBucket("bkt");
  Put("bkt", "digits", "0123456789");
  auto r = Do("GET", "/bkt/digits", {{"Range", "bytes=2-5"}});
  EXPECT_EQ(r->status, 206);
  EXPECT_EQ(r->body, "2345");
  EXPECT_EQ(r->Header("Content-Range"), "bytes 2-5/10");
  EXPECT_EQ(r->content_length, 4u);
  r = Do("GET", "/bkt/digits", {{"Range", "bytes=7-"}});
  EXPECT_EQ(r->body, "789");
  r = Do("GET", "/bkt/digits", {{"Range", "bytes=-3"}});
  EXPECT_EQ(r->status, 206);
  EXPECT_EQ(r->body, "789");
  EXPECT_EQ(r->Header("Content-Range"), "bytes 7-9/10");
  r = Do("GET", "/bkt/digits", {{"Range", "bytes=-100"}});
  EXPECT_EQ(r->body, "0123456789");
  r = Do("GET", "/bkt/digits", {{"Range", "bytes=0-1,4-5"}});
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "0123456789");
  r = Do("GET", "/bkt/digits", {{"Range", "bytes=10-20"}});
  EXPECT_EQ(r->status, 416);
  EXPECT_THAT(r->body, HasSubstr("<Code>InvalidRange</Code>"));
  EXPECT_THAT(r->body, HasSubstr("<ActualObjectSize>10</ActualObjectSize>"));
  EXPECT_THAT(r->body, HasSubstr("<RangeRequested>bytes=10-20</RangeRequested>"));
  auto head = Do("HEAD", "/bkt/digits", {{"Range", "bytes=1-2"}});
  EXPECT_EQ(head->status, 206);
  EXPECT_EQ(head->content_length, 2u);
  EXPECT_EQ(head->body, "");
}

TEST_F(S3ApiTest, ConditionalGets) {
  MakeBucket("bkt");
  Put("bkt", "k", "v");
  std::string etag = "\"" + HexEncode(Md5("v")) + "\"";
  auto r = Do("GET", "/bkt/k", {{"If-Match", "\"other\""}});
  EXPECT_EQ(r->status, 412);
  EXPECT_THAT(r->body, HasSubstr("<Code>PreconditionFailed</Code>"));
  EXPECT_THAT(r->body, HasSubstr("<Condition>If-Match</Condition>"));
  r = Do("GET", "/bkt/k", {{"If-None-Match", etag}});
  EXPECT_EQ(r->status, 304);
  EXPECT_EQ(r->body, "");
  EXPECT_EQ(r->Header("ETag"), etag);
  r = Do("GET", "/bkt/k", {{"If-Modified-Since", "Wed, 01 May 2024 10:00:00 GMT"}});
  EXPECT_EQ(r->status, 304);
  r = Do("GET", "/bkt/k", {{"If-Modified-Since", "Wed, 01 May 2024 09:59:59 GMT"}});
  EXPECT_EQ(r->status, 200);
  r = Do("GET", "/bkt/k", {{"If-Match", etag}, {"If-Unmodified-Since", "Tue, 30 Apr 2024 00:00:00 GMT"}});
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "v");
  r = Do("HEAD", "/bkt/k", {{"If-Unmodified-Since", "Tue, 30 Apr 2024 00:00:00 GMT"}});
  EXPECT_EQ(r->status, 412);
  EXPECT_EQ(r->body, "");
}

TEST_F(S3ApiTest, ConditionalPut) {
  MakeBucket("bkt");
  EXPECT_EQ(Do("PUT", "/bkt/k", {{"If-None-Match", "*"}}, "one")->status, 200);
  auto second = Do("PUT", "/bkt/k", {{"If-None-Match", "*"}}, "two");
  EXPECT_EQ(second->status, 412);
  EXPECT_EQ(store_.DataForTest("bkt", "k").value_or(""), "one");
}

TEST_F(S3ApiTest, ChecksumsVerifiedStoredAndReturned) {
  MakeBucket("bkt");
  std::string data = "checksummed payload";
  auto put = Do("PUT", "/bkt/c", {{"x-amz-checksum-crc32", Crc32Of(data)}}, data);
  EXPECT_EQ(put->status, 200);
  EXPECT_EQ(put->Header("x-amz-checksum-crc32"), Crc32Of(data));
  auto without_mode = Do("GET", "/bkt/c");
  EXPECT_FALSE(without_mode->HasHeader("x-amz-checksum-crc32"));
  auto with_mode = Do("GET", "/bkt/c", {{"x-amz-checksum-mode", "ENABLED"}});
  EXPECT_EQ(with_mode->Header("x-amz-checksum-crc32"), Crc32Of(data));
  auto ranged = Do("GET", "/bkt/c", {{"x-amz-checksum-mode", "ENABLED"}, {"Range", "bytes=0-1"}});
  EXPECT_FALSE(ranged->HasHeader("x-amz-checksum-crc32"));

  auto bad = Do("PUT", "/bkt/bad", {{"x-amz-checksum-crc32", Crc32Of("something else")}}, data);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("<Code>BadDigest</Code>"));
  EXPECT_FALSE(store_.DataForTest("bkt", "bad").has_value());

  auto bad_md5 = Do("PUT", "/bkt/bad", {{"Content-MD5", Base64Encode(Md5("nope"))}}, data);
  EXPECT_EQ(bad_md5->status, 400);
  EXPECT_THAT(bad_md5->body, HasSubstr("<Code>BadDigest</Code>"));
  auto invalid_md5 = Do("PUT", "/bkt/bad", {{"Content-MD5", "xyz"}}, data);
  EXPECT_EQ(invalid_md5->status, 400);
  EXPECT_THAT(invalid_md5->body, HasSubstr("<Code>InvalidDigest</Code>"));
  EXPECT_FALSE(invalid_md5->close);  // a small unread body is drained by the server
  std::string large(100 * 1024, 'x');
  auto large_invalid = Do("PUT", "/bkt/bad", {{"Content-MD5", "xyz"}}, large);
  EXPECT_EQ(large_invalid->status, 400);
  EXPECT_TRUE(large_invalid->close);  // a large unread body closes the connection
  auto good_md5 = Do("PUT", "/bkt/good", {{"Content-MD5", Base64Encode(Md5(data))}}, data);
  EXPECT_EQ(good_md5->status, 200);

  auto sha = Do("PUT", "/bkt/sha", {{"x-amz-content-sha256", std::string(64, 'a')}}, data);
  EXPECT_EQ(sha->status, 400);
  EXPECT_THAT(sha->body, HasSubstr("<Code>XAmzContentSHA256Mismatch</Code>"));

  auto asked = Do("PUT", "/bkt/asked", {{"x-amz-sdk-checksum-algorithm", "CRC32"}}, data);
  EXPECT_EQ(asked->Header("x-amz-checksum-crc32"), Crc32Of(data));
}

TEST_F(S3ApiTest, AwsChunkedUploadWithTrailingChecksum) {
  MakeBucket("bkt");
  // What botocore >= 1.36 sends over HTTPS: STREAMING-UNSIGNED-PAYLOAD-TRAILER.
  std::string data = "hello chunked world";
  std::string body = "13\r\n" + data + "\r\n0\r\nx-amz-checksum-crc32:" + Crc32Of(data) + "\r\n\r\n";
  HeaderMap headers = {{"Content-Encoding", "aws-chunked"},
                       {"x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"},
                       {"x-amz-decoded-content-length", std::to_string(data.size())},
                       {"x-amz-trailer", "x-amz-checksum-crc32"},
                       {"x-amz-sdk-checksum-algorithm", "CRC32"},
                       {"Content-Type", "text/plain"}};
  auto r = Do("PUT", "/bkt/chunked", headers, body);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("x-amz-checksum-crc32"), Crc32Of(data));
  EXPECT_EQ(store_.DataForTest("bkt", "chunked").value_or(""), data);
  auto head = Do("HEAD", "/bkt/chunked", {{"x-amz-checksum-mode", "ENABLED"}});
  EXPECT_FALSE(head->HasHeader("Content-Encoding"));
  EXPECT_EQ(head->Header("x-amz-checksum-crc32"), Crc32Of(data));

  std::string bad = "13\r\n" + data + "\r\n0\r\nx-amz-checksum-crc32:" + Crc32Of("other") + "\r\n\r\n";
  auto mismatch = Do("PUT", "/bkt/chunked2", headers, bad);
  EXPECT_EQ(mismatch->status, 400);
  EXPECT_THAT(mismatch->body, HasSubstr("<Code>BadDigest</Code>"));
  EXPECT_FALSE(store_.DataForTest("bkt", "chunked2").has_value());
}

TEST_F(S3ApiTest, PartNumberOneOfSimpleObject) {
  MakeBucket("bkt");
  Put("bkt", "k", "whole");
  auto r = Do("GET", "/bkt/k?partNumber=1");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "whole");
  EXPECT_EQ(Do("GET", "/bkt/k?partNumber=2")->status, 416);
  auto both = Do("GET", "/bkt/k?partNumber=1", {{"Range", "bytes=0-1"}});
  EXPECT_EQ(both->status, 400);
}

TEST_F(S3ApiTest, TooLargePutIsRejectedBeforeReading) {
  MakeBucket("bkt");
  auto r = Do("PUT", "/bkt/huge", {{"Content-Length", "5368709121"}}, "");
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("<Code>EntityTooLarge</Code>"));
  EXPECT_TRUE(r->close);
}

// ---- Listing ----

class S3ListTest : public S3ApiTest {
 protected:
  void SetUp() override {
    MakeBucket("lst");
    for (const char* key : {"a.txt", "dir/one", "dir/two", "dir/sub/three", "other/x", "z 1+2.txt"}) {
      Put("lst", key, "x");
    }
  }
};

TEST_F(S3ListTest, DelimiterGroupsCommonPrefixes) {
  auto r = Do("GET", "/lst?list-type=2&delimiter=%2F");
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("<KeyCount>4</KeyCount>"));
  EXPECT_THAT(r->body, HasSubstr("<Delimiter>/</Delimiter>"));
  EXPECT_THAT(r->body, HasSubstr("<Contents><Key>a.txt</Key><LastModified>2024-05-01T10:00:00.000Z</LastModified>"
                                 "<ETag>&quot;" +
                                 HexEncode(Md5("x")) +
                                 "&quot;</ETag><Size>1</Size>"
                                 "<StorageClass>STANDARD</StorageClass></Contents>"));
  EXPECT_THAT(r->body, HasSubstr("<CommonPrefixes><Prefix>dir/</Prefix></CommonPrefixes>"
                                 "<CommonPrefixes><Prefix>other/</Prefix></CommonPrefixes>"));
  EXPECT_THAT(r->body, HasSubstr("<IsTruncated>false</IsTruncated>"));
  EXPECT_THAT(r->body, Not(HasSubstr("<Owner>")));
  auto prefixed = Do("GET", "/lst?list-type=2&prefix=dir%2F&delimiter=%2F&fetch-owner=true");
  EXPECT_THAT(prefixed->body, HasSubstr("<Key>dir/one</Key>"));
  EXPECT_THAT(prefixed->body, HasSubstr("<Prefix>dir/sub/</Prefix>"));
  EXPECT_THAT(prefixed->body, HasSubstr("<Owner><ID>"));
}

TEST_F(S3ListTest, PaginatesWithContinuationTokens) {
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  while (pages < 10) {
    std::string target = "/lst?list-type=2&max-keys=2&delimiter=%2F";
    if (!token.empty()) target += "&continuation-token=" + UriEncode(token);
    auto r = Do("GET", target);
    ASSERT_EQ(r->status, 200) << r->body;
    ++pages;
    for (size_t pos = 0; (pos = r->body.find("<Key>", pos)) != std::string::npos;) {
      size_t end = r->body.find("</Key>", pos);
      seen.push_back(r->body.substr(pos + 5, end - pos - 5));
      pos = end;
    }
    for (size_t pos = 0; (pos = r->body.find("<Prefix>", pos)) != std::string::npos;) {
      size_t end = r->body.find("</Prefix>", pos);
      if (end > pos + 8) seen.push_back(r->body.substr(pos + 8, end - pos - 8));
      pos = end;
    }
    size_t t = r->body.find("<NextContinuationToken>");
    if (t == std::string::npos) {
      EXPECT_THAT(r->body, HasSubstr("<IsTruncated>false</IsTruncated>"));
      break;
    }
    EXPECT_THAT(r->body, HasSubstr("<IsTruncated>true</IsTruncated>"));
    size_t e = r->body.find("</NextContinuationToken>");
    token = r->body.substr(t + 23, e - t - 23);
  }
  EXPECT_EQ(pages, 2);  // no empty trailing page
  EXPECT_THAT(seen, ::testing::UnorderedElementsAre("a.txt", "dir/", "other/", "z 1+2.txt"));
  auto bad = Do("GET", "/lst?list-type=2&continuation-token=%%%");
  EXPECT_EQ(bad->status, 400);
}

TEST_F(S3ListTest, EncodingTypeUrl) {
  auto r = Do("GET", "/lst?list-type=2&encoding-type=url&prefix=z%20&start-after=a");
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("<Key>z%201%2B2.txt</Key>"));
  EXPECT_THAT(r->body, HasSubstr("<Prefix>z%20</Prefix>"));
  EXPECT_THAT(r->body, HasSubstr("<EncodingType>url</EncodingType>"));
  EXPECT_THAT(r->body, HasSubstr("<StartAfter>a</StartAfter>"));
  auto bad = Do("GET", "/lst?list-type=2&encoding-type=base64");
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("<Code>InvalidArgument</Code>"));
}

TEST_F(S3ListTest, MaxKeysValidation) {
  auto junk = Do("GET", "/lst?list-type=2&max-keys=abc");
  EXPECT_EQ(junk->status, 400);
  EXPECT_THAT(junk->body, HasSubstr("<Code>InvalidArgument</Code>"));
  EXPECT_EQ(Do("GET", "/lst?list-type=2&max-keys=-1")->status, 400);
  auto big = Do("GET", "/lst?list-type=2&max-keys=5000");
  EXPECT_THAT(big->body, HasSubstr("<MaxKeys>1000</MaxKeys>"));
  auto missing = Do("GET", "/nobucket?list-type=2");
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("NoSuchBucket"));
}

TEST_F(S3ListTest, V1NextMarkerOnlyWithDelimiter) {
  auto plain = Do("GET", "/lst?max-keys=2");
  EXPECT_THAT(plain->body, HasSubstr("<IsTruncated>true</IsTruncated>"));
  EXPECT_THAT(plain->body, Not(HasSubstr("<NextMarker>")));
  EXPECT_THAT(plain->body, HasSubstr("<Owner>"));
  auto delimited = Do("GET", "/lst?max-keys=2&delimiter=%2F");
  EXPECT_THAT(delimited->body, HasSubstr("<NextMarker>dir/</NextMarker>"));
  auto next = Do("GET", "/lst?max-keys=2&delimiter=%2F&marker=dir%2F");
  EXPECT_THAT(next->body, HasSubstr("<Prefix>other/</Prefix>"));
  EXPECT_THAT(next->body, HasSubstr("<Key>z 1+2.txt</Key>"));
  EXPECT_THAT(next->body, HasSubstr("<Marker>dir/</Marker>"));
}

// ---- DeleteObjects ----

TEST_F(S3ApiTest, DeleteObjectsVerboseAndQuiet) {
  MakeBucket("bkt");
  Put("bkt", "a", "1");
  Put("bkt", "b&c", "2");
  std::string body =
      "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Object><Key>a</Key></Object>"
      "<Object><Key>b&amp;c</Key></Object><Object><Key>never</Key></Object></Delete>";
  auto r = Do("POST", "/bkt?delete", {{"Content-MD5", Base64Encode(Md5(body))}}, body);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(
      r->body,
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<Deleted><Key>a</Key></Deleted><Deleted><Key>b&amp;c</Key></Deleted><Deleted><Key>never</Key></Deleted>"
      "</DeleteResult>");
  EXPECT_FALSE(store_.DataForTest("bkt", "b&c").has_value());

  Put("bkt", "q", "1");
  std::string quiet = "<Delete><Quiet>true</Quiet><Object><Key>q</Key></Object></Delete>";
  auto qr = Do("POST", "/bkt?delete", {{"x-amz-checksum-crc32", Crc32Of(quiet)}}, quiet);
  EXPECT_EQ(qr->status, 200);
  EXPECT_THAT(qr->body, HasSubstr("<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"></DeleteResult>"));
  EXPECT_FALSE(store_.DataForTest("bkt", "q").has_value());
}

TEST_F(S3ApiTest, DeleteObjectsErrors) {
  MakeBucket("bkt");
  std::string body = "<Delete><Object><Key>a</Key></Object></Delete>";
  auto no_digest = Do("POST", "/bkt?delete", {}, body);
  EXPECT_EQ(no_digest->status, 400);
  EXPECT_THAT(no_digest->body, HasSubstr("<Code>InvalidRequest</Code>"));
  std::string bad_xml = "<Delete><Object><Key>a</Key></Obj";
  auto malformed = Do("POST", "/bkt?delete", {{"Content-MD5", Base64Encode(Md5(bad_xml))}}, bad_xml);
  EXPECT_EQ(malformed->status, 400);
  EXPECT_THAT(malformed->body, HasSubstr("<Code>MalformedXML</Code>"));
  auto wrong_md5 = Do("POST", "/bkt?delete", {{"Content-MD5", Base64Encode(Md5("x"))}}, body);
  EXPECT_EQ(wrong_md5->status, 400);
  EXPECT_THAT(wrong_md5->body, HasSubstr("<Code>BadDigest</Code>"));
  std::string many = "<Delete>";
  for (int i = 0; i < 1001; ++i) many += "<Object><Key>k" + std::to_string(i) + "</Key></Object>";
  many += "</Delete>";
  auto too_many = Do("POST", "/bkt?delete", {{"Content-MD5", Base64Encode(Md5(many))}}, many);
  EXPECT_EQ(too_many->status, 400);
  EXPECT_THAT(too_many->body, HasSubstr("MalformedXML"));
}

// ---- Copy ----

TEST_F(S3ApiTest, CopyObjectDirectives) {
  MakeBucket("src");
  MakeBucket("dst");
  Do("PUT", "/src/a%20b", {{"Content-Type", "text/csv"}, {"x-amz-meta-k", "v"}}, "payload");
  auto copy = Do("PUT", "/dst/copied", {{"x-amz-copy-source", "/src/a%20b"}});
  EXPECT_EQ(copy->status, 200);
  EXPECT_EQ(copy->body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CopyObjectResult "
            "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LastModified>2024-05-01T10:00:00.000Z"
            "</LastModified><ETag>&quot;" +
                HexEncode(Md5("payload")) + "&quot;</ETag></CopyObjectResult>");
  auto head = Do("HEAD", "/dst/copied");
  EXPECT_EQ(head->Header("Content-Type"), "text/csv");
  EXPECT_EQ(head->Header("x-amz-meta-k"), "v");

  auto replaced = Do("PUT", "/dst/replaced",
                     {{"x-amz-copy-source", "src/a%20b?versionId=null"},
                      {"x-amz-metadata-directive", "REPLACE"},
                      {"Content-Type", "application/json"}});
  EXPECT_EQ(replaced->status, 200);
  auto head2 = Do("HEAD", "/dst/replaced");
  EXPECT_EQ(head2->Header("Content-Type"), "application/json");
  EXPECT_FALSE(head2->HasHeader("x-amz-meta-k"));

  auto self = Do("PUT", "/src/a%20b", {{"x-amz-copy-source", "/src/a%20b"}});
  EXPECT_EQ(self->status, 400);
  EXPECT_THAT(self->body, HasSubstr("<Code>InvalidRequest</Code>"));
  auto self_replace =
      Do("PUT", "/src/a%20b",
         {{"x-amz-copy-source", "/src/a%20b"}, {"x-amz-metadata-directive", "REPLACE"}, {"x-amz-meta-new", "1"}});
  EXPECT_EQ(self_replace->status, 200);
  EXPECT_EQ(Do("HEAD", "/src/a%20b")->Header("x-amz-meta-new"), "1");

  auto bad_directive = Do("PUT", "/dst/x", {{"x-amz-copy-source", "/src/a%20b"}, {"x-amz-metadata-directive", "MOVE"}});
  EXPECT_EQ(bad_directive->status, 400);
  auto missing = Do("PUT", "/dst/x", {{"x-amz-copy-source", "/src/nothing"}});
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("<Key>nothing</Key>"));
  auto cond = Do("PUT", "/dst/x", {{"x-amz-copy-source", "/src/a%20b"}, {"x-amz-copy-source-if-match", "\"zzz\""}});
  EXPECT_EQ(cond->status, 412);
  auto cond_none = Do("PUT", "/dst/x",
                      {{"x-amz-copy-source", "/src/a%20b"},
                       {"x-amz-copy-source-if-none-match", "\"" + HexEncode(Md5("payload")) + "\""}});
  EXPECT_EQ(cond_none->status, 412);
  auto bad_source = Do("PUT", "/dst/x", {{"x-amz-copy-source", "justbucket"}});
  EXPECT_EQ(bad_source->status, 400);
}

// ---- Multipart ----

class S3MultipartTest : public S3ApiTest {
 protected:
  void SetUp() override {
    MakeBucket("mp");
    store_.SetMinPartSizeForTest(5);
  }
  std::string Create(const std::string& key, HeaderMap headers = {}) {
    auto r = Do("POST", "/mp/" + key + "?uploads", headers);
    EXPECT_EQ(r->status, 200);
    size_t s = r->body.find("<UploadId>"), e = r->body.find("</UploadId>");
    EXPECT_NE(s, std::string::npos);
    return r->body.substr(s + 10, e - s - 10);
  }
  std::string Upload(const std::string& key, const std::string& id, int n, const std::string& data) {
    auto r = Do("PUT", "/mp/" + key + "?partNumber=" + std::to_string(n) + "&uploadId=" + id, {}, data);
    EXPECT_EQ(r->status, 200) << r->body;
    return r->Header("ETag");
  }
  static std::string CompleteBody(const std::vector<std::pair<int, std::string>>& parts) {
    std::string body = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
    for (const auto& [n, etag] : parts) {
      body += "<Part><ETag>" + XmlEscape(etag) + "</ETag><PartNumber>" + std::to_string(n) + "</PartNumber></Part>";
    }
    return body + "</CompleteMultipartUpload>";
  }
};

TEST_F(S3MultipartTest, FullUpload) {
  std::string id = Create("big%20file", {{"Content-Type", "text/plain"}});
  auto create_xml = Do("POST", "/mp/k2?uploads");
  EXPECT_THAT(create_xml->body,
              HasSubstr("<InitiateMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                        "<Bucket>mp</Bucket><Key>k2</Key><UploadId>"));
  std::string e1 = Upload("big%20file", id, 1, "hello");
  std::string e2 = Upload("big%20file", id, 2, "world!");
  EXPECT_EQ(e1, "\"" + HexEncode(Md5("hello")) + "\"");

  auto parts = Do("GET", "/mp/big%20file?uploadId=" + id + "&max-parts=1");
  EXPECT_EQ(parts->status, 200);
  EXPECT_THAT(parts->body, HasSubstr("<PartNumber>1</PartNumber>"));
  EXPECT_THAT(parts->body, Not(HasSubstr("<PartNumber>2</PartNumber>")));
  EXPECT_THAT(parts->body, HasSubstr("<IsTruncated>true</IsTruncated>"));
  EXPECT_THAT(parts->body, HasSubstr("<NextPartNumberMarker>1</NextPartNumberMarker>"));
  auto parts2 = Do("GET", "/mp/big%20file?uploadId=" + id + "&part-number-marker=1");
  EXPECT_THAT(parts2->body, HasSubstr("<PartNumber>2</PartNumber><LastModified>2024-05-01T10:00:00.000Z"
                                      "</LastModified><ETag>&quot;"));
  EXPECT_THAT(parts2->body, HasSubstr("<Size>6</Size>"));

  auto uploads = Do("GET", "/mp?uploads");
  EXPECT_THAT(uploads->body, HasSubstr("<Upload><Key>big file</Key><UploadId>" + id + "</UploadId>"));

  auto done = Do("POST", "/mp/big%20file?uploadId=" + id, {}, CompleteBody({{1, e1}, {2, e2}}));
  EXPECT_EQ(done->status, 200) << done->body;
  std::string expected_etag = HexEncode(Md5(Md5("hello") + Md5("world!"))) + "-2";
  EXPECT_EQ(done->body,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUploadResult "
            "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Location>http://localhost:5456/mp/"
            "big%20file</Location><Bucket>mp</Bucket><Key>big file</Key><ETag>&quot;" +
                expected_etag + "&quot;</ETag></CompleteMultipartUploadResult>");
  EXPECT_EQ(store_.DataForTest("mp", "big file").value_or(""), "helloworld!");

  auto part2 = Do("GET", "/mp/big%20file?partNumber=2");
  EXPECT_EQ(part2->status, 206);
  EXPECT_EQ(part2->body, "world!");
  EXPECT_EQ(part2->Header("x-amz-mp-parts-count"), "2");
  EXPECT_EQ(part2->Header("Content-Range"), "bytes 5-10/11");
  EXPECT_EQ(part2->Header("Content-Type"), "text/plain");
  EXPECT_EQ(Do("GET", "/mp/big%20file?partNumber=3")->status, 416);
  EXPECT_EQ(Do("GET", "/mp/big%20file?partNumber=0")->status, 400);

  auto again = Do("POST", "/mp/big%20file?uploadId=" + id, {}, CompleteBody({{1, e1}, {2, e2}}));
  EXPECT_EQ(again->status, 404);
  EXPECT_THAT(again->body, HasSubstr("<Code>NoSuchUpload</Code>"));
  EXPECT_THAT(again->body, HasSubstr("<UploadId>" + id + "</UploadId>"));
}

TEST_F(S3MultipartTest, CompleteErrors) {
  std::string id = Create("k");
  std::string e1 = Upload("k", id, 1, "abc");  // below the (test) minimum of 5 bytes
  std::string e2 = Upload("k", id, 2, "defgh");
  auto bad_etag = Do("POST", "/mp/k?uploadId=" + id, {}, CompleteBody({{1, "\"0000\""}}));
  EXPECT_EQ(bad_etag->status, 400);
  EXPECT_THAT(bad_etag->body, HasSubstr("<Code>InvalidPart</Code>"));
  auto order = Do("POST", "/mp/k?uploadId=" + id, {}, CompleteBody({{2, e2}, {1, e1}}));
  EXPECT_EQ(order->status, 400);
  EXPECT_THAT(order->body, HasSubstr("<Code>InvalidPartOrder</Code>"));
  auto small = Do("POST", "/mp/k?uploadId=" + id, {}, CompleteBody({{1, e1}, {2, e2}}));
  EXPECT_EQ(small->status, 400);
  EXPECT_THAT(small->body, HasSubstr("<Code>EntityTooSmall</Code>"));
  auto unknown = Do("POST", "/mp/k?uploadId=nope", {}, CompleteBody({{1, e1}}));
  EXPECT_EQ(unknown->status, 404);
  EXPECT_THAT(unknown->body, HasSubstr("<Code>NoSuchUpload</Code>"));
  auto malformed = Do("POST", "/mp/k?uploadId=" + id, {}, "<CompleteMultipartUpload><Part>");
  EXPECT_EQ(malformed->status, 400);
  EXPECT_THAT(malformed->body, HasSubstr("<Code>MalformedXML</Code>"));
  auto empty = Do("POST", "/mp/k?uploadId=" + id, {}, "<CompleteMultipartUpload></CompleteMultipartUpload>");
  EXPECT_THAT(empty->body, HasSubstr("<Code>MalformedXML</Code>"));
  auto bad_number = Do("POST", "/mp/k?uploadId=" + id, {},
                       "<CompleteMultipartUpload><Part><PartNumber>x</PartNumber><ETag>a</ETag></Part>"
                       "</CompleteMultipartUpload>");
  EXPECT_THAT(bad_number->body, HasSubstr("<Code>MalformedXML</Code>"));
  // The upload survives failed completions.
  auto ok = Do("POST", "/mp/k?uploadId=" + id, {}, CompleteBody({{2, e2}}));
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(store_.DataForTest("mp", "k").value_or(""), "defgh");
}

TEST_F(S3MultipartTest, PartNumberValidationAndAbort) {
  std::string id = Create("k");
  for (const char* n : {"0", "10001", "abc", "-1", "99999999999999999999"}) {
    auto r = Do("PUT", std::string("/mp/k?partNumber=") + n + "&uploadId=" + id, {}, "data");
    EXPECT_EQ(r->status, 400) << n;
    EXPECT_THAT(r->body, HasSubstr("<Code>InvalidArgument</Code>")) << n;
  }
  auto no_upload = Do("PUT", "/mp/k?partNumber=1&uploadId=ghost", {}, "data");
  EXPECT_EQ(no_upload->status, 404);
  EXPECT_THAT(no_upload->body, HasSubstr("<Code>NoSuchUpload</Code>"));
  EXPECT_EQ(Do("DELETE", "/mp/k?uploadId=" + id)->status, 204);
  auto twice = Do("DELETE", "/mp/k?uploadId=" + id);
  EXPECT_EQ(twice->status, 404);
  EXPECT_THAT(twice->body, HasSubstr("<Code>NoSuchUpload</Code>"));
  auto parts = Do("GET", "/mp/k?uploadId=" + id);
  EXPECT_EQ(parts->status, 404);
}

TEST_F(S3MultipartTest, UploadPartCopyWithRange) {
  Put("mp", "source", "0123456789");
  std::string id = Create("dest");
  auto r = Do("PUT", "/mp/dest?partNumber=1&uploadId=" + id,
              {{"x-amz-copy-source", "/mp/source"}, {"x-amz-copy-source-range", "bytes=2-6"}});
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_THAT(r->body, HasSubstr("<CopyPartResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LastModified>"));
  std::string etag = "\"" + HexEncode(Md5("23456")) + "\"";
  EXPECT_THAT(r->body, HasSubstr("<ETag>" + XmlEscape(etag) + "</ETag>"));
  auto out_of_range = Do("PUT", "/mp/dest?partNumber=2&uploadId=" + id,
                         {{"x-amz-copy-source", "/mp/source"}, {"x-amz-copy-source-range", "bytes=5-10"}});
  EXPECT_EQ(out_of_range->status, 416);
  auto malformed = Do("PUT", "/mp/dest?partNumber=2&uploadId=" + id,
                      {{"x-amz-copy-source", "/mp/source"}, {"x-amz-copy-source-range", "bytes=5-"}});
  EXPECT_EQ(malformed->status, 400);
  auto done = Do("POST", "/mp/dest?uploadId=" + id, {}, CompleteBody({{1, etag}}));
  EXPECT_EQ(done->status, 200);
  EXPECT_EQ(store_.DataForTest("mp", "dest").value_or(""), "23456");
}

TEST_F(S3MultipartTest, ChecksumAlgorithmEchoed) {
  auto r = Do("POST", "/mp/c?uploads", {{"x-amz-checksum-algorithm", "CRC32"}});
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->Header("x-amz-checksum-algorithm"), "CRC32");
  auto bad = Do("POST", "/mp/c?uploads", {{"x-amz-checksum-algorithm", "MD4"}});
  EXPECT_EQ(bad->status, 400);
}

}  // namespace
}  // namespace kiln::objects
