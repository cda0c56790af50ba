#include "control/tuning_space.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

namespace kiln::control::tuning {
namespace {

using nlohmann::json;

// Auto picks Logarithmic for ranges over at least this many orders of magnitude (the ratio).
constexpr double kAutoLogRatio = 1000.0;

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

// The whole text as a finite double, or nullopt.
std::optional<double> ParseDouble(std::string_view text) {
  // from_chars rejects a leading '+' and whitespace; AWS's bounds are plain numbers, so the text
  // is taken as it is apart from one leading '+'.
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

// The whole text as an integer; a double that holds a whole number ("10.0", "1e3") is accepted too.
std::optional<int64_t> ParseInteger(std::string_view text) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty()) return value;
  std::optional<double> d = ParseDouble(text);
  // 2^53: beyond it a double no longer names one integer.
  if (d && std::floor(*d) == *d && std::fabs(*d) <= 9007199254740992.0) return static_cast<int64_t>(*d);
  return std::nullopt;
}

std::optional<Scaling> ParseScaling(std::string_view text) {
  if (text == "Auto") return Scaling::kAuto;
  if (text == "Linear") return Scaling::kLinear;
  if (text == "Logarithmic") return Scaling::kLogarithmic;
  if (text == "ReverseLogarithmic") return Scaling::kReverseLogarithmic;
  return std::nullopt;
}

// The scaled axis of a numeric parameter: Decode maps u ∈ [0, 1] to lo + u (hi - lo) in the
// transformed space and back. Integers widen by half a step each side so each value owns one step.
struct Axis {
  Scaling scaling;
  double lo, hi;  // bounds of the value (integers: widened), before the transform
};

Axis AxisOf(const Parameter& p) {
  Axis axis{EffectiveScaling(p), p.min, p.max};
  if (p.kind == ParameterKind::kInteger) {
    axis.lo -= 0.5;
    axis.hi += 0.5;
  }
  return axis;
}

double Forward(Scaling scaling, double x) {
  switch (scaling) {
    case Scaling::kLogarithmic: return std::log(x);
    case Scaling::kReverseLogarithmic: return std::log1p(-x);
    default: return x;
  }
}

double Inverse(Scaling scaling, double t) {
  switch (scaling) {
    case Scaling::kLogarithmic: return std::exp(t);
    case Scaling::kReverseLogarithmic: return -std::expm1(t);
    default: return t;
  }
}

double ToValue(const Axis& axis, double u) {
  // The ends exactly (exp(log(x)) need not give x back).
  if (u <= 0) return axis.lo;
  if (u >= 1) return axis.hi;
  double t0 = Forward(axis.scaling, axis.lo), t1 = Forward(axis.scaling, axis.hi);
  return Inverse(axis.scaling, t0 + std::clamp(u, 0.0, 1.0) * (t1 - t0));
}

double ToUnit(const Axis& axis, double x) {
  double t0 = Forward(axis.scaling, axis.lo), t1 = Forward(axis.scaling, axis.hi);
  if (t1 == t0) return 0.5;  // a range of one value: any u decodes to it
  return std::clamp((Forward(axis.scaling, x) - t0) / (t1 - t0), 0.0, 1.0);
}

int64_t DecodeInteger(const Parameter& p, double u) {
  double x = std::round(ToValue(AxisOf(p), u));
  return static_cast<int64_t>(std::clamp(x, p.min, p.max));
}

double DecodeContinuous(const Parameter& p, double u) {
  // exp/log may land one ulp outside the bounds; the trial must never see a value outside them.
  return std::clamp(ToValue(AxisOf(p), u), p.min, p.max);
}

size_t ArgMax(const std::vector<double>& unit, size_t offset, size_t width) {
  size_t best = 0;
  for (size_t i = 1; i < width; ++i) {
    double v = offset + i < unit.size() ? unit[offset + i] : 0.0;
    double b = offset + best < unit.size() ? unit[offset + best] : 0.0;
    if (v > b) best = i;
  }
  return best;
}

// Reads a bound member ("MinValue"/"MaxValue") of range `where`.
Result<double> ReadBound(const json& range, const std::string& where, const char* member, bool integer) {
  std::string path = where + "." + member;
  if (!range.contains(member)) return Status::InvalidArgument(path + " is required.");
  const json& value = range.at(member);
  if (!value.is_string()) return Status::InvalidArgument(path + " must be a string holding a number.");
  const std::string& text = value.get_ref<const std::string&>();
  if (integer) {
    std::optional<int64_t> n = ParseInteger(text);
    if (!n) {
      return Status::InvalidArgument(path + " " + Quote(text) +
                                     " is not an integer; integer ranges take whole numbers such as \"10\".");
    }
    return static_cast<double>(*n);
  }
  std::optional<double> d = ParseDouble(text);
  if (!d) return Status::InvalidArgument(path + " " + Quote(text) + " is not a number; give a value such as \"0.01\".");
  return *d;
}

Result<std::string> ReadName(const json& range, const std::string& where) {
  if (!range.is_object()) return Status::InvalidArgument(where + " must be an object.");
  if (!range.contains("Name") || !range.at("Name").is_string()) {
    return Status::InvalidArgument(where + ".Name is required and must be a string.");
  }
  std::string name = range.at("Name").get<std::string>();
  if (name.empty()) return Status::InvalidArgument(where + ".Name must not be empty.");
  return name;
}

Result<Parameter> ParseNumeric(const json& range, const std::string& where, ParameterKind kind) {
  Parameter p;
  p.kind = kind;
  ASSIGN_OR_RETURN(p.name, ReadName(range, where));
  bool integer = kind == ParameterKind::kInteger;
  ASSIGN_OR_RETURN(p.min, ReadBound(range, where, "MinValue", integer));
  ASSIGN_OR_RETURN(p.max, ReadBound(range, where, "MaxValue", integer));
  if (range.contains("ScalingType")) {
    const json& s = range.at("ScalingType");
    std::optional<Scaling> scaling = s.is_string() ? ParseScaling(s.get_ref<const std::string&>()) : std::nullopt;
    if (!scaling) {
      return Status::InvalidArgument(where +
                                     ".ScalingType must be one of Auto, Linear, Logarithmic, "
                                     "ReverseLogarithmic.");
    }
    p.scaling = *scaling;
  }
  std::string label = where + " (" + Quote(p.name) + ")";
  if (p.min > p.max) {
    return Status::InvalidArgument(label + ": MinValue " + FormatContinuous(p.min) + " is greater than MaxValue " +
                                   FormatContinuous(p.max) + "; make MinValue <= MaxValue.");
  }
  if (p.scaling == Scaling::kLogarithmic && p.min <= 0) {
    return Status::InvalidArgument(label + ": Logarithmic scaling requires MinValue > 0 (got " +
                                   FormatContinuous(p.min) + "); raise MinValue or use Linear scaling.");
  }
  if (p.scaling == Scaling::kReverseLogarithmic) {
    if (integer) {
      return Status::InvalidArgument(label +
                                     ": ReverseLogarithmic scaling is only for continuous ranges; use "
                                     "Linear or Logarithmic for an integer range.");
    }
    if (p.min < 0 || p.max >= 1) {
      return Status::InvalidArgument(label + ": ReverseLogarithmic requires 0 <= MinValue <= MaxValue < 1 (got " +
                                     FormatContinuous(p.min) + ".." + FormatContinuous(p.max) +
                                     "); change the bounds or use Linear scaling.");
    }
  }
  return p;
}

Result<Parameter> ParseCategorical(const json& range, const std::string& where) {
  Parameter p;
  p.kind = ParameterKind::kCategorical;
  ASSIGN_OR_RETURN(p.name, ReadName(range, where));
  if (!range.contains("Values") || !range.at("Values").is_array()) {
    return Status::InvalidArgument(where + ".Values is required and must be a list of strings.");
  }
  const json& values = range.at("Values");
  if (values.empty()) {
    return Status::InvalidArgument(where + " (" + Quote(p.name) + "): Values must list at least one value.");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].is_string()) {
      return Status::InvalidArgument(where + ".Values[" + std::to_string(i) + "] must be a string.");
    }
    std::string v = values[i].get<std::string>();
    if (!seen.insert(v).second) {
      return Status::InvalidArgument(where + " (" + Quote(p.name) + "): the value " + Quote(v) +
                                     " is listed twice; list each value once.");
    }
    p.values.push_back(std::move(v));
  }
  return p;
}

}  // namespace

