#include "serving/transform_records.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "base/hash.h"

namespace kiln::serving {
namespace {

using nlohmann::json;

constexpr uint32_t kRecordIOMagic = 0xced7230a;

uint32_t ReadU32(std::string_view data, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(data[at + i]);
  return v;
}

uint64_t ReadU64(std::string_view data, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(data[at + i]);
  return v;
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

Record WholeRecord(std::string_view framed, std::string_view payload) {
  Record r;
  r.framed = framed;
  r.view = payload;
  return r;
}

JsonPath::Step StepOf(JsonPath::Step::Kind kind) {
  JsonPath::Step step;
  step.kind = kind;
  return step;
}

Status Bad(std::string message) { return Status::InvalidArgument(std::move(message)); }

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

Result<std::vector<Record>> SplitLines(std::string_view data) {
  std::vector<Record> out;
  size_t at = 0;
  while (at < data.size()) {
    size_t end = data.find('\n', at);
    Record r;
    if (end == std::string_view::npos) {
      r.framed = data.substr(at);
      r.view = r.framed;
      at = data.size();
    } else {
      r.framed = data.substr(at, end + 1 - at);
      r.view = data.substr(at, end - at);
      at = end + 1;
    }
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<Record>> SplitRecordIO(std::string_view data) {
  std::vector<Record> out;
  size_t at = 0;
  bool in_multi = false;   // a multi-part record is open
  size_t multi_start = 0;  // the offset of its first part
  std::string joined;
  while (at < data.size()) {
    if (data.size() - at < 8) {
      return Bad("RecordIO record at byte " + std::to_string(at) + " is truncated (its 8-byte header is incomplete)");
    }
    if (ReadU32(data, at) != kRecordIOMagic) {
      return Bad("RecordIO record at byte " + std::to_string(at) + " does not start with the magic number 0xced7230a");
    }
    const uint32_t lrecord = ReadU32(data, at + 4);
    const uint32_t cflag = lrecord >> 29;
    const size_t length = lrecord & ((1u << 29) - 1);
    const size_t padded = (length + 3) / 4 * 4;
    if (data.size() - at - 8 < padded) {
      return Bad("RecordIO record at byte " + std::to_string(at) + " is truncated (length " + std::to_string(length) +
                 ", " + std::to_string(data.size() - at - 8) + " bytes left)");
    }
    const std::string_view part = data.substr(at + 8, length);
    const size_t next = at + 8 + padded;
    switch (cflag) {
      case 0:
        if (in_multi) {
          return Bad("RecordIO record at byte " + std::to_string(at) + " is whole while a multi-part record is open");
        }
        out.push_back(WholeRecord(data.substr(at, next - at), part));
        break;
      case 1:
        if (in_multi) {
          return Bad("RecordIO record at byte " + std::to_string(at) + " starts a part while another is open");
        }
        in_multi = true;
        multi_start = at;
        joined.assign(part);
        break;
      case 2:
      case 3: {
        if (!in_multi) {
          return Bad("RecordIO record at byte " + std::to_string(at) + " continues a record that was never started");
        }
        // MXNet's writer cut the data at each magic number it held; its reader puts them back.
        const uint32_t magic = kRecordIOMagic;
        char bytes[4];
        std::memcpy(bytes, &magic, 4);  // little-endian hosts only (as the framing)
        joined.append(bytes, 4);
        joined.append(part);
        if (cflag == 3) {
          Record r;
          r.framed = data.substr(multi_start, next - multi_start);
          r.joined = std::move(joined);
          r.multi_part = true;
          joined.clear();
          out.push_back(std::move(r));
          in_multi = false;
        }
        break;
      }
      default:
        return Bad("RecordIO record at byte " + std::to_string(at) + " has an unknown continuation flag " +
                   std::to_string(cflag));
    }
    at = next;
  }
  if (in_multi) {
    return Bad("RecordIO multi-part record at byte " + std::to_string(multi_start) + " has no last part");
  }
  return out;
}

Result<std::vector<Record>> SplitTFRecord(std::string_view data) {
  std::vector<Record> out;
  size_t at = 0;
  while (at < data.size()) {
    if (data.size() - at < 12) {
      return Bad("TFRecord at byte " + std::to_string(at) + " is truncated (its 12-byte header is incomplete)");
    }
    const uint64_t length = ReadU64(data, at);
    if (MaskCrc32c(Crc32cUpdate(0, data.substr(at, 8))) != ReadU32(data, at + 8)) {
      return Bad("TFRecord at byte " + std::to_string(at) + " has a corrupt length (its CRC does not match)");
    }
    if (data.size() - at - 12 < length || data.size() - at - 12 - length < 4) {
      return Bad("TFRecord at byte " + std::to_string(at) + " is truncated (length " + std::to_string(length) + ", " +
                 std::to_string(data.size() - at - 12) + " bytes left)");
    }
    const std::string_view payload = data.substr(at + 12, length);
    if (MaskCrc32c(Crc32cUpdate(0, payload)) != ReadU32(data, at + 12 + length)) {
      return Bad("TFRecord at byte " + std::to_string(at) + " has corrupt data (its CRC does not match)");
    }
    const size_t next = at + 12 + length + 4;
    out.push_back(WholeRecord(data.substr(at, next - at), payload));
    at = next;
  }
  return out;
}

// ---- JSONPath ----

class PathParser {
 public:
  explicit PathParser(std::string_view text) : text_(text) {}

  Result<std::vector<JsonPath::Step>> Parse() {
    std::vector<JsonPath::Step> steps;
    SkipSpaces();
    if (!Eat('$')) return Error("must start with '$'");
    while (true) {
      SkipSpaces();
      if (at_ == text_.size()) break;
      if (!steps.empty() && steps.back().kind != JsonPath::Step::Kind::kMember &&
          steps.back().kind != JsonPath::Step::Kind::kIndex) {
        return Error("selects several values before its last step, which Kiln does not support");
      }
      if (Eat('.')) {
        if (Eat('*')) {
          steps.push_back(StepOf(JsonPath::Step::Kind::kWildcard));
          continue;
        }
        size_t start = at_;
        while (at_ < text_.size() &&
               (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_' || text_[at_] == '-')) {
          ++at_;
        }
        if (start == at_) return Error("has '.' without a member name");
        JsonPath::Step step = StepOf(JsonPath::Step::Kind::kMember);
        step.members = {std::string(text_.substr(start, at_ - start))};
        steps.push_back(std::move(step));
        continue;
      }
      if (!Eat('[')) return Error("has an unexpected character '" + std::string(1, text_[at_]) + "'");
      auto step = Bracket();
      if (!step.ok()) return step.status();
      steps.push_back(std::move(step).value());
    }
    return steps;
  }

 private:
  Result<JsonPath::Step> Bracket() {
    SkipSpaces();
    if (Eat('*')) {
      SkipSpaces();
      if (!Eat(']')) return Error("has '[*' without ']'");
      return StepOf(JsonPath::Step::Kind::kWildcard);
    }
    if (at_ < text_.size() && (text_[at_] == '\'' || text_[at_] == '"')) {
      std::vector<std::string> members;
      while (true) {
        SkipSpaces();
        if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"')) return Error("expects a quoted name");
        const char quote = text_[at_++];
        std::string name;
        while (at_ < text_.size() && text_[at_] != quote) {
          if (text_[at_] == '\\' && at_ + 1 < text_.size()) ++at_;
          name.push_back(text_[at_++]);
        }
        if (!Eat(quote)) return Error("has an unterminated quoted name");
        members.push_back(std::move(name));
        SkipSpaces();
        if (Eat(']')) break;
        if (!Eat(',')) return Error("expects ',' or ']' after a name");
      }
      JsonPath::Step step;
      step.kind = members.size() == 1 ? JsonPath::Step::Kind::kMember : JsonPath::Step::Kind::kMembers;
      step.members = std::move(members);
      return step;
    }
    // Indexes or a slice.
    std::optional<int64_t> first = Integer();
    SkipSpaces();
    if (Eat(':')) {
      JsonPath::Step step = StepOf(JsonPath::Step::Kind::kSlice);
      step.slice_begin = first;
      SkipSpaces();
      step.slice_end = Integer();
      SkipSpaces();
      if (!Eat(']')) return Error("has a slice without ']' (steps are not supported)");
      return step;
    }
    if (!first) return Error("expects an index, a slice, '*' or a quoted name inside '[]'");
    std::vector<int64_t> indexes{*first};
    while (true) {
      SkipSpaces();
      if (Eat(']')) break;
      if (!Eat(',')) return Error("expects ',' or ']' after an index");
      SkipSpaces();
      auto next = Integer();
      if (!next) return Error("expects an index after ','");
      indexes.push_back(*next);
    }
    JsonPath::Step step;
    step.kind = indexes.size() == 1 ? JsonPath::Step::Kind::kIndex : JsonPath::Step::Kind::kIndexes;
    step.indexes = std::move(indexes);
    return step;
  }

  std::optional<int64_t> Integer() {
    size_t start = at_;
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    size_t digits = at_;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
    if (digits == at_ || at_ - digits > 9) {
      at_ = start;
      return std::nullopt;
    }
    return std::stoll(std::string(text_.substr(start, at_ - start)));
  }

  bool Eat(char c) {
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void SkipSpaces() {
    while (at_ < text_.size() && text_[at_] == ' ') ++at_;
  }
  Status Error(const std::string& what) {
    return Bad("The JSONPath '" + std::string(text_) + "' " + what + " (at character " + std::to_string(at_ + 1) + ")");
  }

  std::string_view text_;
  size_t at_ = 0;
};

std::string KindOf(const json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  return "null";
}

}  // namespace

std::optional<SplitType> ParseSplitType(std::string_view text) {
  if (text.empty() || text == "None") return SplitType::kNone;
  if (text == "Line") return SplitType::kLine;
  if (text == "RecordIO") return SplitType::kRecordIO;
  if (text == "TFRecord") return SplitType::kTFRecord;
  return std::nullopt;
}

RecordFormat FormatOfContentType(std::string_view content_type) {
  std::string type = Lower(content_type.substr(0, content_type.find(';')));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  while (!type.empty() && type.front() == ' ') type.erase(type.begin());
  if (type == "text/csv") return RecordFormat::kCsv;
  if (type == "application/json" || type == "application/jsonlines" || type == "application/x-jsonlines" ||
      type == "application/json-lines") {
    return RecordFormat::kJson;
  }
  return RecordFormat::kOther;
}

Result<std::vector<Record>> SplitRecords(std::string_view data, SplitType type) {
  switch (type) {
    case SplitType::kNone: {
      std::vector<Record> out;
      if (!data.empty()) out.push_back(WholeRecord(data, data));
      return out;
    }
    case SplitType::kLine: return SplitLines(data);
    case SplitType::kRecordIO: return SplitRecordIO(data);
    case SplitType::kTFRecord: return SplitTFRecord(data);
  }
  return Bad("unknown SplitType");
}

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string FrameTFRecord(std::string_view data) {
  std::string out;
  PutU64(out, data.size());
  PutU32(out, MaskCrc32c(Crc32cUpdate(0, out)));
  out.append(data);
  PutU32(out, MaskCrc32c(Crc32cUpdate(0, data)));
  return out;
}

std::string FrameRecordIO(std::string_view data) {
  std::string out;
  PutU32(out, kRecordIOMagic);
  PutU32(out, static_cast<uint32_t>(data.size()));
  out.append(data);
  while (out.size() % 4 != 0) out.push_back('\0');
  return out;
}

Result<JsonPath> JsonPath::Parse(std::string_view text) {
  PathParser parser(text);
  auto steps = parser.Parse();
  if (!steps.ok()) return steps.status();
  JsonPath path;
  path.text_ = std::string(text);
  path.steps_ = std::move(steps).value();
  return path;
}

Result<json> JsonPath::Apply(const json& value) const {
  json current = value;
  for (const Step& step : steps_) {
    const auto fail = [&](const std::string& why) {
      return Bad("The JSONPath '" + text_ + "' does not apply to the record: " + why);
    };
    switch (step.kind) {
      case Step::Kind::kMember:
      case Step::Kind::kMembers: {
        if (!current.is_object()) return fail("it selects members of " + KindOf(current));
        json picked = json::object();
        for (const std::string& m : step.members) {
          auto it = current.find(m);
          if (it == current.end()) return fail("the record has no member '" + m + "'");
          picked[m] = *it;
        }
        if (step.kind == Step::Kind::kMember) {
          json next = std::move(picked[step.members[0]]);
          current = std::move(next);
        } else {
          // A sub-object of those members (written with its keys sorted, as every object).
          current = std::move(picked);
        }
        break;
      }
      case Step::Kind::kIndex:
      case Step::Kind::kIndexes: {
        if (!current.is_array()) return fail("it selects elements of " + KindOf(current));
        const int64_t n = static_cast<int64_t>(current.size());
        json picked = json::array();
        for (int64_t i : step.indexes) {
          const int64_t at = i < 0 ? n + i : i;
          if (at < 0 || at >= n) {
            return fail("index " + std::to_string(i) + " is out of range for " + std::to_string(n) + " values");
          }
          picked.push_back(current[static_cast<size_t>(at)]);
        }
        if (step.kind == Step::Kind::kIndex) {
          json next = std::move(picked[0]);
          current = std::move(next);
        } else {
          current = std::move(picked);
        }
        break;
      }
      case Step::Kind::kSlice: {
        if (!current.is_array()) return fail("it slices " + KindOf(current));
        const int64_t n = static_cast<int64_t>(current.size());
        const auto clamp = [n](std::optional<int64_t> v, int64_t dflt) {
          if (!v) return dflt;
          int64_t at = *v < 0 ? n + *v : *v;
          return std::clamp<int64_t>(at, 0, n);
        };
        const int64_t begin = clamp(step.slice_begin, 0), end = clamp(step.slice_end, n);
        json picked = json::array();
        for (int64_t i = begin; i < end; ++i) picked.push_back(current[static_cast<size_t>(i)]);
        current = std::move(picked);
        break;
      }
      case Step::Kind::kWildcard: {
        json picked = json::array();
        if (current.is_array() || current.is_object()) {
          for (const auto& element : current) picked.push_back(element);
        } else {
          return fail("it selects every element of " + KindOf(current));
        }
        current = std::move(picked);
        break;
      }
    }
  }
  return current;
}

std::vector<std::string> ParseCsvLine(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::vector<std::string> out;
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < line.size() && line[i + 1] == '"') {
          field.push_back('"');
          ++i;
        } else {
          quoted = false;
        }
      } else {
        field.push_back(c);
      }
    } else if (c == '"' && field.empty()) {
      quoted = true;
    } else if (c == ',') {
      out.push_back(std::move(field));
      field.clear();
    } else {
      field.push_back(c);
    }
  }
  out.push_back(std::move(field));
  return out;
}

std::string WriteCsvLine(const std::vector<std::string>& columns) {
  std::string out;
  for (size_t i = 0; i < columns.size(); ++i) {
    if (i > 0) out.push_back(',');
    const std::string& c = columns[i];
    if (c.find_first_of(",\"\r\n") == std::string::npos) {
      out += c;
      continue;
    }
    out.push_back('"');
    for (char ch : c) {
      if (ch == '"') out.push_back('"');
      out.push_back(ch);
    }
    out.push_back('"');
  }
  return out;
}

Result<json> RecordValue(std::string_view text, RecordFormat format) {
  switch (format) {
    case RecordFormat::kCsv: {
      json columns = json::array();
      for (std::string& c : ParseCsvLine(text)) columns.push_back(std::move(c));
      return columns;
    }
    case RecordFormat::kJson: {
      json value = json::parse(text, nullptr, false);
      if (value.is_discarded()) return Bad("a record is not valid JSON");
      return value;
    }
    case RecordFormat::kOther: break;
  }
  return Bad(
      "DataProcessing filters and joins apply to CSV (text/csv) and JSON (application/json, "
      "application/jsonlines) records only");
}

std::string WriteRecordValue(const json& value, RecordFormat format) {
  if (format != RecordFormat::kCsv) return value.dump();
  const auto text = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  if (!value.is_array()) return WriteCsvLine({text(value)});
  std::vector<std::string> columns;
  for (const json& v : value) columns.push_back(text(v));
  return WriteCsvLine(columns);
}

Result<std::string> ApplyFilter(const JsonPath& path, std::string_view text, RecordFormat format) {
  if (path.identity()) return std::string(text);
  auto value = RecordValue(text, format);
  if (!value.ok()) return value.status();
  auto selected = path.Apply(*value);
  if (!selected.ok()) return selected.status();
  return WriteRecordValue(*selected, format);
}

Result<std::string> JoinRecord(std::string_view input, std::string_view output, RecordFormat input_format) {
  while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.remove_suffix(1);
  std::string_view in = input;
  if (!in.empty() && in.back() == '\r') in.remove_suffix(1);
  switch (input_format) {
    case RecordFormat::kCsv: return std::string(in) + "," + std::string(output);
    case RecordFormat::kJson: {
      json value = json::parse(in, nullptr, false);
      if (value.is_discarded()) return Bad("an input record is not valid JSON, so it cannot be joined");
      json out_value = json::parse(output, nullptr, false);
      if (out_value.is_discarded()) out_value = std::string(output);
      if (value.is_object()) {
        value["SageMakerOutput"] = std::move(out_value);
        return value.dump();
      }
      return json{{"SageMakerInput", std::move(value)}, {"SageMakerOutput", std::move(out_value)}}.dump();
    }
    case RecordFormat::kOther: break;
  }
  return Bad(
      "JoinSource Input applies to CSV (text/csv) and JSON (application/json, application/jsonlines) input "
      "only");
}

Result<std::vector<BatchRange>> PlanBatches(const std::vector<size_t>& sizes, BatchStrategy strategy,
                                            uint64_t max_bytes) {
  std::vector<BatchRange> out;
  uint64_t total = 0;  // bytes of the last batch
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (max_bytes != 0 && sizes[i] > max_bytes) {
      return Bad("record " + std::to_string(i + 1) + " is " + std::to_string(sizes[i]) +
                 " bytes, more than MaxPayloadInMB allows (" + std::to_string(max_bytes) + " bytes)");
    }
    if (strategy == BatchStrategy::kMultiRecord && !out.empty() && (max_bytes == 0 || total + sizes[i] <= max_bytes)) {
      ++out.back().count;
      total += sizes[i];
      continue;
    }
    out.push_back({.first = i, .count = 1});
    total = sizes[i];
  }
  return out;
}

Result<std::vector<std::string>> SplitResponse(std::string_view body, size_t expected) {
  std::vector<std::string> out;
  if (expected > 1) {
    json parsed = json::parse(body, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_array() && parsed.size() == expected) {
      for (const json& v : parsed) out.push_back(v.dump());
      return out;
    }
  }
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find('\n', at);
    std::string_view line = end == std::string_view::npos ? body.substr(at) : body.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out.emplace_back(line);
    at = end == std::string_view::npos ? body.size() : end + 1;
  }
  if (out.size() != expected) {
    return Bad("the model answered " + std::to_string(out.size()) + " output records for " + std::to_string(expected) +
               " input records, so they cannot be joined (answer one line, or one JSON array element, per record)");
  }
  return out;
}

