#include "cli/config.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "base/fs.h"
#include "base/ids.h"

namespace kiln::cli {
namespace {

std::string WriteTemp(const std::string& content) {
  std::string path = (std::filesystem::temp_directory_path() / ("kiln-config-" + RandomHex(6) + ".json")).string();
  EXPECT_TRUE(WriteFileAtomic(path, content).ok());
  return path;
}

TEST(ConfigTest, DefaultsValidate) {
  Config c;
  ASSERT_TRUE(Validate(&c).ok());
  EXPECT_EQ(ClientEndpoint(c), "http://127.0.0.1:5456");
}

TEST(ConfigTest, NonLoopbackWithoutCredentialsIsRefused) {
  Config c;
  c.listen = "0.0.0.0:5456";
  Status s = Validate(&c);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("credentials"), std::string::npos);
}

TEST(ConfigTest, NonLoopbackWithCredentialsIsAllowed) {
  std::string path = WriteTemp(R"({"listen": "0.0.0.0:7000",
    "credentials": [{"access_key_id": "AKIAOPERATOR", "secret_access_key": "0123456789abcdefXYZ"}]})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  ASSERT_TRUE(Validate(&c).ok());
  EXPECT_EQ(c.credentials.size(), 1u);
  EXPECT_EQ(c.credentials[0].account_id, "000000000000");
  EXPECT_EQ(ClientEndpoint(c), "http://127.0.0.1:7000");
  std::filesystem::remove(path);
}

TEST(ConfigTest, BadFieldsNameTheProblem) {
  for (const char* bad : {R"({"listen": 5})", R"({"auth": "maybe"})", R"([1,2])", "{not json",
                          R"({"object_store": {"backend": "s3"}})", R"({"account_id": "12"})"}) {
    std::string path = WriteTemp(bad);
    Config c;
    Status s = LoadConfigFile(path, &c);
    if (s.ok()) s = Validate(&c);
    EXPECT_FALSE(s.ok()) << bad;
    std::filesystem::remove(path);
  }
}

TEST(ConfigTest, ParsesEverything) {
  std::string path = WriteTemp(R"({
    // comments are allowed
    "listen": "127.0.0.1:0", "data_dir": "/tmp/x", "regions": ["eu-west-1", "us-east-1"],
    "account_id": "123456789012", "auth": "off", "log_level": "debug", "log_format": "json",
    "object_store": {"backend": "s3", "endpoint": "http://127.0.0.1:9000", "access_key_id": "a",
                     "secret_access_key": "b"}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  ASSERT_TRUE(Validate(&c).ok());
  EXPECT_EQ(c.regions.front(), "eu-west-1");
  EXPECT_FALSE(c.auth_enabled);
  EXPECT_EQ(c.object_store.backend, "s3");
  std::filesystem::remove(path);
}

TEST(ConfigTest, HttpSectionSetsEventLoopsAndWorkerThreads) {
  Config defaults;
  EXPECT_EQ(defaults.http.event_loops, 0);  // one per core
  EXPECT_EQ(defaults.http.worker_threads, 256);
  std::string path = WriteTemp(R"({"http": {"event_loops": 4, "worker_threads": 32}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.http.event_loops, 4);
  EXPECT_EQ(c.http.worker_threads, 32);
  std::filesystem::remove(path);
  for (const char* bad : {R"({"http": {"event_loops": -1}})", R"({"http": {"event_loops": 5000}})",
                          R"({"http": {"event_loops": "many"}})", R"({"http": {"worker_threads": 0}})"}) {
    std::string bad_path = WriteTemp(bad);
    Config b;
    Status s = LoadConfigFile(bad_path, &b);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("http"), std::string::npos) << s.message();
    std::filesystem::remove(bad_path);
  }
}

TEST(ConfigTest, HttpSectionSetsConnectionLimits) {
  std::string path = WriteTemp(R"({"http": {"max_connections": 64, "max_connections_per_address": 8,
    "first_byte_timeout_seconds": 2, "header_timeout_seconds": 5, "idle_timeout_seconds": 20,
    "io_timeout_seconds": 30}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.http.max_connections, 64);
  EXPECT_EQ(c.http.max_connections_per_address, 8);
  EXPECT_EQ(c.http.first_byte_timeout_seconds, 2);
  EXPECT_EQ(c.http.header_timeout_seconds, 5);
  EXPECT_EQ(c.http.idle_timeout_seconds, 20);
  EXPECT_EQ(c.http.io_timeout_seconds, 30);
  std::filesystem::remove(path);
  for (const char* bad :
       {R"({"http": 5})", R"({"http": {"max_connections": 0}})", R"({"http": {"max_connections_per_address": "many"}})",
        R"({"http": {"first_byte_timeout_seconds": 0}})"}) {
    std::string bad_path = WriteTemp(bad);
    Config b;
    Status s = LoadConfigFile(bad_path, &b);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("http"), std::string::npos) << s.message();
    std::filesystem::remove(bad_path);
  }
}

