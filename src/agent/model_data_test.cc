#include "agent/model_data.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>

#include "agent/test_util/agent_fixture.h"
#include "base/strings.h"

namespace kiln::agent {
namespace {

using nlohmann::json;
using testing::AgentTest;

// One tar member. type: 'f' file, 'd' dir, 'l' symlink, 'h' hard link, 'c' char device, 'p' FIFO.
struct TarMember {
  std::string name;
  char type;
  std::string data;  // file content or link target
  mode_t perm = 0644;
};

// A gzip tar built with libarchive, returned as bytes.
std::string BuildTarGz(const std::vector<TarMember>& members) {
  struct archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_pax_restricted(a);
  std::vector<char> out(1 << 20);
  size_t used = 0;
  EXPECT_EQ(archive_write_open_memory(a, out.data(), out.size(), &used), ARCHIVE_OK);
  for (const auto& m : members) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, m.name.c_str());
    archive_entry_set_perm(e, m.type == 'd' ? 0755 : m.perm);
    switch (m.type) {
      case 'f':
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_size(e, static_cast<la_int64_t>(m.data.size()));
        break;
      case 'd': archive_entry_set_filetype(e, AE_IFDIR); break;
      case 'l':
        archive_entry_set_filetype(e, AE_IFLNK);
        archive_entry_set_symlink(e, m.data.c_str());
        break;
      case 'h':
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_hardlink(e, m.data.c_str());
        break;
      case 'c':
        archive_entry_set_filetype(e, AE_IFCHR);
        archive_entry_set_rdev(e, makedev(1, 3));
        break;
      case 'p': archive_entry_set_filetype(e, AE_IFIFO); break;
    }
    EXPECT_GE(archive_write_header(a, e), ARCHIVE_WARN) << m.name;
    if (m.type == 'f') archive_write_data(a, m.data.data(), m.data.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return std::string(out.data(), used);
}

json Url(const std::string& uri) { return json{{"Image", "local:/x"}, {"ModelDataUrl", uri}}; }

class ModelDataTest : public AgentTest {
 protected:
  Result<ModelDataResult> Prepare(const json& container, const std::string& dir, const std::string& cache = "",
                                  const CancelFlag* cancel = nullptr) {
    return PrepareModelData(*store_, container, dir, cache, cancel);
  }
  // Names in `dir` (files and directories, recursively), for "nothing was left behind" checks.
  static std::vector<std::string> Listing(const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != decltype(it)(); ++it) {
      out.push_back(std::filesystem::relative(it->path(), dir).string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  static mode_t Perm(const std::string& path) {
    struct stat st;
    return lstat(path.c_str(), &st) == 0 ? (st.st_mode & 0777) : 0;
  }
};

TEST_F(ModelDataTest, ArchiveIsExtractedWithDirsPermissionsAndInsideLinks) {
  Put("m/model.tar.gz", BuildTarGz({{"./", 'd', ""},
                                    {"./model.pth", 'f', "weights", 0600},
                                    {"./code/", 'd', ""},
                                    {"./code/inference.py", 'f', "def model_fn(d): pass", 0755},
                                    {"./code/deep/er/x.txt", 'f', "nested"},
                                    {"./latest", 'l', "code/alias"},  // chain: latest -> alias -> file
                                    {"./code/alias", 'l', "deep/er/x.txt"},
                                    {"./code/hard.py", 'h', "code/inference.py"}}));
  std::string dir = work() + "/inst-1/model";
  auto r = Prepare(Url("s3://bkt/m/model.tar.gz"), dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files, 4u);  // three files and the hard link
  EXPECT_EQ(r->bytes, 7u + 21u + 6u);
  EXPECT_FALSE(r->cache_hit);
  EXPECT_EQ(Slurp(dir + "/model.pth"), "weights");
  EXPECT_EQ(Perm(dir + "/model.pth"), 0600u);
  EXPECT_EQ(Perm(dir + "/code/inference.py"), 0755u);
  EXPECT_EQ(Slurp(dir + "/code/deep/er/x.txt"), "nested");
  EXPECT_EQ(Slurp(dir + "/latest"), "nested");
  EXPECT_EQ(Slurp(dir + "/code/hard.py"), "def model_fn(d): pass");
  // Only the model directory is left in the parent (the staging directory was renamed).
  EXPECT_EQ(Listing(work() + "/inst-1").front(), "model");
  for (const auto& n : Listing(work() + "/inst-1")) EXPECT_EQ(n.find("staging"), std::string::npos) << n;

  // ModelDataSource S3Object + Gzip is the same thing, into an existing empty directory.
  std::string dir2 = work() + "/inst-2/model";
  ASSERT_TRUE(MakeDirs(dir2).ok());
  json mds = {{"Image", "local:/x"},
              {"ModelDataSource",
               {{"S3DataSource",
                 {{"S3Uri", "s3://bkt/m/model.tar.gz"}, {"S3DataType", "S3Object"}, {"CompressionType", "Gzip"}}}}}};
  r = Prepare(mds, dir2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Slurp(dir2 + "/code/deep/er/x.txt"), "nested");
}

// Regression (issue 10): model.deploy(entry_point=...) repacks model.tar.gz with
// tarfile.add(model_dir, arcname="/"), whose members are "/" (the root), "code/",
// "code/inference.py", "model.pth" (Python strips the '/' of the others); GNU tar -P archives
// keep absolute names ("/code/x.py"). Both are read as tar and tarfile read them: inside the root.
TEST_F(ModelDataTest, SdkRepackedArchiveWithRootMemberIsExtracted) {
  Put("repacked/model.tar.gz", BuildTarGz({{"/", 'd', ""},
                                           {"code/", 'd', ""},
                                           {"code/inference.py", 'f', "def model_fn(d): pass", 0755},
                                           {"model.pth", 'f', "weights"},
                                           {"/code/requirements.txt", 'f', "numpy"},
                                           {"//extra/", 'd', ""},
                                           {"/extra/notes.txt", 'f', "n"},
                                           {"/code/same.py", 'h', "/code/inference.py"},
                                           {"/latest", 'l', "model.pth"}}));
  std::string dir = work() + "/repacked/model";
  auto r = Prepare(Url("s3://bkt/repacked/model.tar.gz"), dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // (Listing() names entries through std::filesystem::relative, which resolves the "latest" link.)
  EXPECT_EQ(Listing(dir + "/code"), (std::vector<std::string>{"inference.py", "requirements.txt", "same.py"}));
  EXPECT_EQ(Listing(dir + "/extra"), std::vector<std::string>{"notes.txt"});
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/latest"));
  EXPECT_EQ(std::filesystem::read_symlink(dir + "/latest"), "model.pth");
  EXPECT_EQ(Slurp(dir + "/code/inference.py"), "def model_fn(d): pass");
  EXPECT_EQ(Perm(dir + "/code/inference.py"), 0755u);
  EXPECT_EQ(Slurp(dir + "/code/requirements.txt"), "numpy");
  EXPECT_EQ(Slurp(dir + "/code/same.py"), "def model_fn(d): pass");
  EXPECT_EQ(Slurp(dir + "/latest"), "weights");
  EXPECT_EQ(r->files, 5u);
  EXPECT_FALSE(PathExists("/extra/notes.txt"));
}

TEST_F(ModelDataTest, UnsafeArchivesAreRefusedWhole) {
  struct Case {
    std::vector<TarMember> members;
    std::string mentions;  // the offending member as the message must name it
  };
  const std::vector<Case> cases = {
      {{{"ok.txt", 'f', "fine"}, {"../evil", 'f', "x"}}, "\"../evil\""},
      {{{"ok.txt", 'f', "fine"}, {"a/../../evil", 'f', "x"}}, "\"a/../../evil\""},
      {{{"/../kiln-model-abs-evil", 'f', "x"}}, "\"/../kiln-model-abs-evil\""},  // climbs out after the '/'
      {{{"//a/../../kiln-model-abs-evil", 'f', "x"}}, "\"//a/../../kiln-model-abs-evil\""},
      {{{"etc", 'l', "/etc"}}, "\"etc\""},
      {{{"sub/up", 'l', "../../x"}}, "\"sub/up\""},
      {{{"a", 'l', "."}, {"b", 'l', "a/.."}}, "\"b\""},  // lexically inside, physically the parent
      {{{"ok.txt", 'f', "fine"}, {"h", 'h', "../outside"}}, "\"h\""},
      {{{"ok.txt", 'f', "fine"}, {"h", 'h', "/../ok.txt"}}, "\"h\""},  // hard link climbing out after the '/'
      {{{"/", 'd', ""}, {"/abs", 'l', "/etc"}}, "\"/abs\""},           // absolute symlink target
      {{{"ok.txt", 'f', "fine"}, {"dev/null", 'c', ""}}, "\"dev/null\""},
      {{{"fifo", 'p', ""}}, "\"fifo\""},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string name = "bad" + std::to_string(i++) + ".tar.gz";
    Put(name, BuildTarGz(c.members));
    std::string parent = work() + "/bad-" + std::to_string(i);
    std::string dir = parent + "/model";
    ASSERT_TRUE(MakeDirs(dir).ok());  // an existing empty model_dir stays empty
    auto r = Prepare(Url("s3://bkt/" + name), dir);
    ASSERT_FALSE(r.ok()) << c.mentions;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: The model archive s3://bkt/" + name + " "))
        << r.status().message();
    EXPECT_NE(r.status().message().find(c.mentions), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("/opt/ml/model"), std::string::npos) << r.status().message();
    EXPECT_EQ(Listing(parent), std::vector<std::string>{"model"}) << c.mentions;
  }
  EXPECT_FALSE(PathExists(work() + "/evil"));
  EXPECT_FALSE(PathExists(work() + "/kiln-model-abs-evil"));

  Put("garbage.tar.gz", "definitely not a tarball");
  auto r = Prepare(Url("s3://bkt/garbage.tar.gz"), work() + "/g/model");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: The model archive s3://bkt/garbage.tar.gz"))
      << r.status().message();
  EXPECT_FALSE(PathExists(work() + "/g/model"));
}

TEST_F(ModelDataTest, PrefixIsCopiedAndConfined) {
  Put("models/m1/config.json", "{}");
  Put("models/m1/weights/part-0.bin", "0123456789");
  Put("models/m1/weights/", "");  // folder marker
  Put("models/m1x/other.bin", "not mine");
  json c = {{"Image", "local:/x"},
            {"ModelDataSource",
             {{"S3DataSource",
               {{"S3Uri", "s3://bkt/models/m1/"}, {"S3DataType", "S3Prefix"}, {"CompressionType", "None"}}}}}};
  std::string dir = work() + "/p/model";
  auto r = Prepare(c, dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files, 2u);
  EXPECT_EQ(r->bytes, 12u);
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"config.json", "weights", "weights/part-0.bin"}));
  EXPECT_EQ(Slurp(dir + "/weights/part-0.bin"), "0123456789");