TransformParameters ResolveTransformParameters(const json& request, const json& execution_parameters) {
  TransformParameters out;
  const json empty = json::object();
  const json& answer = execution_parameters.is_object() ? execution_parameters : empty;
  const auto integer = [](const json& object, const char* member) -> std::optional<int64_t> {
    auto it = object.find(member);
    if (it == object.end() || !it->is_number_integer()) return std::nullopt;
    return it->get<int64_t>();
  };
  const auto strategy = [](const json& object) -> std::optional<BatchStrategy> {
    auto it = object.find("BatchStrategy");
    if (it == object.end() || !it->is_string()) return std::nullopt;
    const std::string text = it->get<std::string>();
    if (text == "MultiRecord" || text == "MULTI_RECORD") return BatchStrategy::kMultiRecord;
    if (text == "SingleRecord" || text == "SINGLE_RECORD") return BatchStrategy::kSingleRecord;
    return std::nullopt;
  };
  auto concurrent = integer(request, "MaxConcurrentTransforms");
  if (!concurrent || *concurrent < 1) concurrent = integer(answer, "MaxConcurrentTransforms");
  if (concurrent && *concurrent >= 1) out.max_concurrent = static_cast<int>(std::min<int64_t>(*concurrent, 1024));
  auto payload = integer(request, "MaxPayloadInMB");
  if (!payload) payload = integer(answer, "MaxPayloadInMB");
  if (payload && *payload >= 0 && *payload <= 100) out.max_payload_mb = *payload;
  auto batch = strategy(request);
  if (!batch) batch = strategy(answer);
  if (batch) out.strategy = *batch;
  return out;
}

std::string TransformOutputKey(std::string_view output_prefix, std::string_view rel) {
  std::string prefix(output_prefix);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  return (prefix.empty() ? std::string() : prefix + "/") + std::string(rel) + ".out";
}

void AppendAssembled(std::string& out, std::string_view body, AssembleWith assemble) {
  out.append(body);
  if (assemble == AssembleWith::kLine && (body.empty() || body.back() != '\n')) out.push_back('\n');
}

}  // namespace kiln::serving