TEST(ConfigTest, ArchivesSectionSetsTheUnpackCaps) {
  Config defaults;
  EXPECT_EQ(defaults.archives.max_unpacked_mib, 0);
  EXPECT_EQ(defaults.archives.max_entries, 1'000'000);
  std::string path = WriteTemp(R"({"archives": {"max_unpacked_mib": 8, "max_entries": 5000}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.archives.max_unpacked_mib, 8);
  EXPECT_EQ(c.archives.max_entries, 5000);
  std::filesystem::remove(path);
  for (const char* bad : {R"({"archives": []})", R"({"archives": {"max_unpacked_mib": -1}})",
                          R"({"archives": {"max_entries": 0}})", R"({"archives": {"max_unpacked_mib": "8"}})"}) {
    std::string bad_path = WriteTemp(bad);
    Config b;
    Status s = LoadConfigFile(bad_path, &b);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.message().find("archives") != std::string::npos ||
                s.message().find("max_unpacked_mib") != std::string::npos)
        << s.message();
    std::filesystem::remove(bad_path);
  }
}

TEST(ConfigTest, ServerlessSectionSetsIdleAndTheAccountWideConcurrency) {
  Config c;
  ASSERT_TRUE(
      LoadConfigFile(WriteTemp(R"({"serverless": {"idle_seconds": 5, "account_max_concurrency": 7}})"), &c).ok());
  EXPECT_EQ(c.serverless.idle_seconds, 5);
  EXPECT_EQ(c.serverless.account_max_concurrency, 7);
  Config d;
  ASSERT_TRUE(LoadConfigFile(WriteTemp(R"({"serverless": {"idle_seconds": 5}})"), &d).ok());
  EXPECT_EQ(d.serverless.account_max_concurrency, 1000);  // AWS's regional quota
  for (const char* bad :
       {R"({"serverless": {"account_max_concurrency": 0}})", R"({"serverless": {"account_max_concurrency": "many"}})",
        R"({"serverless": {"max_concurrency": 3}})"}) {
    Config b;
    Status s = LoadConfigFile(WriteTemp(bad), &b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("serverless"), std::string::npos) << s.message();
  }
}

TEST(ConfigTest, EndpointsProvisionTimeoutDefaultsToTheModelMaximum) {
  Config defaults;
  EXPECT_EQ(defaults.endpoints.provision_timeout_seconds, 3600);
  std::string path = WriteTemp(R"({"endpoints": {"provision_timeout_seconds": 20}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.endpoints.provision_timeout_seconds, 20);
  std::filesystem::remove(path);
  for (const char* bad : {R"({"endpoints": {"provision_timeout_seconds": 0}})",
                          R"({"endpoints": {"provision_timeout_seconds": "20"}})"}) {
    std::string bad_path = WriteTemp(bad);
    Config b;
    Status s = LoadConfigFile(bad_path, &b);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("provision_timeout_seconds"), std::string::npos) << s.message();
    std::filesystem::remove(bad_path);
  }
}

