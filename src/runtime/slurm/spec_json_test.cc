#include "runtime/slurm/spec_json.h"

#include <gtest/gtest.h>

namespace kiln::runtime::slurm {
namespace {

InstanceSpec FullSpec() {
  InstanceSpec s;
  s.instance_id = "train-job-algo-2";
  s.opt_ml_dir = "/var/lib/kiln/jobs/x/algo-2";
  s.extra_mounts = {{"/data", "/opt/ml/input/data/ro", true}};
  s.hostname = "algo-2";
  s.hosts_file_lines = {"127.0.0.1 localhost", "10.0.0.2 algo-2"};
  s.argv = {"/usr/bin/python3", "train.py"};
  s.env = {{"SM_HOSTS", "[\"algo-1\",\"algo-2\"]"}, {"PATH", "/usr/bin"}};
  s.working_dir = "/opt/ml/code";
  s.cpus = {0, 1};
  s.memory_limit_bytes = 1ull << 33;
  s.gpus = {3};
  s.network = NetworkAttachment{"job-x", "kb-1", "kv1-2", "10.213.1.2", 24, "10.213.1.1", true, "eth0", {5456}};
  s.network_namespace = "";
  s.container = ContainerImage{"123.dkr.ecr.us-east-1.amazonaws.com/x:1", "registry.local/x:1",
                               std::vector<std::string>{"/bin/sh", "-c"}};
  s.group = "train-job";
  s.group_size = 2;
  s.group_index = 1;
  s.shape_vcpus = 8;
  s.shape_memory_bytes = 32ull << 30;
  s.shape_gpus = 1;
  s.instance_type = "ml.g5.2xlarge";
  s.time_limit_seconds = 86430;
  s.placement = {{"partition", "gpu"}, {"qos", "high"}};
  return s;
}

TEST(SpecJson, RoundTripsEveryMember) {
  InstanceSpec in = FullSpec();
  Result<InstanceSpec> out = DecodeSpec(EncodeSpec(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->instance_id, in.instance_id);
  EXPECT_EQ(out->opt_ml_dir, in.opt_ml_dir);
  ASSERT_EQ(out->extra_mounts.size(), 1u);
  EXPECT_EQ(out->extra_mounts[0].host_path, "/data");
  EXPECT_EQ(out->extra_mounts[0].sandbox_path, "/opt/ml/input/data/ro");
  EXPECT_TRUE(out->extra_mounts[0].read_only);
  EXPECT_EQ(out->hostname, in.hostname);
  EXPECT_EQ(out->hosts_file_lines, in.hosts_file_lines);
  EXPECT_EQ(out->argv, in.argv);
  EXPECT_EQ(out->env, in.env);
  EXPECT_EQ(out->working_dir, in.working_dir);
  EXPECT_EQ(out->cpus, in.cpus);
  EXPECT_EQ(out->memory_limit_bytes, in.memory_limit_bytes);
  EXPECT_EQ(out->gpus, in.gpus);
  ASSERT_TRUE(out->network.has_value());
  EXPECT_EQ(out->network->address, "10.213.1.2");
  EXPECT_TRUE(out->network->isolated);
  EXPECT_EQ(out->network->loopback_forwards, std::vector<int>{5456});
  ASSERT_TRUE(out->container.has_value());
  EXPECT_EQ(out->container->requested, in.container->requested);
  EXPECT_EQ(out->container->reference, in.container->reference);
  ASSERT_TRUE(out->container->entrypoint.has_value());
  EXPECT_EQ(*out->container->entrypoint, *in.container->entrypoint);
  EXPECT_EQ(out->group, "train-job");
  EXPECT_EQ(out->group_size, 2);
  EXPECT_EQ(out->group_index, 1);
  EXPECT_EQ(out->shape_vcpus, 8);
  EXPECT_EQ(out->shape_memory_bytes, 32ull << 30);
  EXPECT_EQ(out->shape_gpus, 1);
  EXPECT_EQ(out->instance_type, "ml.g5.2xlarge");
  EXPECT_EQ(out->time_limit_seconds, 86430);
  EXPECT_EQ(out->placement, in.placement);
}

TEST(SpecJson, MinimalDocumentTakesDefaults) {
  Result<InstanceSpec> out = DecodeSpec(R"({"instance_id":"e-1","argv":["/bin/true"],"future_member":7})");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->instance_id, "e-1");
  EXPECT_FALSE(out->network.has_value());
  EXPECT_FALSE(out->container.has_value());
  EXPECT_EQ(out->group_size, 1);
  EXPECT_EQ(out->group_index, 0);
  EXPECT_TRUE(out->placement.empty());
}

TEST(SpecJson, ContainerWithoutEntrypointStaysUnset) {
  InstanceSpec in;
  in.instance_id = "x";
  in.argv = {"serve"};
  in.container = ContainerImage{"img:1", "", std::nullopt};
  Result<InstanceSpec> out = DecodeSpec(EncodeSpec(in));
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE(out->container.has_value());
  EXPECT_FALSE(out->container->entrypoint.has_value());
}

TEST(SpecJson, RefusesBadDocuments) {
  EXPECT_TRUE(DecodeSpec("not json").status().IsInvalidArgument());
  EXPECT_TRUE(DecodeSpec("[1]").status().IsInvalidArgument());
  EXPECT_TRUE(DecodeSpec(R"({"argv":[]})").status().IsInvalidArgument());
  Result<InstanceSpec> wrong_type = DecodeSpec(R"({"instance_id":"x","argv":"python"})");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_NE(wrong_type.status().message().find("bad instance spec"), std::string::npos);
  EXPECT_FALSE(DecodeSpec(R"({"instance_id":"x","argv":[],"group_size":2,"group_index":2})").ok());
}

TEST(NodeReportJson, RoundTrips) {
  NodeReport r;
  r.state = "exited";
  r.node = "kn1";
  r.address = "10.77.0.11";
  r.started_millis = 1000;
  r.finished_millis = 2000;
  r.exit_code = 0;
  r.term_signal = 0;
  r.oom_killed = true;
  r.usage = InstanceUsage{123, 456, 789, {0}, "proc", 3};
  r.error = "";
  Result<NodeReport> out = ReportFromJson(ReportToJson(r));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->state, "exited");
  EXPECT_EQ(out->node, "kn1");
  EXPECT_EQ(out->address, "10.77.0.11");
  EXPECT_EQ(out->finished_millis, 2000);
  EXPECT_TRUE(out->oom_killed);
  ASSERT_TRUE(out->usage.has_value());
  EXPECT_EQ(out->usage->cpu_usec, 123u);
  EXPECT_EQ(out->usage->process_count, 3);
  EXPECT_FALSE(ReportFromJson(nlohmann::json{{"state", "bogus"}}).ok());
  EXPECT_FALSE(ReportFromJson(nlohmann::json::object()).ok());
}

TEST(NodeReportJson, AnswerRoundTrips) {
  NodeReportAnswer a;
  Result<NodeReportAnswer> none = AnswerFromJson(AnswerToJson(a));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->stop_grace_seconds.has_value());
  a.stop_grace_seconds = 30;
  a.signals = {15, 10};
  Result<NodeReportAnswer> out = AnswerFromJson(AnswerToJson(a));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->stop_grace_seconds, 30);
  EXPECT_EQ(out->signals, (std::vector<int>{15, 10}));
}

}  // namespace
}  // namespace kiln::runtime::slurm
