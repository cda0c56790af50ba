// Issue 9: archives that unpack to more than their UnpackCap (a gzip bomb, many small files, a
// sparse member) are stopped before the cap is passed, fail with a message naming the archive,
// the cap and its origin, and leave nothing behind.

#include "agent/unpack_cap.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "agent/artifacts.h"
#include "agent/model_data.h"
#include "agent/tar_extract.h"
#include "agent/test_util/agent_fixture.h"
#include "base/strings.h"

namespace kiln::agent {
namespace {

using nlohmann::json;
using testing::AgentTest;

constexpr uint64_t kMiB = 1 << 20;

struct Member {
  std::string name;
  char type = 'f';     // 'f' file of `zeros` zero bytes, 'd' directory, 's' sparse file (see below)
  uint64_t zeros = 0;  // 'f': size; 's': logical size, with one 4 KiB data block at its end
};

// A gzip pax tar built in memory. A 64 MiB zero-filled file compresses to about 64 KiB.
std::string BuildTarGz(const std::vector<Member>& members) {
  struct archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_pax(a);
  std::vector<char> out(8 << 20);
  size_t used = 0;
  EXPECT_EQ(archive_write_open_memory(a, out.data(), out.size(), &used), ARCHIVE_OK);
  std::string zeros(kMiB, '\0');
  for (const auto& m : members) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, m.name.c_str());
    archive_entry_set_perm(e, m.type == 'd' ? 0755 : 0644);
    archive_entry_set_filetype(e, m.type == 'd' ? AE_IFDIR : AE_IFREG);
    if (m.type == 'f') archive_entry_set_size(e, static_cast<la_int64_t>(m.zeros));
    if (m.type == 's') {
      archive_entry_set_size(e, static_cast<la_int64_t>(m.zeros));
      archive_entry_sparse_add_entry(e, static_cast<la_int64_t>(m.zeros - 4096), 4096);
    }
    EXPECT_GE(archive_write_header(a, e), ARCHIVE_WARN) << m.name;
    if (m.type == 'f') {
      for (uint64_t left = m.zeros; left > 0;) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(left, zeros.size()));
        EXPECT_EQ(archive_write_data(a, zeros.data(), n), static_cast<la_ssize_t>(n));
        left -= n;
      }
    }
    if (m.type == 's') {
      EXPECT_EQ(archive_write_data(a, zeros.data(), 4096), 4096);
    }
    archive_entry_free(e);
  }
  EXPECT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  return std::string(out.data(), used);
}

// Total size of the regular files under `dir`.
uint64_t BytesUnder(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != decltype(it)(); ++it) {
    if (it->is_regular_file()) total += it->file_size();
  }
  return total;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != decltype(it)(); ++it) {
    out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

UnpackCap Cap(uint64_t bytes, uint64_t entries = 0) {
  UnpackCap cap;
  cap.max_bytes = bytes;
  cap.max_entries = entries;
  cap.bytes_origin = "(the cap from the test's VolumeSizeInGB)";
  cap.entries_origin = "(the test's entry cap)";
  return cap;
}

class UnpackCapTest : public AgentTest {
 protected:
  // ExtractTar straight into `dest` (no staging), so the test can see what was written.
  Status Extract(const std::string& tgz, const std::string& dest, const UnpackCap& cap, ExtractStats* stats) {
    ArchiveReadPtr a = NewTarReader();
    EXPECT_EQ(archive_read_open_memory(a.get(), tgz.data(), tgz.size()), ARCHIVE_OK);
    ExtractOptions options;
    options.dest_name = "/opt/ml/model";
    options.cap = cap;
    options.archive_name = "ModelDataUrl s3://bkt/test.tar.gz";
    return ExtractTar(
        a.get(), dest, options, [](const std::string& why) { return Status::InvalidArgument(why); }, stats);
  }
};

TEST(FormatCapBytesTest, ExactUnitsOrBytes) {
  EXPECT_EQ(FormatCapBytes(10ull << 30), "10 GiB");
  EXPECT_EQ(FormatCapBytes(64 * kMiB), "64 MiB");
  EXPECT_EQ(FormatCapBytes(1536 * kMiB), "1536 MiB");
  EXPECT_EQ(FormatCapBytes(4096), "4 KiB");
  EXPECT_EQ(FormatCapBytes(1000), "1000 bytes");
  EXPECT_EQ(FormatCapBytes(2ull << 40), "2 TiB");
}

TEST_F(UnpackCapTest, GzipBombStopsAtTheCapWithTheCapInTheMessage) {
  std::string bomb = BuildTarGz({{"weights.bin", 'f', 64 * kMiB}});
  EXPECT_LT(bomb.size(), 256u * 1024) << "the bomb should compress about 1000:1";
  std::string dest = work() + "/direct";
  Status s = Extract(bomb, dest, Cap(kMiB), nullptr);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message(),
            "ClientError: ModelDataUrl s3://bkt/test.tar.gz unpacks to more than 1 MiB (the cap from the test's "
            "VolumeSizeInGB). Extraction stopped there and nothing was kept in /opt/ml/model.");
  // The announced size was refused before anything was written.
  EXPECT_EQ(BytesUnder(dest), 0u);
}

