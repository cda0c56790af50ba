#pragma once
// Request-side pieces of the S3 front, kept free of I/O so they can be tested alone: addressing
// (path vs virtual-hosted style), query parsing, Range and conditional-header evaluation, and a
// tiny XML writer for response documents. Internal to s3api/; all functions are pure and
// thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::objects::s3 {

inline constexpr std::string_view kXmlNamespace = "http://s3.amazonaws.com/doc/2006-03-01/";

// Decoded query parameters, in request order. Names and values are percent-decoded once ('+'
// means space, as in forms); a value with a bad escape is kept raw.
class QueryParams {
 public:
  static QueryParams Parse(std::string_view raw_query);
  bool Has(std::string_view name) const { return Get(name) != nullptr; }
  // First value of `name`, or nullptr. A parameter without '=' has the empty value.
  const std::string* Get(std::string_view name) const;
  std::string GetOr(std::string_view name, std::string_view fallback) const;
  const std::vector<std::pair<std::string, std::string>>& all() const { return params_; }

 private:
  std::vector<std::pair<std::string, std::string>> params_;
};

// Where a request points. `bucket` empty: the service (ListBuckets). `key` empty: the bucket.
struct Address {
  std::string bucket;
  std::string key;
  bool virtual_hosted = false;
};

// Splits Host (with optional ":port" or "[v6]:port") into the bucket and key. A Host of the form
// "<bucket>.<suffix>" for one of `suffixes` selects virtual-hosted style; everything else is path
// style. The key is percent-decoded exactly once ('+' stays '+'). InvalidArgument on a bad escape.
Result<Address> ResolveAddress(std::string_view host_header, std::string_view raw_path,
                               const std::vector<std::string>& suffixes);

// AWS's general purpose bucket naming rules, applied by CreateBucket only (spec §10.1; the S3 user
// guide's "General purpose bucket naming rules"), so that a bucket created before a rule existed
// stays usable:
//   3–63 characters of a-z 0-9 '.' '-'; begins and ends with a letter or digit; no two adjacent
//   periods (and, as S3 answers, no '-' beside a '.'); not formatted as an IPv4 address;
//   not starting with the reserved prefixes xn--, sthree- (which covers sthree-configurator),
//   amzn-s3-demo-; not ending with the reserved suffixes -s3alias (access point aliases),
//   --ol-s3 (Object Lambda access point aliases), .mrap (Multi-Region Access Points), --x-s3
//   (directory buckets), --table-s3 (table buckets).
// Returns the rule `name` breaks as a phrase ("starts with the reserved prefix xn--"), or
// nullopt when it keeps all of them. S3's answer is the same for every rule: InvalidBucketName,
// 400, "The specified bucket is not valid.".
std::optional<std::string> BucketNameViolation(std::string_view name);
inline bool IsValidBucketName(std::string_view name) { return !BucketNameViolation(name).has_value(); }

// Outcome of a Range header against an object of `size` bytes.
struct RangeSpec {
  enum Kind { kNone, kSatisfiable, kUnsatisfiable } kind = kNone;
  ByteRange range;
};
// "bytes=a-b" / "bytes=a-" / "bytes=-n". As S3: a header that is not a single well-formed byte
// range (other units, several ranges, a > b, junk) is ignored (kNone → whole object); a range
// starting at or beyond the end, or an empty suffix, is kUnsatisfiable; b is clamped to size-1.
RangeSpec ParseRange(std::string_view header, uint64_t size);

// Parses "bytes=first-last" exactly (x-amz-copy-source-range). nullopt when malformed.
std::optional<ByteRange> ParseCopySourceRange(std::string_view header);

struct ConditionHeaders {
  const std::string* if_match = nullptr;
  const std::string* if_none_match = nullptr;
  const std::string* if_modified_since = nullptr;
  const std::string* if_unmodified_since = nullptr;
};
enum class ConditionResult { kProceed, kPreconditionFailed, kNotModified };
// Evaluates conditional headers with S3's precedence: If-Match (when present, If-Unmodified-Since
// is not consulted) then If-Unmodified-Since → 412; If-None-Match (when present,
// If-Modified-Since is not consulted) then If-Modified-Since → 304. Dates are compared at
// second granularity; an unparsable date is ignored. `failed` names the header that failed.
ConditionResult EvaluateConditions(const ConditionHeaders& headers, const std::string& etag,
                                   int64_t last_modified_millis, std::string* failed);

// True when `etag` appears in the comma-separated If-Match / If-None-Match `list` (quotes and W/
// tolerated; "*" matches anything).
bool EtagListMatches(std::string_view list, std::string_view etag);

// Parses a decimal unsigned value for a query parameter; nullopt for junk or > max_value.
std::optional<uint64_t> ParseQueryUint(const std::string& text, uint64_t max_value);

// URL-encodes a key or prefix for encoding-type=url responses (every byte but the RFC 3986
// unreserved set and '/').
std::string ListEncode(std::string_view s);

// Builds an XML response document. Element values are escaped; names are trusted literals.
class XmlWriter {
 public:
  // Starts the document with the XML declaration and `root` carrying the S3 namespace.
  explicit XmlWriter(std::string_view root);
  XmlWriter& Open(std::string_view name);
  XmlWriter& Close(std::string_view name);
  XmlWriter& Element(std::string_view name, std::string_view value);
  // Closes the root and returns the document.
  std::string Finish();

 private:
  std::string root_;
  std::string out_;
};

}  // namespace kiln::objects::s3
