#pragma once
// The record-level work of a batch transform job (spec/serving-contract.md §13.2–§13.4), as pure
// functions over bytes so that every rule is unit-tested without a container:
//
//   SplitRecords      an object's bytes → records (SplitType None, Line, RecordIO, TFRecord)
//   ApplyInputFilter  InputFilter (a JSONPath) on one Line record, CSV or JSON
//   PlanBatches       records → mini-batches (BatchStrategy SingleRecord / MultiRecord within
//                     MaxPayloadInMB); a record over the limit is an error naming it
//   BatchBody         one mini-batch's request body
//   SplitResponse     a MultiRecord response → one output record per input record (joins)
//   JoinRecord        JoinSource Input: the original input record with its output record
//   ApplyOutputFilter OutputFilter on a joined (or output) record
//   Assemble          the output object: AssembleWith None (bytes as they came) or Line
//
// A JSONPath here is the subset the contract describes (parsed once by ParseJsonPath):
//   $                   the whole record
//   .name  ['name']     an object member            [i] (negative: from the end)   an element
//   ['a','b']           a sub-object of those members, in that order
//   [i,j,...]           an array of those elements   [a:b]  [a:]  [:b]  a slice (Python rules,
//                       clamped: slices never fail)   [*]  .*  every element/member
// Selecting several values (union, slice, wildcard) is allowed only as the last step. A missing
// member or an index out of range is an error naming the path (AWS fails the object).
//
// CSV records are arrays of their column values (strings; quoted fields are unquoted on reading
// and re-quoted on writing when they contain a comma, a quote or a line break); a filter result
// that is an array is written back as its columns, a single value as one column.
//
// Errors are InvalidArgument with a message meant to end up in FailureReason after the object's
// name. Thread-safety: plain functions and values.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::serving {

enum class SplitType { kNone, kLine, kRecordIO, kTFRecord };
enum class BatchStrategy { kSingleRecord, kMultiRecord };
enum class AssembleWith { kNone, kLine };
// How a Line record's text is read for filters and joins (from TransformInput.ContentType /
// TransformOutput.Accept): CSV for text/csv, JSON for application/json and application/jsonlines,
// kOther for anything else (filters other than "$" and joins fail such records).
enum class RecordFormat { kCsv, kJson, kOther };

// "None", "Line", "RecordIO", "TFRecord" (absent: None). nullopt for anything else.
std::optional<SplitType> ParseSplitType(std::string_view text);
// "text/csv" (parameters ignored, any case) → kCsv; "application/json", "application/jsonlines",
// "application/x-jsonlines", "application/json-lines" → kJson; else kOther.
RecordFormat FormatOfContentType(std::string_view content_type);

// One record of an object: `framed` is its bytes as they appear in the object (a line with its
// '\n', a RecordIO record with header and padding, a TFRecord frame), `payload` the record without
// framing (the line without '\n'; RecordIO parts joined as MXNet's reader joins them; the TFRecord
// data). Both view the object's bytes, except a multi-part RecordIO payload (held in `joined`).
struct Record {
  std::string_view framed;
  std::string_view view;  // the payload when it is a part of the object (!multi_part)
  std::string joined;     // the payload of a multi-part RecordIO record
  bool multi_part = false;
  std::string_view payload() const { return multi_part ? std::string_view(joined) : view; }
};

// Splits `data` (decompressed). None: one record (the whole object; an empty object has none).
// Line: '\n' ends a record (a '\r' before it is data; a last line without '\n' is a record; no
// empty record after a final '\n'). RecordIO: magic 0xced7230a (little-endian), then a uint32 whose
// top 3 bits are the continuation flag (0 whole, 1 first, 2 middle, 3 last part) and low 29 bits
// the length, the data, zero padding to 4 bytes. TFRecord: uint64 length, uint32 masked CRC-32C of
// the length bytes, the data, uint32 masked CRC-32C of the data (both CRCs checked). Errors
// (InvalidArgument): a bad magic, a truncated record, a continuation out of order, a CRC mismatch —
// each naming the byte offset.
Result<std::vector<Record>> SplitRecords(std::string_view data, SplitType type);

// TFRecord's CRC mask: rotate right by 15 bits, add 0xa282ead8.
uint32_t MaskCrc32c(uint32_t crc);
// One TFRecord frame / one whole RecordIO record around `data` (for tests and benchmarks).
std::string FrameTFRecord(std::string_view data);
std::string FrameRecordIO(std::string_view data);

