#pragma once
// GetMetricData's metric math (spec §13, Kiln's subset), apart from the request handling in
// cloudwatch.cc so the grammar and its arithmetic can be read and tested on their own.
//
// GetMetricData metric math (spec §13, Kiln's subset): + - * / with the usual precedence,
// parentheses, unary minus, numbers, query ids, and SUM/AVG/MIN/MAX over a list [a, b, ...] (per
// timestamp, across the series) or over one series (its values at each timestamp: the series
// itself). A binary operation on two series keeps the timestamps both have; with a scalar, every
// value. Non-finite results (x / 0) are dropped, as CloudWatch leaves such points out.
//
// Errors are returned as the message GetMetricData puts in its ValidationError (the caller
// chooses the code); evaluation never throws.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <variant>

namespace kiln::api {

struct MathValue {
  bool is_series = false;
  double scalar = 0;
  std::map<int64_t, double> points;
};
using MathLookup = std::function<std::variant<const MathValue*, std::string>(const std::string& id)>;

// Evaluates `text`. `lookup` resolves a query id to its value (valid for the call) or to the
// error message to report for it.
std::variant<MathValue, std::string> EvaluateMath(std::string_view text, MathLookup lookup);

}  // namespace kiln::api
