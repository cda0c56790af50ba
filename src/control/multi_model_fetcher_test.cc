#include "control/multi_model_fetcher.h"

#include <gtest/gtest.h>

#include <map>

#include "agent/artifacts.h"
#include "base/fs.h"
#include "base/io.h"
#include "control/test_util/controller_fixture.h"

namespace kiln::control {
namespace {

class MultiModelFetcherTest : public testing::ControllerTest {
 protected:
  // Puts a gzip tar of {name: content} at bkt/<key>.
  void PutArchive(const std::string& key, const std::map<std::string, std::string>& files) {
    const std::string src = dir_.path() + "/src-" + std::to_string(archives_++);
    ASSERT_TRUE(MakeDirs(src).ok());
    for (const auto& [name, content] : files) ASSERT_TRUE(WriteFileAtomic(src + "/" + name, content).ok());
    const std::string archive = src + ".tar.gz";
    ASSERT_TRUE(agent::WriteTarGz({src}, archive, nullptr).ok());
    auto bytes = ReadFile(archive);
    ASSERT_TRUE(bytes.ok());
    StringByteSource source(*bytes);
    ASSERT_TRUE(object_store_->PutObject("bkt", key, source, objects::PutOptions{}).ok());
  }
  int archives_ = 0;
};

TEST_F(MultiModelFetcherTest, UnpacksTheTargetModelIntoTheDirectory) {
  PutArchive("models/team-a/m1.tar.gz", {{"weights.bin", "w1"}, {"info.json", "{}"}});
  MultiModelFetcher fetcher(object_store_.get(), dir_.path() + "/cache");
  const std::string dir = dir_.path() + "/models/abc/model";
  ASSERT_TRUE(MakeDirs(dir_.path() + "/models/abc").ok());
  ASSERT_TRUE(fetcher.Fetch("s3://bkt/models/team-a/m1.tar.gz", dir).ok());
  auto weights = ReadFile(dir + "/weights.bin");
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ(*weights, "w1");
  EXPECT_TRUE(PathExists(dir + "/info.json"));
}

TEST_F(MultiModelFetcherTest, AMissingObjectOrBucketIsNotFoundAndLeavesNoDirectory) {
  MultiModelFetcher fetcher(object_store_.get(), "");
  const std::string dir = dir_.path() + "/models/x/model";
  ASSERT_TRUE(MakeDirs(dir_.path() + "/models/x").ok());
  EXPECT_EQ(fetcher.Fetch("s3://bkt/models/absent.tar.gz", dir).code(), StatusCode::kNotFound);
  EXPECT_EQ(fetcher.Fetch("s3://no-such-bucket/m.tar.gz", dir).code(), StatusCode::kNotFound);
  EXPECT_EQ(fetcher.Fetch("s3://bkt/", dir).code(), StatusCode::kNotFound);
  EXPECT_FALSE(PathExists(dir));
  EXPECT_EQ(fetcher.Fetch("https://example.com/m.tar.gz", dir).code(), StatusCode::kInvalidArgument);
}

TEST_F(MultiModelFetcherTest, AnArchiveThatIsNotAGzipTarIsAClientError) {
  StringByteSource source("not a tar");
  ASSERT_TRUE(object_store_->PutObject("bkt", "models/bad.tar.gz", source, objects::PutOptions{}).ok());
  MultiModelFetcher fetcher(object_store_.get(), "");
  const std::string dir = dir_.path() + "/models/bad/model";
  ASSERT_TRUE(MakeDirs(dir_.path() + "/models/bad").ok());
  Status s = fetcher.Fetch("s3://bkt/models/bad.tar.gz", dir);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("ClientError"), std::string::npos) << s.message();
  EXPECT_FALSE(PathExists(dir));
}

}  // namespace
}  // namespace kiln::control