  Put("models/m2/../evil", "x");
  c["ModelDataSource"]["S3DataSource"]["S3Uri"] = "s3://bkt/models/m2/";
  r = Prepare(c, work() + "/p2/model");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
  EXPECT_NE(r.status().message().find("s3://bkt/models/m2/../evil"), std::string::npos) << r.status().message();
  EXPECT_FALSE(PathExists(work() + "/p2/model"));
  EXPECT_FALSE(PathExists(work() + "/p2/evil"));

  c["ModelDataSource"]["S3DataSource"]["S3Uri"] = "s3://bkt/models/m1";  // no trailing '/'
  r = Prepare(c, work() + "/p3/model");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("must end with \"/\""), std::string::npos) << r.status().message();

  c["ModelDataSource"]["S3DataSource"]["S3Uri"] = "s3://bkt/models/none/";
  r = Prepare(c, work() + "/p4/model");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: No S3 objects found")) << r.status().message();
}

TEST_F(ModelDataTest, MissingObjectOrBucketIsClientError) {
  auto r = Prepare(Url("s3://bkt/nope/model.tar.gz"), work() + "/a/model");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
  EXPECT_NE(r.status().message().find("s3://bkt/nope/model.tar.gz"), std::string::npos) << r.status().message();
  EXPECT_FALSE(PathExists(work() + "/a/model"));
  // The same through the cache path (HEAD first).
  r = Prepare(Url("s3://no-such-bucket/model.tar.gz"), work() + "/b/model", work() + "/cache");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not exist"), std::string::npos) << r.status().message();
  r = Prepare(Url("https://example.com/model.tar.gz"), work() + "/c/model");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ")) << r.status().message();
}

TEST_F(ModelDataTest, NoModelDataLeavesAnEmptyDirectory) {
  std::string dir = work() + "/n/model";
  auto r = Prepare(json{{"Image", "local:/x"}}, dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(PathExists(dir));
  EXPECT_TRUE(Listing(dir).empty());
  EXPECT_EQ(r->files, 0u);
  // Multi-model containers load on demand: the prefix is not copied here.
  Put("mme/a.tar.gz", "x");
  r = Prepare(json{{"Image", "local:/x"}, {"Mode", "MultiModel"}, {"ModelDataUrl", "s3://bkt/mme/"}},
              work() + "/n2/model");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(Listing(work() + "/n2/model").empty());
  // A non-empty model_dir is the caller's mistake.
  ASSERT_TRUE(WriteFileAtomic(dir + "/stale", "x").ok());
  r = Prepare(json{{"Image", "local:/x"}}, dir);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(ModelDataTest, CacheIsKeyedByEtagAndSkipsTheDownload) {
  Put("c/model.tar.gz", BuildTarGz({{"version.txt", 'f', "v1"}}));
  std::string cache = work() + "/cache";
  auto r = Prepare(Url("s3://bkt/c/model.tar.gz"), work() + "/i1/model", cache);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->cache_hit);
  EXPECT_EQ(Slurp(work() + "/i1/model/version.txt"), "v1");
  std::vector<std::string> entries;
  for (const auto& n : Listing(cache)) {
    if (EndsWith(n, ".tar.gz")) entries.push_back(n);
  }
  ASSERT_EQ(entries.size(), 1u);
  for (const auto& n : Listing(cache)) EXPECT_EQ(n.find(".tmp-"), std::string::npos) << n;

  // A hit extracts from the local copy: swap the cached bytes for a different archive and the
  // second instance sees them, proving the object was not read again.
  ASSERT_TRUE(WriteFileAtomic(cache + "/" + entries[0], BuildTarGz({{"version.txt", 'f', "from-cache"}})).ok());
  r = Prepare(Url("s3://bkt/c/model.tar.gz"), work() + "/i2/model", cache);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->cache_hit);
  EXPECT_EQ(Slurp(work() + "/i2/model/version.txt"), "from-cache");

  // A new version of the object has a new ETag: a miss, and the new content.
  Put("c/model.tar.gz", BuildTarGz({{"version.txt", 'f', "v2"}}));
  r = Prepare(Url("s3://bkt/c/model.tar.gz"), work() + "/i3/model", cache);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->cache_hit);
  EXPECT_EQ(Slurp(work() + "/i3/model/version.txt"), "v2");

