#include "agent/artifacts.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include "agent/test_util/agent_fixture.h"
#include "base/strings.h"

namespace kiln::agent {
namespace {

using nlohmann::json;
using testing::AgentTest;

// Reads a tar(.gz) from memory: path -> content, "<dir>" or "-> target".
std::map<std::string, std::string> ReadTar(const std::string& data) {
  std::map<std::string, std::string> out;
  struct archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_all(a);
  EXPECT_EQ(archive_read_open_memory(a, data.data(), data.size()), ARCHIVE_OK);
  struct archive_entry* e;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    std::string name = archive_entry_pathname(e);
    if (archive_entry_filetype(e) == AE_IFDIR) {
      out[name] = "<dir>";
    } else if (archive_entry_filetype(e) == AE_IFLNK) {
      out[name] = std::string("-> ") + archive_entry_symlink(e);
    } else {
      std::string content;
      char buf[4096];
      la_ssize_t n;
      while ((n = archive_read_data(a, buf, sizeof(buf))) > 0) content.append(buf, static_cast<size_t>(n));
      out[name] = content;
    }
  }
  archive_read_free(a);
  return out;
}

struct Member {
  std::string name;
  char type;         // 'f' file, 'd' dir, 'l' symlink, 'h' hardlink
  std::string data;  // content or link target
};

std::string MakeTarGz(const std::string& tmp_path, const std::vector<Member>& members) {
  struct archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_pax_restricted(a);
  EXPECT_EQ(archive_write_open_filename(a, tmp_path.c_str()), ARCHIVE_OK);
  for (const auto& m : members) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, m.name.c_str());
    archive_entry_set_perm(e, m.type == 'd' ? 0755 : 0644);
    if (m.type == 'f') {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_size(e, static_cast<la_int64_t>(m.data.size()));
    } else if (m.type == 'd') {
      archive_entry_set_filetype(e, AE_IFDIR);
    } else if (m.type == 'l') {
      archive_entry_set_filetype(e, AE_IFLNK);
      archive_entry_set_symlink(e, m.data.c_str());
    } else {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_hardlink(e, m.data.c_str());
    }
    archive_write_header(a, e);
    if (m.type == 'f') archive_write_data(a, m.data.data(), m.data.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  auto r = ReadFile(tmp_path);
  return r.ok() ? *r : "";
}

class ArtifactsTest : public AgentTest {
 protected:
  void Write(const std::string& path, const std::string& data) {
    ASSERT_TRUE(MakeDirs(std::filesystem::path(path).parent_path().string()).ok());
    ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  }
  json OutputConfig(const std::string& path = "s3://bkt/out/") { return json{{"S3OutputPath", path}}; }
};

TEST_F(ArtifactsTest, ModelTarGzContainsRelativePaths) {
  std::string h1 = work() + "/algo-1";
  Write(h1 + "/model/model.pth", "weights");
  Write(h1 + "/model/code/inference.py", "print(1)");
  ASSERT_TRUE(MakeDirs(h1 + "/model/empty").ok());
  ASSERT_EQ(symlink("model.pth", (h1 + "/model/latest").c_str()), 0);
  ASSERT_TRUE(MakeDirs(h1 + "/output/data").ok());
  auto r = UploadJobArtifacts(*store_, {h1}, OutputConfig(), "job-1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model_artifacts, "s3://bkt/out/job-1/output/model.tar.gz");
  EXPECT_EQ(r->output_data, "");  // nothing written to output/data
  EXPECT_FALSE(Exists("out/job-1/output/output.tar.gz"));
  auto tar = ReadTar(Get("out/job-1/output/model.tar.gz"));
  std::map<std::string, std::string> expected = {{"model.pth", "weights"},
                                                 {"code/", "<dir>"},
                                                 {"code/inference.py", "print(1)"},
                                                 {"empty/", "<dir>"},
                                                 {"latest", "-> model.pth"}};
  EXPECT_EQ(tar, expected);
  EXPECT_EQ(r->files, 2u);
  // No temp archive is left behind.
  for (const auto& e : std::filesystem::directory_iterator(h1)) {
    EXPECT_FALSE(StartsWith(e.path().filename().string(), ".kiln-")) << e.path();
  }
}

TEST_F(ArtifactsTest, EmptyModelIsStillUploadedAndSlashesNormalised) {
  ASSERT_TRUE(MakeDirs(work() + "/h/model").ok());
  auto r = UploadModelArtifacts(*store_, {work() + "/h/model", work() + "/missing/model"},
                                OutputConfig("s3://bkt/out///"), "job-2");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model_artifacts, "s3://bkt/out/job-2/output/model.tar.gz");
  ASSERT_TRUE(Exists("out/job-2/output/model.tar.gz"));
  EXPECT_TRUE(ReadTar(Get("out/job-2/output/model.tar.gz")).empty());
  EXPECT_EQ(ModelArtifactsUri(OutputConfig("s3://bkt"), "j"), "s3://bkt/j/output/model.tar.gz");
}

TEST_F(ArtifactsTest, MultiHostMergeLowestHostWins) {
  std::string h1 = work() + "/algo-1", h2 = work() + "/algo-2";
  Write(h1 + "/model/shared.bin", "from host 1");
  Write(h1 + "/model/rank0.bin", "r0");
  Write(h2 + "/model/shared.bin", "from host 2");
  Write(h2 + "/model/rank1.bin", "r1");
  Write(h2 + "/model/d/x", "dx");
  Write(h2 + "/output/data/metrics.json", "{}");
  ASSERT_TRUE(MakeDirs(h1 + "/output/data").ok());
  auto r = UploadJobArtifacts(*store_, {h1, h2}, OutputConfig(), "job-3");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto tar = ReadTar(Get("out/job-3/output/model.tar.gz"));
  EXPECT_EQ(tar["shared.bin"], "from host 1");
  EXPECT_EQ(tar["rank0.bin"], "r0");
  EXPECT_EQ(tar["rank1.bin"], "r1");
  EXPECT_EQ(tar["d/x"], "dx");
  EXPECT_EQ(r->clashes, std::vector<std::string>{"shared.bin (algo-2)"});
  EXPECT_EQ(r->output_data, "s3://bkt/out/job-3/output/output.tar.gz");
  auto out = ReadTar(Get("out/job-3/output/output.tar.gz"));
  EXPECT_EQ(out["metrics.json"], "{}");
}

TEST_F(ArtifactsTest, CompressionNoneUploadsFiles) {
  std::string h1 = work() + "/algo-1";
  Write(h1 + "/model/a.bin", "A");
  Write(h1 + "/model/sub/b.bin", "B");
  json config = OutputConfig();
  config["CompressionType"] = "NONE";
  auto r = UploadModelArtifacts(*store_, {h1 + "/model"}, config, "job-4");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model_artifacts, "s3://bkt/out/job-4/output/model/");
  EXPECT_EQ(Get("out/job-4/output/model/a.bin"), "A");
  EXPECT_EQ(Get("out/job-4/output/model/sub/b.bin"), "B");
  EXPECT_FALSE(Exists("out/job-4/output/model.tar.gz"));
}

