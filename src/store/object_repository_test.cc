#include "store/object_repository.h"

#include <gtest/gtest.h>

#include "base/strings.h"
#include "store/migrations.h"
#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

class ObjectRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path());
    repo_ = std::make_unique<ObjectRepository>(db_.get());
    ASSERT_TRUE(repo_->CreateBucket({"b", "us-east-1", 1}).ok());
  }
  ObjectRow Row(const std::string& key, const std::string& file) {
    ObjectRow r;
    r.bucket = "b";
    r.key = key;
    r.file_id = file;
    r.etag = "e-" + file;
    return r;
  }
  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<ObjectRepository> repo_;
};

TEST(PrefixUpperBoundTest, Cases) {
  EXPECT_EQ(PrefixUpperBound(""), std::nullopt);
  EXPECT_EQ(PrefixUpperBound("ab"), "ac");
  EXPECT_EQ(PrefixUpperBound(std::string("a\xff\xff", 3)), "b");
  EXPECT_EQ(PrefixUpperBound(std::string("\xff", 1)), std::nullopt);
}

TEST_F(ObjectRepositoryTest, BucketsUniqueAndNotEmpty) {
  EXPECT_TRUE(repo_->CreateBucket({"b", "us-east-1", 2}).IsAlreadyExists());
  ASSERT_TRUE(repo_->PutObject(Row("k", "f1"), {}).ok());
  Status s = repo_->DeleteBucket("b");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(StartsWith(s.message(), "BucketNotEmpty:")) << s.message();
  EXPECT_TRUE(s.Is(ErrorReason::kBucketNotEmpty));
  EXPECT_TRUE(StartsWith(repo_->DeleteBucket("nope").message(), "NoSuchBucket:"));
  EXPECT_TRUE(repo_->DeleteBucket("nope").Is(ErrorReason::kNoSuchBucket));
  auto old = repo_->DeleteObject("b", "k");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(*old, std::vector<std::string>{"f1"});
  EXPECT_TRUE(repo_->DeleteBucket("b").ok());
}

TEST_F(ObjectRepositoryTest, PutReplacesAndReturnsOldFile) {
  auto first = repo_->PutObject(Row("k", "f1"), {});
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->empty());
  auto second = repo_->PutObject(Row("k", "f2"), {});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, std::vector<std::string>{"f1"});
  auto got = repo_->GetObject("b", "k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->file_id, "f2");
  EXPECT_TRUE(StartsWith(repo_->GetObject("b", "zz").status().message(), "NoSuchKey:"));
  EXPECT_TRUE(StartsWith(repo_->GetObject("q", "k").status().message(), "NoSuchBucket:"));
  EXPECT_TRUE(repo_->GetObject("b", "zz").status().Is(ErrorReason::kNoSuchKey));
  EXPECT_TRUE(repo_->GetObject("q", "k").status().Is(ErrorReason::kNoSuchBucket));
}

TEST_F(ObjectRepositoryTest, ConditionsCheckedInTransaction) {
  ASSERT_TRUE(repo_->PutObject(Row("k", "f1"), {}).ok());
  WriteCondition none_match;
  none_match.if_none_match_star = true;
  auto r = repo_->PutObject(Row("k", "f2"), none_match);
  EXPECT_TRUE(StartsWith(r.status().message(), "PreconditionFailed:"));
  EXPECT_TRUE(r.status().Is(ErrorReason::kPreconditionFailed));
  WriteCondition match;
  match.if_match = "wrong";
  EXPECT_FALSE(repo_->PutObject(Row("k", "f2"), match).ok());
  match.if_match = "e-f1";
  EXPECT_TRUE(repo_->PutObject(Row("k", "f2"), match).ok());
  EXPECT_EQ(repo_->GetObject("b", "k")->file_id, "f2");
}

TEST_F(ObjectRepositoryTest, ScanUsesByteOrder) {
  for (std::string k : {std::string("a"), std::string("a/b"), std::string("\xc3\xa9"), std::string("B"),
                        std::string("a\x01", 2), std::string("", 0)}) {
    ASSERT_TRUE(repo_->PutObject(Row(k, "f" + k), {}).ok());
  }
  auto all = repo_->ScanObjects("b", "", true, std::nullopt, 100);
  ASSERT_TRUE(all.ok());
  std::vector<std::string> keys;
  for (auto& r : *all) keys.push_back(r.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"", "B", "a", std::string("a\x01", 2), "a/b", "\xc3\xa9"}));
  auto range = repo_->ScanObjects("b", "a", false, PrefixUpperBound("a"), 100);
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->size(), 2u);
}