// A parsed JSONPath (see above). Thread-safety: immutable after parsing.
class JsonPath {
 public:
  // InvalidArgument naming the path and the position for anything outside the subset.
  static Result<JsonPath> Parse(std::string_view text);
  // True for "$" (nothing to do).
  bool identity() const { return steps_.empty(); }
  const std::string& text() const { return text_; }
  // The selected value. InvalidArgument for a missing member, an index out of range, or a step
  // applied to a value of the wrong kind (each naming the path).
  Result<nlohmann::json> Apply(const nlohmann::json& value) const;

  struct Step {
    enum class Kind { kMember, kIndex, kMembers, kIndexes, kSlice, kWildcard } kind = Kind::kMember;
    std::vector<std::string> members;
    std::vector<int64_t> indexes;
    std::optional<int64_t> slice_begin, slice_end;
  };

 private:
  std::string text_;
  std::vector<Step> steps_;
};

// CSV line (no '\n') → its column values; and back (quoting fields that need it).
std::vector<std::string> ParseCsvLine(std::string_view line);
std::string WriteCsvLine(const std::vector<std::string>& columns);

// A record's text as the value filters see (CSV: array of strings; JSON: the parsed value).
// InvalidArgument for JSON that does not parse or a kOther format.
Result<nlohmann::json> RecordValue(std::string_view text, RecordFormat format);
// A filter's result written back in the record's format (CSV: columns; a scalar is one column,
// written as its text; JSON: compact JSON).
std::string WriteRecordValue(const nlohmann::json& value, RecordFormat format);

// `path` applied to one record's text (without its line break); identity paths return the text
// unchanged. Errors: RecordValue's and JsonPath::Apply's.
Result<std::string> ApplyFilter(const JsonPath& path, std::string_view text, RecordFormat format);

// JoinSource Input (§13.4): CSV: "<input>,<output>" (the output's trailing line break dropped);
// JSON: an input object gets the output under "SageMakerOutput" (parsed when it is JSON, else the
// text); any other JSON input becomes {"SageMakerInput": input, "SageMakerOutput": output}.
// `input` and `output` carry no line break. Errors: input JSON that does not parse; kOther.
Result<std::string> JoinRecord(std::string_view input, std::string_view output, RecordFormat input_format);

// The mini-batches of `records` as [first, first + count) ranges. SingleRecord: one record each.
// MultiRecord: consecutive records while their `sizes` sum stays within `max_bytes` (0: no
// limit). `sizes[i]` is what record i adds to a request body. A record larger than `max_bytes`
// (either strategy) is InvalidArgument naming it (1-based) and both sizes.
struct BatchRange {
  size_t first = 0;
  size_t count = 0;
};
Result<std::vector<BatchRange>> PlanBatches(const std::vector<size_t>& sizes, BatchStrategy strategy,
                                            uint64_t max_bytes);

// One response split into its output records for a batch of `expected` records: a JSON array
// with `expected` elements (when the body is one), else its lines (a final line break ends the
// last line; a '\r' before '\n' is dropped). InvalidArgument when the count differs.
Result<std::vector<std::string>> SplitResponse(std::string_view body, size_t expected);

// The parameters of one instance's requests (§13.1 step 2): each from the request when it set
// it, else from the container's GET /execution-parameters answer (`execution_parameters`: its
// JSON, or null when it answered 404, an error or no JSON), else the default (MaxConcurrentTransforms
// 1, MaxPayloadInMB 6, BatchStrategy MultiRecord). The answer's BatchStrategy may be written
// MULTI_RECORD / SINGLE_RECORD or MultiRecord / SingleRecord; values of the wrong type or out of
// range (concurrency < 1, payload outside 0–100) are ignored. A request MaxConcurrentTransforms of
// 0 counts as not set.
struct TransformParameters {
  int max_concurrent = 1;
  int64_t max_payload_mb = 6;
  BatchStrategy strategy = BatchStrategy::kMultiRecord;
  uint64_t max_payload_bytes() const { return static_cast<uint64_t>(max_payload_mb) * 1048576; }
};
TransformParameters ResolveTransformParameters(const nlohmann::json& request,
                                               const nlohmann::json& execution_parameters);

// The output key of the input object whose relative path is `rel` (§13.3): `<prefix>/<rel>.out`,
// one '/' between them ("" prefix: "<rel>.out").
std::string TransformOutputKey(std::string_view output_prefix, std::string_view rel);

// AssembleWith: None appends `body` as it is; Line appends it and a '\n' unless it ends with one.
void AppendAssembled(std::string& out, std::string_view body, AssembleWith assemble);

}  // namespace kiln::serving
