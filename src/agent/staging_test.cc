#include "agent/staging.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "agent/test_util/agent_fixture.h"
#include "agent/transfer.h"
#include "base/strings.h"

namespace kiln::agent {
namespace {

using nlohmann::json;
using testing::AgentTest;

json Channel(const std::string& name, const std::string& uri, const std::string& type = "S3Prefix",
             const std::string& distribution = "FullyReplicated") {
  return json{{"ChannelName", name},
              {"DataSource",
               {{"S3DataSource", {{"S3DataType", type}, {"S3Uri", uri}, {"S3DataDistributionType", distribution}}}}}};
}

json Request(std::vector<json> channels, const std::string& mode = "File") {
  return json{{"RoleArn", "arn:aws:iam::1:role/r"},
              {"AlgorithmSpecification", {{"TrainingInputMode", mode}}},
              {"InputDataConfig", channels}};
}

class StagingTest : public AgentTest {
 protected:
  Result<StagingReport> Stage(const json& request, int index = 0, int count = 1, const std::string& host = "h") {
    CancelFlag cancel;
    StageOptions options;
    options.parallelism = 3;
    options.buffer_size = 4096;  // several buffers per object
    return StageChannels(*store_, request, index, count, work() + "/" + host, cancel, options);
  }
  std::string Data(const std::string& host, const std::string& rel) {
    return Slurp(work() + "/" + host + "/input/data/" + rel);
  }
};

TEST(PrefixRelativePathTest, KeyMinusPrefixThenLeadingSlashes) {
  EXPECT_EQ(PrefixRelativePath("data/train/a/1.csv", "data/train/"), "a/1.csv");
  EXPECT_EQ(PrefixRelativePath("data/train/a/1.csv", "data/train"), "a/1.csv");
  EXPECT_EQ(PrefixRelativePath("data/train//a.csv", "data/train"), "a.csv");
  EXPECT_EQ(PrefixRelativePath("data/train.lst", "data/train.lst"), "train.lst");  // the prefix is one object
  EXPECT_EQ(PrefixRelativePath("single", "single"), "single");
  EXPECT_EQ(PrefixRelativePath("data/train.lst", "data/train"), ".lst");
  EXPECT_EQ(PrefixRelativePath("data/training-extra/z", "data/train"), "ing-extra/z");
  EXPECT_EQ(PrefixRelativePath("k/x", ""), "k/x");  // the whole bucket
}

// Regression (issue 10): Session.upload_data returns s3://b/demo/train without a trailing slash
// and scripts read $SM_CHANNEL_TRAIN/train.csv; Kiln used to stage train/train/train.csv.
TEST_F(StagingTest, PrefixWithAndWithoutTrailingSlashGiveTheSameLayout) {
  Put("data/train/a/1.csv", "one");
  Put("data/train/2.csv", std::string(100000, 'x'));
  Put("data/train/", "");      // folder marker
  Put("data/train/sub/", "");  // folder marker
  Put("data/train.lst", "list");
  Put("data/other/z", "z");
  auto r = Stage(Request({Channel("train", "s3://bkt/data/train/"), Channel("lst", "s3://bkt/data/train.lst"),
                          Channel("loose", "s3://bkt/data/train")}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Data("h", "train/a/1.csv"), "one");
  EXPECT_EQ(Data("h", "train/2.csv"), std::string(100000, 'x'));
  EXPECT_FALSE(PathExists(work() + "/h/input/data/train/sub"));
  EXPECT_EQ(Data("h", "lst/train.lst"), "list");
  // s3://bkt/data/train (no trailing slash): the same layout as with the slash, plus what else
  // starts with the prefix (data/train.lst -> ".lst", as SageMaker Local Mode does).
  EXPECT_EQ(Data("h", "loose/a/1.csv"), "one");
  EXPECT_EQ(Data("h", "loose/2.csv"), std::string(100000, 'x'));
  EXPECT_EQ(Data("h", "loose/.lst"), "list");
  EXPECT_FALSE(PathExists(work() + "/h/input/data/loose/train"));
  EXPECT_FALSE(PathExists(work() + "/h/input/data/loose/z"));
  ASSERT_EQ(r->channels.size(), 3u);
  EXPECT_EQ(r->channels[0].objects, 2u);
  EXPECT_EQ(r->channels[0].bytes, 100003u);
  EXPECT_EQ(r->objects, 2u + 1u + 3u);
  EXPECT_EQ(r->bytes, 100003u + 4u + 100003u + 4u);
  EXPECT_GT(r->elapsed_seconds, 0);
  EXPECT_GT(r->BytesPerSecond(), 0);
}

TEST_F(StagingTest, ShardedByS3KeySharesUseThePrefixRule) {
  for (int i = 0; i < 4; ++i) Put("sh/part/k" + std::to_string(i), "v" + std::to_string(i));
  json request = Request({Channel("c", "s3://bkt/sh/part", "S3Prefix", "ShardedByS3Key")}, "FastFile");
  for (int host = 0; host < 2; ++host) {
    std::string name = "algo-" + std::to_string(host + 1);
    auto r = Stage(request, host, 2, name);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(PathExists(work() + "/" + name + "/input/data/c/k" + std::to_string(i)), i % 2 == host) << name << i;
    }
    EXPECT_FALSE(PathExists(work() + "/" + name + "/input/data/c/part"));
  }
}

TEST_F(StagingTest, EmptyPrefixFailsWithAwsWording) {
  Put("other/x", "x");
  auto r = Stage(Request({Channel("train", "s3://bkt/data/train/")}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "ClientError: No S3 objects found under S3 URL \"s3://bkt/data/train/\" given in input data source. "
            "Please ensure that the bucket exists in the selected region, that objects exist under that S3 prefix, "
            "and that the role \"arn:aws:iam::1:role/r\" has \"s3:ListBucket\" permissions on bucket \"bkt\".");
  auto missing_bucket = Stage(Request({Channel("train", "s3://nobucket/x/")}));
  ASSERT_FALSE(missing_bucket.ok());
  EXPECT_TRUE(StartsWith(missing_bucket.status().message(),
                         "ClientError: No S3 objects found under S3 URL "
                         "\"s3://nobucket/x/\""));
  auto bad_scheme = Stage(Request({Channel("train", "https://bkt/x/")}));
  ASSERT_FALSE(bad_scheme.ok());
  EXPECT_TRUE(StartsWith(bad_scheme.status().message(), "ClientError: ")) << bad_scheme.status().message();
}

TEST_F(StagingTest, ShardedByS3KeyAcrossThreeHosts) {
  for (int i = 0; i < 8; ++i) Put("s/k" + std::to_string(i), "v" + std::to_string(i));
  json request = Request({Channel("c", "s3://bkt/s/", "S3Prefix", "ShardedByS3Key"), Channel("all", "s3://bkt/s/")});
  for (int host = 0; host < 3; ++host) {
    std::string name = "algo-" + std::to_string(host + 1);
    auto r = Stage(request, host, 3, name);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (int i = 0; i < 8; ++i) {
      std::string rel = "c/k" + std::to_string(i);
      EXPECT_EQ(PathExists(work() + "/" + name + "/input/data/" + rel), i % 3 == host) << name << " " << rel;
      EXPECT_EQ(Data(name, "all/k" + std::to_string(i)), "v" + std::to_string(i));
    }
  }
  // More hosts than objects: an empty share is allowed.
  auto r = Stage(request, 9, 10, "algo-10");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->channels[0].objects, 0u);
  EXPECT_TRUE(PathExists(work() + "/algo-10/input/data/c"));
}

TEST_F(StagingTest, ManifestFile) {
  Put("imgs/a/1.jpg", "A1");
  Put("imgs/b/2.jpg", "B2");
  Put("imgs/c.jpg", "C");
  Put("manifest.json", R"([{"prefix": "s3://bkt/imgs/"}, "b/2.jpg", "a/1.jpg", "c.jpg"])");
  auto r = Stage(Request({Channel("m", "s3://bkt/manifest.json", "ManifestFile", "ShardedByS3Key")}), 0, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Sorted keys: a/1.jpg, b/2.jpg, c.jpg; host 0 of 2 gets a/1.jpg and c.jpg.
  EXPECT_EQ(Data("h", "m/a/1.jpg"), "A1");
  EXPECT_EQ(Data("h", "m/c.jpg"), "C");
  EXPECT_FALSE(PathExists(work() + "/h/input/data/m/b/2.jpg"));

  Put("bad1.json", "{not json");
  Put("bad2.json", R"(["a", "b"])");
  Put("bad3.json", R"([{"prefix": "s3://bkt/imgs/"}, "missing.jpg"])");
  Put("bad4.json", R"([{"prefix": "s3://bkt/imgs/"}])");
  for (const char* m : {"bad1.json", "bad2.json", "bad3.json", "bad4.json", "nosuch.json"}) {
    auto bad = Stage(Request({Channel("m", std::string("s3://bkt/") + m, "ManifestFile")}), 0, 1, "x");
    ASSERT_FALSE(bad.ok()) << m;
    EXPECT_TRUE(StartsWith(bad.status().message(), "ClientError: ")) << bad.status().message();
    EXPECT_NE(bad.status().message().find("Please"), std::string::npos) << bad.status().message();
  }
}

TEST_F(StagingTest, TraversalKeysAreRejected) {
  Put("d/../../escape", "evil");
  auto r = Stage(Request({Channel("c", "s3://bkt/d/")}));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
  EXPECT_NE(r.status().message().find(".."), std::string::npos);
  EXPECT_FALSE(PathExists(work() + "/escape"));
  EXPECT_FALSE(PathExists(work() + "/h/input/escape"));

  Put("imgs/x", "x");
  Put("trav.json", R"([{"prefix": "s3://bkt/imgs/"}, "../../../../tmp/pwned"])");
  auto m = Stage(Request({Channel("m", "s3://bkt/trav.json", "ManifestFile")}), 0, 1, "y");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(StartsWith(m.status().message(), "ClientError: ")) << m.status().message();

  // Odd but safe keys are normalised inside the channel.
  Put("n/a//b/./c", "abc");
  auto ok = Stage(Request({Channel("n", "s3://bkt/n/")}), 0, 1, "z");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(Data("z", "n/a/b/c"), "abc");
}

TEST_F(StagingTest, FastFileIsReadOnlyAndPipeIsSkipped) {
  Put("f/x/y", "data");
  json request = Request({Channel("fast", "s3://bkt/f/"), Channel("pipe", "s3://bkt/f/")});
  request["InputDataConfig"][0]["InputMode"] = "FastFile";
  request["InputDataConfig"][1]["InputMode"] = "Pipe";
  auto r = Stage(request);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Data("h", "fast/x/y"), "data");
  struct stat st;
  ASSERT_EQ(stat((work() + "/h/input/data/fast/x/y").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0222, 0u);
  EXPECT_FALSE(PathExists(work() + "/h/input/data/pipe"));
  EXPECT_TRUE(r->channels[0].staged);
  EXPECT_FALSE(r->channels[1].staged);
}

TEST_F(StagingTest, FileAndFolderWithTheSameNameFail) {
  Put("c/a", "file");
  Put("c/a/b", "nested");
  auto r = Stage(Request({Channel("c", "s3://bkt/c/")}));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
}

TEST_F(StagingTest, CancelStopsTheDownload) {
  for (int i = 0; i < 50; ++i) Put("big/o" + std::to_string(i), std::string(200000, 'q'));
  CancelFlag cancel;
  cancel.Cancel();
  StageOptions options;
  auto r = StageChannels(*store_, Request({Channel("c", "s3://bkt/big/")}), 0, 1, work() + "/h", cancel, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
}

// Throughput figure for the lead's measurements (printed, not asserted).
TEST_F(StagingTest, ReportsThroughput) {
  std::string blob(4 << 20, 'z');
  for (int i = 0; i < 16; ++i) Put("tp/o" + std::to_string(i), blob);
  CancelFlag cancel;
  auto r = StageChannels(*store_, Request({Channel("c", "s3://bkt/tp/")}), 0, 1, work() + "/h", cancel, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 16u * blob.size());
  std::printf("staging: %llu bytes in %.3f s = %.1f MiB/s\n", static_cast<unsigned long long>(r->bytes),
              r->elapsed_seconds, r->BytesPerSecond() / (1 << 20));
}

// ObjectError tells a missing bucket from a missing object by the store's typed reason, not by
// the message text: a NotFound whose message merely starts with "NoSuchBucket" but carries no
// reason is a missing object, and a prefixed message keeps its reason.
TEST(ObjectErrorTest, MissingBucketIsTheTypedReason) {
  Status bucket = ObjectError(Status::NotFound("NoSuchBucket: gone").WithReason(ErrorReason::kNoSuchBucket),
                              "Downloading", "b", "k");
  EXPECT_EQ(bucket.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bucket.message().find("bucket \"b\" does not exist"), std::string::npos) << bucket.message();
  Status prefixed =
      ObjectError(Status::NotFound("NoSuchBucket: gone").WithReason(ErrorReason::kNoSuchBucket).WithPrefix("listing"),
                  "Downloading", "b", "k");
  EXPECT_NE(prefixed.message().find("bucket \"b\" does not exist"), std::string::npos) << prefixed.message();
  Status key =
      ObjectError(Status::NotFound("NoSuchKey: gone").WithReason(ErrorReason::kNoSuchKey), "Downloading", "b", "k");
  EXPECT_NE(key.message().find("the object does not exist"), std::string::npos) << key.message();
  Status untyped = ObjectError(Status::NotFound("NoSuchBucket lookalike"), "Downloading", "b", "k");
  EXPECT_NE(untyped.message().find("the object does not exist"), std::string::npos) << untyped.message();
}

// Warm pools (training-contract.md §19): files kept from a previous staging are moved into place
// for the same objects; a changed object, a file the job changed and a manifest-named object are
// downloaded again.
TEST_F(StagingTest, KeptFilesOfTheSameObjectsAreReusedNotDownloaded) {
  Put("d/a.csv", std::string(5000, 'a'));
  Put("d/b.csv", std::string(6000, 'b'));
  Put("d/c.csv", std::string(7000, 'c'));
  json request = Request({Channel("train", "s3://bkt/d/")});
  auto first = Stage(request, 0, 1, "old");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->files.size(), 3u);
  EXPECT_EQ(first->reused_objects, 0u);
  const std::string manifest = work() + "/old-staged.json";
  ASSERT_TRUE(WriteStagedManifest(manifest, first->files).ok());
  // The pool moves: the manifest follows its directory.
  ASSERT_EQ(rename((work() + "/old").c_str(), (work() + "/pool").c_str()), 0);
  ASSERT_TRUE(RebaseStagedManifest(manifest, work() + "/old", work() + "/pool").ok());
  // b.csv changes in the store; the job changed c.csv in place (same size, new mtime).
  Put("d/b.csv", std::string(6000, 'B'));
  {
    std::FILE* f = std::fopen((work() + "/pool/input/data/train/c.csv").c_str(), "r+");
    ASSERT_NE(f, nullptr);
    std::fputs("X", f);
    std::fclose(f);
    struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, (work() + "/pool/input/data/train/c.csv").c_str(), times, 0), 0);
  }
  CancelFlag cancel;
  StageOptions options;
  options.reuse_manifest = manifest;
  auto second = StageChannels(*store_, request, 0, 1, work() + "/new", cancel, options);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->objects, 3u);
  EXPECT_EQ(second->reused_objects, 1u);  // a.csv only
  EXPECT_EQ(second->reused_bytes, 5000u);
  EXPECT_EQ(Data("new", "train/a.csv"), std::string(5000, 'a'));
  EXPECT_FALSE(PathExists(work() + "/pool/input/data/train/a.csv"));  // moved, not copied
  EXPECT_EQ(Data("new", "train/b.csv"), std::string(6000, 'B'));
  EXPECT_EQ(Data("new", "train/c.csv"), std::string(7000, 'c'));
  // An entry naming a file outside the manifest's directory is never taken.
  Put("d/x.csv", "outside");
  const std::string outside =
      (std::filesystem::temp_directory_path() / ("kiln-outside-" + std::to_string(getpid()) + ".csv")).string();
  ASSERT_TRUE(WriteFileAtomic(outside, "outside").ok());
  StagedFile foreign{"bkt", "d/x.csv", "", 7, outside};
  struct stat st;
  ASSERT_EQ(stat(outside.c_str(), &st), 0);
  foreign.etag = store_->HeadObject("bkt", "d/x.csv")->etag;
  foreign.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  foreign.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  foreign.inode = st.st_ino;
  ASSERT_TRUE(WriteStagedManifest(manifest, {foreign}).ok());
  options.reuse_manifest = manifest;
  auto fourth = StageChannels(*store_, request, 0, 1, work() + "/fourth", cancel, options);
  ASSERT_TRUE(fourth.ok()) << fourth.status().ToString();
  EXPECT_EQ(fourth->reused_objects, 0u);
  EXPECT_TRUE(PathExists(outside));
  std::remove(outside.c_str());
  // A missing manifest reuses nothing and is no error.
  options.reuse_manifest = work() + "/none.json";
  auto third = StageChannels(*store_, request, 0, 1, work() + "/third", cancel, options);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->reused_objects, 0u);
}

}  // namespace
}  // namespace kiln::agent
