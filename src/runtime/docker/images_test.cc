#include "runtime/docker/images.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/encoding.h"
#include "runtime/docker/test_util/fake_engine.h"

namespace kiln::runtime::docker {
namespace internal {
// Defined in images.cc: EnsureImage with an injected clock (milliseconds).
Status EnsureImageWithClock(Engine& engine, const ContainerImage& image, const ImageSettings& settings,
                            const std::function<void(const std::string&)>& progress,
                            const std::function<bool()>& cancelled, const std::function<int64_t()>& now_millis);
}  // namespace internal

namespace {

using ::testing::ElementsAre;
using testing::FakeEngine;
using ::testing::HasSubstr;

constexpr char kEcr[] = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
const std::string kDigest = "sha256:" + std::string(64, 'a');

ImageReference Parse(const std::string& text) {
  Result<ImageReference> ref = ParseImageReference(text);
  EXPECT_TRUE(ref.ok()) << text << ": " << ref.status().ToString();
  return ref.ok() ? *ref : ImageReference{};
}

// ---- ParseImageReference ------------------------------------------------------------------------

TEST(ParseImageReferenceTest, ShortNamesAreDockerHubLibraryLatest) {
  ImageReference ref = Parse("ubuntu");
  EXPECT_EQ(ref.registry, "docker.io");
  EXPECT_EQ(ref.repository, "library/ubuntu");
  EXPECT_EQ(ref.tag, "latest");
  EXPECT_EQ(ref.digest, "");
  EXPECT_EQ(ref.ToString(), "docker.io/library/ubuntu:latest");
  EXPECT_EQ(Parse("ubuntu:22.04").ToString(), "docker.io/library/ubuntu:22.04");
  // Two components without '.', ':' or "localhost" first: still Docker Hub, no library/.
  EXPECT_EQ(Parse("byo/train:1").ToString(), "docker.io/byo/train:1");
  EXPECT_EQ(Parse("index.docker.io/ubuntu").ToString(), "docker.io/library/ubuntu:latest");
}

TEST(ParseImageReferenceTest, RegistriesByDotColonOrLocalhost) {
  ImageReference local = Parse("localhost/byo:1");
  EXPECT_EQ(local.registry, "localhost");
  EXPECT_EQ(local.repository, "byo");
  EXPECT_EQ(local.tag, "1");
  ImageReference port = Parse("localhost:5000/byo");
  EXPECT_EQ(port.registry, "localhost:5000");
  EXPECT_EQ(port.tag, "latest");
  ImageReference mirror = Parse("registry.local:5000/ecr/team/byo:v1.2-rc_3");
  EXPECT_EQ(mirror.registry, "registry.local:5000");
  EXPECT_EQ(mirror.repository, "ecr/team/byo");
  EXPECT_EQ(mirror.tag, "v1.2-rc_3");
  EXPECT_EQ(Parse("[::1]:5000/x:1").registry, "[::1]:5000");
  EXPECT_EQ(Parse("Registry.Example.com/x").registry, "Registry.Example.com");  // host names: any case
  EXPECT_EQ(Parse("a.b/c__d/e-f.g_h--i").repository, "c__d/e-f.g_h--i");
}

TEST(ParseImageReferenceTest, Digests) {
  ImageReference ref = Parse("ubuntu@" + kDigest);
  EXPECT_EQ(ref.digest, kDigest);
  EXPECT_EQ(ref.tag, "");  // no default tag with a digest
  EXPECT_EQ(ref.ToString(), "docker.io/library/ubuntu@" + kDigest);
  ImageReference both = Parse("localhost:5000/x:1@" + kDigest);
  EXPECT_EQ(both.tag, "1");
  EXPECT_EQ(both.digest, kDigest);
  EXPECT_EQ(both.ToString(), "localhost:5000/x@" + kDigest);  // the digest decides
}

TEST(ParseImageReferenceTest, Ecr) {
  EXPECT_TRUE(Parse(std::string(kEcr) + "/byo:1").ecr());
  EXPECT_TRUE(Parse("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/byo:1").ecr());
  EXPECT_TRUE(Parse("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com/byo").ecr());
  EXPECT_FALSE(Parse("12345678901.dkr.ecr.us-east-1.amazonaws.com/byo").ecr());  // 11 digits
  EXPECT_FALSE(Parse("123456789012.dkr.ecr.us-east-1.example.com/byo").ecr());   // not AWS
  EXPECT_FALSE(Parse("123456789012.dkr.ecr.us-east-1.amazonaws.com:443/b").ecr());
  EXPECT_FALSE(Parse("public.ecr.aws/lambda/python:3.11").ecr());
  EXPECT_FALSE(Parse("ubuntu").ecr());
}

TEST(ParseImageReferenceTest, MalformedReferencesSayWhatIsWrong) {
  struct Case {
    std::string text;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty"},
           {"Ubuntu", "lower case"},
           {"byo/Train:1", "lower case"},
           {"ubuntu:", "tag after ':' is empty"},
           {"ubuntu:-x", "must start with"},
           {"ubuntu:a+b", "may contain only"},
           {"ubuntu:" + std::string(129, 'a'), "longer than 128"},
           {"ubuntu :1", "white space"},
           {"a//b", "empty path component"},
           {"/ubuntu", "empty path component"},
           {"ubuntu/", "empty path component"},
           {"-ubuntu", "start and end"},
           {"a...b", "not a valid separator"},
           {"a___b", "not a valid separator"},
           {"a$b", "not allowed"},
           {"ubuntu@sha256:abc", "64 hex digits"},
           {"ubuntu@md5", "algorithm:hex"},
           {"ubuntu@sha256:" + std::string(64, 'z'), "hexadecimal"},
           {"registry.local:port/x", "not a number"},
           {"registry.local:5000/", "no repository"},
           {"bad_host.local/x", "not a valid host name"},
           {"[::1/x", "unclosed"},
           {":1", "no repository name"},
           {std::string(300, 'a'), "longer than 255"},
       }) {
    Result<ImageReference> ref = ParseImageReference(c.text);
    ASSERT_FALSE(ref.ok()) << c.text;
    EXPECT_EQ(ref.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(ref.status().message(), HasSubstr(c.why)) << c.text;
    if (c.text.size() < 100) {
      EXPECT_THAT(ref.status().message(), HasSubstr("\"" + c.text + "\""));
    }
  }
}

// ---- EngineReference ----------------------------------------------------------------------------

TEST(EngineReferenceTest, EcrMapsToTheMirror) {
  ImageSettings settings;
  settings.ecr_mirror = "registry.local:5000/ecr";
  EXPECT_EQ(*EngineReference(std::string(kEcr) + "/byo:1", settings), "registry.local:5000/ecr/byo:1");
  EXPECT_EQ(*EngineReference(std::string(kEcr) + "/team/byo", settings), "registry.local:5000/ecr/team/byo:latest");
  EXPECT_EQ(*EngineReference(std::string(kEcr) + "/byo@" + kDigest, settings),
            "registry.local:5000/ecr/byo@" + kDigest);
  settings.ecr_mirror = "registry.local:5000/";
  EXPECT_EQ(*EngineReference(std::string(kEcr) + "/byo:1", settings), "registry.local:5000/byo:1");
}

TEST(EngineReferenceTest, OthersStayAsWritten) {
  ImageSettings settings;
  settings.ecr_mirror = "registry.local:5000/ecr";
  for (const char* uri : {"byo:1", "localhost/byo:1", "byo", "registry.local:5000/team/x:2", "docker.io/library/u"}) {
    EXPECT_EQ(*EngineReference(uri, settings), uri);
  }
  // ECR without a mirror: as written (present locally, or the pull fails and says what to set).
  EXPECT_EQ(*EngineReference(std::string(kEcr) + "/byo:1", ImageSettings{}), std::string(kEcr) + "/byo:1");
}

TEST(EngineReferenceTest, InvalidUriOrMirror) {
  Result<std::string> bad = EngineReference("Byo:1", ImageSettings{});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"Byo:1\""));
  ImageSettings settings;
  settings.ecr_mirror = "Not A Mirror";
  Result<std::string> mirror = EngineReference(std::string(kEcr) + "/byo:1", settings);
  ASSERT_FALSE(mirror.ok());
  EXPECT_EQ(mirror.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(mirror.status().message(), HasSubstr("container_engine.ecr_mirror \"Not A Mirror\""));
}

// ---- RegistryAuthHeader -------------------------------------------------------------------------

nlohmann::json DecodeAuth(std::string header) {
  for (char& c : header) {
    if (c == '-') c = '+';
    if (c == '_') c = '/';
  }
  std::optional<std::string> json = Base64Decode(header);
  EXPECT_TRUE(json.has_value()) << header;
  return json ? nlohmann::json::parse(*json) : nlohmann::json();
}

TEST(RegistryAuthHeaderTest, NoneConfiguredIsEmpty) {
  EXPECT_EQ(RegistryAuthHeader("registry.local:5000", ImageSettings{}), "");
}

TEST(RegistryAuthHeaderTest, Base64UrlOfTheCredentialJson) {
  ImageSettings settings;
  // A password whose standard base64 has '+' and '/' (">>>" -> "Pj4+", "???" -> "Pz8/").
  settings.registries["registry.local:5000"] = {"kiln", "?~?>>>?~?>>>"};
  std::string header = RegistryAuthHeader("registry.local:5000", settings);
  EXPECT_EQ(header.find_first_of("+/"), std::string::npos) << header;
  nlohmann::json auth = DecodeAuth(header);
  EXPECT_EQ(auth, nlohmann::json(
                      {{"username", "kiln"}, {"password", "?~?>>>?~?>>>"}, {"serveraddress", "registry.local:5000"}}));
  std::string standard = Base64Encode(auth.dump());
  EXPECT_NE(standard.find_first_of("+/"), std::string::npos) << "the test's password no longer exercises the alphabet";
  EXPECT_EQ(RegistryAuthHeader("other.local", settings), "");
}

TEST(RegistryAuthHeaderTest, DockerHubAliases) {
  ImageSettings settings;
  settings.registries["index.docker.io"] = {"u", "p"};
  EXPECT_EQ(DecodeAuth(RegistryAuthHeader("docker.io", settings))["username"], "u");
}

// ---- EnsureImage --------------------------------------------------------------------------------

struct Progress {
  std::vector<std::string> texts;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& t) { texts.push_back(t); };
  }
};