TEST(ConfigTest, NetworkSectionDefaultsAndParses) {
  Config defaults;
  EXPECT_EQ(defaults.network.mode, "auto");
  EXPECT_EQ(defaults.network.cidr, "10.213.0.0/16");
  EXPECT_EQ(defaults.network.subnet_prefix, 24);
  EXPECT_TRUE(defaults.network.firewall);
  std::string path = WriteTemp(
      R"({"network": {"mode": "namespaces", "cidr": "172.31.0.0/20", "subnet_prefix": 26, "firewall": false}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.network.mode, "namespaces");
  EXPECT_EQ(c.network.cidr, "172.31.0.0/20");
  EXPECT_EQ(c.network.subnet_prefix, 26);
  EXPECT_FALSE(c.network.firewall);
  std::filesystem::remove(path);
  // A partial section keeps the other defaults.
  path = WriteTemp(R"({"network": {"mode": "host"}})");
  Config h;
  ASSERT_TRUE(LoadConfigFile(path, &h).ok());
  EXPECT_EQ(h.network.mode, "host");
  EXPECT_EQ(h.network.cidr, "10.213.0.0/16");
  std::filesystem::remove(path);
}

TEST(ConfigTest, BadNetworkFieldsNameTheSetting) {
  struct Case {
    const char* doc;
    const char* names;
  };
  const Case cases[] = {
      {R"({"network": "auto"})", "\"network\" must be an object"},
      {R"({"network": {"mode": "bridge"}})", "network.mode must be \"auto\", \"namespaces\" or \"host\""},
      {R"({"network": {"mode": 1}})", "\"mode\" must be a string"},
      {R"({"network": {"cidr": "10.213.0.0"}})", "network.cidr must be an IPv4 range"},
      {R"({"network": {"cidr": "10.213.0.300/16"}})", "network.cidr must be an IPv4 range"},
      {R"({"network": {"cidr": "fd00::/64"}})", "network.cidr must be an IPv4 range"},
      {R"({"network": {"cidr": "10.0.0.0/31"}})", "network.cidr must be an IPv4 range"},
      {R"({"network": {"cidr": "10.0.0.0/x"}})", "network.cidr must be an IPv4 range"},
      {R"({"network": {"cidr": "10.213.0.1/16"}})", "no host bits set"},
      {R"({"network": {"subnet_prefix": 29}})", "network.subnet_prefix must be from 16 to 28"},
      {R"({"network": {"cidr": "10.213.0.0/24", "subnet_prefix": 24}})", "longer than the prefix of network.cidr"},
      {R"({"network": {"firewall": "yes"}})", "\"firewall\" must be true or false"},
  };
  for (const Case& bad : cases) {
    std::string bad_path = WriteTemp(bad.doc);
    Config b;
    Status s = LoadConfigFile(bad_path, &b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad.doc;
    EXPECT_NE(s.message().find(bad.names), std::string::npos) << bad.doc << ": " << s.message();
    std::filesystem::remove(bad_path);
  }
}

TEST(ConfigTest, ContainerEngineIsOffByDefault) {
  Config c;
  ASSERT_TRUE(Validate(&c).ok());
  EXPECT_FALSE(c.container_engine.enabled());
  EXPECT_TRUE(c.container_engine.images.empty());
  EXPECT_EQ(c.container_engine.gpus, "auto");
  EXPECT_DOUBLE_EQ(c.container_engine.shm_fraction, 0.5);
  EXPECT_EQ(c.container_engine.lost_after_seconds, 60);
  // A section without a socket configures no engine and no images.
  std::string path = WriteTemp(R"({"container_engine": {"socket": "", "gpus": "cdi"}})");
  Config e;
  ASSERT_TRUE(LoadConfigFile(path, &e).ok());
  EXPECT_FALSE(e.container_engine.enabled());
  EXPECT_TRUE(e.container_engine.images.empty());
  std::filesystem::remove(path);
}

TEST(ConfigTest, ContainerEngineSectionParses) {
  std::string path = WriteTemp(R"({"container_engine": {
    "socket": "/run/podman/podman.sock", "images": ["localhost/*", "*.dkr.ecr.*"],
    "ecr_mirror": "registry.local:5000/ecr",
    "registries": {"registry.local:5000": {"username": "kiln", "password": "s3cret"}},
    "gpus": "device_requests", "log_driver": "journald", "shm_fraction": 0.25,
    "ulimits": {"nofile": [1024, 65536], "memlock": "unlimited", "stack": [8388608, "unlimited"]},
    "lost_after_seconds": 15}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  ASSERT_TRUE(Validate(&c).ok());
  const ContainerEngineConfig& ce = c.container_engine;
  EXPECT_TRUE(ce.enabled());
  EXPECT_EQ(ce.socket, "unix:///run/podman/podman.sock");  // a plain path is kept as a unix:// address
  EXPECT_EQ(ce.images, (std::vector<std::string>{"localhost/*", "*.dkr.ecr.*"}));
  EXPECT_EQ(ce.ecr_mirror, "registry.local:5000/ecr");
  ASSERT_EQ(ce.registries.count("registry.local:5000"), 1u);
  EXPECT_EQ(ce.registries.at("registry.local:5000").username, "kiln");
  EXPECT_EQ(ce.registries.at("registry.local:5000").password, "s3cret");
  EXPECT_EQ(ce.gpus, "device_requests");
  EXPECT_EQ(ce.log_driver, "journald");
  EXPECT_DOUBLE_EQ(ce.shm_fraction, 0.25);
  EXPECT_EQ(ce.lost_after_seconds, 15);
  ASSERT_EQ(ce.ulimits.size(), 3u);
  // nlohmann's object keeps keys sorted: memlock, nofile, stack.
  EXPECT_EQ(ce.ulimits[0].name, "memlock");
  EXPECT_EQ(ce.ulimits[0].soft, -1);
  EXPECT_EQ(ce.ulimits[0].hard, -1);
  EXPECT_EQ(ce.ulimits[1].name, "nofile");
  EXPECT_EQ(ce.ulimits[1].soft, 1024);
  EXPECT_EQ(ce.ulimits[1].hard, 65536);
  EXPECT_EQ(ce.ulimits[2].name, "stack");
  EXPECT_EQ(ce.ulimits[2].soft, 8388608);
  EXPECT_EQ(ce.ulimits[2].hard, -1);
  std::filesystem::remove(path);
}

TEST(ConfigTest, ContainerEngineImagesDefaultToEveryImageWhenASocketIsSet) {
  std::string path = WriteTemp(R"({"container_engine": {"socket": "unix:///var/run/docker.sock"}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.container_engine.socket, "unix:///var/run/docker.sock");
  EXPECT_EQ(c.container_engine.images, std::vector<std::string>{"*"});
  EXPECT_TRUE(c.container_engine.ulimits.empty());  // the server's own limits (DefaultUlimits)
  std::filesystem::remove(path);
  // An explicit empty list: the engine is there, but no image runs on it.
  path = WriteTemp(R"({"container_engine": {"socket": "/var/run/docker.sock", "images": []}})");
  Config e;
  ASSERT_TRUE(LoadConfigFile(path, &e).ok());
  EXPECT_TRUE(e.container_engine.images.empty());
  std::filesystem::remove(path);
}

TEST(ConfigTest, BadContainerEngineFieldsNameTheSetting) {
  struct Case {
    const char* doc;
    const char* names;
  };
  const Case cases[] = {
      {R"({"container_engine": "podman"})", "container_engine must be an object"},
      {R"({"container_engine": {"sockett": "/x"}})", "unknown key \"sockett\""},
      {R"({"container_engine": {"socket": 1}})", "\"socket\" must be a string"},
      {R"({"container_engine": {"socket": "tcp://127.0.0.1:2375"}})", "container_engine.socket must be a Unix socket"},
      {R"({"container_engine": {"socket": "run/podman.sock"}})", "container_engine.socket must be an absolute path"},
      {R"({"container_engine": {"socket": "unix://"}})", "container_engine.socket must be an absolute path"},
      {R"({"container_engine": {"images": "*"}})", "\"images\" must be a list of strings"},
      {R"({"container_engine": {"images": [""]}})", "container_engine.images: an empty pattern"},
      {R"({"container_engine": {"images": ["local:*"]}})", "local: images always run on the process runtime"},
      {R"({"container_engine": {"registries": []}})", "container_engine.registries must be an object"},
      {R"({"container_engine": {"registries": {"r:5000": {"username": "u"}}}})",
       "container_engine.registries[\"r:5000\"] needs"},
      {R"({"container_engine": {"registries": {"r:5000/x": {"username": "u", "password": "p"}}}})",
       "is not a registry host[:port]"},
      {R"({"container_engine": {"gpus": "all"}})", "container_engine.gpus must be \"auto\""},
      {R"({"container_engine": {"shm_fraction": 0}})", "container_engine.shm_fraction must be above 0"},
      {R"({"container_engine": {"shm_fraction": 1.5}})", "container_engine.shm_fraction must be above 0"},
      {R"({"container_engine": {"shm_fraction": "half"}})", "\"shm_fraction\" must be a number"},
      {R"({"container_engine": {"lost_after_seconds": 0}})", "container_engine.lost_after_seconds must be >= 1"},
      {R"({"container_engine": {"ulimits": [1]}})", "container_engine.ulimits must be an object"},
      {R"({"container_engine": {"ulimits": {"nofile": 5}}})", "container_engine.ulimits.nofile must be [soft, hard]"},
      {R"({"container_engine": {"ulimits": {"nofile": [1, 2, 3]}}})",
       "container_engine.ulimits.nofile must be [soft, hard]"},
      {R"({"container_engine": {"ulimits": {"nofile": [-2, 5]}}})",
       "container_engine.ulimits.nofile must be [soft, hard]"},
      {R"({"container_engine": {"ulimits": {"nofile": [10, 5]}}})", "the soft limit 10 is above the hard limit 5"},
      {R"({"container_engine": {"ulimits": {"nofile": ["unlimited", 5]}}})", "is above the hard limit 5"},
      {R"({"container_engine": {"ulimits": {"NOFILE": [1, 1]}}})", "is not a limit name"},
  };
  for (const Case& bad : cases) {
    std::string bad_path = WriteTemp(bad.doc);
    Config b;
    Status s = LoadConfigFile(bad_path, &b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad.doc;
    EXPECT_NE(s.message().find(bad.names), std::string::npos) << bad.doc << ": " << s.message();
    std::filesystem::remove(bad_path);
  }
}

TEST(ConfigTest, RemoteAccessDefaultsAndParses) {
  Config defaults;
  EXPECT_TRUE(defaults.remote_access.enabled);
  EXPECT_EQ(defaults.remote_access.allowed_principals, std::vector<std::string>{"*"});
  EXPECT_TRUE(defaults.remote_access.allow_network_isolated);
  EXPECT_EQ(defaults.remote_access.idle_timeout_seconds, 3600);
  EXPECT_EQ(defaults.remote_access.max_connection_seconds, 0);

  std::string path = WriteTemp(R"({"remote_access": {"enabled": false,
    "allowed_principals": ["arn:aws:iam::*:user/alice", "arn:aws:iam::*:role/dev-*"],
    "allow_network_isolated": false, "idle_timeout_seconds": 60, "max_connection_seconds": 7200}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_FALSE(c.remote_access.enabled);
  EXPECT_EQ(c.remote_access.allowed_principals,
            (std::vector<std::string>{"arn:aws:iam::*:user/alice", "arn:aws:iam::*:role/dev-*"}));
  EXPECT_FALSE(c.remote_access.allow_network_isolated);
  EXPECT_EQ(c.remote_access.idle_timeout_seconds, 60);
  EXPECT_EQ(c.remote_access.max_connection_seconds, 7200);
  std::filesystem::remove(path);
}

TEST(ConfigTest, BadRemoteAccessFieldsNameTheSetting) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"remote_access": true})", "remote_access must be an object"},
           {R"({"remote_access": {"enable": true}})", "unknown key \"enable\""},
           {R"({"remote_access": {"enabled": "yes"}})", "\"enabled\" must be true or false"},
           {R"({"remote_access": {"allowed_principals": "*"}})", "allowed_principals"},
           {R"({"remote_access": {"allowed_principals": [""]}})", "an empty pattern"},
           {R"({"remote_access": {"idle_timeout_seconds": 0}})", "idle_timeout_seconds must be >= 1"},
           {R"({"remote_access": {"max_connection_seconds": -1}})", "max_connection_seconds must be >= 0"},
       }) {
    std::string path = WriteTemp(text);
    Config c;
    Status s = LoadConfigFile(path, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(expected), std::string::npos) << text << " -> " << s.message();
    std::filesystem::remove(path);
  }
}

TEST(ConfigTest, TuningLimitsDefaultAndParse) {
  Config defaults;
  EXPECT_EQ(defaults.tuning.max_parallel_training_jobs, 100);
  EXPECT_EQ(defaults.tuning.max_number_of_training_jobs, 500);
  std::string path = WriteTemp(R"({"tuning": {"max_parallel_training_jobs": 4, "max_number_of_training_jobs": 50}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.tuning.max_parallel_training_jobs, 4);
  EXPECT_EQ(c.tuning.max_number_of_training_jobs, 50);
  std::filesystem::remove(path);
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"tuning": 3})", "tuning must be an object"},
           {R"({"tuning": {"max_parallel": 3}})", "unknown key \"max_parallel\""},
           {R"({"tuning": {"max_parallel_training_jobs": 0}})", "must be >= 1"},
       }) {
    std::string bad = WriteTemp(text);
    Config config;
    Status s = LoadConfigFile(bad, &config);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(expected), std::string::npos) << text << " -> " << s.message();
    std::filesystem::remove(bad);
  }
}

