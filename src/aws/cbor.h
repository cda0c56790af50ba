#pragma once
// CBOR (RFC 8949) for the Smithy RPC v2 CBOR protocol (spec/control-plane-api.md §13): a bounded
// decoder into nlohmann::json, a writer, and a model-driven encoder for responses.
//
// Decoding maps CBOR onto the JSON the service handlers and the model validator already take:
//   unsigned/negative integers → JSON integers (values outside int64 refused), half/single/double
//   floats → doubles (NaN and infinities kept: the handlers refuse them with the service's error),
//   text strings → strings (must be valid UTF-8), byte strings → base64 strings (the model's
//   blob form), arrays → arrays, maps → objects (keys must be text strings, no duplicates),
//   false/true/null/undefined → booleans/null, tag 1 (epoch-seconds timestamp, integer or float)
//   → its number. Any other tag or simple value, a reserved additional-info value, a break outside
//   an indefinite item, trailing bytes, truncation, nesting deeper than `max_depth` or more than
//   `max_values` items → InvalidArgument naming the byte offset. Indefinite-length strings, arrays
//   and maps are accepted (RFC 8949 §3.2.2–3). Nothing is allocated from a declared length before
//   the bytes are seen, so a 9-byte input cannot ask for gigabytes.
//
// nlohmann::json::from_cbor is not used: it has no depth bound (a deeply nested input overflows the
// stack) and its tag handling cannot keep tag 1's value while refusing other tags.
//
// Thread-safety: free functions over their arguments; CborWriter is a plain value.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "aws/errors.h"
#include "base/status.h"

namespace kiln::aws {

struct CborLimits {
  int max_depth = 64;          // arrays/maps/tags nested deeper are refused
  size_t max_values = 200000;  // data items in the whole document
};

// Decodes exactly one data item spanning all of `bytes`. See the header comment for the mapping.
Result<nlohmann::json> DecodeCbor(std::string_view bytes, const CborLimits& limits = {});

// Appends CBOR data items to a byte string (definite lengths, shortest integer heads).
class CborWriter {
 public:
  void Uint(uint64_t value) { Head(0, value); }
  void Int(int64_t value);
  void Double(double value);  // always the 8-byte form (what the model's double shapes say)
  void Bool(bool value) { out_.push_back(static_cast<char>(value ? 0xf5 : 0xf4)); }
  void Null() { out_.push_back(static_cast<char>(0xf6)); }
  void Text(std::string_view text);
  void Bytes(std::string_view bytes);
  void ArrayHeader(uint64_t size) { Head(4, size); }
  void MapHeader(uint64_t size) { Head(5, size); }
  void Tag(uint64_t tag) { Head(6, tag); }
  // Epoch seconds as tag 1: an integer when whole, else a double.
  void Timestamp(double epoch_seconds);
  // Any JSON value with JSON's own types: integers, doubles, strings, arrays, objects.
  void Json(const nlohmann::json& value);

  const std::string& bytes() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Head(int major, uint64_t value);
  std::string out_;
};

// Encodes `value` (JSON as a handler returns it) as shape `shape_name` of a botocore model's
// `shapes` object: timestamp shapes become tag 1 over epoch seconds (JSON numbers or ISO-8601
// strings), double/float shapes CBOR doubles, integer/long shapes integers, blob shapes byte
// strings (from base64), structures maps of the members present (in the value's order, members
// the shape does not know dropped), lists arrays, maps maps. A value whose JSON type does not fit
// its shape is written with its JSON type (the shapes are Kiln's own answers, so this is a bug
// guard, not a client error). An unknown shape name writes the value with JSON types.
std::string EncodeCborShaped(const nlohmann::json& shapes, std::string_view shape_name, const nlohmann::json& value);

// An RPC v2 CBOR error answer: the error's status, body the CBOR map {__type: code, message},
// Content-Type application/cbor, smithy-protocol: rpc-v2-cbor, and JSON 1.0's error headers
// (x-amzn-RequestId, x-amzn-ErrorType, x-amzn-query-error "<code>;Sender|Receiver", Date) —
// botocore's RpcV2CBORParser reads the code from x-amzn-query-error for query-compatible services.
WireResponse SerializeCborError(const AwsError& error, std::string_view request_id);

}  // namespace kiln::aws