std::function<bool()> Never() {
  return [] { return false; };
}

// A clock that moves 100 ms on every reading.
std::function<int64_t()> SteppingClock() {
  auto now = std::make_shared<int64_t>(0);
  return [now] { return *now += 100; };
}

PullProgress Msg(const std::string& status, const std::string& layer, int64_t current = 0, int64_t total = 0) {
  return PullProgress{status, layer, current, total};
}

TEST(EnsureImageTest, PresentImageNeedsNothing) {
  FakeEngine engine;
  engine.AddImage("localhost/byo:1");
  Progress progress;
  Status s =
      EnsureImage(engine, ContainerImage{"localhost/byo:1", "", std::nullopt}, ImageSettings{}, progress.fn(), Never());
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(progress.texts.empty());
  EXPECT_TRUE(engine.pulls().empty());
  EXPECT_EQ(engine.calls("InspectImage"), 1);
}

TEST(EnsureImageTest, PullsWithThrottledProgressAndConfirms) {
  FakeEngine engine;
  const std::string ref = "registry.local:5000/team/x:1";
  FakeEngine::PullScript script;
  script.progress = {
      Msg("Pulling from team/x", "1"),                    // t=200: no layer
      Msg("Pulling fs layer", "aaa"),                     // 300
      Msg("Pulling fs layer", "bbb"),                     // 400
      Msg("Downloading", "aaa", 10'000'000, 40'000'000),  // 500
      Msg("Downloading", "bbb", 5'000'000, 80'000'000),   // 600: reported
      Msg("Downloading", "aaa", 40'000'000, 40'000'000),  // 700
      Msg("Download complete", "aaa"),                    // 800
      Msg("Downloading", "bbb", 40'000'000, 80'000'000),  // 900
      Msg("Extracting", "aaa", 1, 40'000'000),            // 1000: extraction bytes are no download bytes
      Msg("Pull complete", "aaa"),                        // 1100: reported
      Msg("Download complete", "bbb"),                    // 1200
      Msg("Pull complete", "bbb"),                        // 1300
      Msg("Download complete", "0123456789ab"),           // 1400: Podman's image id, no layer
  };
  engine.SetPullScript(ref, script);
  ImageSettings settings;
  settings.registries["registry.local:5000"] = {"kiln", "secret"};
  Progress progress;
  Status s = internal::EnsureImageWithClock(engine, ContainerImage{ref, "", std::nullopt}, settings, progress.fn(),
                                            Never(), SteppingClock());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_THAT(progress.texts,
              ElementsAre("pulling " + ref + ": starting", "pulling " + ref + ": 0 of 2 layers, 15 MB of 120 MB",
                          "pulling " + ref + ": 1 of 2 layers, 80 MB of 120 MB",
                          "pulled " + ref + ": 2 of 2 layers, 120 MB of 120 MB"));
  ASSERT_EQ(engine.pulls().size(), 1u);
  EXPECT_EQ(engine.pulls()[0].reference, ref);
  EXPECT_EQ(engine.pulls()[0].registry_auth, RegistryAuthHeader("registry.local:5000", settings));
  EXPECT_EQ(engine.calls("InspectImage"), 2);  // before, and to confirm after
}

