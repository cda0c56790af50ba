#include "control/instance_placement.h"

namespace kiln::control {

std::map<std::string, std::string> PlacementFromTags(const std::vector<store::Tag>& tags) {
  std::map<std::string, std::string> placement;
  for (const store::Tag& tag : tags) {
    if (tag.value.empty()) continue;
    if (tag.key == kSlurmPartitionTag) placement["partition"] = tag.value;
    if (tag.key == kSlurmQosTag) placement["qos"] = tag.value;
    if (tag.key == kSlurmAccountTag) placement["account"] = tag.value;
  }
  return placement;
}

int64_t InstanceTimeLimitSeconds(const nlohmann::json& request, std::chrono::seconds stop_grace,
                                 std::chrono::seconds margin) {
  int64_t max_runtime = 86400;
  if (request.is_object()) {
    auto sc = request.find("StoppingCondition");
    if (sc != request.end() && sc->is_object()) {
      auto m = sc->find("MaxRuntimeInSeconds");
      if (m != sc->end() && m->is_number_integer() && m->get<int64_t>() > 0) max_runtime = m->get<int64_t>();
    }
  }
  return max_runtime + stop_grace.count() + margin.count();
}

}  // namespace kiln::control