TEST(ConfigTest, SpotDefaultsAndParse) {
  Config defaults;
  EXPECT_TRUE(defaults.spot.interrupt_after_seconds.empty());
  EXPECT_EQ(defaults.spot.interrupt_probability_per_hour, 0);
  EXPECT_EQ(defaults.spot.restart_delay_seconds, 0);
  EXPECT_TRUE(defaults.spot.preempt_for_on_demand);
  EXPECT_EQ(defaults.spot.seed, 0u);
  std::string path = WriteTemp(R"({"spot": {"interrupt_after_seconds": [30, 0.5, 0],
    "interrupt_probability_per_hour": 2.5, "restart_delay_seconds": 1.5, "preempt_for_on_demand": false,
    "seed": 18446744073709551615}})");
  Config c;
  Status loaded = LoadConfigFile(path, &c);
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  EXPECT_EQ(c.spot.interrupt_after_seconds, (std::vector<double>{30, 0.5, 0}));
  EXPECT_EQ(c.spot.interrupt_probability_per_hour, 2.5);
  EXPECT_EQ(c.spot.restart_delay_seconds, 1.5);
  EXPECT_FALSE(c.spot.preempt_for_on_demand);
  EXPECT_EQ(c.spot.seed, 18446744073709551615u);
  std::filesystem::remove(path);

  // Every key is optional; an empty list is no schedule.
  std::string partial = WriteTemp(R"({"spot": {"interrupt_after_seconds": []}})");
  Config p;
  ASSERT_TRUE(LoadConfigFile(partial, &p).ok());
  EXPECT_TRUE(p.spot.interrupt_after_seconds.empty());
  EXPECT_TRUE(p.spot.preempt_for_on_demand);
  std::filesystem::remove(partial);
}

