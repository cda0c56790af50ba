#pragma once
// The one parser of "a=b&c=d" text: URL query strings and form-encoded bodies. Callers differ in
// what '+' means and in what a bad %XX escape does, so those are options, not separate parsers:
//
//   caller                               plus_is_space  bad escape   names
//   SigV4 canonical query (aws/sigv4)    no             keep raw     decoded
//   SigV2 string to sign (aws/sigv2)     no             keep raw     raw (not decoded)
//   S3 request parameters (s3api)        yes            keep raw     decoded
//   STS Query form (api/front_door)      yes            drop pair    decoded
//   CloudWatch Query (aws/query_codec)   yes            refuse       decoded
//
// SigV4 and SigV2 sign the query as sent, where '+' is a literal plus (RFC 3986); form bodies and
// the services' own parameters read '+' as a space (application/x-www-form-urlencoded).
//
// Common to every mode: the text is split on '&'; empty segments ("a=1&&b=2", a trailing '&')
// are skipped; a segment without '=' is a name with an empty value; only the first '=' splits
// ("a=b=c" is a → "b=c"); repeated names are all kept, in order.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kiln {

struct QueryParam {
  std::string name;
  std::string value;
};

enum class QueryBadEscape {
  kKeepRaw,   // the field with the bad escape is kept as written (the other field still decoded)
  kDropPair,  // the whole name=value pair is left out
  kRefuse,    // ParseQueryString fails (InvalidArgument)
};

struct QueryStringOptions {
  bool plus_is_space = false;
  QueryBadEscape bad_escape = QueryBadEscape::kKeepRaw;
  bool decode_names = true;  // false: names as written (values still decoded)
};

// Parses `text` (without a leading '?'). Fails only under QueryBadEscape::kRefuse, with
// InvalidArgument "The parameter <name as written, at most 128 bytes> is not correctly
// percent-encoded."
Result<std::vector<QueryParam>> ParseQueryString(std::string_view text, const QueryStringOptions& options = {});

// The value of the first parameter called `name`, or null.
const std::string* FindQueryParam(const std::vector<QueryParam>& params, std::string_view name);

// Name → value, the last of repeated names winning (the Query protocol's reading).
std::map<std::string, std::string> QueryParamMap(std::vector<QueryParam> params);

}  // namespace kiln