TEST_F(UnpackCapTest, BytesWrittenNeverPassTheCap) {
  // Three honest 400 KiB files under a 1 MiB cap: two fit (with their 4 KiB entry charges), the
  // third is refused from its header, before it is created.
  std::string tgz = BuildTarGz({{"a", 'f', 400 * 1024}, {"b", 'f', 400 * 1024}, {"c", 'f', 400 * 1024}});
  std::string dest = work() + "/three";
  Status s = Extract(tgz, dest, Cap(kMiB), nullptr);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("unpacks to more than 1 MiB"), std::string::npos) << s.message();
  EXPECT_LE(BytesUnder(dest), kMiB);
  EXPECT_EQ(Names(dest), (std::vector<std::string>{"a", "b"}));  // c refused before it was created
  EXPECT_EQ(BytesUnder(dest), 800u * 1024);
}

TEST_F(UnpackCapTest, SparseMemberCountsItsHoles) {
  // 256 MiB logically, 4 KiB stored: what lands on disk is the logical size.
  std::string tgz = BuildTarGz({{"sparse.bin", 's', 256 * kMiB}});
  std::string dest = work() + "/sparse";
  Status s = Extract(tgz, dest, Cap(kMiB), nullptr);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("unpacks to more than 1 MiB"), std::string::npos) << s.message();
  EXPECT_LE(BytesUnder(dest), kMiB);
  // Under a large enough cap the same member unpacks to its full logical size.
  ExtractStats stats;
  ASSERT_TRUE(Extract(BuildTarGz({{"sparse.bin", 's', 2 * kMiB}}), work() + "/sparse-ok", Cap(4 * kMiB), &stats).ok());
  EXPECT_EQ(stats.bytes, 2 * kMiB);
  EXPECT_EQ(BytesUnder(work() + "/sparse-ok"), 2 * kMiB);
}

TEST_F(UnpackCapTest, ManySmallFilesAreBoundedByEntriesAndByTheirBlocks) {
  std::vector<Member> empties;
  for (int i = 0; i < 300; ++i) empties.push_back({"f" + std::to_string(i), 'f', 0});
  std::string tgz = BuildTarGz(empties);
  // By entries.
  ExtractStats stats;
  Status s = Extract(tgz, work() + "/entries", Cap(0, 100), &stats);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message(),
            "ClientError: ModelDataUrl s3://bkt/test.tar.gz has more than 100 members (the test's entry cap). "
            "Extraction stopped there and nothing was kept in /opt/ml/model.");
  EXPECT_EQ(Names(work() + "/entries").size(), 100u);
  // By bytes: 300 empty files are charged 300 * 4 KiB > 1 MiB (256 fit).
  s = Extract(tgz, work() + "/blocks", Cap(kMiB), nullptr);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("unpacks to more than 1 MiB"), std::string::npos) << s.message();
  EXPECT_EQ(Names(work() + "/blocks").size(), 256u);
  // Unbounded: everything, and the stats count every member.
  ASSERT_TRUE(Extract(tgz, work() + "/all", UnpackCap(), &stats).ok());
  EXPECT_EQ(stats.entries, 300u);
  EXPECT_EQ(stats.files, 300u);
}

