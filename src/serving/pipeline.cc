#include "serving/pipeline.h"

#include <algorithm>

#include "base/strings.h"

namespace kiln::serving {

int FindContainer(const InstanceTarget& instance, std::string_view hostname) {
  for (size_t i = 0; i < instance.containers.size(); ++i) {
    if (instance.containers[i].hostname == hostname) return static_cast<int>(i);
  }
  return -1;
}

HeaderMap PipelineHopHeaders(const HeaderMap& forward, size_t index, size_t count,
                             const std::string* previous_content_type) {
  HeaderMap hop;
  const bool last = index + 1 >= count;
  for (const auto& [name, value] : forward) {
    if (index > 0 && EqualsIgnoreCase(name, "Content-Type")) continue;
    if (!last && EqualsIgnoreCase(name, "Accept")) continue;
    hop.emplace(name, value);
  }
  if (index > 0) {
    hop.emplace("Content-Type",
                previous_content_type != nullptr ? *previous_content_type : std::string("application/octet-stream"));
  }
  return hop;
}

int RemainingBudgetMs(int64_t start_ns, int64_t now_ns, int budget_ms) {
  const int64_t left = int64_t{budget_ms} - (now_ns - start_ns) / 1000000;
  return static_cast<int>(std::clamp<int64_t>(left, 0, budget_ms));
}

}  // namespace kiln::serving