TEST(ConfigTest, BadSpotFieldsNameTheSetting) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"spot": true})", "spot must be an object"},
           {R"({"spot": {"interrupt_after": [1]}})", "unknown key \"interrupt_after\""},
           {R"({"spot": {"interrupt_after_seconds": 30}})", "interrupt_after_seconds must be a list"},
           {R"({"spot": {"interrupt_after_seconds": [30, -1]}})", "interrupt_after_seconds must be a list"},
           {R"({"spot": {"interrupt_after_seconds": ["30"]}})", "interrupt_after_seconds must be a list"},
           {R"({"spot": {"interrupt_probability_per_hour": "often"}})", "\"interrupt_probability_per_hour\" must be"},
           {R"({"spot": {"interrupt_probability_per_hour": -0.1}})", "interrupt_probability_per_hour must be between"},
           {R"({"spot": {"interrupt_probability_per_hour": 3601}})", "interrupt_probability_per_hour must be between"},
           {R"({"spot": {"restart_delay_seconds": -1}})", "restart_delay_seconds must be between"},
           {R"({"spot": {"restart_delay_seconds": 1e300}})", "restart_delay_seconds must be between"},
           {R"({"spot": {"restart_delay_seconds": null}})", "\"restart_delay_seconds\" must be a number"},
           {R"({"spot": {"preempt_for_on_demand": 1}})", "\"preempt_for_on_demand\" must be true or false"},
           {R"({"spot": {"seed": -1}})", "seed must be an integer >= 0"},
           {R"({"spot": {"seed": 1.5}})", "seed must be an integer >= 0"},
       }) {
    std::string path = WriteTemp(text);
    Config c;
    Status s = LoadConfigFile(path, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(expected), std::string::npos) << text << " -> " << s.message();
    std::filesystem::remove(path);
  }
}

