#pragma once
// The search space of a hyperparameter tuning job (issue 17): the ParameterRanges of a
// CreateHyperParameterTuningJob request parsed into Parameters, and the map between a point of the
// unit cube (what the strategies search) and an Assignment (the hyperparameter values a trial gets).
//
// Encoding (the unit cube, `encoded_dimensions()` coordinates in parameter order):
//   integer, continuous  one coordinate u in [0, 1]; the scaling maps it onto [MinValue, MaxValue]:
//                          Linear              x = min + u (max - min)
//                          Logarithmic         log x uniform: x = exp(log min + u (log max - log min))
//                          ReverseLogarithmic  log(1 - x) uniform (dense near 1):
//                                              x = 1 - exp(log(1 - min) + u (log(1 - max) - log(1 - min)))
//                        so a uniform u is a uniform sample in the scaled space. An integer range
//                        is scaled over [min - 0.5, max + 0.5] and rounded, so every integer owns an
//                        equal share of the scaled axis; Encode puts an integer at the centre of it.
//   categorical          one-hot: one coordinate per value; Decode takes the largest (first on ties).
// Auto scaling (Kiln's rule; AWS does not publish its own): Logarithmic when MinValue > 0 and
// MaxValue >= 1000 * MinValue (a range over three or more orders of magnitude, e.g. a learning
// rate 1e-5..1e-1), else Linear. `Parameter::scaling` keeps what the request said (kAuto);
// EffectiveScaling() gives the resolved one.
//
// Value text (training-contract.md §18): integers as decimal text ("12"), continuous values as the
// shortest text that reads back to the same double (FormatContinuous), categorical as given.
//
// Thread-safety: a SearchSpace is an immutable value after Parse; const methods may be called
// from any thread.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::control::tuning {

enum class Scaling { kAuto, kLinear, kLogarithmic, kReverseLogarithmic };
enum class ParameterKind { kInteger, kContinuous, kCategorical };

struct Parameter {
  std::string name;
  ParameterKind kind = ParameterKind::kContinuous;
  double min = 0, max = 0;  // integer and continuous ranges (integers hold whole numbers)
  Scaling scaling = Scaling::kAuto;
  std::vector<std::string> values;  // categorical only, in the request's order
};

// hyperparameter name → value text
using Assignment = std::map<std::string, std::string>;

// "Auto" | "Linear" | "Logarithmic" | "ReverseLogarithmic".
std::string_view ToString(Scaling scaling);
// The scaling Decode/Encode apply: kAuto resolved by the rule in the file comment; never kAuto.
Scaling EffectiveScaling(const Parameter& parameter);

class SearchSpace {
 public:
  // `ranges`: a ParameterRanges JSON object ({IntegerParameterRanges, ContinuousParameterRanges,
  // CategoricalParameterRanges}, each optional). Parameters come out in that order (integer ranges,
  // then continuous, then categorical, each in request order).
  // InvalidArgument, with a message that names the member (e.g. "ContinuousParameterRanges[1].MinValue")
  // and says what to change, for: AutoParameters ("AutoParameters is not supported by Kiln."), a bound
  // that is not a number (integer bounds must be whole numbers), MinValue > MaxValue, Logarithmic with
  // MinValue <= 0, ReverseLogarithmic on an integer range or outside [0, 1) ("ReverseLogarithmic
  // requires 0 <= MinValue <= MaxValue < 1"), an empty name, a name used twice, no ranges at all
  // ("ParameterRanges must define at least one range" — callers decide whether that is allowed), an
  // empty Values list or a value listed twice, a wrongly typed member, and a range whose name is also
  // in `static_names` (the StaticHyperParameters keys).
  static Result<SearchSpace> Parse(const nlohmann::json& ranges, const std::set<std::string>& static_names = {});

  // Builds a space from parameters already validated (tests, benches). Computes the encoding.
  static SearchSpace FromParameters(std::vector<Parameter> parameters);

  const std::vector<Parameter>& parameters() const { return parameters_; }
  // Numeric parameters 1 each, categorical ones one per value (one-hot).
  size_t encoded_dimensions() const { return dimensions_; }
  // The first coordinate of parameter i in an encoded point (its width: 1, or values.size()).
  size_t offset(size_t parameter_index) const { return offsets_[parameter_index]; }

  // Unit point → values (scaling applied, integers rounded, categorical argmax). Coordinates are
  // clamped to [0, 1]; `unit` must have encoded_dimensions() entries (missing ones read as 0).
  Assignment Decode(const std::vector<double>& unit) const;
  // Values → unit point; nullopt when a parameter is missing or its value is not in the range
  // (not a number, not a whole number for an integer, outside [MinValue, MaxValue], not one of the
  // categorical values). Extra keys are ignored (a warm-start parent's other hyperparameters).
  std::optional<std::vector<double>> Encode(const Assignment& assignment) const;
  // The point Encode(Decode(unit)) without the text round trip: integer coordinates moved to the
  // centre of their integer's share, categorical blocks made one-hot.
  std::vector<double> Snap(const std::vector<double>& unit) const;

  // True when every parameter is categorical (Grid needs that).
  bool all_categorical() const;
  // Product of the categorical parameters' value counts (numeric ones are ignored); saturates at
  // UINT64_MAX.
  uint64_t grid_size() const;
  // Point `index` of the Cartesian product of the categorical parameters, FIRST parameter varying
  // slowest, values in the request's order. Empty when index >= grid_size().
  Assignment GridPoint(uint64_t index) const;

 private:
  std::vector<Parameter> parameters_;
  std::vector<size_t> offsets_;
  size_t dimensions_ = 0;
};

// Shortest text that reads back to the same double (std::to_chars, general format: fixed notation
// unless the exponent is below -4 or beyond the digits, as %g), e.g. "0.1", "0.0001", "1e-05", "3".
std::string FormatContinuous(double value);

}  // namespace kiln::control::tuning
