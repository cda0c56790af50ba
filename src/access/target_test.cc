#include "access/target.h"

#include <gtest/gtest.h>

namespace kiln::access {
namespace {

Target MustParse(std::string_view text) {
  Result<Target> t = ParseTarget(text);
  EXPECT_TRUE(t.ok()) << text << ": " << t.status().ToString();
  return t.ok() ? *t : Target{};
}

TEST(TargetTest, TrainingForms) {
  struct Case {
    std::string text;
    std::string job;
    int host;
    bool bare;
  };
  for (const Case& c : std::vector<Case>{
           {"training-job/my-job/algo-2", "my-job", 2, false},
           {"training-job/my-job", "my-job", 1, false},
           {"sagemaker-training-job:my-job_algo-3", "my-job", 3, false},
           {"algo-12.My-Job.training.kiln", "My-Job", 12, false},
           {"ALGO-1.j.TRAINING.KILN", "j", 1, false},
           {"my-job", "my-job", 1, true},
           {"arn:aws:sagemaker:us-east-1:000000000000:training-job/my-job", "my-job", 1, false},
       }) {
    Target t = MustParse(c.text);
    EXPECT_EQ(t.resource.kind, ResourceKind::kTrainingJob) << c.text;
    EXPECT_EQ(t.resource.name, c.job) << c.text;
    EXPECT_EQ(t.host, c.host) << c.text;
    EXPECT_EQ(t.resource.bare, c.bare) << c.text;
  }
  Target t = MustParse("sagemaker-training-job:j-1_algo-2");
  EXPECT_EQ(t.Canonical(), "training-job/j-1/algo-2");
  EXPECT_EQ(t.Alias(), "sagemaker-training-job:j-1_algo-2");
  EXPECT_EQ(t.HostName(), "algo-2");
}

TEST(TargetTest, EndpointForms) {
  Target t = MustParse("endpoint/ep/AllTraffic/endpoint-ep-1a2b");
  EXPECT_EQ(t.resource.kind, ResourceKind::kEndpoint);
  EXPECT_EQ(t.resource.name, "ep");
  EXPECT_EQ(t.variant, "AllTraffic");
  EXPECT_EQ(t.instance_id, "endpoint-ep-1a2b");
  EXPECT_EQ(t.Canonical(), "endpoint/ep/AllTraffic/endpoint-ep-1a2b");
  EXPECT_EQ(t.HostName(), "endpoint-ep-1a2b");

  t = MustParse("endpoint/ep");
  EXPECT_EQ(t.resource.name, "ep");
  EXPECT_TRUE(t.variant.empty());
  EXPECT_TRUE(t.instance_id.empty());
  EXPECT_EQ(t.Canonical(), "endpoint/ep");

  t = MustParse("endpoint/ep/v1");
  EXPECT_EQ(t.variant, "v1");
  EXPECT_TRUE(t.instance_id.empty());

  t = MustParse("arn:aws:sagemaker:us-east-1:000000000000:endpoint/ep");
  EXPECT_EQ(t.resource.kind, ResourceKind::kEndpoint);
  EXPECT_EQ(t.resource.name, "ep");
}

TEST(TargetTest, BadTargetsAreRefusedWithTheFormsInTheMessage) {
  for (std::string_view bad : std::vector<std::string_view>{
           "",
           "training-job/",
           "training-job/j/algo-0",
           "training-job/j/algo-01",
           "training-job/j/algo-",
           "training-job/j/algo-x",
           "training-job/j/host-1",
           "training-job/j/algo-1/extra",
           "training-job/bad_name/algo-1",
           "training-job/-j/algo-1",
           "sagemaker-training-job:j",
           "sagemaker-training-job:j_algo-",
           "sagemaker-training-job:_algo-1",
           "sagemaker-training-job:a_b_algo-1",
           "algo-1.training.kiln",
           "algo-x.j.training.kiln",
           "algo-1.j.k.training.kiln",
           "endpoint/",
           "endpoint/ep/",
           "endpoint/ep/v/",
           "endpoint/ep/v/i/extra",
           "endpoint/ep/v/..",
           "endpoint/ep/v/a b",
           "arn:aws:sagemaker:us-east-1:000000000000:model/m",
           "arn:aws:s3:::bucket/key",
           "j.k",
           "job with spaces",
           std::string_view("a\0b", 3),
       }) {
    Result<Target> t = ParseTarget(bad);
    EXPECT_FALSE(t.ok()) << "accepted: " << bad;
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(t.status().message().find("training-job/<job>/algo-<n>"), std::string::npos) << bad;
    }
  }
  // A very long name is refused without echoing all of it.
  Result<Target> long_target = ParseTarget(std::string(100000, 'a'));
  ASSERT_FALSE(long_target.ok());
  EXPECT_LT(long_target.status().message().size(), 1000u);
}

TEST(TargetTest, Resources) {
  auto parse = [](std::string_view text) {
    Result<ResourceRef> r = ParseResource(text);
    EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    return r.ok() ? *r : ResourceRef{};
  };
  ResourceRef r = parse("my-job");
  EXPECT_TRUE(r.bare);
  EXPECT_EQ(r.name, "my-job");
  r = parse("training-job/my-job");
  EXPECT_EQ(r.kind, ResourceKind::kTrainingJob);
  EXPECT_FALSE(r.bare);
  r = parse("endpoint/ep");
  EXPECT_EQ(r.kind, ResourceKind::kEndpoint);
  r = parse("arn:aws:sagemaker:eu-west-1:123456789012:endpoint/ep-2");
  EXPECT_EQ(r.kind, ResourceKind::kEndpoint);
  EXPECT_EQ(r.name, "ep-2");
  for (std::string_view bad : {"", "training-job/", "training-job/j/algo-1", "endpoint/e/v", "x/y",
                               "arn:aws:sagemaker:us-east-1:000000000000:model/m"}) {
    EXPECT_FALSE(ParseResource(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace kiln::access
