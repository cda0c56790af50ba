#include "observe/metric_extractor.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace kiln::observe {

std::optional<double> ParseMetricValue(std::string_view text) {
  size_t begin = 0;
  size_t end = text.size();
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; };
  while (begin < end && is_space(text[begin])) ++begin;
  while (end > begin && is_space(text[end - 1])) --end;
  if (begin == end || end - begin > 64) {
    return std::nullopt;  // nothing, or far longer than any number a log prints
  }
  // strtod needs a terminated buffer; the value is short, so copy it to the stack.
  char buffer[65];
  std::string_view trimmed = text.substr(begin, end - begin);
  trimmed.copy(buffer, trimmed.size());
  buffer[trimmed.size()] = '\0';
  // strtod also reads hex floats ("0x1p3"); Python's float() does not, so they are refused.
  for (char c : trimmed) {
    if (c == 'x' || c == 'X') return std::nullopt;
  }
  char* parsed_end = nullptr;
  errno = 0;
  double value = std::strtod(buffer, &parsed_end);
  if (parsed_end != buffer + trimmed.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

Result<std::unique_ptr<MetricExtractor>> MetricExtractor::Create(const std::vector<MetricDefinition>& definitions) {
  if (definitions.size() > kMaxDefinitions) {
    return Status::InvalidArgument("At most " + std::to_string(kMaxDefinitions) +
                                   " metric definitions are allowed; got " + std::to_string(definitions.size()) + ".");
  }
  std::vector<Metric> metrics;
  metrics.reserve(definitions.size());
  for (const auto& definition : definitions) {
    // Python semantics (Unicode \d \w \s), as the SageMaker SDK documents the regexes.
    auto regex = Regex::Compile(definition.regex, {.mode = Regex::Mode::kSearch, .ucp = true});
    if (!regex.ok()) {
      return Status::InvalidArgument("Metric definition '" + definition.name +
                                     "' has an invalid regex: " + regex.status().message());
    }
    metrics.push_back(Metric{definition.name, std::move(regex).value()});
  }
  return std::unique_ptr<MetricExtractor>(new MetricExtractor(std::move(metrics)));
}

std::vector<MetricPoint> MetricExtractor::Extract(std::string_view line, int64_t timestamp_millis) const {
  std::vector<MetricPoint> points;
  for (const auto& metric : metrics_) {
    if (metric.regex.capture_count() < 1) {
      continue;  // a regex without a group produces nothing
    }
    auto group = metric.regex.SearchFirstGroup(line);
    if (!group) {
      continue;
    }
    if (auto value = ParseMetricValue(*group)) {
      points.push_back(MetricPoint{metric.name, *value, timestamp_millis});
    }
  }
  return points;
}

}  // namespace kiln::observe