  // An unsafe archive is refused from the cache as well.
  Put("c/bad.tar.gz", BuildTarGz({{"../evil", 'f', "x"}}));
  for (int pass = 0; pass < 2; ++pass) {
    r = Prepare(Url("s3://bkt/c/bad.tar.gz"), work() + "/i4/model", cache);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("\"../evil\""), std::string::npos) << r.status().message();
  }
}

TEST_F(ModelDataTest, CancelGivesDeadlineExceededAndNoModel) {
  Put("k/model.tar.gz", BuildTarGz({{"big.bin", 'f', std::string(3 << 20, 'z')}}));
  Put("k/prefix/a.bin", "a");
  CancelFlag cancel;
  cancel.Cancel();
  for (const std::string& cache : {std::string(), work() + "/cache"}) {
    std::string parent = work() + "/k" + std::to_string(cache.size());
    auto r = Prepare(Url("s3://bkt/k/model.tar.gz"), parent + "/model", cache, &cancel);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
    EXPECT_NE(r.status().message().find("s3://bkt/k/model.tar.gz"), std::string::npos) << r.status().message();
    EXPECT_TRUE(Listing(parent).empty()) << parent;
  }
  json c = {
      {"Image", "local:/x"},
      {"ModelDataSource",
       {{"S3DataSource", {{"S3Uri", "s3://bkt/k/prefix/"}, {"S3DataType", "S3Prefix"}, {"CompressionType", "None"}}}}}};
  auto r = Prepare(c, work() + "/kp/model", "", &cancel);
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_FALSE(PathExists(work() + "/kp/model"));
}

}  // namespace
}  // namespace kiln::agent