std::string_view ToString(Scaling scaling) {
  switch (scaling) {
    case Scaling::kAuto: return "Auto";
    case Scaling::kLinear: return "Linear";
    case Scaling::kLogarithmic: return "Logarithmic";
    case Scaling::kReverseLogarithmic: return "ReverseLogarithmic";
  }
  return "Auto";
}

Scaling EffectiveScaling(const Parameter& p) {
  if (p.scaling != Scaling::kAuto) return p.scaling;
  if (p.kind != ParameterKind::kCategorical && p.min > 0 && p.max >= kAutoLogRatio * p.min) {
    return Scaling::kLogarithmic;
  }
  return Scaling::kLinear;
}

std::string FormatContinuous(double value) {
  char buf[64];
  // general: the shortest digits that round-trip, laid out as %g would ("0.0001", "1e-05", "123.5").
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::general);
  if (ec != std::errc()) return "0";  // cannot happen: 64 bytes hold any double's shortest form
  return std::string(buf, end);
}

Result<SearchSpace> SearchSpace::Parse(const json& ranges, const std::set<std::string>& static_names) {
  if (!ranges.is_object()) return Status::InvalidArgument("ParameterRanges must be an object.");
  if (ranges.contains("AutoParameters") &&
      !(ranges.at("AutoParameters").is_array() && ranges.at("AutoParameters").empty())) {
    return Status::InvalidArgument("AutoParameters is not supported by Kiln.");
  }
  std::vector<Parameter> parameters;
  struct Member {
    const char* name;
    ParameterKind kind;
  };
  for (Member member : {Member{"IntegerParameterRanges", ParameterKind::kInteger},
                        Member{"ContinuousParameterRanges", ParameterKind::kContinuous},
                        Member{"CategoricalParameterRanges", ParameterKind::kCategorical}}) {
    if (!ranges.contains(member.name) || ranges.at(member.name).is_null()) continue;
    const json& list = ranges.at(member.name);
    if (!list.is_array()) return Status::InvalidArgument(std::string(member.name) + " must be a list.");
    for (size_t i = 0; i < list.size(); ++i) {
      std::string where = std::string(member.name) + "[" + std::to_string(i) + "]";
      Result<Parameter> p = member.kind == ParameterKind::kCategorical ? ParseCategorical(list[i], where)
                                                                       : ParseNumeric(list[i], where, member.kind);
      if (!p.ok()) return p.status();
      for (const Parameter& earlier : parameters) {
        if (earlier.name == p->name) {
          return Status::InvalidArgument("ParameterRanges: the hyperparameter " + Quote(p->name) +
                                         " has more than one range (" + where +
                                         "); give each hyperparameter one range.");
        }
      }
      if (static_names.count(p->name)) {
        return Status::InvalidArgument("ParameterRanges: the hyperparameter " + Quote(p->name) + " (" + where +
                                       ") is also in StaticHyperParameters; remove it from one of them.");
      }
      parameters.push_back(std::move(p).value());
    }
  }
  if (parameters.empty()) return Status::InvalidArgument("ParameterRanges must define at least one range");
  return FromParameters(std::move(parameters));
}

