#include "api/metric_math.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

namespace kiln::api {
namespace {

class MathParser {
 public:
  MathParser(std::string_view text, MathLookup lookup) : text_(text), lookup_(std::move(lookup)) {}

  std::variant<MathValue, std::string> Parse() {
    MathValue v;
    if (!Expr(&v)) return error_;
    Skip();
    if (pos_ != text_.size())
      return "Unexpected \"" + std::string(text_.substr(pos_, 16)) + "\" at position " + std::to_string(pos_ + 1);
    return v;
  }

 private:
  void Skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  static MathValue Combine(const MathValue& a, const MathValue& b, char op) {
    auto apply = [op](double x, double y) {
      switch (op) {
        case '+': return x + y;
        case '-': return x - y;
        case '*': return x * y;
        default: return x / y;
      }
    };
    MathValue out;
    if (!a.is_series && !b.is_series) {
      out.scalar = apply(a.scalar, b.scalar);
      return out;
    }
    out.is_series = true;
    auto put = [&](int64_t t, double v) {
      if (std::isfinite(v)) out.points[t] = v;
    };
    if (a.is_series && b.is_series) {
      for (const auto& [t, x] : a.points) {
        auto it = b.points.find(t);
        if (it != b.points.end()) put(t, apply(x, it->second));
      }
    } else if (a.is_series) {
      for (const auto& [t, x] : a.points) put(t, apply(x, b.scalar));
    } else {
      for (const auto& [t, y] : b.points) put(t, apply(a.scalar, y));
    }
    return out;
  }

  bool Expr(MathValue* out) {
    if (!Term(out)) return false;
    for (;;) {
      Skip();
      if (pos_ >= text_.size() || (text_[pos_] != '+' && text_[pos_] != '-')) return true;
      char op = text_[pos_++];
      MathValue rhs;
      if (!Term(&rhs)) return false;
      *out = Combine(*out, rhs, op);
    }
  }
  bool Term(MathValue* out) {
    if (!Factor(out)) return false;
    for (;;) {
      Skip();
      if (pos_ >= text_.size() || (text_[pos_] != '*' && text_[pos_] != '/')) return true;
      char op = text_[pos_++];
      MathValue rhs;
      if (!Factor(&rhs)) return false;
      *out = Combine(*out, rhs, op);
    }
  }
  bool Factor(MathValue* out) {
    if (++depth_ > 64) return Fail("Expression nested too deeply");
    struct Leave {
      int* depth;
      ~Leave() { --*depth; }
    } leave{&depth_};
    Skip();
    if (pos_ >= text_.size()) return Fail("Unexpected end of expression");
    char c = text_[pos_];
    if (c == '-') {
      ++pos_;
      if (!Factor(out)) return false;
      MathValue minus_one;
      minus_one.scalar = -1;
      *out = Combine(minus_one, *out, '*');
      return true;
    }
    if (c == '(') {
      ++pos_;
      if (!Expr(out)) return false;
      return Eat(')') || Fail("Missing \")\"");
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      size_t begin = pos_;
      while (pos_ < text_.size() && (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.'))
        ++pos_;
      char* end = nullptr;
      std::string number(text_.substr(begin, pos_ - begin));
      out->is_series = false;
      out->scalar = std::strtod(number.c_str(), &end);
      if (end != number.c_str() + number.size()) return Fail("Invalid number " + number);
      return true;
    }
    if (std::isalpha(static_cast<unsigned char>(c))) {
      size_t begin = pos_;
      while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
        ++pos_;
      std::string name(text_.substr(begin, pos_ - begin));
      if (Eat('(')) return Function(name, out);
      auto found = lookup_(name);
      if (auto* message = std::get_if<std::string>(&found)) return Fail(*message);
      *out = *std::get<const MathValue*>(found);
      return true;
    }
    return Fail("Unexpected \"" + std::string(1, c) + "\" at position " + std::to_string(pos_ + 1));
  }
  bool Function(const std::string& name, MathValue* out) {
    if (name != "SUM" && name != "AVG" && name != "MIN" && name != "MAX") {
      return Fail("Unsupported Metric Math function: " + name + " (Kiln evaluates SUM, AVG, MIN and MAX)");
    }
    std::vector<MathValue> args;
    if (Eat('[')) {
      do {
        MathValue v;
        if (!Expr(&v)) return false;
        args.push_back(std::move(v));
      } while (Eat(','));
      if (!Eat(']')) return Fail("Missing \"]\"");
    } else {
      MathValue v;
      if (!Expr(&v)) return false;
      args.push_back(std::move(v));
    }
    if (!Eat(')')) return Fail("Missing \")\"");
    // Per timestamp across the arguments that have it (scalars count everywhere).
    std::set<int64_t> times;
    bool any_series = false;
    for (const MathValue& a : args) {
      if (!a.is_series) continue;
      any_series = true;
      for (const auto& [t, v] : a.points) times.insert(t);
    }
    auto reduce = [&](const std::vector<double>& xs) {
      double acc = name == "MIN" ? xs[0] : name == "MAX" ? xs[0] : 0;
      for (double x : xs) {
        if (name == "MIN")
          acc = std::min(acc, x);
        else if (name == "MAX")
          acc = std::max(acc, x);
        else
          acc += x;
      }
      return name == "AVG" ? acc / static_cast<double>(xs.size()) : acc;
    };
    *out = MathValue();
    if (!any_series) {
      std::vector<double> xs;
      for (const MathValue& a : args) xs.push_back(a.scalar);
      out->scalar = reduce(xs);
      return true;
    }
    out->is_series = true;
    for (int64_t t : times) {
      std::vector<double> xs;
      for (const MathValue& a : args) {
        if (!a.is_series) {
          xs.push_back(a.scalar);
        } else if (auto it = a.points.find(t); it != a.points.end()) {
          xs.push_back(it->second);
        }
      }
      double v = reduce(xs);
      if (std::isfinite(v)) out->points[t] = v;
    }
    return true;
  }

  std::string_view text_;
  MathLookup lookup_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string error_;
};

}  // namespace

std::variant<MathValue, std::string> EvaluateMath(std::string_view text, MathLookup lookup) {
  return MathParser(text, std::move(lookup)).Parse();
}

}  // namespace kiln::api
