#include "control/endpoint_status.h"

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using nlohmann::json;

VariantProgress Progress(std::string_view status, bool provisioning, std::string waiting = "") {
  VariantProgress p;
  p.endpoint_status = *store::ParseEndpointStatus(status);
  p.provisioning = provisioning;
  p.waiting_for = std::move(waiting);
  p.start_time = 1700000000.5;
  return p;
}

// Regression (issue 10): a Failed endpoint reported VariantStatus "Creating".
// The entries as DescribeEndpoint shows them (store::ToJson of the variant summary).
json Entries(const VariantProgress& progress) {
  store::VariantSummary summary;
  summary.variant_status = VariantStatusEntries(progress);
  return store::ToJson(summary)["VariantStatus"];
}

TEST(VariantStatusEntriesTest, FailedAndSettledEndpointsListNoEntry) {
  EXPECT_EQ(Entries(Progress("Failed", false)), json::array());
  EXPECT_EQ(Entries(Progress("Failed", true, "Waiting for compute capacity: x")), json::array());
  EXPECT_EQ(Entries(Progress("Deleting", true)), json::array());
  EXPECT_EQ(Entries(Progress("InService", false)), json::array());
}

TEST(VariantStatusEntriesTest, OperationsInProgressSayWhatTheyWaitFor) {
  struct Case {
    VariantProgress progress;
    std::string status;
    std::string message;
  };
  const std::string wait = "Waiting for compute capacity: ml.m5.xlarge needs 4 vCPUs and 16 GiB; 0 of 2 vCPUs free";
  const std::vector<Case> cases = {
      {Progress("Creating", true, wait), "Creating", wait},
      {Progress("Creating", true), "Creating", "Starting and health-checking instances."},
      {Progress("Creating", false), "Creating", ""},
      {Progress("Updating", true, wait), "Updating", wait},
      {Progress("Updating", false), "Updating", ""},
      {Progress("InService", true), "Updating", "Starting and health-checking instances."},  // a replacement
      {Progress("InService", true, wait), "Updating", wait},
      {Progress("SystemUpdating", false), "Updating", ""},
  };
  for (const auto& c : cases) {
    json entries = Entries(c.progress);
    ASSERT_EQ(entries.size(), 1u) << store::ToString(c.progress.endpoint_status);
    EXPECT_EQ(entries[0]["Status"], c.status) << store::ToString(c.progress.endpoint_status);
    EXPECT_EQ(entries[0]["StatusMessage"], c.message) << store::ToString(c.progress.endpoint_status);
    EXPECT_EQ(entries[0]["StartTime"].get<double>(), 1700000000.5);
  }
}

TEST(VariantStatusEntriesTest, MessageIsCutToTheModelsLimitOnACharacterBoundary) {
  std::string long_wait = "Waiting for compute capacity: " + std::string(600, 'x') + std::string(390, 'e') +
                          "\xC3\xA9\xC3\xA9\xC3\xA9" + std::string(400, 'y');  // 'é' at bytes 1020-1021
  json entries = Entries(Progress("Creating", true, long_wait));
  std::string message = entries[0]["StatusMessage"];
  EXPECT_LE(message.size(), 1024u);
  EXPECT_EQ(message.substr(message.size() - 3), "...");
  EXPECT_NE(static_cast<unsigned char>(message[message.size() - 4]), 0xC3);  // no dangling lead byte
}

TEST(ProvisionTimeoutTest, VariantValueElseTheOperatorDefault) {
  EXPECT_EQ(ProvisionTimeout(json{{"VariantInstanceProvisionTimeoutInSeconds", 300}}, std::chrono::seconds(3600)),
            std::chrono::seconds(300));
  EXPECT_EQ(ProvisionTimeout(json{{"VariantName", "AllTraffic"}}, std::chrono::seconds(20)), std::chrono::seconds(20));
  EXPECT_EQ(ProvisionTimeout(json{{"VariantInstanceProvisionTimeoutInSeconds", "300"}}, std::chrono::seconds(20)),
            std::chrono::seconds(20));
  EXPECT_EQ(ProvisionTimeout(json(), std::chrono::seconds(7)), std::chrono::seconds(7));
}

TEST(CapacityReasonTest, AwsSentenceFirstThenWhatKilnKnows) {
  const std::string shortfall = "ml.m5.24xlarge needs 96 vCPUs and 384 GiB; 8 of 8 vCPUs free";
  EXPECT_EQ(CapacityWaitMessage(shortfall, std::chrono::seconds(300), std::chrono::seconds(42)),
            "Waiting for compute capacity: ml.m5.24xlarge needs 96 vCPUs and 384 GiB; 8 of 8 vCPUs free (scheduler "
            "policy strict). The instance fails if it cannot start within VariantInstanceProvisionTimeoutInSeconds "
            "(300 s; 42 s left).");
  EXPECT_EQ(CapacityTimeoutReason("AllTraffic", shortfall, std::chrono::seconds(300)),
            "Unable to provision requested ML compute capacity. Please retry using a different ML instance type. "
            "Kiln: production variant AllTraffic waited 300 s (VariantInstanceProvisionTimeoutInSeconds) for "
            "capacity on this host (scheduler policy strict): " +
                shortfall + ".");
  EXPECT_EQ(CapacityNeverReason("V1", "ml.g5.xlarge needs 1 GPU per instance, but this host has no GPUs"),
            "Unable to provision requested ML compute capacity. Please retry using a different ML instance type. "
            "Kiln: production variant V1: ml.g5.xlarge needs 1 GPU per instance, but this host has no GPUs.");
}

}  // namespace
}  // namespace kiln::control
