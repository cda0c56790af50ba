#pragma once
// The AWS Query protocol (spec/control-plane-api.md §13, §14), driven by a botocore model's
// `shapes` object: form/query-string parsing, the parameters of an input shape decoded into the
// JSON form the service handlers take, and XML answers.
//
// Decoding (DecodeQueryInput) follows botocore's QuerySerializer: a structure member is
// `<prefix>.<Member>` (or its locationName), a list is `<prefix>.member.N` (N = 1, 2, ...; the
// element name from the model's member locationName; `flattened` lists drop it), an empty list is
// `<prefix>=` with an empty value, a map `<prefix>.entry.N.key` / `.value`. Scalars: strings as
// given; integer/long decimal (a fraction is truncated, as JSON input is); float/double any
// strtod number incl. NaN/Infinity (the handlers refuse non-finite values with the service's own
// error); boolean `true`/`false`; timestamps ISO-8601 or epoch seconds → epoch seconds (a JSON
// number); blobs as given (base64). Parameters the shape does not name are ignored (AWS does).
// List indexes are taken in numeric order; gaps are allowed; an index that is not a positive
// decimal number is refused. Nesting is bounded by the model (and at 32 levels).
//
// Errors: ParseQueryForm → InvalidArgument for bad percent-encoding (answer MalformedQueryString);
// DecodeQueryInput → InvalidArgument whose message names the parameter, for the caller to answer
// as the service's invalid-parameter error.
//
// Thread-safety: free functions over their arguments.

#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "aws/errors.h"
#include "base/status.h"

namespace kiln::aws {

// `a=1&b=x%20y` → {a: "1", b: "x y"} ('+' is a space). Empty pairs are skipped; a name without
// '=' has the empty value; a repeated name keeps the last value.
Result<std::map<std::string, std::string>> ParseQueryForm(std::string_view text);

// The members of input shape `shape_name` found in `params`, as JSON (see the header comment).
Result<nlohmann::json> DecodeQueryInput(const nlohmann::json& shapes, std::string_view shape_name,
                                        const std::map<std::string, std::string>& params);

// The XML content of `value` as shape `shape_name`: one element per member present, in the
// shape's xmlOrder when it has one (else member order); lists as <member> elements, maps as
// <entry><key/><value/></entry>; timestamps (epoch-seconds numbers) as ISO-8601 with
// milliseconds; doubles in the shortest form that reads back exactly; text XML-escaped.
std::string EncodeQueryXml(const nlohmann::json& shapes, std::string_view shape_name, const nlohmann::json& value);

// A whole Query answer: <OpResponse xmlns><OpResult>result_xml</OpResult><ResponseMetadata>
// <RequestId/></ResponseMetadata></OpResponse>; `with_result` false (operations without output)
// leaves out the Result element. Status 200, Content-Type text/xml, x-amzn-RequestId.
WireResponse QueryResponse(std::string_view operation, std::string_view xmlns, bool with_result,
                           std::string_view result_xml, std::string_view request_id);

// A Query error: <ErrorResponse xmlns><Error><Type>Sender|Receiver</Type><Code/><Message/>
// </Error><RequestId/></ErrorResponse> with the error's HTTP status (SerializeError's Query form
// with the service's own namespace).
WireResponse QueryError(std::string_view xmlns, const AwsError& error, std::string_view request_id);

}  // namespace kiln::aws
