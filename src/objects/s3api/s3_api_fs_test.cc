// The S3 front over the real embedded store (FsObjectStore on a temp dir, in-memory SQLite):
// catches contract mismatches the fake store cannot.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "base/encoding.h"
#include "base/hash.h"
#include "objects/fs_object_store.h"
#include "objects/s3api/s3_api.h"
#include "net/test_util/fake_response_writer.h"

namespace kiln::objects {
namespace {

using net::FakeResponseWriter;
using ::testing::HasSubstr;

class S3ApiFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kiln-s3api-fs-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
    store::Database::Options db_options;
    db_options.durable = false;
    auto db = store::Database::Open(":memory:", db_options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    FsObjectStore::Options options;
    options.root = root_ + "/objects";
    options.database = db_.get();
    options.min_part_size = 5;
    options.sync = false;
    auto store = FsObjectStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    api_ = std::make_unique<S3Api>(S3ApiOptions{}, store_.get());
    ASSERT_EQ(Do("PUT", "/fsb")->status(), 200);
  }
  void TearDown() override {
    api_.reset();
    store_.reset();
    db_.reset();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  std::unique_ptr<FakeResponseWriter> Do(const std::string& method, const std::string& target, HeaderMap headers = {},
                                         const std::string& body = "") {
    net::HttpRequest request;
    request.method = method;
    size_t q = target.find('?');
    request.raw_path = target.substr(0, q);
    request.raw_query = q == std::string::npos ? "" : target.substr(q + 1);
    headers.emplace("Host", "127.0.0.1:5456");
    headers.emplace("Content-Length", std::to_string(body.size()));
    request.headers = headers;
    StringByteSource source(body);
    request.body = &source;
    aws::RequestContext context;
    context.request_id = "FSREQ";
    auto out = std::make_unique<FakeResponseWriter>();
    api_->Handle(context, request, *out);
    EXPECT_TRUE(out->finished());
    return out;
  }

  std::string root_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<FsObjectStore> store_;
  std::unique_ptr<S3Api> api_;
};

TEST_F(S3ApiFsTest, OddKeysAndRanges) {
  for (std::string raw : {"a%2F%2Fb", "..%2Fx", "a+b", "sp%20ace", "%E2%9C%93"}) {
    EXPECT_EQ(Do("PUT", "/fsb/" + raw, {}, "0123456789")->status(), 200) << raw;
    auto g = Do("GET", "/fsb/" + raw, {{"Range", "bytes=-4"}});
    EXPECT_EQ(g->status(), 206) << raw;
    EXPECT_EQ(g->body(), "6789");
  }
  auto list = Do("GET", "/fsb?list-type=2&encoding-type=url");
  EXPECT_THAT(list->body(), HasSubstr("<Key>a%2Bb</Key>"));
  EXPECT_THAT(list->body(), HasSubstr("<Key>a//b</Key>"));
  EXPECT_THAT(list->body(), HasSubstr("<KeyCount>5</KeyCount>"));
  auto bad = Do("GET", "/fsb/a+b", {{"Range", "bytes=50-"}});
  EXPECT_EQ(bad->status(), 416);
}

TEST_F(S3ApiFsTest, DelimitedPagination) {
  for (const char* key : {"a", "d/1", "d/2", "e/1", "f"}) Do("PUT", std::string("/fsb/") + key, {}, "x");
  auto p1 = Do("GET", "/fsb?max-keys=2&delimiter=%2F");
  EXPECT_THAT(p1->body(), HasSubstr("<NextMarker>d/</NextMarker>"));
  auto p2 = Do("GET", "/fsb?max-keys=2&delimiter=%2F&marker=d%2F");
  EXPECT_THAT(p2->body(), HasSubstr("<Prefix>e/</Prefix>"));
  EXPECT_THAT(p2->body(), HasSubstr("<Key>f</Key>"));
  EXPECT_THAT(p2->body(), HasSubstr("<IsTruncated>false</IsTruncated>"));
}

TEST_F(S3ApiFsTest, MultipartCopyAndChecksums) {
  auto created = Do("POST", "/fsb/mp?uploads", {{"Content-Type", "text/plain"}});
  ASSERT_EQ(created->status(), 200);
  const std::string& body = created->body();
  size_t s = body.find("<UploadId>") + 10;
  std::string id = body.substr(s, body.find("</UploadId>") - s);
  std::string e1 = Do("PUT", "/fsb/mp?partNumber=1&uploadId=" + id, {}, "hello")->header("ETag");
  std::string e2 = Do("PUT", "/fsb/mp?partNumber=2&uploadId=" + id, {}, "world")->header("ETag");
  std::string xml = "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>" + XmlEscape(e1) +
                    "</ETag></Part><Part><PartNumber>2</PartNumber><ETag>" + XmlEscape(e2) +
                    "</ETag></Part></CompleteMultipartUpload>";
  auto done = Do("POST", "/fsb/mp?uploadId=" + id, {}, xml);
  ASSERT_EQ(done->status(), 200) << done->body();
  EXPECT_THAT(done->body(), HasSubstr("-2&quot;</ETag>"));
  auto part = Do("GET", "/fsb/mp?partNumber=2");
  EXPECT_EQ(part->status(), 206);
  EXPECT_EQ(part->body(), "world");
  EXPECT_EQ(part->header("Content-Type"), "text/plain");

  auto copy = Do("PUT", "/fsb/copy", {{"x-amz-copy-source", "fsb/mp"}});
  EXPECT_EQ(copy->status(), 200) << copy->body();
  EXPECT_EQ(Do("GET", "/fsb/copy")->body(), "helloworld");
  EXPECT_EQ(Do("PUT", "/fsb/copy", {{"x-amz-copy-source", "/fsb/copy"}})->status(), 400);

  S3Checksum crc(S3Checksum::Algorithm::kCrc32);
  crc.Update("data");
  std::string value = crc.FinalBase64();
  auto put = Do("PUT", "/fsb/sum", {{"x-amz-checksum-crc32", value}}, "data");
  EXPECT_EQ(put->status(), 200) << put->body();
  EXPECT_EQ(put->header("x-amz-checksum-crc32"), value);
  EXPECT_EQ(Do("HEAD", "/fsb/sum", {{"x-amz-checksum-mode", "ENABLED"}})->header("x-amz-checksum-crc32"), value);
  auto cond = Do("PUT", "/fsb/sum", {{"If-None-Match", "*"}}, "again");
  EXPECT_EQ(cond->status(), 412);
  EXPECT_EQ(Do("DELETE", "/fsb")->status(), 409);
}

}  // namespace
}  // namespace kiln::objects
