#pragma once
// Regex: a compiled PCRE2 pattern (Perl/Python syntax, lazy quantifiers, \p{L} classes).
//
// Compile once, match from any number of threads: a Regex is an immutable value (copies share the
// compiled code) and every match call uses its own match data (a per-thread cache, or a fresh one
// for patterns with many groups). Patterns are compiled in UTF mode and JIT-compiled when the
// library supports it. Subjects need not be valid UTF-8: invalid sequences simply never match a
// character (PCRE2_MATCH_INVALID_UTF).
//
//   ASSIGN_OR_RETURN(Regex loss, Regex::Compile("Train Loss = (.*?);"));
//   std::optional<std::string_view> value = loss.SearchFirstGroup(line);
//
//   ASSIGN_OR_RETURN(Regex name, Regex::Compile("[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}",
//                                               {.mode = Regex::Mode::kFullMatch}));
//   bool ok = name.Match("my-job");  // anchored at both ends

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kiln {

class Regex {
 public:
  enum class Mode {
    kSearch,     // Match() finds the pattern anywhere in the subject
    kFullMatch,  // Match() requires the pattern to match the whole subject (compiled anchored, so JIT applies)
  };
  struct Options {
    Mode mode = Mode::kSearch;
    // Unicode properties for \d \w \s \b and POSIX classes (Python 3 semantics). Off gives Java's
    // defaults, where those are ASCII-only; \p{..} classes work either way.
    bool ucp = true;
    bool caseless = false;
  };

  // Compiles `pattern`. A syntax error → InvalidArgument "<PCRE2 message> at offset <n>".
  static Result<Regex> Compile(std::string_view pattern, Options options);
  static Result<Regex> Compile(std::string_view pattern) { return Compile(pattern, Options{}); }

  // Matches according to the compiled mode.
  bool Match(std::string_view subject) const;
  // True when the whole subject matches (uses the anchored code when compiled kFullMatch).
  bool FullMatch(std::string_view subject) const;
  // True when the pattern matches somewhere in the subject. On a kFullMatch regex this is the same
  // as FullMatch (the anchoring is part of the compiled code).
  bool Search(std::string_view subject) const;
  // The first capture group of the first match (a view into `subject`); nullopt when the pattern
  // does not match, has no group, or group 1 did not take part in the match.
  std::optional<std::string_view> SearchFirstGroup(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }
  Mode mode() const { return mode_; }
  // Number of capture groups in the pattern.
  int capture_count() const { return capture_count_; }

 private:
  struct Code;
  Regex() = default;
  // Runs one match; returns the PCRE2 result (>0 match, <=0 none/error) and fills `group1`.
  int Run(std::string_view subject, uint32_t match_options, std::optional<std::string_view>* group1) const;

  std::shared_ptr<const Code> code_;
  std::string pattern_;
  Mode mode_ = Mode::kSearch;
  int capture_count_ = 0;
};

}  // namespace kiln