TEST(EnsureImageTest, ManyMessagesFewTexts) {
  FakeEngine engine;
  FakeEngine::PullScript script;
  script.progress.push_back(Msg("Pulling fs layer", "aaa"));
  for (int i = 1; i <= 100; ++i) script.progress.push_back(Msg("Downloading", "aaa", i * 1000, 100'000));
  engine.SetPullScript("x:1", script);
  Progress progress;
  ASSERT_TRUE(internal::EnsureImageWithClock(engine, ContainerImage{"x:1", "", std::nullopt}, ImageSettings{},
                                             progress.fn(), Never(), SteppingClock())
                  .ok());
  // 101 messages 100 ms apart: the first text, one per 500 ms (every fifth message), the final one.
  EXPECT_EQ(progress.texts.size(), 1u + 20u + 1u);
  EXPECT_EQ(progress.texts.back(), "pulled x:1: 0 of 1 layers, 100 kB of 100 kB");
}

TEST(EnsureImageTest, NotFoundNamesTheImageTheEngineAndWhatToDo) {
  FakeEngine engine;  // no pull script: NotFound "manifest unknown"
  Status s = EnsureImage(engine, ContainerImage{"registry.local:5000/team/x:1", "", std::nullopt}, ImageSettings{},
                         nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("image registry.local:5000/team/x:1 is not in the container engine "
                                     "(unix:///fake/podman.sock) and pulling registry.local:5000/team/x:1 failed: "));
  EXPECT_THAT(s.message(), HasSubstr("manifest unknown"));
  EXPECT_THAT(s.message(), HasSubstr("Build or load the image on this node"));
  EXPECT_THAT(s.message(), HasSubstr("push it to registry.local:5000"));
}

TEST(EnsureImageTest, EcrWithoutMirrorSaysToSetTheMirror) {
  FakeEngine engine;
  const std::string uri = std::string(kEcr) + "/byo:1";
  Status s = EnsureImage(engine, ContainerImage{uri, "", std::nullopt}, ImageSettings{}, nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("pulling " + uri + " failed"));
  EXPECT_THAT(s.message(), HasSubstr("set container_engine.ecr_mirror"));
  ASSERT_EQ(engine.pulls().size(), 1u);
  EXPECT_EQ(engine.pulls()[0].reference, uri);
}

TEST(EnsureImageTest, EcrThroughTheMirror) {
  FakeEngine engine;
  const std::string uri = std::string(kEcr) + "/byo:1";
  const std::string mirrored = "registry.local:5000/ecr/byo:1";
  FakeEngine::PullScript script;
  script.progress = {Msg("Pulling fs layer", "aaa"), Msg("Download complete", "aaa")};
  engine.SetPullScript(mirrored, script);
  ImageSettings settings;
  settings.ecr_mirror = "registry.local:5000/ecr";
  settings.registries["registry.local:5000"] = {"kiln", "pw"};
  Progress progress;
  Status s = EnsureImage(engine, ContainerImage{uri, "", std::nullopt}, settings, progress.fn(), Never());
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(engine.pulls().size(), 1u);
  EXPECT_EQ(engine.pulls()[0].reference, mirrored);
  EXPECT_EQ(engine.pulls()[0].registry_auth, RegistryAuthHeader("registry.local:5000", settings));
  ASSERT_FALSE(progress.texts.empty());
  EXPECT_EQ(progress.texts.back(), "pulled " + uri + " (mirror " + mirrored + "): 1 of 1 layers");
  EXPECT_TRUE(engine.InspectImage(mirrored).ok());
}

TEST(EnsureImageTest, EcrMissingFromTheMirror) {
  FakeEngine engine;
  ImageSettings settings;
  settings.ecr_mirror = "registry.local:5000/ecr";
  Status s =
      EnsureImage(engine, ContainerImage{std::string(kEcr) + "/byo:1", "", std::nullopt}, settings, nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("image " + std::string(kEcr) + "/byo:1 is not in the container engine"));
  EXPECT_THAT(s.message(), HasSubstr("pulling registry.local:5000/ecr/byo:1 from the mirror failed"));
  EXPECT_THAT(s.message(), HasSubstr("Push it to the mirror as registry.local:5000/ecr/byo:1"));
}

TEST(EnsureImageTest, PermissionDeniedSaysToFixTheCredentials) {
  FakeEngine engine;
  const std::string ref = "registry.local:5000/team/x:1";
  FakeEngine::PullScript script;
  script.outcome = FakeEngine::PullScript::Outcome::kPermissionDenied;
  script.error = "unauthorized: authentication required";
  engine.SetPullScript(ref, script);
  ImageSettings settings;
  settings.registries["registry.local:5000"] = {"kiln", "wrong"};
  Status s = EnsureImage(engine, ContainerImage{ref, "", std::nullopt}, settings, nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("unauthorized: authentication required"));
  EXPECT_THAT(s.message(), HasSubstr("refused the configured credentials: fix them under "
                                     "container_engine.registries[\"registry.local:5000\"]"));
  // Without credentials: says to configure them.
  Status anonymous = EnsureImage(engine, ContainerImage{ref, "", std::nullopt}, ImageSettings{}, nullptr, Never());
  ASSERT_EQ(anonymous.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(anonymous.message(), HasSubstr("refused an anonymous pull: configure credentials for it"));
}

TEST(EnsureImageTest, EngineUnreachable) {
  FakeEngine engine;
  engine.SetUnreachable(true);
  Status s = EnsureImage(engine, ContainerImage{"byo:1", "", std::nullopt}, ImageSettings{}, nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("cannot make image byo:1 ready: the container engine at "
                                     "unix:///fake/podman.sock is unreachable"));
  EXPECT_THAT(s.message(), HasSubstr("container_engine.socket"));
}

TEST(EnsureImageTest, EngineFailingThePullOtherwise) {
  FakeEngine engine;
  FakeEngine::PullScript script;
  script.outcome = FakeEngine::PullScript::Outcome::kInternal;
  script.error = "writing blob: no space left on device";
  engine.SetPullScript("byo:1", script);
  Status s = EnsureImage(engine, ContainerImage{"byo:1", "", std::nullopt}, ImageSettings{}, nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("pulling byo:1 through the container engine (unix:///fake/podman.sock) failed: "
                                     "writing blob: no space left on device"));
}

TEST(EnsureImageTest, UnreachableRegistryIsTheImagesProblem) {
  FakeEngine engine;
  FakeEngine::PullScript script;
  script.outcome = FakeEngine::PullScript::Outcome::kInternal;
  script.error =
      "initializing source docker://registry.local:5000/byo:1: pinging container registry "
      "registry.local:5000: Get \"https://registry.local:5000/v2/\": dial tcp 127.0.0.1:5000: connect: "
      "connection refused";
  engine.SetPullScript("registry.local:5000/byo:1", script);
  Status s = EnsureImage(engine, ContainerImage{"registry.local:5000/byo:1", "", std::nullopt}, ImageSettings{},
                         nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("image registry.local:5000/byo:1 is not in "));
  EXPECT_THAT(s.message(), HasSubstr("connection refused"));
  EXPECT_THAT(s.message(), HasSubstr("or make registry.local:5000 reachable from this node"));
}

TEST(EnsureImageTest, PulledButNotListedIsAnError) {
  FakeEngine engine;
  FakeEngine::PullScript script;
  script.image.repo_tags = {"somewhere/else:1"};
  engine.SetPullScript("byo:1", script);
  Status s = EnsureImage(engine, ContainerImage{"byo:1", "", std::nullopt}, ImageSettings{}, nullptr, Never());
  ASSERT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("reported pulling byo:1 as done but does not have it"));
}

TEST(EnsureImageTest, PulledUnderItsCanonicalNameIsFound) {
  FakeEngine engine;
  FakeEngine::PullScript script;
  script.image.repo_tags = {"docker.io/library/byo:1"};  // how the engine stores a pulled short name
  engine.SetPullScript("byo:1", script);
  EXPECT_TRUE(EnsureImage(engine, ContainerImage{"byo:1", "", std::nullopt}, ImageSettings{}, nullptr, Never()).ok());
}

TEST(EnsureImageTest, AnExplicitReferenceIsUsedAsIs) {
  FakeEngine engine;
  engine.AddImage("localhost/prebuilt:7");
  ImageSettings settings;
  settings.ecr_mirror = "registry.local:5000/ecr";
  EXPECT_TRUE(EnsureImage(engine, ContainerImage{std::string(kEcr) + "/byo:1", "localhost/prebuilt:7", std::nullopt},
                          settings, nullptr, Never())
                  .ok());
  EXPECT_TRUE(engine.pulls().empty());
}

TEST(EnsureImageTest, InvalidUriTouchesNoEngine) {
  FakeEngine engine;
  Status s = EnsureImage(engine, ContainerImage{"Byo:1", "", std::nullopt}, ImageSettings{}, nullptr, Never());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.calls("InspectImage"), 0);
}

TEST(EnsureImageTest, CancelledBeforeStarting) {
  FakeEngine engine;
  Status s =
      EnsureImage(engine, ContainerImage{"byo:1", "", std::nullopt}, ImageSettings{}, nullptr, [] { return true; });
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(engine.calls("InspectImage"), 0);
}

TEST(EnsureImageTest, CancelledDuringThePull) {
  FakeEngine engine;
  FakeEngine::PullScript script;
  script.outcome = FakeEngine::PullScript::Outcome::kBlockUntilCancelled;
  script.progress = {Msg("Pulling fs layer", "aaa")};
  engine.SetPullScript("byo:1", script);
  std::atomic<bool> cancel{false};
  Status result;
  std::thread puller([&] {
    result = EnsureImage(engine, ContainerImage{"byo:1", "", std::nullopt}, ImageSettings{}, nullptr,
                         [&] { return cancel.load(); });
  });
  ASSERT_TRUE(engine.WaitUntil([&] { return engine.active_pulls() == 1; }, std::chrono::seconds(10)));
  cancel = true;
  puller.join();
  EXPECT_EQ(result.code(), StatusCode::kAborted) << result.ToString();
  EXPECT_THAT(result.message(), HasSubstr("preparing image byo:1 was cancelled"));
  EXPECT_EQ(engine.active_pulls(), 0);
}

}  // namespace
}  // namespace kiln::runtime::docker
