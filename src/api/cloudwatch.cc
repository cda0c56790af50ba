#include "api/cloudwatch.h"

#include "store/autoscaling_repository.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "api/errors.h"
#include "api/metric_math.h"
#include "aws/cbor.h"
#include "aws/query_codec.h"
#include "base/encoding.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln::api {
namespace {

using json = nlohmann::json;

constexpr int64_t kMinute = 60 * 1000;
constexpr int64_t kHour = 60 * kMinute;
constexpr int64_t kDay = 24 * kHour;
constexpr size_t kMaxPutData = 1000;
constexpr size_t kMaxValues = 150;
constexpr size_t kMaxQueries = 500;
constexpr int64_t kMaxStatisticsDatapoints = 1440;
constexpr size_t kListPageSize = 500;
// CloudWatch's accepted magnitude range: ±2^360, non-zero magnitudes from 2^-260.
const double kMaxMagnitude = std::ldexp(1.0, 360);
const double kMinMagnitude = std::ldexp(1.0, -260);

aws::AwsError InvalidValue(std::string message) { return aws::AwsError("InvalidParameterValue", std::move(message)); }
aws::AwsError Missing(std::string message) { return aws::AwsError("MissingParameter", std::move(message)); }
aws::AwsError Combination(std::string message) {
  return aws::AwsError("InvalidParameterCombination", std::move(message));
}

// "1440" → "1,440" (AWS's datapoint-limit message groups digits).
std::string Grouped(int64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

bool Present(const json& in, const char* key) {
  auto it = in.find(key);
  return it != in.end() && !it->is_null();
}

// A model timestamp in JSON form (epoch seconds, or ISO-8601 text: the validator allows both).
std::optional<int64_t> TimestampMillis(const json& value) {
  if (value.is_number()) {
    double seconds = value.get<double>();
    if (!std::isfinite(seconds) || std::fabs(seconds) > 1.0e13) return std::nullopt;
    return static_cast<int64_t>(std::llround(seconds * 1000.0));
  }
  if (value.is_string()) return ParseIso8601(value.get<std::string>());
  return std::nullopt;
}

double Seconds(int64_t millis) { return static_cast<double>(millis) / 1000.0; }

// Dimensions [{Name, Value}] → a set; a name given twice is refused (a set has one value each).
std::variant<observe::Dimensions, aws::AwsError> ParseDimensions(const json& in, const std::string& param) {
  observe::Dimensions out;
  auto it = in.find("Dimensions");
  if (it == in.end() || !it->is_array()) return out;
  size_t i = 0;
  for (const json& d : *it) {
    ++i;
    std::string name = d.value("Name", "");
    std::string value = d.value("Value", "");
    if (!out.emplace(name, value).second) {
      return InvalidValue("The value " + name + " for parameter " + param + ".member." + std::to_string(i) +
                          ".Name is invalid: a dimension name may appear only once per metric.");
    }
  }
  return out;
}

bool ValueInRange(double v) {
  if (!std::isfinite(v)) return false;
  double m = std::fabs(v);
  return m == 0 || (m >= kMinMagnitude && m <= kMaxMagnitude);
}

aws::AwsError BadNumber(double v, const std::string& param) {
  return InvalidValue("The value " + FormatNumber(v) + " for parameter " + param +
                      " is invalid: values must be finite numbers between -2^360 and 2^360.");
}

// "p99", "p99.9", "p0.0", "p100": the percentile, else nullopt.
std::optional<double> ParsePercentile(std::string_view stat) {
  if (stat.size() < 2 || stat.size() > 7 || stat[0] != 'p') return std::nullopt;
  std::string_view number = stat.substr(1);
  size_t dot = number.find('.');
  std::string_view whole = number.substr(0, dot);
  if (whole.empty() || whole.size() > 3) return std::nullopt;
  for (char c : whole) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  if (dot != std::string_view::npos) {
    std::string_view fraction = number.substr(dot + 1);
    if (fraction.size() > 2) return std::nullopt;  // "p99." is accepted as p99
    for (char c : fraction) {
      if (c < '0' || c > '9') return std::nullopt;
    }
  }
  double p = std::strtod(std::string(number).c_str(), nullptr);
  if (p < 0 || p > 100) return std::nullopt;
  return p;
}

enum class Stat { kSampleCount, kAverage, kSum, kMinimum, kMaximum, kPercentile };
struct StatSpec {
  Stat kind = Stat::kAverage;
  double percentile = 0;
};

std::optional<StatSpec> ParseStat(std::string_view stat) {
  if (stat == "SampleCount") return StatSpec{Stat::kSampleCount, 0};
  if (stat == "Average") return StatSpec{Stat::kAverage, 0};
  if (stat == "Sum") return StatSpec{Stat::kSum, 0};
  if (stat == "Minimum") return StatSpec{Stat::kMinimum, 0};
  if (stat == "Maximum") return StatSpec{Stat::kMaximum, 0};
  if (auto p = ParsePercentile(stat)) return StatSpec{Stat::kPercentile, *p};
  return std::nullopt;
}

std::optional<double> StatValue(const observe::PeriodAggregate& period, const StatSpec& spec) {
  const observe::StatisticSet& s = period.stats;
  switch (spec.kind) {
    case Stat::kSampleCount: return s.sample_count;
    case Stat::kAverage: return s.sample_count > 0 ? s.sum / s.sample_count : 0.0;
    case Stat::kSum: return s.sum;
    case Stat::kMinimum: return s.minimum;
    case Stat::kMaximum: return s.maximum;
    case Stat::kPercentile: return observe::Percentile(period, spec.percentile);
  }
  return std::nullopt;
}

// The period and time rules shared by GetMetricStatistics and GetMetricData; `start` comes back
// rounded down as CloudWatch rounds it.
struct Window {
  int64_t start = 0;
  int64_t end = 0;
  int64_t period = 60;
};

std::optional<aws::AwsError> ResolveWindow(int64_t now, int64_t period, const std::string& period_param,
                                           Window* window) {
  if (window->start >= window->end) {
    return InvalidValue("The parameter StartTime must be less than the parameter EndTime.");
  }
  if (period <= 0) return InvalidValue("The parameter " + period_param + " must be greater than 0.");
  if (period < 60 ? (period != 1 && period != 5 && period != 10 && period != 20 && period != 30) : period % 60 != 0) {
    return InvalidValue("The parameter " + period_param + " must be 1, 5, 10, 20, 30 or a multiple of 60 (it is " +
                        std::to_string(period) + ").");
  }
  const int64_t age = now - window->start;
  int64_t grid = kMinute;
  if (age > 63 * kDay) {
    if (period % 3600 != 0) {
      return InvalidValue("The parameter " + period_param +
                          " must be a multiple of 3600 when StartTime is more than 63 days ago.");
    }
    grid = kHour;
  } else if (age > 15 * kDay) {
    if (period % 300 != 0) {
      return InvalidValue("The parameter " + period_param +
                          " must be a multiple of 300 when StartTime is more than 15 days ago.");
    }
    grid = 5 * kMinute;
  } else if (age > 3 * kHour) {
    if (period % 60 != 0) {
      return InvalidValue("The parameter " + period_param +
                          " must be a multiple of 60 when StartTime is more than 3 hours ago.");
    }
  } else if (period < 60) {
    grid = period * 1000;
  }
  // Floor (also for times before 1970).
  int64_t r = window->start % grid;
  if (r < 0) r += grid;
  window->start -= r;
  window->period = period;
  return std::nullopt;
}

int64_t PeriodCount(const Window& w) {
  const int64_t p = w.period * 1000;
  return (w.end - w.start + p - 1) / p;
}

std::string Canonical(json in) {
  in.erase("NextToken");
  return Sha256Hex(in.dump(-1, ' ', false, json::error_handler_t::replace)).substr(0, 16);
}

std::optional<json> DecodeToken(const std::string& token) {
  auto raw = Base64Decode(token);
  if (!raw) return std::nullopt;
  auto parsed = json::parse(*raw, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
  return parsed;
}

std::string EncodeToken(const json& token) { return Base64Encode(token.dump()); }

// One PutMetricData datum `d`, reported as parameter `p` in errors; `now` is the default and
// the reference for the accepted timestamp range.
std::variant<observe::MetricDatum, aws::AwsError> ReadDatum(const std::string& p, const json& datum_json, int64_t now) {
  const json* d = &datum_json;
  observe::MetricDatum datum;
  datum.name = d->value("MetricName", "");
  auto dims = ParseDimensions(*d, p + ".Dimensions");
  if (auto* e = std::get_if<aws::AwsError>(&dims)) return *e;
  datum.dimensions = std::move(std::get<observe::Dimensions>(dims));
  datum.timestamp_millis = now;
  if (Present(*d, "Timestamp")) {
    auto t = TimestampMillis((*d)["Timestamp"]);
    if (!t) return InvalidValue("The parameter " + p + ".Timestamp is not a valid timestamp.");
    if (*t < now - 14 * kDay) {
      return InvalidValue("The parameter " + p + ".Timestamp must specify a time no more than two weeks in the past.");
    }
    if (*t > now + 2 * kHour) {
      return InvalidValue("The parameter " + p +
                          ".Timestamp must specify a time no more than two hours in the future.");
    }
    datum.timestamp_millis = *t;
  }
  const bool has_value = Present(*d, "Value");
  const bool has_values = Present(*d, "Values") && !(*d)["Values"].empty();
  const bool has_counts = Present(*d, "Counts") && !(*d)["Counts"].empty();
  const bool has_stats = Present(*d, "StatisticValues");
  if (has_value + has_values + has_stats > 1) {
    std::string first = has_value ? "Value" : "Values";
    std::string second = has_stats ? "StatisticValues" : "Values";
    return Combination("The parameters " + p + "." + first + " and " + p + "." + second +
                       " are mutually exclusive and you have specified both.");
  }
  if (!has_value && !has_values && !has_stats) {
    return Missing("The parameter " + p + ".Value, " + p + ".Values or " + p + ".StatisticValues is required.");
  }
  if (has_counts && !has_values) {
    return Combination("The parameter " + p + ".Counts can only be specified with " + p + ".Values.");
  }
  if (has_value) {
    double v = (*d)["Value"].get<double>();
    if (!ValueInRange(v)) return BadNumber(v, p + ".Value");
    datum.value = v;
  } else if (has_values) {
    const json& values = (*d)["Values"];
    if (values.size() > kMaxValues) {
      return InvalidValue("The collection " + p + ".Values must not have a size greater than " +
                          std::to_string(kMaxValues) + " (it has " + std::to_string(values.size()) + ").");
    }
    if (has_counts && (*d)["Counts"].size() != values.size()) {
      return InvalidValue("The parameters " + p + ".Values and " + p + ".Counts must be of the same size (" +
                          std::to_string(values.size()) + " and " + std::to_string((*d)["Counts"].size()) + ").");
    }
    std::map<double, double> merged;
    for (size_t i = 0; i < values.size(); ++i) {
      double v = values[i].get<double>();
      if (!ValueInRange(v)) return BadNumber(v, p + ".Values.member." + std::to_string(i + 1));
      double c = has_counts ? (*d)["Counts"][i].get<double>() : 1.0;
      if (!std::isfinite(c) || c <= 0 || c > kMaxMagnitude) {
        return InvalidValue("The value " + FormatNumber(c) + " for parameter " + p + ".Counts.member." +
                            std::to_string(i + 1) + " is invalid: counts must be positive numbers.");
      }
      merged[v == 0 ? 0.0 : v] += c;
    }
    datum.values_counts.assign(merged.begin(), merged.end());
  } else {
    const json& s = (*d)["StatisticValues"];
    observe::StatisticSet set;
    set.sample_count = s["SampleCount"].get<double>();
    set.sum = s["Sum"].get<double>();
    set.minimum = s["Minimum"].get<double>();
    set.maximum = s["Maximum"].get<double>();
    for (auto [name, v] : {std::pair<const char*, double>{"SampleCount", set.sample_count},
                           {"Sum", set.sum},
                           {"Minimum", set.minimum},
                           {"Maximum", set.maximum}}) {
      if (!ValueInRange(v)) return BadNumber(v, p + ".StatisticValues." + name);
    }
    if (set.sample_count <= 0) {
      return InvalidValue("The value " + FormatNumber(set.sample_count) + " for parameter " + p +
                          ".StatisticValues.SampleCount is invalid: it must be greater than 0.");
    }
    if (set.minimum > set.maximum) {
      return InvalidValue("The parameter " + p + ".StatisticValues.Minimum must be less than or equal to " + p +
                          ".StatisticValues.Maximum.");
    }
    datum.statistics = set;
  }
  datum.unit = d->value("Unit", "");
  if (Present(*d, "StorageResolution")) {
    int64_t r = (*d)["StorageResolution"].get<int64_t>();
    if (r != 1 && r != 60) {
      return InvalidValue("The value " + std::to_string(r) + " for parameter " + p +
                          ".StorageResolution is invalid: valid values are 1 and 60.");
    }
    datum.storage_resolution = static_cast<int>(r);
  }
  return datum;
}

// One returned GetMetricData result: its points in the order answered.
struct Series {
  std::string id;
  std::string label;
  std::vector<std::pair<int64_t, double>> points;
};

// Evaluates every expression (id → text) into `values`, each once, in dependency order (a
// reference cycle is refused); `values` holds the metric stats' series on entry.
std::optional<aws::AwsError> EvaluateExpressions(const std::map<std::string, std::string>& expressions,
                                                 std::map<std::string, MathValue>& values) {
  std::set<std::string> evaluating;
  std::function<std::optional<aws::AwsError>(const std::string&)> evaluate =
      [&](const std::string& id) -> std::optional<aws::AwsError> {
    if (values.count(id) > 0) return std::nullopt;
    if (!evaluating.insert(id).second) {
      return aws::AwsError("ValidationError", "Error in expression " + id +
                                                  " [it refers to itself through other "
                                                  "expressions]");
    }
    // An error in an expression this one refers to is answered as it is, not wrapped again.
    std::optional<aws::AwsError> referenced_error;
    auto result =
        EvaluateMath(expressions.at(id), [&](const std::string& ref) -> std::variant<const MathValue*, std::string> {
          if (values.count(ref) == 0 && expressions.count(ref) > 0) {
            if (auto e = evaluate(ref)) {
              if (!referenced_error) referenced_error = e;
              return e->message;
            }
          }
          auto it = values.find(ref);
          if (it == values.end()) return "Unknown id " + ref;
          return &it->second;
        });
    if (auto* message = std::get_if<std::string>(&result)) {
      if (referenced_error && referenced_error->message == *message) return referenced_error;
      return aws::AwsError("ValidationError", "Error in expression " + id + " [" + *message + "]");
    }
    values[id] = std::get<MathValue>(std::move(result));
    return std::nullopt;
  };
  for (const auto& [id, text] : expressions) {
    if (auto e = evaluate(id)) return e;
  }
  return std::nullopt;
}

// GetMetricData's answer: at most `max_datapoints` points over all `results`, from where the
// request's NextToken left off. The token holds each result's offset and a digest of the request
// it belongs to.
JsonOutcome PageMetricData(const json& in, const std::vector<Series>& results, int64_t max_datapoints) {
  const std::string digest = Canonical(in);
  std::vector<int64_t> offsets(results.size(), 0);
  if (Present(in, "NextToken")) {
    auto token = DecodeToken(in["NextToken"].get<std::string>());
    bool valid = token && token->value("h", "") == digest && token->contains("o") && (*token)["o"].is_array() &&
                 (*token)["o"].size() == results.size();
    if (valid) {
      for (size_t i = 0; i < results.size(); ++i) {
        const json& o = (*token)["o"][i];
        valid = valid && o.is_number_integer() && o.get<int64_t>() >= 0 &&
                o.get<int64_t>() <= static_cast<int64_t>(results[i].points.size());
        if (valid) offsets[i] = o.get<int64_t>();
      }
    }
    if (!valid) {
      return aws::AwsError("InvalidNextToken",
                           "The NextToken is invalid: it does not belong to this request (pass the same queries, "
                           "times and options as the call that returned it).");
    }
  }
  int64_t budget = max_datapoints;
  bool more = false;
  json out_results = json::array();
  std::vector<int64_t> next = offsets;
  for (size_t i = 0; i < results.size(); ++i) {
    const Series& s = results[i];
    const int64_t total = static_cast<int64_t>(s.points.size());
    const int64_t take = std::min(total - offsets[i], budget);
    json timestamps = json::array();
    json values = json::array();
    for (int64_t k = offsets[i]; k < offsets[i] + take; ++k) {
      timestamps.push_back(Seconds(s.points[static_cast<size_t>(k)].first));
      values.push_back(s.points[static_cast<size_t>(k)].second);
    }
    budget -= take;
    next[i] = offsets[i] + take;
    const bool complete = next[i] == total;
    more = more || !complete;
    out_results.push_back(json{{"Id", s.id},
                               {"Label", s.label},
                               {"Timestamps", std::move(timestamps)},
                               {"Values", std::move(values)},
                               {"StatusCode", complete ? "Complete" : "PartialData"},
                               {"Messages", json::array()}});
  }
  json out = {{"MetricDataResults", std::move(out_results)}, {"Messages", json::array()}};
  if (more) out["NextToken"] = EncodeToken(json{{"h", digest}, {"o", next}});
  return out;
}

}  // namespace

CloudWatch::CloudWatch(CloudWatchOptions options) : options_(std::move(options)) {}

int64_t CloudWatch::Now() const { return options_.now_millis ? options_.now_millis() : NowMillis(); }

std::shared_ptr<const ServiceModel> CloudWatch::Model() {
  static const std::shared_ptr<const ServiceModel> model = [] {
    auto parsed = ServiceModel::Parse(EmbeddedCloudWatchModelJson());
    if (!parsed.ok()) {
      KLOG(error, "embedded CloudWatch model does not parse", {{"error", parsed.status().message()}});
      std::abort();
    }
    return std::move(parsed).value();
  }();
  return model;
}

const nlohmann::json& CloudWatch::ModelJson() {
  static const json model = [] {
    json parsed = json::parse(EmbeddedCloudWatchModelJson(), nullptr, false);
    if (parsed.is_discarded()) {
      KLOG(error, "embedded CloudWatch model is not JSON", {});
      std::abort();
    }
    return parsed;
  }();
  return model;
}

bool CloudWatch::Serves(std::string_view operation) {
  return operation == "PutMetricData" || operation == "GetMetricStatistics" || operation == "GetMetricData" ||
         operation == "ListMetrics" || operation == "DescribeAlarms" || operation == "PutMetricAlarm" ||
         operation == "DeleteAlarms";
}

JsonOutcome CloudWatch::Call(const aws::RequestContext& context, std::string_view operation, const json& input) const {
  context.operation = std::string(operation);
  if (!Serves(operation)) {
    return aws::AwsError("InvalidAction", "Could not find operation " + std::string(operation) +
                                              " for version 2010-08-01 (Kiln serves PutMetricData, "
                                              "GetMetricStatistics, GetMetricData, ListMetrics, DescribeAlarms, "
                                              "PutMetricAlarm and DeleteAlarms).");
  }
  if (operation == "GetMetricStatistics") {
    // CloudWatch checks Statistics itself, before the model's enum, with its own code and words
    // (clients and scripts match this message; the enum check would say ValidationError).
    if (auto it = input.find("Statistics"); it != input.end() && it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        const json& s = (*it)[i];
        if (!s.is_string()) break;  // a type error: the model's SerializationException below
        std::optional<StatSpec> stat = ParseStat(s.get<std::string>());
        if (stat && stat->kind != Stat::kPercentile) continue;
        return InvalidValue("The parameter Statistics.member." + std::to_string(i + 1) +
                            " must be a value in the set [ Minimum, Maximum, Average, SampleCount, Sum ].");
      }
    }
  }
  if (auto invalid = Model()->ValidateInput(operation, input)) {
    // CloudWatch answers constraint violations with the Query code ValidationError.
    if (invalid->code == "ValidationException") invalid->code = "ValidationError";
    return *invalid;
  }
  try {
    if (operation == "PutMetricData") return PutMetricData(input);
    if (operation == "GetMetricStatistics") return GetMetricStatistics(input);
    if (operation == "GetMetricData") return GetMetricData(input);
    if (operation == "DescribeAlarms") return DescribeAlarms(input);
    if (operation == "PutMetricAlarm") return PutMetricAlarm(input);
    if (operation == "DeleteAlarms") return DeleteAlarms(input);
    return ListMetrics(input);
  } catch (const std::exception& e) {
    KLOG(error, "CloudWatch operation threw",
         {{"operation", operation}, {"what", e.what()}, {"request_id", context.request_id}});
    aws::AwsError error("InternalServiceError", "Internal error; request id " + context.request_id, 500);
    error.sender_fault = false;
    return error;
  }
}

std::unique_ptr<JsonService> CloudWatch::MakeJsonService() const {
  auto service = std::make_unique<JsonService>(std::string(kCloudWatchTargetPrefix),
                                               std::string(kCloudWatchSigningName), aws::Protocol::kJson10);
  for (const char* op : {"PutMetricData", "GetMetricStatistics", "GetMetricData", "ListMetrics", "DescribeAlarms",
                         "PutMetricAlarm", "DeleteAlarms"}) {
    service->Register(
        op, [this, op](const aws::RequestContext& context, const json& input) { return Call(context, op, input); });
  }
  return service;
}

aws::WireResponse CloudWatch::HandleCbor(const aws::RequestContext& context, std::string_view operation,
                                         std::string_view body) const {
  auto error_response = [&](const aws::AwsError& error) { return aws::SerializeCborError(error, context.request_id); };
  json input = json::object();
  if (!body.empty()) {
    auto decoded = aws::DecodeCbor(body, aws::CborLimits{.max_depth = JsonService::kRequestLimits.max_depth,
                                                         .max_values = JsonService::kRequestLimits.max_values});
    if (!decoded.ok()) {
      return error_response(
          aws::AwsError("SerializationException", "The request body is not valid CBOR: " + decoded.status().message()));
    }
    if (!decoded->is_object()) {
      return error_response(aws::AwsError("SerializationException", "The request body is not a CBOR map."));
    }
    input = std::move(decoded).value();
  }
  if (!Serves(operation)) {
    context.operation = std::string(operation);
    return error_response(aws::AwsError("UnknownOperationException",
                                        "Operation " + std::string(kCloudWatchTargetPrefix) + "." +
                                            std::string(operation) + " is not supported by Kiln.",
                                        404));
  }
  JsonOutcome outcome = Call(context, operation, input);
  if (auto* error = std::get_if<aws::AwsError>(&outcome)) return error_response(*error);
  aws::WireResponse response;
  response.status = 200;
  response.headers.emplace("x-amzn-RequestId", context.request_id);
  response.headers.emplace("smithy-protocol", "rpc-v2-cbor");
  response.headers.emplace("Content-Type", "application/cbor");
  const json& op = ModelJson()["operations"][std::string(operation)];
  if (op.contains("output")) {
    response.body =
        aws::EncodeCborShaped(ModelJson()["shapes"], op["output"].value("shape", ""), std::get<json>(outcome));
  }
  return response;
}

aws::WireResponse CloudWatch::HandleQuery(const aws::RequestContext& context,
                                          const std::map<std::string, std::string>& params) const {
  auto error_response = [&](const aws::AwsError& error) {
    return aws::QueryError(kCloudWatchXmlns, error, context.request_id);
  };
  auto action = params.find("Action");
  if (action == params.end() || action->second.empty()) {
    return error_response(aws::AwsError("MissingAction", "Missing Action"));
  }
  const std::string& operation = action->second;
  context.operation = operation;
  auto version = params.find("Version");
  if (version != params.end() && version->second != "2010-08-01") {
    return error_response(aws::AwsError("InvalidAction", "Could not find operation " + operation + " for version " +
                                                             version->second.substr(0, 64) + "."));
  }
  if (!Serves(operation)) {
    return error_response(std::get<aws::AwsError>(Call(context, operation, json::object())));
  }
  const json& op = ModelJson()["operations"][operation];
  auto input = aws::DecodeQueryInput(ModelJson()["shapes"], op["input"].value("shape", ""), params);
  if (!input.ok()) return error_response(InvalidValue(input.status().message()));
  JsonOutcome outcome = Call(context, operation, *input);
  if (auto* error = std::get_if<aws::AwsError>(&outcome)) return error_response(*error);
  if (!op.contains("output")) return aws::QueryResponse(operation, kCloudWatchXmlns, false, "", context.request_id);
  std::string xml =
      aws::EncodeQueryXml(ModelJson()["shapes"], op["output"].value("shape", ""), std::get<json>(outcome));
  return aws::QueryResponse(operation, kCloudWatchXmlns, true, xml, context.request_id);
}

JsonOutcome CloudWatch::PutMetricData(const json& in) const {
  const std::string ns = in.value("Namespace", "");
  if (StartsWith(ns, "AWS/")) {
    return InvalidValue("The value " + ns +
                        " for parameter Namespace is invalid: namespaces starting with AWS/ are "
                        "reserved for AWS services.");
  }
  // Every datum with the parameter name AWS would report it under.
  std::vector<std::pair<std::string, const json*>> data;
  if (in.contains("MetricData") && in["MetricData"].is_array()) {
    size_t i = 0;
    for (const json& d : in["MetricData"]) data.emplace_back("MetricData.member." + std::to_string(++i), &d);
  }
  if (in.contains("EntityMetricData") && in["EntityMetricData"].is_array()) {
    size_t e = 0;
    for (const json& entity : in["EntityMetricData"]) {
      ++e;
      if (!entity.contains("MetricData") || !entity["MetricData"].is_array()) continue;
      size_t i = 0;
      for (const json& d : entity["MetricData"]) {
        data.emplace_back("EntityMetricData.member." + std::to_string(e) + ".MetricData.member." + std::to_string(++i),
                          &d);
      }
    }
  }
  if (data.empty()) {
    return Missing("At least one of the parameters MetricData and EntityMetricData must be specified.");
  }
  if (data.size() > kMaxPutData) {
    return InvalidValue("The collection MetricData must not have a size greater than " + std::to_string(kMaxPutData) +
                        " (it has " + std::to_string(data.size()) + ").");
  }
  const int64_t now = Now();
  std::vector<observe::MetricDatum> batch;
  batch.reserve(data.size());
  for (const auto& [p, d] : data) {
    auto datum = ReadDatum(p, *d, now);
    if (auto* e = std::get_if<aws::AwsError>(&datum)) return *e;
    batch.push_back(std::get<observe::MetricDatum>(std::move(datum)));
  }
  Status stored = options_.store->Put(ns, batch);
  if (!stored.ok()) return AwsErrorFromStatus(stored, ErrorService::kCloudWatch);
  return json::object();
}

JsonOutcome CloudWatch::GetMetricStatistics(const json& in) const {
  const bool has_statistics = Present(in, "Statistics") && !in["Statistics"].empty();
  const bool has_extended = Present(in, "ExtendedStatistics") && !in["ExtendedStatistics"].empty();
  if (!has_statistics && !has_extended) {
    return Missing("Must specify either Statistics or ExtendedStatistics.");
  }
  std::vector<std::pair<std::string, double>> percentiles;
  if (has_extended) {
    size_t i = 0;
    for (const json& e : in["ExtendedStatistics"]) {
      ++i;
      std::string text = e.get<std::string>();
      auto p = ParsePercentile(text);
      if (!p) {
        return InvalidValue("The value " + text + " for parameter ExtendedStatistics.member." + std::to_string(i) +
                            " is invalid: extended statistics are percentiles p0.0 to p100 (e.g. p99, p99.9).");
      }
      percentiles.emplace_back(text, *p);
    }
  }
  auto dims = ParseDimensions(in, "Dimensions");
  if (auto* e = std::get_if<aws::AwsError>(&dims)) return *e;
  auto start = TimestampMillis(in["StartTime"]);
  auto end = TimestampMillis(in["EndTime"]);
  if (!start) return InvalidValue("The parameter StartTime is not a valid timestamp.");
  if (!end) return InvalidValue("The parameter EndTime is not a valid timestamp.");
  Window window{*start, *end, 60};
  if (auto e = ResolveWindow(Now(), in["Period"].get<int64_t>(), "Period", &window)) return *e;
  const int64_t requested = PeriodCount(window);
  if (requested > kMaxStatisticsDatapoints) {
    return Combination("You have requested up to " + Grouped(requested) +
                       " datapoints, which exceeds the limit of 1,440. You may reduce the datapoints requested by "
                       "increasing Period, or decreasing the time range.");
  }
  observe::MetricQuery query;
  query.ns = in.value("Namespace", "");
  query.name = in.value("MetricName", "");
  query.dimensions = std::move(std::get<observe::Dimensions>(dims));
  query.start_millis = window.start;
  query.end_millis = window.end;
  query.period_seconds = window.period;
  if (Present(in, "Unit")) query.unit = in["Unit"].get<std::string>();
  query.distributions = !percentiles.empty();  // merging sketches is ~35% of a latency query
  auto periods = options_.store->Aggregate(query);
  if (!periods.ok()) return AwsErrorFromStatus(periods.status(), ErrorService::kCloudWatch);
  std::set<std::string> wanted;
  if (has_statistics) {
    for (const json& s : in["Statistics"]) wanted.insert(s.get<std::string>());
  }
  json datapoints = json::array();
  for (const observe::PeriodAggregate& period : *periods) {
    json point = json::object();
    point["Timestamp"] = Seconds(period.start_millis);
    for (const char* name : {"SampleCount", "Average", "Sum", "Minimum", "Maximum"}) {
      if (wanted.count(name) > 0) point[name] = *StatValue(period, *ParseStat(name));
    }
    point["Unit"] = period.unit.empty() ? "None" : period.unit;
    if (!percentiles.empty()) {
      json extended = json::object();
      for (const auto& [text, p] : percentiles) {
        if (auto v = observe::Percentile(period, p)) extended[text] = *v;
      }
      if (!extended.empty()) point["ExtendedStatistics"] = std::move(extended);
    }
    datapoints.push_back(std::move(point));
  }
  return json{{"Label", query.name}, {"Datapoints", std::move(datapoints)}};
}

JsonOutcome CloudWatch::GetMetricData(const json& in) const {
  const json& queries = in["MetricDataQueries"];
  if (queries.empty()) {
    return Missing("The parameter MetricDataQueries must contain at least one query.");
  }
  if (queries.size() > kMaxQueries) {
    return InvalidValue("The collection MetricDataQueries must not have a size greater than " +
                        std::to_string(kMaxQueries) + " (it has " + std::to_string(queries.size()) + ").");
  }
  auto start = TimestampMillis(in["StartTime"]);
  auto end = TimestampMillis(in["EndTime"]);
  if (!start) return InvalidValue("The parameter StartTime is not a valid timestamp.");
  if (!end) return InvalidValue("The parameter EndTime is not a valid timestamp.");
  int64_t max_datapoints = options_.max_datapoints;
  if (Present(in, "MaxDatapoints")) {
    max_datapoints = in["MaxDatapoints"].get<int64_t>();
    if (max_datapoints <= 0) {
      return InvalidValue("The value " + std::to_string(max_datapoints) +
                          " for parameter MaxDatapoints is invalid: it must be greater than 0.");
    }
  }
  const bool ascending = in.value("ScanBy", "TimestampDescending") == "TimestampAscending";
  const int64_t now = Now();

  // Every query's series (metric stats and expressions, returned or not), by id; the returned ones
  // in request order.
  std::map<std::string, MathValue> values;
  std::map<std::string, std::string> expressions;             // id → text, evaluated after the metric stats
  std::vector<std::pair<std::string, std::string>> returned;  // (id, label)
  std::set<std::string> ids;
  for (size_t i = 0; i < queries.size(); ++i) {
    const json& q = queries[i];
    const std::string p = "MetricDataQueries.member." + std::to_string(i + 1);
    const std::string id = q.value("Id", "");
    bool id_ok = !id.empty() && id[0] >= 'a' && id[0] <= 'z';
    for (char c : id) {
      id_ok = id_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    }
    if (!id_ok) {
      return InvalidValue("The value " + id + " for parameter " + p +
                          ".Id is invalid: an Id starts with a lower-case letter and has only letters, digits and "
                          "underscores.");
    }
    if (!ids.insert(id).second) {
      return InvalidValue("The value " + id + " for parameter " + p + ".Id is invalid: Ids must be unique.");
    }
    const bool has_stat = Present(q, "MetricStat");
    const bool has_expression = Present(q, "Expression");
    if (has_stat == has_expression) {
      return Combination("Exactly one of the parameters " + p + ".MetricStat and " + p +
                         ".Expression must be specified.");
    }
    const bool return_data = !Present(q, "ReturnData") || q["ReturnData"].get<bool>();
    if (has_expression) {
      expressions[id] = q["Expression"].get<std::string>();
      if (return_data) returned.emplace_back(id, Present(q, "Label") ? q["Label"].get<std::string>() : id);
      continue;
    }
    const json& stat = q["MetricStat"];
    const json& metric = stat["Metric"];
    if (!Present(metric, "Namespace"))
      return Missing("The parameter " + p + ".MetricStat.Metric.Namespace is required.");
    if (!Present(metric, "MetricName")) {
      return Missing("The parameter " + p + ".MetricStat.Metric.MetricName is required.");
    }
    const std::string stat_text = stat["Stat"].get<std::string>();
    auto spec = ParseStat(stat_text);
    if (!spec) {
      return InvalidValue("The value " + stat_text + " for parameter " + p +
                          ".MetricStat.Stat is invalid: Kiln answers SampleCount, Average, Sum, Minimum, Maximum and "
                          "percentiles p0 to p100.");
    }
    auto dims = ParseDimensions(metric, p + ".MetricStat.Metric.Dimensions");
    if (auto* e = std::get_if<aws::AwsError>(&dims)) return *e;
    Window window{*start, *end, 60};
    if (auto e = ResolveWindow(now, stat["Period"].get<int64_t>(), p + ".MetricStat.Period", &window)) return *e;
    if (PeriodCount(window) > 100 * options_.max_datapoints) {
      return Combination("The query " + p + " asks for " + Grouped(PeriodCount(window)) +
                         " periods; reduce the time range or increase the period.");
    }
    observe::MetricQuery query;
    query.ns = metric["Namespace"].get<std::string>();
    query.name = metric["MetricName"].get<std::string>();
    query.dimensions = std::move(std::get<observe::Dimensions>(dims));
    query.start_millis = window.start;
    query.end_millis = window.end;
    query.period_seconds = window.period;
    if (Present(stat, "Unit")) query.unit = stat["Unit"].get<std::string>();
    query.distributions = spec->kind == Stat::kPercentile;  // merging sketches is ~35% of a latency query
    auto periods = options_.store->Aggregate(query);
    if (!periods.ok()) return AwsErrorFromStatus(periods.status(), ErrorService::kCloudWatch);
    MathValue series;
    series.is_series = true;
    for (const observe::PeriodAggregate& period : *periods) {
      if (auto v = StatValue(period, *spec)) series.points[period.start_millis] = *v;
    }
    values[id] = std::move(series);
    if (return_data) returned.emplace_back(id, Present(q, "Label") ? q["Label"].get<std::string>() : query.name);
  }
  // Expressions, each once, in dependency order (a reference cycle is refused).
  if (auto e = EvaluateExpressions(expressions, values)) return *e;
  std::vector<Series> results;
  for (const auto& [id, label] : returned) {
    Series series;
    series.id = id;
    series.label = label;
    const MathValue& v = values[id];
    if (v.is_series) {
      for (const auto& [t, x] : v.points) series.points.emplace_back(t, x);
    }
    // A scalar result (e.g. "2 * 3") has no timestamps to put it at: returned empty, as no period.
    if (!ascending) std::reverse(series.points.begin(), series.points.end());
    results.push_back(std::move(series));
  }

  return PageMetricData(in, results, max_datapoints);
}

JsonOutcome CloudWatch::ListMetrics(const json& in) const {
  observe::MetricListFilter filter;
  if (Present(in, "Namespace")) filter.ns = in["Namespace"].get<std::string>();
  if (Present(in, "MetricName")) filter.name = in["MetricName"].get<std::string>();
  if (Present(in, "Dimensions")) {
    for (const json& d : in["Dimensions"]) {
      std::optional<std::string> value;
      if (Present(d, "Value")) value = d["Value"].get<std::string>();
      filter.dimensions.emplace_back(d.value("Name", ""), std::move(value));
    }
  }
  if (Present(in, "RecentlyActive")) filter.active_since_millis = Now() - 3 * kHour;
  const std::string digest = Canonical(in);
  std::string after;
  if (Present(in, "NextToken")) {
    auto token = DecodeToken(in["NextToken"].get<std::string>());
    if (!token || token->value("h", "") != digest || !(*token)["k"].is_string()) {
      return InvalidValue(
          "The parameter NextToken is invalid: it does not belong to this request (pass the same "
          "filters as the call that returned it).");
    }
    after = (*token)["k"].get<std::string>();
  }
  auto page = options_.store->List(filter, after, kListPageSize);
  if (!page.ok()) {
    if (page.status().code() == StatusCode::kInvalidArgument) {
      return InvalidValue("The parameter NextToken is invalid.");
    }
    return AwsErrorFromStatus(page.status(), ErrorService::kCloudWatch);
  }
  json metrics = json::array();
  for (const observe::MetricId& m : page->metrics) {
    json dims = json::array();
    for (const auto& [name, value] : m.dimensions) dims.push_back(json{{"Name", name}, {"Value", value}});
    metrics.push_back(json{{"Namespace", m.ns}, {"MetricName", m.name}, {"Dimensions", std::move(dims)}});
  }
  json out = {{"Metrics", std::move(metrics)}};
  if (!page->next_key.empty()) out["NextToken"] = EncodeToken(json{{"h", digest}, {"k", page->next_key}});
  return out;
}

namespace {

// A stored metric alarm (PutMetricAlarm's request, less its Tags) as DescribeAlarms shows it, with
// the state control::Autoscaler keeps in the row.
json RenderStoredAlarm(const store::AutoscalingRecord& r, const std::string& arn_prefix) {
  json out = r.doc;
  out["AlarmArn"] = arn_prefix + r.name;
  out["AlarmConfigurationUpdatedTimestamp"] = r.doc.value("UpdatedMillis", r.creation_millis) / 1000.0;
  out.erase("UpdatedMillis");
  if (!out.contains("ActionsEnabled")) out["ActionsEnabled"] = true;
  for (const char* list : {"OKActions", "AlarmActions", "InsufficientDataActions"}) {
    if (!out.contains(list)) out[list] = json::array();
  }
  const std::string state = r.state.value("state", "INSUFFICIENT_DATA");
  out["StateValue"] = state;
  out["StateReason"] = r.state.value("reason", "Unchecked: Initial alarm creation");
  const int64_t since = r.state.value("since", r.creation_millis);
  out["StateUpdatedTimestamp"] = since / 1000.0;
  out["StateTransitionedTimestamp"] = since / 1000.0;
  return out;
}

}  // namespace

// The scaling alarms options_.alarms gives, then the metric alarms of PutMetricAlarm, filtered by
// AlarmNames, AlarmNamePrefix, StateValue, ActionPrefix and AlarmTypes, paged by MaxRecords
// (default 50) and NextToken.
JsonOutcome CloudWatch::DescribeAlarms(const json& in) const {
  std::vector<json> alarms;
  if (options_.alarms) {
    auto listed = options_.alarms();
    if (!listed.ok()) return AwsErrorFromStatus(listed.status(), ErrorService::kCloudWatch);
    alarms = std::move(listed).value();
  }
  if (options_.alarm_database != nullptr) {
    auto stored = store::AutoscalingRepository(options_.alarm_database).ListAll(store::AutoscalingKind::kAlarm);
    if (!stored.ok()) return AwsErrorFromStatus(stored.status(), ErrorService::kCloudWatch);
    for (const store::AutoscalingRecord& r : *stored) alarms.push_back(RenderStoredAlarm(r, options_.alarm_arn_prefix));
  }
  if (Present(in, "AlarmNames") && Present(in, "AlarmNamePrefix")) {
    return aws::AwsError("InvalidParameterCombination",
                         "AlarmNames and AlarmNamePrefix cannot be given together; give one of them.");
  }
  bool metric_alarms = true;
  if (Present(in, "AlarmTypes")) {
    metric_alarms = false;
    for (const json& type : in["AlarmTypes"]) metric_alarms = metric_alarms || type == "MetricAlarm";
  }
  std::vector<json> selected;
  for (json& alarm : alarms) {
    const std::string name = alarm.value("AlarmName", "");
    if (!metric_alarms) break;
    if (Present(in, "AlarmNames")) {
      bool listed = false;
      for (const json& n : in["AlarmNames"]) listed = listed || n == name;
      if (!listed) continue;
    }
    if (Present(in, "AlarmNamePrefix") && name.rfind(in["AlarmNamePrefix"].get<std::string>(), 0) != 0) continue;
    if (Present(in, "StateValue") && alarm.value("StateValue", "") != in["StateValue"].get<std::string>()) continue;
    if (Present(in, "ActionPrefix")) {
      const std::string prefix = in["ActionPrefix"].get<std::string>();
      bool matched = false;
      const json actions = alarm.value("AlarmActions", json::array());
      for (const json& action : actions) {
        matched = matched || (action.is_string() && action.get<std::string>().rfind(prefix, 0) == 0);
      }
      if (!matched) continue;
    }
    selected.push_back(std::move(alarm));
  }
  const int64_t max_records = Present(in, "MaxRecords") ? in["MaxRecords"].get<int64_t>() : 50;
  const std::string digest = Canonical(in);
  size_t start = 0;
  if (Present(in, "NextToken")) {
    auto token = DecodeToken(in["NextToken"].get<std::string>());
    if (!token || token->value("h", "") != digest || !(*token)["k"].is_number_unsigned()) {
      return InvalidValue(
          "The parameter NextToken is invalid: it does not belong to this request (pass the same "
          "filters as the call that returned it).");
    }
    start = (*token)["k"].get<size_t>();
  }
  json page = json::array();
  size_t i = start;
  for (; i < selected.size() && static_cast<int64_t>(page.size()) < max_records; ++i) page.push_back(selected[i]);
  json out = {{"MetricAlarms", std::move(page)}, {"CompositeAlarms", json::array()}};
  if (i < selected.size()) out["NextToken"] = EncodeToken(json{{"h", digest}, {"k", i}});
  return out;
}

// A metric alarm over one metric (Kiln: no metric math, no percentiles, no anomaly bands), kept
// for the autoscaler, which evaluates it each Period and runs the step-scaling policies its
// AlarmActions name while it is in ALARM.
JsonOutcome CloudWatch::PutMetricAlarm(const json& in) const {
  if (options_.alarm_database == nullptr) {
    return aws::AwsError("InvalidAction", "PutMetricAlarm is not served by this server.");
  }
  if (Present(in, "Metrics") || Present(in, "ThresholdMetricId") || Present(in, "EvaluationCriteria")) {
    return InvalidValue(
        "Metric math and PromQL alarms are not supported by Kiln; give MetricName, Namespace, "
        "Statistic, Period and Threshold.");
  }
  if (Present(in, "ExtendedStatistic")) {
    return InvalidValue("ExtendedStatistic (percentile) alarms are not supported by Kiln; give a Statistic.");
  }
  for (const char* member :
       {"MetricName", "Namespace", "Statistic", "Period", "EvaluationPeriods", "Threshold", "ComparisonOperator"}) {
    if (!Present(in, member)) return Missing("The parameter " + std::string(member) + " is required.");
  }
  const std::string comparison = in["ComparisonOperator"].get<std::string>();
  if (comparison != "GreaterThanOrEqualToThreshold" && comparison != "GreaterThanThreshold" &&
      comparison != "LessThanThreshold" && comparison != "LessThanOrEqualToThreshold") {
    return InvalidValue("ComparisonOperator " + comparison +
                        " (anomaly detection bands) is not supported by Kiln; use GreaterThanThreshold, "
                        "GreaterThanOrEqualToThreshold, LessThanThreshold or LessThanOrEqualToThreshold.");
  }
  if (Present(in, "DatapointsToAlarm") &&
      in["DatapointsToAlarm"].get<int64_t>() > in["EvaluationPeriods"].get<int64_t>()) {
    return Combination("DatapointsToAlarm must be less than or equal to EvaluationPeriods.");
  }
  store::AutoscalingRecord alarm;
  alarm.kind = store::AutoscalingKind::kAlarm;
  alarm.service_namespace = "cloudwatch";
  alarm.name = in["AlarmName"].get<std::string>();
  alarm.creation_millis = Now();
  alarm.doc = in;
  alarm.doc.erase("Tags");
  alarm.doc["UpdatedMillis"] = Now();
  alarm.state = json::object();  // evaluated afresh
  auto stored = store::AutoscalingRepository(options_.alarm_database).Put(alarm);
  if (!stored.ok()) return AwsErrorFromStatus(stored.status(), ErrorService::kCloudWatch);
  if (stored->state != alarm.state) {
    Status reset = store::AutoscalingRepository(options_.alarm_database).SetState(*stored, alarm.state);
    if (!reset.ok()) return AwsErrorFromStatus(reset, ErrorService::kCloudWatch);
  }
  return json::object();
}

JsonOutcome CloudWatch::DeleteAlarms(const json& in) const {
  if (options_.alarm_database == nullptr) {
    return aws::AwsError("InvalidAction", "DeleteAlarms is not served by this server.");
  }
  store::AutoscalingRepository repo(options_.alarm_database);
  for (const json& name : in["AlarmNames"]) {
    auto found = repo.Get(store::AutoscalingKind::kAlarm, "cloudwatch", "", "", name.get<std::string>());
    if (found.status().IsNotFound()) {
      return aws::AwsError("ResourceNotFound", "Alarm " + name.get<std::string>() + " does not exist.", 404);
    }
    if (!found.ok()) return AwsErrorFromStatus(found.status(), ErrorService::kCloudWatch);
  }
  for (const json& name : in["AlarmNames"]) {
    Status deleted = repo.Delete(store::AutoscalingKind::kAlarm, "cloudwatch", "", "", name.get<std::string>());
    if (!deleted.ok() && !deleted.IsNotFound()) return AwsErrorFromStatus(deleted, ErrorService::kCloudWatch);
  }
  return json::object();
}

}  // namespace kiln::api
