#include "control/endpoint_status.h"

#include <algorithm>

namespace kiln::control {

namespace {

// The API model's VariantStatusMessage maximum.
constexpr size_t kMaxStatusMessage = 1024;

// AWS's FailureReason when SageMaker cannot get instances of the requested type.
constexpr const char* kCapacitySentence =
    "Unable to provision requested ML compute capacity. Please retry using a different ML instance type.";

std::string Cut(std::string s, size_t max) {
  if (s.size() <= max) return s;
  // Never split a UTF-8 sequence: back up to the start of the character at the cut.
  size_t end = max - 3;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  s.resize(end);
  return s + "...";
}

}  // namespace

std::vector<store::VariantStatusEntry> VariantStatusEntries(const VariantProgress& progress) {
  using store::EndpointStatus;
  std::vector<store::VariantStatusEntry> entries;
  const EndpointStatus status = progress.endpoint_status;
  const bool operation = status == EndpointStatus::kCreating || status == EndpointStatus::kUpdating ||
                         status == EndpointStatus::kSystemUpdating;
  if (status == EndpointStatus::kFailed || status == EndpointStatus::kDeleting ||
      (!operation && !progress.provisioning)) {
    return entries;
  }
  std::string message = !progress.waiting_for.empty() ? progress.waiting_for
                        : progress.provisioning       ? "Starting and health-checking instances."
                                                      : "";
  entries.push_back({.status = status == EndpointStatus::kCreating ? "Creating" : "Updating",
                     .status_message = Cut(std::move(message), kMaxStatusMessage),
                     .start_time = progress.start_time});
  return entries;
}

std::chrono::seconds ProvisionTimeout(const nlohmann::json& config_variant, std::chrono::seconds fallback) {
  if (!config_variant.is_object()) return fallback;
  auto it = config_variant.find("VariantInstanceProvisionTimeoutInSeconds");
  if (it == config_variant.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return fallback;
  return std::chrono::seconds(it->get<int64_t>());
}

std::string CapacityWaitMessage(const std::string& shortfall, std::chrono::seconds timeout, std::chrono::seconds left) {
  return "Waiting for compute capacity: " + shortfall +
         " (scheduler policy strict). The instance fails if it cannot start within "
         "VariantInstanceProvisionTimeoutInSeconds (" +
         std::to_string(timeout.count()) + " s; " + std::to_string(std::max<int64_t>(left.count(), 0)) + " s left).";
}

std::string CapacityTimeoutReason(const std::string& variant, const std::string& shortfall,
                                  std::chrono::seconds timeout) {
  return std::string(kCapacitySentence) + " Kiln: production variant " + variant + " waited " +
         std::to_string(timeout.count()) +
         " s (VariantInstanceProvisionTimeoutInSeconds) for capacity on this host (scheduler policy strict): " +
         shortfall + ".";
}

std::string CapacityNeverReason(const std::string& variant, const std::string& why) {
  return std::string(kCapacitySentence) + " Kiln: production variant " + variant + ": " + why + ".";
}

}  // namespace kiln::control
