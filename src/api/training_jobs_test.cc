#include "api/training_jobs.h"

#include <gtest/gtest.h>

namespace kiln::api {
namespace {

using nlohmann::json;

store::TrainingJobRecord Record() {
  store::TrainingJobRecord r;
  r.name = "Job-1";
  r.arn = "arn:aws:sagemaker:us-east-1:000000000000:training-job/Job-1";
  r.request = json::parse(R"({
    "TrainingJobName": "Job-1", "RoleArn": "arn:aws:iam::000000000000:role/r",
    "AlgorithmSpecification": {"TrainingImage": "local:/bin/true", "TrainingInputMode": "File"},
    "InputDataConfig": [{"ChannelName": "train",
                         "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/t/"}}}],
    "OutputDataConfig": {"S3OutputPath": "s3://b/out/"},
    "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    "Environment": {"A": "1"}})");
  r.status = store::TrainingJobStatus::kCompleted;
  r.secondary_status = store::SecondaryStatus::kCompleted;
  r.creation_millis = 1714557600123;
  r.last_modified_millis = 1714557700000;
  r.training_end_millis = 1714557650500;
  r.state = *store::TrainingJobStateFromJson(json::parse(R"({"training_start_millis": 1714557640000,
    "transitions": [{"Status": "Training", "StartTime": 1714557640000, "EndTime": 1714557650500,
                     "StatusMessage": "Training image download completed. Training in progress."},
                    {"Status": "Completed", "StartTime": 1714557650500, "StatusMessage": "Training job completed"}],
    "final_metrics": {"loss": {"value": 0.25, "timestamp_millis": 1714557650000}}})"));
  return r;
}

// A queue that has "Job-1" waiting with two jobs ahead.
class FakeQueue : public control::TrainingQueueView {
 public:
  std::string PendingMessage(const std::string& job_name) const override {
    return job_name == queued ? "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB (2 jobs ahead)" : "";
  }
  std::string queued = "Job-1";
};

store::TrainingJobRecord PendingRecord() {
  store::TrainingJobRecord r = Record();
  r.status = store::TrainingJobStatus::kInProgress;
  r.secondary_status = store::SecondaryStatus::kPending;
  r.training_end_millis.reset();
  r.state = *store::TrainingJobStateFromJson(json::parse(R"({"transitions": [
    {"Status": "Starting", "StartTime": 1714557600123, "EndTime": 1714557600200, "StatusMessage": "Starting the training job"},
    {"Status": "Pending", "StartTime": 1714557600200, "StatusMessage": "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB"}]})"));
  return r;
}

TEST(RenderTrainingJobTest, APendingJobShowsItsLivePlaceInLine) {
  FakeQueue queue;
  json out = RenderTrainingJob(PendingRecord(), &queue);
  EXPECT_EQ(out["SecondaryStatus"], "Pending");
  ASSERT_EQ(out["SecondaryStatusTransitions"].size(), 2u);
  EXPECT_EQ(out["SecondaryStatusTransitions"][1]["StatusMessage"],
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB (2 jobs ahead)");
  EXPECT_EQ(out["SecondaryStatusTransitions"][0]["StatusMessage"], "Starting the training job");
}

TEST(RenderTrainingJobTest, TheRowsPendingMessageStandsWhenTheQueueHasNotTheJob) {
  FakeQueue queue;
  queue.queued = "someone-else";  // granted meanwhile: its row still says Pending for a moment
  const std::string stored = "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB";
  EXPECT_EQ(RenderTrainingJob(PendingRecord(), &queue)["SecondaryStatusTransitions"][1]["StatusMessage"], stored);
  EXPECT_EQ(RenderTrainingJob(PendingRecord())["SecondaryStatusTransitions"][1]["StatusMessage"], stored);
  // Only a Pending job asks the queue.
  queue.queued = "Job-1";
  json done = RenderTrainingJob(Record(), &queue);
  EXPECT_EQ(done["SecondaryStatusTransitions"][1]["StatusMessage"], "Training job completed");
}

TEST(RenderTrainingJobTest, EchoesTheRequestWithAwsDefaults) {
  json out = RenderTrainingJob(Record());
  EXPECT_EQ(out["TrainingJobName"], "Job-1");
  // One '/' between S3OutputPath and the job name, known from creation.
  EXPECT_EQ(out["ModelArtifacts"]["S3ModelArtifacts"], "s3://b/out/Job-1/output/model.tar.gz");
  EXPECT_EQ(out["StoppingCondition"]["MaxRuntimeInSeconds"], 86400);
  EXPECT_EQ(out["OutputDataConfig"]["CompressionType"], "GZIP");
  EXPECT_EQ(out["OutputDataConfig"]["KmsKeyId"], "");  // read unguarded by the SDK's Estimator.attach
  const json& channel = out["InputDataConfig"][0];
  EXPECT_EQ(channel["CompressionType"], "None");
  EXPECT_EQ(channel["RecordWrapperType"], "None");
  EXPECT_EQ(channel["DataSource"]["S3DataSource"]["S3DataDistributionType"], "FullyReplicated");
  EXPECT_EQ(out["Environment"]["A"], "1");
  EXPECT_EQ(out["EnableManagedSpotTraining"], false);
  EXPECT_EQ(out["HyperParameters"], json::object());
}

TEST(RenderTrainingJobTest, KeepsAGivenKmsKeyId) {
  auto r = Record();
  r.request["OutputDataConfig"]["KmsKeyId"] = "arn:aws:kms:us-east-1:000000000000:key/k";
  EXPECT_EQ(RenderTrainingJob(r)["OutputDataConfig"]["KmsKeyId"], "arn:aws:kms:us-east-1:000000000000:key/k");
}

TEST(RenderTrainingJobTest, TimesAreEpochSecondsWithMillis) {
  json out = RenderTrainingJob(Record());
  EXPECT_DOUBLE_EQ(out["CreationTime"].get<double>(), 1714557600.123);
  EXPECT_DOUBLE_EQ(out["TrainingStartTime"].get<double>(), 1714557640.0);
  EXPECT_DOUBLE_EQ(out["TrainingEndTime"].get<double>(), 1714557650.5);
  EXPECT_EQ(out["TrainingTimeInSeconds"], 11);  // 10.5 s rounded up
  EXPECT_EQ(out["BillableTimeInSeconds"], 11);
  const json& transitions = out["SecondaryStatusTransitions"];
  ASSERT_EQ(transitions.size(), 2u);
  EXPECT_TRUE(transitions[0].contains("EndTime"));
  EXPECT_EQ(transitions[1]["StatusMessage"], "Training job completed");
  ASSERT_EQ(out["FinalMetricDataList"].size(), 1u);
  EXPECT_EQ(out["FinalMetricDataList"][0]["MetricName"], "loss");
  EXPECT_DOUBLE_EQ(out["FinalMetricDataList"][0]["Value"].get<double>(), 0.25);
}

TEST(RenderTrainingJobTest, FailureReasonOnlyWhenFailed) {
  auto r = Record();
  EXPECT_FALSE(RenderTrainingJob(r).contains("FailureReason"));
  r.status = store::TrainingJobStatus::kFailed;
  r.state.failure_reason = "AlgorithmError: boom, exit code: 1";
  EXPECT_EQ(RenderTrainingJob(r)["FailureReason"], "AlgorithmError: boom, exit code: 1");
}

}  // namespace
}  // namespace kiln::api