TEST(ConfigTest, MultiModelLoadWaitDefaultsAndParses) {
  EXPECT_EQ(Config().multi_model.load_wait_seconds, 60);
  std::string path = WriteTemp(R"({"multi_model": {"load_wait_seconds": 2.5}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_EQ(c.multi_model.load_wait_seconds, 2.5);
  std::filesystem::remove(path);
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"multi_model": []})", "multi_model must be an object"},
           {R"({"multi_model": {"wait": 1}})", "unknown key \"wait\""},
           {R"({"multi_model": {"load_wait_seconds": 0}})", "load_wait_seconds must be 0.1..3600"},
           {R"({"multi_model": {"load_wait_seconds": "5"}})", "load_wait_seconds"},
       }) {
    std::string bad = WriteTemp(text);
    Config b;
    Status s = LoadConfigFile(bad, &b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(expected), std::string::npos) << text << " -> " << s.message();
    std::filesystem::remove(bad);
  }
}

TEST(ConfigTest, ConsoleDefaultsAndParses) {
  EXPECT_TRUE(Config().console.enabled);
  EXPECT_EQ(Config().console.session_minutes, 720);
  std::string path = WriteTemp(R"({"console": {"enabled": false, "session_minutes": 30}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  EXPECT_FALSE(c.console.enabled);
  EXPECT_EQ(c.console.session_minutes, 30);
  std::filesystem::remove(path);
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"console": true})", "console must be an object"},
           {R"({"console": {"ttl": 1}})", "unknown key \"ttl\""},
           {R"({"console": {"session_minutes": 0}})", "session_minutes must be 1..43200"},
           {R"({"console": {"enabled": "yes"}})", "enabled"},
       }) {
    std::string bad = WriteTemp(text);
    Config b;
    Status s = LoadConfigFile(bad, &b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(expected), std::string::npos) << text << " -> " << s.message();
    std::filesystem::remove(bad);
  }
}

