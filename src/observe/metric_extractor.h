#pragma once
// MetricExtractor: turns training log lines into metric points, per
// AlgorithmSpecification.MetricDefinitions (spec/training-contract.md §15).
//
// For each line, every definition's regex is searched (not full-matched) in the line; the first
// capture group of the first match is parsed as a floating-point number, ignoring leading and
// trailing spaces. NaN, infinities and unparsable text are dropped; a regex without a group
// produces nothing. One definition gives at most one point per line; several definitions may
// each give one. Points come out in definition order.
//
// Thread-safety: immutable after Create; Extract may be called from any number of threads.
//
//   ASSIGN_OR_RETURN(auto extractor, MetricExtractor::Create({{"train:loss", "Train Loss = (.*?);"}}));
//   for (const MetricPoint& point : extractor->Extract(line, event_millis)) store.Put(...);

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/regex.h"
#include "base/status.h"

namespace kiln::observe {

struct MetricDefinition {
  std::string name;   // MetricDefinition.Name
  std::string regex;  // MetricDefinition.Regex (Perl/Python syntax, PCRE2)
};

struct MetricPoint {
  std::string name;
  double value = 0;
  int64_t timestamp_millis = 0;

  bool operator==(const MetricPoint&) const = default;
};

class MetricExtractor {
 public:
  // SageMaker's limit on MetricDefinitions.
  static constexpr size_t kMaxDefinitions = 40;

  // Compiles every definition. InvalidArgument naming the metric when a regex does not compile
  // ("Metric definition 'train:loss' has an invalid regex: missing closing parenthesis at offset
  // 7"), or when there are more than kMaxDefinitions. An empty list is valid (extracts nothing).
  static Result<std::unique_ptr<MetricExtractor>> Create(const std::vector<MetricDefinition>& definitions);

  // The points `line` yields, stamped `timestamp_millis`.
  std::vector<MetricPoint> Extract(std::string_view line, int64_t timestamp_millis) const;

  size_t size() const { return metrics_.size(); }

 private:
  struct Metric {
    std::string name;
    Regex regex;
  };
  explicit MetricExtractor(std::vector<Metric> metrics) : metrics_(std::move(metrics)) {}

  std::vector<Metric> metrics_;
};

// Parses a metric value the way §15 says: surrounding spaces ignored, the whole rest must be a
// finite floating-point number. nullopt otherwise.
std::optional<double> ParseMetricValue(std::string_view text);

}  // namespace kiln::observe
