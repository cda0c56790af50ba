#include "cli/images_command.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/docker/test_util/fake_engine.h"

namespace kiln::cli {
namespace {

using runtime::docker::ImageInfo;
using runtime::docker::testing::FakeEngine;

constexpr int64_t kNow = 1'796'212'800;  // 2026-12-02T12:00:00Z

ImageInfo Image(std::string id, std::vector<std::string> tags, int64_t size, int64_t age_seconds) {
  ImageInfo info;
  info.id = std::move(id);
  info.repo_tags = std::move(tags);
  info.size_bytes = size;
  info.created_seconds = kNow - age_seconds;
  return info;
}

TEST(ImagesCommandTest, HumanSizeUsesDecimalUnitsWithThreeDigits) {
  EXPECT_EQ(HumanSize(0), "0B");
  EXPECT_EQ(HumanSize(999), "999B");
  EXPECT_EQ(HumanSize(1000), "1kB");
  EXPECT_EQ(HumanSize(812'345), "812kB");
  EXPECT_EQ(HumanSize(55'212'345), "55.2MB");
  EXPECT_EQ(HumanSize(999'900), "1MB");  // not "1e+03kB"
  EXPECT_EQ(HumanSize(1'073'741'824), "1.07GB");
}

TEST(ImagesCommandTest, HumanAgeReadsLikeDockers) {
  EXPECT_EQ(HumanAge(0), "Less than a second ago");
  EXPECT_EQ(HumanAge(-5), "Less than a second ago");  // a clock behind the engine's
  EXPECT_EQ(HumanAge(1), "1 second ago");
  EXPECT_EQ(HumanAge(42), "42 seconds ago");
  EXPECT_EQ(HumanAge(90), "About a minute ago");
  EXPECT_EQ(HumanAge(180), "3 minutes ago");
  EXPECT_EQ(HumanAge(3700), "About an hour ago");
  EXPECT_EQ(HumanAge(5 * 3600), "5 hours ago");
  EXPECT_EQ(HumanAge(3 * 86400), "3 days ago");
  EXPECT_EQ(HumanAge(20 * 86400), "2 weeks ago");
  EXPECT_EQ(HumanAge(100 * 86400), "3 months ago");
  EXPECT_EQ(HumanAge(800 * 86400), "2 years ago");
}

TEST(ImagesCommandTest, TableHasOneRowPerTagNewestFirst) {
  FakeEngine engine;
  engine.AddImage("old", Image("sha256:aaaaaaaaaaaa1111", {"docker.io/library/debian:12"}, 116'000'000, 40 * 86400));
  engine.AddImage(
      "byo", Image("sha256:0123456789abcdef", {"localhost/kiln-byo:1", "localhost/kiln-byo:latest"}, 55'212'345, 180));
  std::ostringstream out;
  ASSERT_TRUE(RunImagesCommand(engine, /*json=*/false, kNow, out).ok());
  // FakeEngine tags every image it is given; an untagged (dangling) one goes straight to the table.
  std::vector<ImageInfo> images = *engine.ListImages();
  images.push_back(Image("sha256:ffffffffffff2222", {}, 1000, 3 * 86400));
  out.str("");
  PrintImages(images, /*json=*/false, kNow, out);
  std::istringstream lines(out.str());
  std::vector<std::string> rows;
  for (std::string row; std::getline(lines, row);) rows.push_back(row);
  ASSERT_EQ(rows.size(), 5u) << out.str();
  EXPECT_EQ(rows[0].rfind("REPOSITORY:TAG", 0), 0u);
  EXPECT_NE(rows[0].find("IMAGE ID"), std::string::npos);
  EXPECT_EQ(rows[1], "localhost/kiln-byo:1         0123456789ab  55.2MB    3 minutes ago");
  EXPECT_EQ(rows[2].rfind("localhost/kiln-byo:latest    0123456789ab", 0), 0u) << rows[2];
  EXPECT_EQ(rows[3].rfind("<none>:<none>                ffffffffffff  1kB       3 days ago", 0), 0u) << rows[3];
  EXPECT_EQ(rows[4].rfind("docker.io/library/debian:12  aaaaaaaaaaaa  116MB     5 weeks ago", 0), 0u) << rows[4];
  // The columns line up: IMAGE ID starts where every id starts.
  const size_t id_column = rows[0].find("IMAGE ID");
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].substr(id_column, 12).find_first_not_of("0123456789abcdef"), std::string::npos) << rows[i];
    EXPECT_EQ(rows[i][id_column - 1], ' ') << rows[i];
  }
}

TEST(ImagesCommandTest, JsonHasOneObjectPerImage) {
  FakeEngine engine;
  engine.AddImage("byo", Image("sha256:0123456789abcdef", {"localhost/kiln-byo:1"}, 55'212'345, 0));
  std::ostringstream out;
  ASSERT_TRUE(RunImagesCommand(engine, /*json=*/true, kNow, out).ok());
  nlohmann::json doc = nlohmann::json::parse(out.str());
  ASSERT_TRUE(doc.is_array());
  ASSERT_EQ(doc.size(), 1u);
  EXPECT_EQ(doc[0]["id"], "sha256:0123456789abcdef");
  EXPECT_EQ(doc[0]["repo_tags"], nlohmann::json::array({"localhost/kiln-byo:1"}));
  EXPECT_EQ(doc[0]["size_bytes"], 55'212'345);
  EXPECT_EQ(doc[0]["created"], "2026-12-02T12:00:00Z");
}

TEST(ImagesCommandTest, AnEmptyEngineListsOnlyTheHeader) {
  FakeEngine engine;
  std::ostringstream out;
  ASSERT_TRUE(RunImagesCommand(engine, false, kNow, out).ok());
  const std::string table = out.str();
  EXPECT_EQ(table.rfind("REPOSITORY:TAG", 0), 0u);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 1);
  std::ostringstream json_out;
  ASSERT_TRUE(RunImagesCommand(engine, true, kNow, json_out).ok());
  EXPECT_EQ(json_out.str(), "[]\n");
}

TEST(ImagesCommandTest, AnUnreachableEngineSaysWhereAndHowToStartIt) {
  FakeEngine engine(/*podman=*/true, "unix:///run/podman/podman.sock");
  engine.SetUnreachable(true);
  std::ostringstream out;
  Status s = RunImagesCommand(engine, false, kNow, out);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("the container engine at unix:///run/podman/podman.sock is unreachable"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("podman system service --time=0 unix:///run/podman/podman.sock"), std::string::npos)
      << s.message();
  EXPECT_TRUE(out.str().empty());
}

TEST(ImagesCommandTest, NoEngineMessageSaysWhatToSet) {
  EXPECT_NE(NoEngineConfiguredMessage().find("container_engine.socket"), std::string::npos);
  EXPECT_NE(NoEngineConfiguredMessage().find("unix:///run/podman/podman.sock"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cli