TEST_F(ObjectRepositoryTest, MultipartLifecycle) {
  UploadRow up{"u1", "b", "key", 5, "{}", ""};
  ASSERT_TRUE(repo_->CreateUpload(up).ok());
  EXPECT_TRUE(StartsWith(repo_->GetUpload("b", "other", "u1").status().message(), "NoSuchUpload:"));
  EXPECT_TRUE(repo_->GetUpload("b", "other", "u1").status().Is(ErrorReason::kNoSuchUpload));
  PartRow p{"u1", 1, "p1", 10, "e1", 6, "{}"};
  ASSERT_TRUE(repo_->PutPart("b", "key", p).ok());
  p.file_id = "p1b";
  auto replaced = repo_->PutPart("b", "key", p);
  ASSERT_TRUE(replaced.ok());
  EXPECT_EQ(**replaced, "p1");
  p.part_number = 2;
  p.file_id = "p2";
  ASSERT_TRUE(repo_->PutPart("b", "key", p).ok());
  EXPECT_EQ(repo_->ListParts("u1", 1, 10)->size(), 1u);
  EXPECT_EQ(repo_->DeleteBucket("b").code(), StatusCode::kFailedPrecondition);
  auto ids = repo_->AllFileIds();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 2u);

  auto unref = repo_->CompleteUpload("b", "key", "u1", Row("key", "obj"));
  ASSERT_TRUE(unref.ok());
  EXPECT_EQ(unref->size(), 2u);
  EXPECT_TRUE(repo_->ListParts("u1", 0, 0)->empty());
  EXPECT_TRUE(StartsWith(repo_->AbortUpload("b", "key", "u1").status().message(), "NoSuchUpload:"));
  EXPECT_EQ(repo_->GetObject("b", "key")->file_id, "obj");
}

TEST_F(ObjectRepositoryTest, ExtentsReplaceDeleteAndCollect) {
  ObjectRow multi = Row("m", "");
  multi.file_id.clear();
  multi.extents = {{"x1", 0, 10}, {"x2", 0, 5}, {"x3", 2, 1}};
  multi.size = 16;
  ASSERT_TRUE(repo_->PutObject(multi, {}).ok());
  auto got = repo_->GetObject("b", "m");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->extents, multi.extents);
  EXPECT_EQ(got->Layout(), multi.extents);
  EXPECT_EQ(repo_->GetObject("b", "m")->file_id, "");
  auto ids = repo_->AllFileIds();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::unordered_set<std::string>{"x1", "x2", "x3"}));

  // Exactly one of file_id and extents.
  ObjectRow both = multi;
  both.file_id = "f";
  EXPECT_EQ(repo_->PutObject(both, {}).status().code(), StatusCode::kInvalidArgument);
  ObjectRow neither = Row("m", "");
  EXPECT_EQ(repo_->PutObject(neither, {}).status().code(), StatusCode::kInvalidArgument);

  // Replacing a multi-extent object by a single file returns every extent file; and back.
  auto old = repo_->PutObject(Row("m", "single"), {});
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(*old, (std::vector<std::string>{"x1", "x2", "x3"}));
  got = repo_->GetObject("b", "m");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->extents.empty());
  EXPECT_EQ(got->Layout(), (std::vector<Extent>{{"single", 0, 0}}));
  multi.extents = {{"y1", 0, 8}, {"y2", 0, 8}};
  old = repo_->PutObject(multi, {});
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(*old, std::vector<std::string>{"single"});
  EXPECT_EQ(*repo_->AllFileIds(), (std::unordered_set<std::string>{"y1", "y2"}));
  auto deleted = repo_->DeleteObject("b", "m");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, (std::vector<std::string>{"y1", "y2"}));
  EXPECT_TRUE(repo_->AllFileIds()->empty());
  EXPECT_TRUE(StartsWith(repo_->GetObject("b", "m").status().message(), "NoSuchKey:"));
  EXPECT_TRUE(repo_->DeleteObject("b", "m")->empty());
  EXPECT_TRUE(repo_->DeleteBucket("b").ok());
}

