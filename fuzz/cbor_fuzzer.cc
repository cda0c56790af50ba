// Fuzzes the RPC v2 CBOR codec (src/aws/cbor.h): DecodeCbor under normal and small limits, the
// writer, and the model-driven encoder.
//
// Input layout: byte 0 = flags:
//   bit 0   small limits (depth 4, 64 data items) instead of the service's (64, 200,000)
//   bit 1   also encode the decoded value as shape "Out" of a small fixed model (timestamps,
//           doubles, integers, blobs, lists, maps)
// the rest = the CBOR document.
//
// Checks besides "no crash, no sanitizer report": a refusal names its byte offset ("malformed CBOR
// at byte N: ...", N within the input); an accepted document's text strings and keys are valid
// UTF-8; re-encoding it with CborWriter::Json decodes to the same JSON; the shaped encoding always
// decodes.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "aws/cbor.h"
#include "fuzz_support.h"

namespace {

using kiln::fuzz::Check;

const nlohmann::json& Shapes() {
  static const nlohmann::json* shapes = new nlohmann::json(nlohmann::json::parse(R"({
    "Out": {"type": "structure", "members": {"When": {"shape": "Ts"}, "V": {"shape": "D"}, "N": {"shape": "I"},
            "B": {"shape": "Blob"}, "L": {"shape": "TsList"}, "M": {"shape": "DMap"}, "S": {"shape": "Out"}}},
    "Ts": {"type": "timestamp"}, "D": {"type": "double"}, "I": {"type": "integer"}, "Blob": {"type": "blob"},
    "TsList": {"type": "list", "member": {"shape": "Ts"}},
    "DMap": {"type": "map", "key": {"shape": "Str"}, "value": {"shape": "D"}}, "Str": {"type": "string"}})"));
  return *shapes;
}

void CheckStrings(const nlohmann::json& value) {
  if (value.is_string()) Check(kiln::fuzz::ValidUtf8(value.get_ref<const std::string&>()));
  if (value.is_array()) {
    for (const auto& e : value) CheckStrings(e);
  }
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      Check(kiln::fuzz::ValidUtf8(it.key()));
      CheckStrings(it.value());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string_view doc(reinterpret_cast<const char*>(data) + 1, size - 1);
  kiln::aws::CborLimits limits;
  if (flags & 1) limits = kiln::aws::CborLimits{.max_depth = 4, .max_values = 64};
  auto decoded = kiln::aws::DecodeCbor(doc, limits);
  if (!decoded.ok()) {
    const std::string& m = decoded.status().message();
    constexpr std::string_view kPrefix = "malformed CBOR at byte ";
    Check(m.rfind(kPrefix, 0) == 0);
    size_t offset = std::stoul(m.substr(kPrefix.size()));
    Check(offset <= doc.size());
    if (kiln::fuzz::Debug()) std::fprintf(stderr, "refused: %s\n", m.c_str());
    return 0;
  }
  CheckStrings(*decoded);
  kiln::aws::CborWriter writer;
  writer.Json(*decoded);
  auto again = kiln::aws::DecodeCbor(writer.bytes(), kiln::aws::CborLimits{});
  Check(again.ok());
  // dump(): NaN is written as null on both sides, so NaN != NaN does not fail the comparison.
  Check(again->dump() == decoded->dump());
  if (flags & 2) {
    std::string shaped = kiln::aws::EncodeCborShaped(Shapes(), "Out", *decoded);
    Check(kiln::aws::DecodeCbor(shaped, kiln::aws::CborLimits{.max_depth = 200, .max_values = 1 << 22}).ok());
  }
  if (kiln::fuzz::Debug()) std::fprintf(stderr, "accepted: %s\n", decoded->dump().substr(0, 400).c_str());
  return 0;
}