SearchSpace SearchSpace::FromParameters(std::vector<Parameter> parameters) {
  SearchSpace space;
  space.parameters_ = std::move(parameters);
  for (const Parameter& p : space.parameters_) {
    space.offsets_.push_back(space.dimensions_);
    space.dimensions_ += p.kind == ParameterKind::kCategorical ? p.values.size() : 1;
  }
  return space;
}

Assignment SearchSpace::Decode(const std::vector<double>& unit) const {
  Assignment out;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Parameter& p = parameters_[i];
    size_t at = offsets_[i];
    double u = at < unit.size() ? unit[at] : 0.0;
    switch (p.kind) {
      case ParameterKind::kInteger: out[p.name] = std::to_string(DecodeInteger(p, u)); break;
      case ParameterKind::kContinuous: out[p.name] = FormatContinuous(DecodeContinuous(p, u)); break;
      case ParameterKind::kCategorical: out[p.name] = p.values[ArgMax(unit, at, p.values.size())]; break;
    }
  }
  return out;
}

std::optional<std::vector<double>> SearchSpace::Encode(const Assignment& assignment) const {
  std::vector<double> unit(dimensions_, 0.0);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Parameter& p = parameters_[i];
    auto it = assignment.find(p.name);
    if (it == assignment.end()) return std::nullopt;
    size_t at = offsets_[i];
    switch (p.kind) {
      case ParameterKind::kInteger: {
        std::optional<int64_t> n = ParseInteger(it->second);
        if (!n || *n < p.min || *n > p.max) return std::nullopt;
        unit[at] = ToUnit(AxisOf(p), static_cast<double>(*n));
        break;
      }
      case ParameterKind::kContinuous: {
        std::optional<double> x = ParseDouble(it->second);
        if (!x || *x < p.min || *x > p.max) return std::nullopt;
        unit[at] = ToUnit(AxisOf(p), *x);
        break;
      }
      case ParameterKind::kCategorical: {
        auto v = std::find(p.values.begin(), p.values.end(), it->second);
        if (v == p.values.end()) return std::nullopt;
        unit[at + static_cast<size_t>(v - p.values.begin())] = 1.0;
        break;
      }
    }
  }
  return unit;
}

