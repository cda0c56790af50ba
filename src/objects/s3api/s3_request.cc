#include "objects/s3api/s3_request.h"

#include "base/encoding.h"
#include "base/query_string.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln::objects::s3 {

QueryParams QueryParams::Parse(std::string_view raw_query) {
  QueryParams out;
  // S3 reads '+' as a space; a malformed escape is kept as written.
  Result<std::vector<QueryParam>> params = ParseQueryString(raw_query, {.plus_is_space = true});
  for (QueryParam& p : *params) out.params_.emplace_back(std::move(p.name), std::move(p.value));
  return out;
}

const std::string* QueryParams::Get(std::string_view name) const {
  for (const auto& [n, v] : params_) {
    if (n == name) return &v;
  }
  return nullptr;
}

std::string QueryParams::GetOr(std::string_view name, std::string_view fallback) const {
  const std::string* v = Get(name);
  return v ? *v : std::string(fallback);
}

namespace {

// Host without its port: "b.localhost:5456" → "b.localhost", "[::1]:80" → "::1".
std::string_view StripPort(std::string_view host) {
  if (!host.empty() && host.front() == '[') {
    size_t close = host.find(']');
    return close == std::string_view::npos ? host : host.substr(1, close - 1);
  }
  size_t colon = host.rfind(':');
  if (colon != std::string_view::npos && host.find(':') == colon) return host.substr(0, colon);
  return host;
}

}  // namespace

Result<Address> ResolveAddress(std::string_view host_header, std::string_view raw_path,
                               const std::vector<std::string>& suffixes) {
  Address out;
  std::string host = ToLower(StripPort(Trim(host_header)));
  if (!host.empty() && host.back() == '.') host.pop_back();  // fully qualified form
  std::string_view path = raw_path;
  if (path.empty()) path = "/";
  if (path.front() != '/') return Status::InvalidArgument("Couldn't parse the specified URI.");
  for (const std::string& suffix : suffixes) {
    std::string lower_suffix = ToLower(suffix);
    if (host.size() > lower_suffix.size() + 1 && EndsWith(host, lower_suffix) &&
        host[host.size() - lower_suffix.size() - 1] == '.') {
      out.virtual_hosted = true;
      out.bucket = host.substr(0, host.size() - lower_suffix.size() - 1);
      auto key = UriDecode(path.substr(1), /*plus_is_space=*/false);
      if (!key) return Status::InvalidArgument("Couldn't parse the specified URI.");
      out.key = std::move(*key);
      return out;
    }
  }
  std::string_view rest = path.substr(1);
  size_t slash = rest.find('/');
  std::string_view bucket = rest.substr(0, slash);
  std::string_view key = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  auto decoded_bucket = UriDecode(bucket, false);
  auto decoded_key = UriDecode(key, false);
  if (!decoded_bucket || !decoded_key) return Status::InvalidArgument("Couldn't parse the specified URI.");
  out.bucket = std::move(*decoded_bucket);
  out.key = std::move(*decoded_key);
  return out;
}

namespace {

// Reserved by AWS for other kinds of names that share the bucket namespace.
constexpr std::string_view kReservedBucketPrefixes[] = {"xn--", "sthree-", "amzn-s3-demo-"};
constexpr std::string_view kReservedBucketSuffixes[] = {"-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"};

}  // namespace

std::optional<std::string> BucketNameViolation(std::string_view name) {
  if (name.size() < 3 || name.size() > 63) return "is not 3 to 63 characters long";
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  for (char c : name) {
    if (!alnum(c) && c != '.' && c != '-') return "has a character other than a-z, 0-9, '.' and '-'";
  }
  if (!alnum(name.front()) || !alnum(name.back())) return "does not begin and end with a letter or digit";
  if (name.find("..") != std::string_view::npos) return "has two adjacent periods";
  if (name.find(".-") != std::string_view::npos || name.find("-.") != std::string_view::npos) {
    return "has a '-' next to a '.'";
  }
  // Formatted as an IPv4 address: four dot-separated runs of digits.
  auto parts = Split(name, '.');
  if (parts.size() == 4) {
    bool all_numeric = true;
    for (auto p : parts) {
      if (!ParseUint64(p)) all_numeric = false;
    }
    if (all_numeric) return "is formatted as an IP address";
  }
  for (std::string_view prefix : kReservedBucketPrefixes) {
    if (StartsWith(name, prefix)) return "starts with the reserved prefix " + std::string(prefix);
  }
  for (std::string_view suffix : kReservedBucketSuffixes) {
    if (EndsWith(name, suffix)) return "ends with the reserved suffix " + std::string(suffix);
  }
  return std::nullopt;
}

