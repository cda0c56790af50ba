#include "cli/server.h"

#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace kiln::cli