std::vector<double> SearchSpace::Snap(const std::vector<double>& unit) const {
  std::vector<double> out(dimensions_, 0.0);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Parameter& p = parameters_[i];
    size_t at = offsets_[i];
    double u = at < unit.size() ? std::clamp(unit[at], 0.0, 1.0) : 0.0;
    switch (p.kind) {
      case ParameterKind::kInteger: out[at] = ToUnit(AxisOf(p), static_cast<double>(DecodeInteger(p, u))); break;
      case ParameterKind::kContinuous: out[at] = u; break;
      case ParameterKind::kCategorical: out[at + ArgMax(unit, at, p.values.size())] = 1.0; break;
    }
  }
  return out;
}

bool SearchSpace::all_categorical() const {
  return std::all_of(parameters_.begin(), parameters_.end(),
                     [](const Parameter& p) { return p.kind == ParameterKind::kCategorical; });
}

uint64_t SearchSpace::grid_size() const {
  uint64_t size = 1;
  for (const Parameter& p : parameters_) {
    if (p.kind != ParameterKind::kCategorical) continue;
    uint64_t n = p.values.size();
    if (n != 0 && size > std::numeric_limits<uint64_t>::max() / n) return std::numeric_limits<uint64_t>::max();
    size *= n;
  }
  return size;
}

Assignment SearchSpace::GridPoint(uint64_t index) const {
  if (index >= grid_size()) return {};
  Assignment out;
  // Mixed radix with the LAST categorical parameter as the least significant digit.
  for (size_t i = parameters_.size(); i-- > 0;) {
    const Parameter& p = parameters_[i];
    if (p.kind != ParameterKind::kCategorical) continue;
    uint64_t n = p.values.size();
    out[p.name] = p.values[index % n];
    index /= n;
  }
  return out;
}

}  // namespace kiln::control::tuning
