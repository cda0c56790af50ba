#include "cli/server.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "base/fs.h"
#include "base/hash.h"
#include "base/ids.h"

namespace kiln::cli {
namespace {

const runtime::docker::Ulimit* Find(const std::vector<runtime::docker::Ulimit>& limits, const std::string& name) {
  for (const auto& limit : limits) {
    if (limit.name == name) return &limit;
  }
  return nullptr;
}

TEST(ServerWiringTest, ContainersGetTheServersOwnLimitsWhenNoneAreConfigured) {
  ContainerEngineConfig config;
  std::vector<runtime::docker::Ulimit> limits = ContainerUlimits(config);
  std::vector<runtime::docker::Ulimit> defaults = runtime::docker::DefaultUlimits();
  ASSERT_EQ(limits.size(), defaults.size());
  for (const char* name : {"nofile", "nproc", "memlock", "stack"}) EXPECT_NE(Find(limits, name), nullptr) << name;
}

TEST(ServerWiringTest, ConfiguredLimitsReplaceTheirNameAndTheRestStay) {
  ContainerEngineConfig config;
  config.ulimits = {{"nofile", 1024, 4096}, {"core", -1, -1}};
  std::vector<runtime::docker::Ulimit> limits = ContainerUlimits(config);
  std::vector<runtime::docker::Ulimit> defaults = runtime::docker::DefaultUlimits();
  ASSERT_EQ(limits.size(), defaults.size() + 1);
  const auto* nofile = Find(limits, "nofile");
  ASSERT_NE(nofile, nullptr);
  EXPECT_EQ(nofile->soft, 1024);
  EXPECT_EQ(nofile->hard, 4096);
  const auto* core = Find(limits, "core");
  ASSERT_NE(core, nullptr);
  EXPECT_EQ(core->soft, -1);
  // nproc is still sent: Podman would otherwise drop its own default and crun fail setrlimit.
  const auto* nproc = Find(limits, "nproc");
  ASSERT_NE(nproc, nullptr);
  EXPECT_EQ(nproc->hard, Find(defaults, "nproc")->hard);
}

TEST(ServerWiringTest, ServerLabelIsTheDataDirsHashAndIgnoresHowItIsNamed) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kiln-label-" + RandomHex(6));
  fs::create_directories(dir);
  const std::string canonical = fs::canonical(dir).string();
  const std::string label = ContainerServerLabel(dir.string());
  EXPECT_EQ(label, Sha256Hex(canonical).substr(0, 8));
  EXPECT_EQ(ContainerServerLabel(dir.string() + "/"), label);
  EXPECT_EQ(ContainerServerLabel((dir / "." / ".." / dir.filename()).string()), label);
  EXPECT_NE(ContainerServerLabel(dir.string() + "-other"), label);
  fs::remove_all(dir);
}

TEST(ServerWiringTest, DefaultLimitsAreLoweredToTheEnginesButConfiguredOnesAreKept) {
  std::vector<runtime::docker::Ulimit> defaults = runtime::docker::DefaultUlimits();
  const auto* own_nproc = Find(defaults, "nproc");
  ASSERT_NE(own_nproc, nullptr);
  if (own_nproc->hard >= 0 && own_nproc->hard < 2) GTEST_SKIP() << "nproc hard limit too low to lower";
  ContainerEngineConfig config;
  config.ulimits = {{"nofile", 100, 1'000'000'000}};
  // The engine's nproc is below the server's, its nofile too (but nofile is configured), its stack
  // unlimited (nothing to lower), memlock unknown.
  std::map<std::string, int64_t> engine = {{"nproc", 1}, {"nofile", 50}, {"stack", -1}};
  std::vector<runtime::docker::Ulimit> limits = ContainerUlimits(config, engine);
  ASSERT_EQ(limits.size(), defaults.size());
  EXPECT_EQ(Find(limits, "nproc")->hard, 1);
  EXPECT_EQ(Find(limits, "nproc")->soft, 1);
  EXPECT_EQ(Find(limits, "nofile")->soft, 100);  // the operator's, even above the engine's
  EXPECT_EQ(Find(limits, "nofile")->hard, 1'000'000'000);
  EXPECT_EQ(Find(limits, "stack")->hard, Find(defaults, "stack")->hard);
  EXPECT_EQ(Find(limits, "stack")->soft, Find(defaults, "stack")->soft);
  EXPECT_EQ(Find(limits, "memlock")->hard, Find(defaults, "memlock")->hard);
}

TEST(ServerWiringTest, ParsesProcLimits) {
  const std::string text =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max cpu time              unlimited            unlimited            seconds   \n"
      "Max stack size            8388608              unlimited            bytes     \n"
      "Max core file size        0                    unlimited            bytes     \n"
      "Max processes             32768                32768                processes \n"
      "Max open files            20000                20000                files     \n"
      "Max locked memory         8388608              8388608              bytes     \n";
  std::map<std::string, int64_t> limits = ParseProcLimits(text);
  EXPECT_EQ(limits.at("cpu"), -1);
  EXPECT_EQ(limits.at("stack"), -1);
  EXPECT_EQ(limits.at("core"), -1);
  EXPECT_EQ(limits.at("nproc"), 32768);
  EXPECT_EQ(limits.at("nofile"), 20000);
  EXPECT_EQ(limits.at("memlock"), 8388608);
  EXPECT_EQ(limits.count("rss"), 0u);
  EXPECT_TRUE(ParseProcLimits("").empty());
}

TEST(ServerWiringTest, EngineHardLimitsAreThoseOfTheProcessServingTheSocket) {
  namespace fs = std::filesystem;
  const std::string path = (fs::temp_directory_path() / ("kiln-limits-" + RandomHex(6) + ".sock")).string();
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  // This process listens: its own limits come back, by either spelling of the address.
  std::map<std::string, int64_t> expected = ParseProcLimits(*ReadFile("/proc/self/limits"));
  ASSERT_EQ(expected.count("nproc"), 1u);
  EXPECT_EQ(EngineHardLimits(path), expected);
  EXPECT_EQ(EngineHardLimits("unix://" + path), expected);
  ::close(fd);
  fs::remove(path);
  EXPECT_TRUE(EngineHardLimits(path).empty());  // nothing answers
  EXPECT_TRUE(EngineHardLimits("").empty());
}

}  // namespace
}  // namespace kiln::cli