TEST_F(ObjectRepositoryTest, CompleteAdoptsPartsAsExtents) {
  ASSERT_TRUE(repo_->PutObject(Row("key", "previous"), {}).ok());
  ASSERT_TRUE(repo_->CreateUpload(UploadRow{"u1", "b", "key", 5, "{}", ""}).ok());
  for (uint32_t n = 1; n <= 3; ++n) {
    ASSERT_TRUE(repo_->PutPart("b", "key", PartRow{"u1", n, "p" + std::to_string(n), 10, "e", 6, "{}"}).ok());
  }
  ObjectRow object = Row("key", "");
  object.file_id.clear();
  object.size = 20;
  // An extent naming a file that is not a part of the upload (a part replaced meanwhile) aborts
  // and changes nothing.
  object.extents = {{"p1", 0, 10}, {"gone", 0, 10}};
  EXPECT_EQ(repo_->CompleteUpload("b", "key", "u1", object).status().code(), StatusCode::kAborted);
  EXPECT_EQ(repo_->ListParts("u1", 0, 0)->size(), 3u);
  EXPECT_EQ(repo_->GetObject("b", "key")->file_id, "previous");

  object.extents = {{"p1", 0, 10}, {"p3", 0, 10}};
  auto unref = repo_->CompleteUpload("b", "key", "u1", object);
  ASSERT_TRUE(unref.ok()) << unref.status().ToString();
  EXPECT_EQ(*unref, (std::vector<std::string>{"p2", "previous"}));
  EXPECT_EQ(repo_->GetObject("b", "key")->extents, object.extents);
  EXPECT_EQ(*repo_->AllFileIds(), (std::unordered_set<std::string>{"p1", "p3"}));
  EXPECT_TRUE(StartsWith(repo_->GetUpload("b", "key", "u1").status().message(), "NoSuchUpload:"));
}

// A data directory written by a binary that knew only migration 1 opens, migrates, and its
// objects (one whole data file each, no extents rows) read and collect as before.
TEST(ObjectRepositoryMigrationTest, DatabaseFromMigrationOneOpensAndMigrates) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/kiln.db";
  {
    std::vector<Migration> first_only = {AllMigrations().front()};
    Database::Options options;
    options.migrations = &first_only;
    auto db = Database::Open(path, options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    EXPECT_EQ((*db)->schema_version(), 1);
    ASSERT_TRUE((*db)
                    ->Exec("INSERT INTO buckets VALUES ('old', 'us-east-1', 1);"
                           "INSERT INTO objects VALUES ('old', X'6B', 'oldfile', 7, 'etag', 2, '{}', '{}', "
                           "'[3,4]', 'STANDARD');"
                           "INSERT INTO multipart_uploads VALUES ('u', 'old', X'6B', 3, '{}', '');"
                           "INSERT INTO multipart_parts VALUES ('u', 1, 'partfile', 5, 'pe', 4, '{}');")
                    .ok());
  }
  auto db = testing::OpenTestDatabase(dir.path());
  EXPECT_EQ(db->schema_version(), AllMigrations().back().version);
  ObjectRepository repo(db.get());
  auto got = repo.GetObject("old", "k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->file_id, "oldfile");
  EXPECT_EQ(got->size, 7u);
  EXPECT_EQ(got->part_sizes_json, "[3,4]");
  EXPECT_EQ(got->Layout(), (std::vector<Extent>{{"oldfile", 0, 7}}));
  EXPECT_EQ(*repo.AllFileIds(), (std::unordered_set<std::string>{"oldfile", "partfile"}));
  // The old upload completes into extents, and the old single-file version is released.
  ObjectRow object;
  object.bucket = "old";
  object.key = "k";
  object.size = 5;
  object.etag = "x-1";
  object.extents = {{"partfile", 0, 5}};
  auto unref = repo.CompleteUpload("old", "k", "u", object);
  ASSERT_TRUE(unref.ok()) << unref.status().ToString();
  EXPECT_EQ(*unref, std::vector<std::string>{"oldfile"});
  EXPECT_EQ(repo.GetObject("old", "k")->extents, object.extents);
}

}  // namespace
}  // namespace kiln::store
