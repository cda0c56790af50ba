// Fuzzes Kiln's metric-datum decoding as it exists today: observe::MetricExtractor (a training
// job's MetricDefinitions regexes, from the client's CreateTrainingJob, applied to the job's log
// lines), ParseMetricValue, and observe::MetricStore (series keys and dimension sets written and
// read back, and dimension text decoded from the database when a row was damaged).
// CloudWatch PutMetricData (CBOR protocol) is not served yet; its decoder gets a target with the
// issue that adds it.
//
// Input layout: byte 0 = mode.
//   even: extractor. The rest is split at the first empty line ("\n\n"): before it, one
//         definition per line "<name>\t<regex>" (at most 40; a line without a tab is a regex named
//         "m<n>"); after it, log lines.
//   odd:  store. The rest is split at '\x1f' into fields: namespace, name, then dimension
//         "key=value" pairs up to a field starting "#"; the bytes after '#' (if 8+) are a
//         timestamp (8 bytes) and a value (8 bytes, a double). The point is put, then read back
//         with Last/Query/ListSeries; finally the series row's stored dimension text is replaced
//         by the last field's bytes and ListSeries decodes it.
//
// Checks besides "no crash, no sanitizer report":
//   extractor: every point names a definition, in definition order, at most one per definition
//   per line, with a finite value that ParseMetricValue gives for some substring of the line;
//   ParseMetricValue never returns a non-finite value.
//   store: a finite point that Put accepts is the series' Last, is in Query's window and the
//   series comes back from ListSeries (with exactly its dimensions when they are valid UTF-8:
//   invalid bytes are stored as U+FFFD); a non-finite value is refused.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/strings.h"
#include "fuzz_support.h"
#include "observe/metric_extractor.h"
#include "observe/metric_store.h"
#include "store/database.h"

namespace {

using kiln::fuzz::Check;

void FuzzExtractor(std::string_view input) {
  size_t split = input.find("\n\n");
  std::string_view defs = input.substr(0, split);
  std::string_view lines = split == std::string_view::npos ? std::string_view() : input.substr(split + 2);
  std::vector<kiln::observe::MetricDefinition> definitions;
  for (std::string_view line : kiln::Split(defs, '\n')) {
    if (line.empty()) continue;
    size_t tab = line.find('\t');
    if (tab == std::string_view::npos) {
      definitions.push_back({"m" + std::to_string(definitions.size()), std::string(line)});
    } else {
      definitions.push_back({std::string(line.substr(0, tab)), std::string(line.substr(tab + 1))});
    }
    if (definitions.size() > kiln::observe::MetricExtractor::kMaxDefinitions) break;
  }
  auto extractor = kiln::observe::MetricExtractor::Create(definitions);
  if (!extractor.ok()) {
    Check(extractor.status().code() == kiln::StatusCode::kInvalidArgument);
    return;
  }
  Check(definitions.size() <= kiln::observe::MetricExtractor::kMaxDefinitions);
  for (std::string_view line : kiln::Split(lines, '\n')) {
    if (auto v = kiln::observe::ParseMetricValue(line)) Check(std::isfinite(*v));
    std::vector<kiln::observe::MetricPoint> points = (*extractor)->Extract(line, 42);
    Check(points.size() <= definitions.size());
    size_t next = 0;  // points come in definition order, one per definition at most
    for (const auto& p : points) {
      Check(std::isfinite(p.value) && p.timestamp_millis == 42);
      while (next < definitions.size() && definitions[next].name != p.name) ++next;
      Check(next < definitions.size());
      ++next;
    }
  }
}

// Dimension sets are stored as JSON text, written with invalid UTF-8 replaced by U+FFFD (the
// store's documented behaviour; every dimension Kiln writes is a validated name), so only valid
// UTF-8 is expected back unchanged.
using kiln::fuzz::ValidUtf8;

void FuzzStore(std::string_view input) {
  kiln::store::Database& db = kiln::fuzz::RestoreDatabase();
  kiln::observe::MetricStore store(&db);

  std::vector<std::string_view> fields = kiln::Split(input, '\x1f');
  if (fields.size() < 2) return;
  std::string ns(fields[0]);
  std::string name(fields[1]);
  kiln::observe::Dimensions dimensions;
  std::string_view tail;
  for (size_t i = 2; i < fields.size(); ++i) {
    if (!fields[i].empty() && fields[i][0] == '#') {
      tail = fields[i].substr(1);
      break;
    }
    size_t eq = fields[i].find('=');
    dimensions[std::string(fields[i].substr(0, eq))] =
        eq == std::string_view::npos ? "" : std::string(fields[i].substr(eq + 1));
  }
  int64_t timestamp = 1714557600000;
  double value = 1.5;
  if (tail.size() >= 16) {
    std::memcpy(&timestamp, tail.data(), 8);
    std::memcpy(&value, tail.data() + 8, 8);
  }
  kiln::Status put = store.Put(ns, name, dimensions, timestamp, value);
  if (!std::isfinite(value)) Check(!put.ok());
  if (put.ok()) {
    auto last = store.Last(ns, name, dimensions);
    Check(last.ok() && last->has_value());
    Check((*last)->timestamp_millis == timestamp && (*last)->value == value);
    if (timestamp < INT64_MAX) {
      auto points = store.Query(ns, name, dimensions, timestamp, timestamp + 1);
      Check(points.ok() && points->size() == 1 && (*points)[0].value == value);
    }
    bool utf8 = true;
    for (const auto& [key, value] : dimensions) utf8 = utf8 && ValidUtf8(key) && ValidUtf8(value);
    auto series = store.ListSeries(ns, std::string_view(name), dimensions);
    Check(series.ok() && series->size() == 1 && (*series)[0].name == name);
    if (utf8) Check((*series)[0].dimensions == dimensions);
  }

  // Damaged dimension text: decoding it must not fail hard.
  auto st = db.Prepare("UPDATE metric_series SET dimensions = ?");
  Check(st.ok());
  st->BindText(1, fields.back());
  (void)st->Run();
  (void)store.ListSeries(ns, std::nullopt, dimensions);
  (void)store.ListSeries(ns, std::string_view(name), {});
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    FuzzExtractor(rest);
  } else {
    FuzzStore(rest);
  }
  return 0;
}