RangeSpec ParseRange(std::string_view header, uint64_t size) {
  RangeSpec out;
  std::string_view h = Trim(header);
  if (!StartsWith(h, "bytes=")) return out;
  std::string_view spec = Trim(h.substr(6));
  if (spec.find(',') != std::string_view::npos) return out;  // S3 ignores multiple ranges
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return out;
  std::string_view first_text = Trim(spec.substr(0, dash));
  std::string_view last_text = Trim(spec.substr(dash + 1));
  if (first_text.empty()) {
    // Suffix range: the last n bytes.
    auto n = ParseUint64(last_text);
    if (!n) return out;
    if (*n == 0 || size == 0) {
      out.kind = RangeSpec::kUnsatisfiable;
      return out;
    }
    out.kind = RangeSpec::kSatisfiable;
    out.range.first = *n >= size ? 0 : size - *n;
    out.range.last = size - 1;
    return out;
  }
  auto first = ParseUint64(first_text);
  if (!first) return out;
  std::optional<uint64_t> last;
  if (!last_text.empty()) {
    last = ParseUint64(last_text);
    if (!last || *last < *first) return out;
  }
  if (*first >= size) {
    out.kind = RangeSpec::kUnsatisfiable;
    return out;
  }
  out.kind = RangeSpec::kSatisfiable;
  out.range.first = *first;
  out.range.last = (!last || *last >= size) ? size - 1 : *last;
  return out;
}

std::optional<ByteRange> ParseCopySourceRange(std::string_view header) {
  std::string_view h = Trim(header);
  if (!StartsWith(h, "bytes=")) return std::nullopt;
  std::string_view spec = h.substr(6);
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  auto first = ParseUint64(spec.substr(0, dash));
  auto last = ParseUint64(spec.substr(dash + 1));
  if (!first || !last || *last < *first) return std::nullopt;
  return ByteRange{*first, *last};
}

bool EtagListMatches(std::string_view list, std::string_view etag) {
  for (std::string_view item : Split(list, ',')) {
    item = Trim(item);
    if (item == "*") return true;
    if (StartsWith(item, "W/")) item.remove_prefix(2);
    if (item.size() >= 2 && item.front() == '"' && item.back() == '"') item = item.substr(1, item.size() - 2);
    if (!item.empty() && item == etag) return true;
  }
  return false;
}

namespace {

std::optional<int64_t> ParseHttpDateSeconds(const std::string& text) {
  std::string_view t = Trim(text);
  auto millis = ParseRfc1123(t);
  if (!millis) millis = ParseIso8601(t);
  if (!millis) return std::nullopt;
  return *millis / 1000;
}

}  // namespace

ConditionResult EvaluateConditions(const ConditionHeaders& headers, const std::string& etag,
                                   int64_t last_modified_millis, std::string* failed) {
  int64_t modified_seconds = last_modified_millis / 1000;
  if (headers.if_match) {
    if (!EtagListMatches(*headers.if_match, etag)) {
      if (failed) *failed = "If-Match";
      return ConditionResult::kPreconditionFailed;
    }
  } else if (headers.if_unmodified_since) {
    auto since = ParseHttpDateSeconds(*headers.if_unmodified_since);
    if (since && modified_seconds > *since) {
      if (failed) *failed = "If-Unmodified-Since";
      return ConditionResult::kPreconditionFailed;
    }
  }
  if (headers.if_none_match) {
    if (EtagListMatches(*headers.if_none_match, etag)) {
      if (failed) *failed = "If-None-Match";
      return ConditionResult::kNotModified;
    }
  } else if (headers.if_modified_since) {
    auto since = ParseHttpDateSeconds(*headers.if_modified_since);
    if (since && modified_seconds <= *since) {
      if (failed) *failed = "If-Modified-Since";
      return ConditionResult::kNotModified;
    }
  }
  return ConditionResult::kProceed;
}

std::optional<uint64_t> ParseQueryUint(const std::string& text, uint64_t max_value) {
  auto v = ParseUint64(Trim(text));
  if (!v || *v > max_value) return std::nullopt;
  return v;
}

std::string ListEncode(std::string_view s) { return UriEncode(s, /*keep_slash=*/true); }

XmlWriter::XmlWriter(std::string_view root) : root_(root) {
  out_ = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<";
  out_ += root;
  out_ += " xmlns=\"";
  out_ += kXmlNamespace;
  out_ += "\">";
}

XmlWriter& XmlWriter::Open(std::string_view name) {
  out_ += '<';
  out_ += name;
  out_ += '>';
  return *this;
}

XmlWriter& XmlWriter::Close(std::string_view name) {
  out_ += "</";
  out_ += name;
  out_ += '>';
  return *this;
}

XmlWriter& XmlWriter::Element(std::string_view name, std::string_view value) {
  Open(name);
  out_ += XmlEscape(value);
  return Close(name);
}

std::string XmlWriter::Finish() {
  Close(root_);
  return std::move(out_);
}

}  // namespace kiln::objects::s3