TEST(ConfigTest, SlurmSection) {
  std::string path = WriteTemp(R"({"runtime": "slurm",
    "slurm": {"server_url": "http://10.77.0.1:5456", "partition": "gpu", "qos": "high", "account": "ml",
              "node_command": ["/opt/kiln/bin/kiln"], "scratch_dir": "/scratch", "poll_seconds": 1,
              "sbatch_args": ["--constraint=a100"], "request_memory": false, "bin_dir": "/opt/slurm/bin"}})");
  Config c;
  ASSERT_TRUE(LoadConfigFile(path, &c).ok());
  ASSERT_TRUE(Validate(&c).ok());
  EXPECT_EQ(c.runtime, "slurm");
  EXPECT_EQ(c.slurm.server_url, "http://10.77.0.1:5456");
  EXPECT_EQ(c.slurm.partition, "gpu");
  EXPECT_EQ(c.slurm.qos, "high");
  EXPECT_EQ(c.slurm.account, "ml");
  EXPECT_EQ(c.slurm.node_command, std::vector<std::string>{"/opt/kiln/bin/kiln"});
  EXPECT_EQ(c.slurm.scratch_dir, "/scratch");
  EXPECT_EQ(c.slurm.poll_seconds, 1);
  EXPECT_EQ(c.slurm.sbatch_args, std::vector<std::string>{"--constraint=a100"});
  EXPECT_TRUE(c.slurm.request_cpus);
  EXPECT_FALSE(c.slurm.request_memory);
  EXPECT_EQ(c.slurm.bin_dir, "/opt/slurm/bin");
  std::filesystem::remove(path);
}

TEST(ConfigTest, SlurmMistakesAreNamed) {
  Config defaults;
  EXPECT_EQ(defaults.runtime, "process");
  auto check = [](const std::string& text, const std::string& expected) {
    std::string path = WriteTemp(text);
    Config c;
    Status s = LoadConfigFile(path, &c);
    if (s.ok()) s = Validate(&c);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();
    std::filesystem::remove(path);
  };
  check(R"({"runtime": "kubernetes"})", "runtime must be \"process\" or \"slurm\"");
  check(R"({"runtime": "slurm"})", "needs slurm.server_url");
  check(R"({"runtime": "slurm", "slurm": {"server_url": "http://h:1", "node_command": []}})", "node_command");
  check(R"({"runtime": "slurm", "slurm": {"server_url": "http://h:1", "scratch_dir": "tmp"}})", "absolute");
  check(R"({"runtime": "slurm", "slurm": {"server_url": "http://h:1", "poll_seconds": 0}})", "poll_seconds");
  check(R"({"slurm": {"partiton": "x"}})", "unknown key \"partiton\"");
  check(R"({"runtime": "slurm", "slurm": {"server_url": "http://h:1"},
            "container_engine": {"socket": "/run/docker.sock"}})",
        "cannot run container images");
}

}  // namespace
}  // namespace kiln::cli
