#include "base/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

namespace kiln {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Most patterns have few groups; a per-thread match data block of this many pairs serves them
// without an allocation per match. Larger patterns get their own block per call.
constexpr uint32_t kCachedPairs = 16;

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

pcre2_match_data* ThreadMatchData() {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(kCachedPairs, nullptr));
  return data.get();
}

std::string ErrorText(int code) {
  PCRE2_UCHAR buffer[256];
  int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) {
    return "PCRE2 error " + std::to_string(code);
  }
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

}  // namespace

Result<Regex> Regex::Compile(std::string_view pattern, Options options) {
  uint32_t flags = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
  if (options.ucp) {
    flags |= PCRE2_UCP;
  }
  if (options.caseless) {
    flags |= PCRE2_CASELESS;
  }
  if (options.mode == Mode::kFullMatch) {
    // Anchoring at compile time (not per match) keeps the JIT usable: PCRE2 falls back to the
    // interpreter when ANCHORED/ENDANCHORED are passed to pcre2_match.
    flags |= PCRE2_ANCHORED | PCRE2_ENDANCHORED;
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &error, &offset, nullptr);
  if (code == nullptr) {
    return Status::InvalidArgument(ErrorText(error) + " at offset " + std::to_string(offset));
  }
  auto holder = std::make_shared<Code>();
  holder->code = code;
  // JIT is an optimisation: a build without it (or a pattern it refuses) still matches correctly.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  uint32_t captures = 0;
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &captures);

  Regex regex;
  regex.code_ = std::move(holder);
  regex.pattern_ = std::string(pattern);
  regex.mode_ = options.mode;
  regex.capture_count_ = static_cast<int>(captures);
  return regex;
}

int Regex::Run(std::string_view subject, uint32_t match_options, std::optional<std::string_view>* group1) const {
  if (!code_) {
    return PCRE2_ERROR_NULL;
  }
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> owned;
  pcre2_match_data* data = nullptr;
  if (static_cast<uint32_t>(capture_count_) + 1 <= kCachedPairs) {
    data = ThreadMatchData();
  } else {
    owned.reset(pcre2_match_data_create_from_pattern(code_->code, nullptr));
    data = owned.get();
  }
  if (data == nullptr) {
    return PCRE2_ERROR_NOMEMORY;
  }
  // An empty string_view may carry a null pointer; PCRE2 wants a valid one even for length 0.
  PCRE2_SPTR start =
      subject.data() != nullptr ? reinterpret_cast<PCRE2_SPTR>(subject.data()) : reinterpret_cast<PCRE2_SPTR>("");
  int rc = pcre2_match(code_->code, start, subject.size(), 0, match_options, data, nullptr);
  if (rc > 0 && group1 != nullptr) {
    group1->reset();
    if (capture_count_ >= 1) {
      PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
      if (rc >= 2 && ovector[2] != PCRE2_UNSET) {
        *group1 = subject.substr(ovector[2], ovector[3] - ovector[2]);
      }
    }
  }
  return rc;
}

bool Regex::Match(std::string_view subject) const { return Run(subject, 0, nullptr) > 0; }

bool Regex::FullMatch(std::string_view subject) const {
  if (mode_ == Mode::kFullMatch) {
    return Run(subject, 0, nullptr) > 0;
  }
  return Run(subject, PCRE2_ANCHORED | PCRE2_ENDANCHORED, nullptr) > 0;
}

bool Regex::Search(std::string_view subject) const { return Run(subject, 0, nullptr) > 0; }

std::optional<std::string_view> Regex::SearchFirstGroup(std::string_view subject) const {
  std::optional<std::string_view> group1;
  if (Run(subject, 0, &group1) <= 0) {
    return std::nullopt;
  }
  return group1;
}

}  // namespace kiln