TEST_F(UnpackCapTest, ModelDataBombFailsAndLeavesNothing) {
  Put("m/model.tar.gz", BuildTarGz({{"code/", 'd'}, {"code/inference.py", 'f', 100}, {"big.bin", 'f', 64 * kMiB}}));
  for (const std::string& cache : {std::string(), work() + "/cache"}) {
    std::string parent = work() + "/inst" + std::to_string(cache.size());
    json container = {{"Image", "local:/x"}, {"ModelDataUrl", "s3://bkt/m/model.tar.gz"}};
    auto r = PrepareModelData(*store_, container, parent + "/model", cache, nullptr, Cap(kMiB));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              "ClientError: ModelDataUrl s3://bkt/m/model.tar.gz unpacks to more than 1 MiB (the cap from the test's "
              "VolumeSizeInGB). Extraction stopped there and nothing was kept in /opt/ml/model.");
    EXPECT_TRUE(Names(parent).empty()) << parent;  // no model dir, no staging dir
  }
  // The same archive under a cap it fits.
  auto ok = PrepareModelData(*store_, {{"Image", "local:/x"}, {"ModelDataUrl", "s3://bkt/m/model.tar.gz"}},
                             work() + "/fits/model", "", nullptr, Cap(65 * kMiB));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->bytes, 64 * kMiB + 100);
  // ModelDataSource names its own field.
  json source = {{"Image", "local:/x"},
                 {"ModelDataSource",
                  {{"S3DataSource",
                    {{"S3Uri", "s3://bkt/m/model.tar.gz"}, {"S3DataType", "S3Object"}, {"CompressionType", "Gzip"}}}}}};
  auto r = PrepareModelData(*store_, source, work() + "/src/model", "", nullptr, Cap(kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(StartsWith(r.status().message(), "ClientError: ModelDataSource s3://bkt/m/model.tar.gz unpacks to "))
      << r.status().message();
}

TEST_F(UnpackCapTest, SourceDirBombFailsAndLeavesTheCodeDirAsItWas) {
  Put("src/sourcedir.tar.gz", BuildTarGz({{"train.py", 'f', 10}, {"data.bin", 'f', 64 * kMiB}}));
  std::string opt_ml = work() + "/opt_ml";
  std::string code = opt_ml + "/code";
  ASSERT_TRUE(MakeDirs(code).ok());
  Status s = DownloadSourceDir(*store_, "s3://bkt/src/sourcedir.tar.gz", code, Cap(kMiB));
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message(),
            "ClientError: sagemaker_submit_directory s3://bkt/src/sourcedir.tar.gz unpacks to more than 1 MiB (the "
            "cap from the test's VolumeSizeInGB). Extraction stopped there and nothing was kept in the code "
            "directory.");
  EXPECT_EQ(Names(opt_ml), (std::vector<std::string>{"code"}));  // no staging directory left
  EXPECT_TRUE(Names(code).empty());
  // A local archive is capped too.
  std::string local = work() + "/local.tar.gz";
  ASSERT_TRUE(WriteFileAtomic(local, BuildTarGz({{"data.bin", 'f', 64 * kMiB}})).ok());
  s = DownloadSourceDir(*store_, "file://" + local, code, Cap(kMiB));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(Names(code).empty());
  // Within the cap the code directory is filled, replacing what an earlier attempt left.
  ASSERT_TRUE(WriteFileAtomic(code + "/stale.py", "old").ok());
  Put("src/small.tar.gz", BuildTarGz({{"train.py", 'f', 10}}));
  ASSERT_TRUE(DownloadSourceDir(*store_, "s3://bkt/src/small.tar.gz", code, Cap(kMiB)).ok());
  EXPECT_EQ(Names(code), (std::vector<std::string>{"train.py"}));
  EXPECT_EQ(Names(opt_ml), (std::vector<std::string>{"code"}));
}

}  // namespace
}  // namespace kiln::agent
