// Fuzzes api::ServiceModel::ValidateInput (src/api/service_model.cc) directly with the embedded
// SageMaker model: faster than json_protocol_fuzzer (no front door, no database), so it goes
// deeper into the shape walk — patterns, lengths in code points, ranges, enums, unions, maps and
// lists of every operation.
//
// Input layout: first line = the operation name; when it is not an operation of the model, the
// operation is the model's (sorted) operation number (first byte % count), so every input
// validates something. The rest = the request body, parsed with ParseJsonBounded as the service
// parses it (non-objects are skipped: JsonService refuses them before validating).
//
// Checks besides "no crash, no sanitizer report":
//   - an error is a SerializationException or ValidationException with status 400 and a
//     non-empty, well-formed UTF-8 message (quoted values are cut at a byte limit); a ValidationException message
//     starts with "N validation error(s) detected: " and counts at most kMaxReportedErrors;
//   - validating is deterministic (the same document twice gives the same answer), and a
//     document that survives dump → parse unchanged gets the same answer again.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/service_model.h"
#include "base/json_parse.h"
#include "fuzz_support.h"

namespace {

using kiln::fuzz::Check;

const std::vector<std::string>& Operations() {
  static const std::vector<std::string> operations = [] {
    std::vector<std::string> out;
    auto model = nlohmann::json::parse(kiln::api::EmbeddedSageMakerModelJson());
    for (const auto& [name, op] : model.at("operations").items()) out.push_back(name);  // sorted (std::map)
    Check(!out.empty());
    return out;
  }();
  return operations;
}

bool SameAnswer(const std::optional<kiln::aws::AwsError>& a, const std::optional<kiln::aws::AwsError>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->code == b->code && a->message == b->message && a->http_status == b->http_status);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::QuietLogs();
  (void)Operations();
  (void)kiln::api::ServiceModel::SageMaker();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  auto [name, body] = kiln::fuzz::FirstLine(input);
  const auto model = kiln::api::ServiceModel::SageMaker();
  std::string operation(name);
  if (!model->HasOperation(operation)) operation = Operations()[data[0] % Operations().size()];

  auto document = kiln::ParseJsonBounded(body);
  if (!document.ok() || !document->is_object()) return 0;

  auto answer = model->ValidateInput(operation, *document);
  if (kiln::fuzz::Debug()) {
    std::fprintf(stderr, "%s: %s\n", operation.c_str(),
                 answer ? (answer->code + ": " + answer->message).c_str() : "valid");
  }
  if (answer) {
    Check(answer->code == "SerializationException" || answer->code == "ValidationException");
    Check(answer->http_status == 400);
    Check(!answer->message.empty());
    // Values and paths are quoted up to a byte limit: the cut must not split a character.
    Check(kiln::fuzz::ValidUtf8(answer->message));
    if (answer->code == "ValidationException") {
      int count = 0;
      size_t i = 0;
      while (i < answer->message.size() && answer->message[i] >= '0' && answer->message[i] <= '9') {
        count = count * 10 + (answer->message[i] - '0');
        if (count > kiln::api::ServiceModel::kMaxReportedErrors) break;
        ++i;
      }
      Check(count >= 1 && count <= kiln::api::ServiceModel::kMaxReportedErrors);
      std::string_view rest = std::string_view(answer->message).substr(i);
      Check(rest.starts_with(count == 1 ? " validation error detected: " : " validation errors detected: "));
    }
  }
  Check(SameAnswer(answer, model->ValidateInput(operation, *document)));

  auto reparsed = kiln::ParseJsonBounded(document->dump());
  Check(reparsed.ok());
  if (*reparsed == *document) Check(SameAnswer(answer, model->ValidateInput(operation, *reparsed)));
  return 0;
}