TEST_F(ArtifactsTest, MissingOutputBucketIsClientError) {
  auto r = UploadModelArtifacts(*store_, {}, OutputConfig("s3://nobucket/x"), "j");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
  EXPECT_NE(r.status().message().find("nobucket"), std::string::npos);
}

TEST_F(ArtifactsTest, SourceDirFromS3IsExtracted) {
  std::string tgz = MakeTarGz(work() + "/src.tgz", {{"./", 'd', ""},
                                                    {"./train.py", 'f', "print('hi')"},
                                                    {"./lib/", 'd', ""},
                                                    {"./lib/util.py", 'f', "x = 1"},
                                                    {"./lib/alias.py", 'l', "util.py"},
                                                    {"./lib/hard.py", 'h', "lib/util.py"},
                                                    {"./requirements.txt", 'f', "numpy"}});
  Put("code/sourcedir.tar.gz", tgz);
  std::string code = work() + "/opt/code";
  // The hyperparameter arrives JSON-encoded.
  Status s = DownloadSourceDir(*store_, "\"s3://bkt/code/sourcedir.tar.gz\"", code);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Slurp(code + "/train.py"), "print('hi')");
  EXPECT_EQ(Slurp(code + "/lib/util.py"), "x = 1");
  EXPECT_EQ(Slurp(code + "/lib/alias.py"), "x = 1");
  EXPECT_EQ(Slurp(code + "/lib/hard.py"), "x = 1");
  EXPECT_EQ(Slurp(code + "/requirements.txt"), "numpy");

  // The same archive from a local file, and a local directory copy.
  ASSERT_TRUE(DownloadSourceDir(*store_, "file://" + work() + "/src.tgz", work() + "/code2").ok());
  EXPECT_EQ(Slurp(work() + "/code2/lib/util.py"), "x = 1");
  ASSERT_TRUE(DownloadSourceDir(*store_, "file://" + code, work() + "/code3").ok());
  EXPECT_EQ(Slurp(work() + "/code3/train.py"), "print('hi')");
}

// Regression (issue 10): leading '/'s are dropped as GNU tar and Python's tarfile do, for
// sourcedir.tar.gz as for model.tar.gz (a root member "/" as tarfile.add(dir, arcname="/")
// writes it, and members written with absolute names).
TEST_F(ArtifactsTest, SourceDirWithRootAndAbsoluteMembersIsExtractedInside) {
  std::string tgz = MakeTarGz(work() + "/abs.tgz", {{"/", 'd', ""},
                                                    {"train.py", 'f', "print('root')"},
                                                    {"/lib/", 'd', ""},
                                                    {"/lib/util.py", 'f', "x = 2"},
                                                    {"//lib/hard.py", 'h', "/lib/util.py"}});
  Put("code/abs.tar.gz", tgz);
  std::string code = work() + "/abs/code";
  Status s = DownloadSourceDir(*store_, "s3://bkt/code/abs.tar.gz", code);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Slurp(code + "/train.py"), "print('root')");
  EXPECT_EQ(Slurp(code + "/lib/util.py"), "x = 2");
  EXPECT_EQ(Slurp(code + "/lib/hard.py"), "x = 2");
  EXPECT_FALSE(PathExists("/lib/util.py"));
}

TEST_F(ArtifactsTest, MaliciousSourceTarballsAreRejected) {
  const std::vector<std::vector<Member>> cases = {
      {{"../evil.py", 'f', "x"}},
      {{"a/../../evil.py", 'f', "x"}},
      {{"/../kiln-abs-evil.py", 'f', "x"}},  // still climbs out once the leading '/' is dropped
      {{"etc", 'l', "/etc"}},
      {{"up", 'l', "../.."}},
      {{"s", 'l', "sub"}, {"sub/", 'd', ""}, {"s/x", 'f', "through a symlink"}},
      {{"a", 'l', "."}, {"b", 'l', "a/.."}},  // lexically inside, physically the parent
      {{"h", 'h', "../outside"}},
  };
  int i = 0;
  for (const auto& members : cases) {
    std::string name = "bad" + std::to_string(i++) + ".tar.gz";
    Put(name, MakeTarGz(work() + "/" + name, members));
    std::string code = work() + "/code-" + name;
    Status s = DownloadSourceDir(*store_, "s3://bkt/" + name, code);
    ASSERT_FALSE(s.ok()) << members[0].name;
    EXPECT_TRUE(StartsWith(s.message(), "ClientError: ")) << s.message();
    EXPECT_NE(s.message().find("s3://bkt/" + name), std::string::npos) << s.message();
  }
  EXPECT_FALSE(PathExists(work() + "/evil.py"));
  EXPECT_FALSE(PathExists(work() + "/kiln-abs-evil.py"));

  Put("garbage.tar.gz", "definitely not a tarball");
  Status s = DownloadSourceDir(*store_, "s3://bkt/garbage.tar.gz", work() + "/g");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(StartsWith(s.message(),
                         "ClientError: Failed to extract the source code archive "
                         "\"s3://bkt/garbage.tar.gz\""))
      << s.message();
  s = DownloadSourceDir(*store_, "s3://bkt/none.tar.gz", work() + "/g");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(StartsWith(s.message(), "ClientError: ")) << s.message();
  s = DownloadSourceDir(*store_, "http://example.com/x.tar.gz", work() + "/g");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(StartsWith(s.message(), "ClientError: ")) << s.message();
}

}  // namespace
}  // namespace kiln::agent
