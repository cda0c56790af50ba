#include "control/autoscaler.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <ctime>
#include <map>

#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "control/endpoint_states.h"
#include "store/endpoint_repository.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::AutoscalingKind;
using store::AutoscalingRecord;

bool Has(const json& object, const char* member) {
  return object.is_object() && object.contains(member) && !object[member].is_null();
}

int64_t IntOf(const json& object, const char* member, int64_t fallback) {
  return Has(object, member) && object[member].is_number() ? object[member].get<int64_t>() : fallback;
}

double DoubleOf(const json& object, const char* member, double fallback) {
  return Has(object, member) && object[member].is_number() ? object[member].get<double>() : fallback;
}

bool FlagOf(const json& object, const char* member) {
  return Has(object, member) && object[member].is_boolean() && object[member].get<bool>();
}

std::string StringOf(const json& object, const char* member) {
  return Has(object, member) && object[member].is_string() ? object[member].get<std::string>() : "";
}

int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// ---- cron ----

const char* const kMonthNames[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"};
const char* const kDayNames[] = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"};

std::optional<int> CronValue(std::string_view text, int field) {
  std::string upper(text);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (field == 3) {
    for (int i = 0; i < 12; ++i)
      if (upper == kMonthNames[i]) return i + 1;
  }
  if (field == 4) {
    for (int i = 0; i < 7; ++i)
      if (upper == kDayNames[i]) return i + 1;
  }
  if (text.empty() || text.size() > 4) return std::nullopt;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

// Whether `value` matches one cron field (AWS's six-field syntax: *, ?, lists, ranges, steps).
// nullopt when the field is malformed.
std::optional<bool> CronMatches(std::string_view spec, int field, int value) {
  static const int kLow[] = {0, 0, 1, 1, 1, 1970};
  static const int kHigh[] = {59, 23, 31, 12, 7, 2199};
  bool matched = false;
  for (std::string_view part : Split(spec, ',')) {
    int step = 1;
    if (size_t slash = part.find('/'); slash != std::string_view::npos) {
      auto parsed = CronValue(part.substr(slash + 1), -1);
      if (!parsed || *parsed <= 0) return std::nullopt;
      step = *parsed;
      part = part.substr(0, slash);
    }
    int low = kLow[field];
    int high = kHigh[field];
    if (part == "*" || part == "?") {
      // the whole range
    } else if (size_t dash = part.find('-'); dash != std::string_view::npos) {
      auto a = CronValue(part.substr(0, dash), field);
      auto b = CronValue(part.substr(dash + 1), field);
      if (!a || !b || *a > *b) return std::nullopt;
      low = *a;
      high = *b;
    } else {
      auto a = CronValue(part, field);
      if (!a) return std::nullopt;
      low = *a;
      high = step > 1 ? kHigh[field] : *a;
    }
    if (low < kLow[field] || high > kHigh[field]) return std::nullopt;
    if (value >= low && value <= high && (value - low) % step == 0) matched = true;
  }
  return matched;
}

bool ValidCronField(const std::string& spec, int field) { return CronMatches(spec, field, 1970).has_value(); }

std::optional<int64_t> ParseRateUnit(std::string_view unit) {
  if (unit == "minute" || unit == "minutes") return 60'000;
  if (unit == "hour" || unit == "hours") return 3'600'000;
  if (unit == "day" || unit == "days") return 86'400'000;
  return std::nullopt;
}

// ---- activities ----

// What the target's dimension counts, as AWS's activity texts name it.
std::string CapacityWord(std::string_view dimension) {
  return dimension == kProvisionedConcurrencyDimension ? "desired provisioned concurrency" : "desired instance count";
}

std::string ActivityText(std::string_view dimension, int64_t count) {
  return "Setting " + CapacityWord(dimension) + " to " + std::to_string(count) + ".";
}

}  // namespace

std::optional<VariantResource> ParseVariantResourceId(std::string_view resource_id) {
  const std::vector<std::string_view> parts = Split(resource_id, '/');
  if (parts.size() != 4 || parts[0] != "endpoint" || parts[2] != "variant" || parts[1].empty() || parts[3].empty()) {
    return std::nullopt;
  }
  return VariantResource{std::string(parts[1]), std::string(parts[3])};
}

Result<ScalingSchedule> ParseScalingSchedule(std::string_view text) {
  auto inner = [&](std::string_view prefix) -> std::optional<std::string_view> {
    if (text.size() < prefix.size() + 2 || text.substr(0, prefix.size()) != prefix || text[prefix.size()] != '(' ||
        text.back() != ')') {
      return std::nullopt;
    }
    return text.substr(prefix.size() + 1, text.size() - prefix.size() - 2);
  };
  ScalingSchedule out;
  if (auto at = inner("at")) {
    auto millis = ParseIso8601(std::string(*at) + (at->find('Z') == std::string_view::npos ? "Z" : ""));
    if (!millis)
      return Status::InvalidArgument("at(" + std::string(*at) + ") is not of the form at(yyyy-mm-ddThh:mm:ss)");
    out.kind = ScalingSchedule::Kind::kAt;
    out.at_millis = *millis;
    return out;
  }
  if (auto rate = inner("rate")) {
    const std::vector<std::string_view> words = Split(*rate, ' ');
    std::optional<int> value = words.size() == 2 ? CronValue(words[0], -1) : std::nullopt;
    std::optional<int64_t> unit = words.size() == 2 ? ParseRateUnit(words[1]) : std::nullopt;
    if (!value || *value <= 0 || !unit) {
      return Status::InvalidArgument("rate(" + std::string(*rate) +
                                     ") is not of the form rate(value unit) with unit minute(s), hour(s) or day(s)");
    }
    out.kind = ScalingSchedule::Kind::kRate;
    out.rate_millis = *value * *unit;
    return out;
  }
  if (auto cron = inner("cron")) {
    std::vector<std::string> fields;
    for (std::string_view f : Split(*cron, ' ')) {
      if (!f.empty()) fields.emplace_back(f);
    }
    if (fields.size() != 6) {
      return Status::InvalidArgument("cron(" + std::string(*cron) +
                                     ") must have six fields: minutes hours day-of-month month day-of-week year");
    }
    for (int i = 0; i < 6; ++i) {
      if (!ValidCronField(fields[i], i)) {
        return Status::InvalidArgument("cron field '" + fields[i] +
                                       "' is not supported (Kiln: numbers, names, *, ?, lists, ranges and steps)");
      }
    }
    out.kind = ScalingSchedule::Kind::kCron;
    out.cron_fields = std::move(fields);
    return out;
  }
  return Status::InvalidArgument("Schedule must be at(...), rate(...) or cron(...)");
}

std::optional<int64_t> NextCronMillis(const ScalingSchedule& schedule, int64_t after_millis) {
  if (schedule.cron_fields.size() != 6) return std::nullopt;
  const auto& f = schedule.cron_fields;
  const int64_t first_minute = FloorDiv(after_millis, 60'000) + 1;
  const int64_t first_day = FloorDiv(first_minute, 1440);
  for (int64_t day = first_day; day < first_day + 366 * 5; ++day) {
    const time_t seconds = static_cast<time_t>(day * 86400);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    if (!CronMatches(f[5], 5, tm.tm_year + 1900).value_or(false)) continue;
    if (!CronMatches(f[3], 3, tm.tm_mon + 1).value_or(false)) continue;
    const bool dom_any = f[2] == "?" || f[2] == "*";
    const bool dow_any = f[4] == "?" || f[4] == "*";
    if (!dom_any && !CronMatches(f[2], 2, tm.tm_mday).value_or(false)) continue;
    if (!dow_any && !CronMatches(f[4], 4, tm.tm_wday + 1).value_or(false)) continue;
    for (int h = 0; h < 24; ++h) {
      if (!CronMatches(f[1], 1, h).value_or(false)) continue;
      for (int m = 0; m < 60; ++m) {
        const int64_t minute = day * 1440 + h * 60 + m;
        if (minute < first_minute || !CronMatches(f[0], 0, m).value_or(false)) continue;
        return minute * 60'000;
      }
    }
  }
  return std::nullopt;
}

std::optional<TrackedMetric> TrackedMetricOf(const json& configuration, const VariantResource& resource) {
  TrackedMetric out;
  if (Has(configuration, "PredefinedMetricSpecification")) {
    const json& spec = configuration["PredefinedMetricSpecification"];
    const std::string type = StringOf(spec, "PredefinedMetricType");
    out.ns = "AWS/SageMaker";
    out.dimensions = {{"EndpointName", resource.endpoint}, {"VariantName", resource.variant}};
    out.missing_is_zero = true;
    if (type == kInvocationsPerInstanceMetric) {
      out.name = "InvocationsPerInstance";
      out.statistic = "Sum";
      return out;
    }
    if (type == kProvisionedConcurrencyMetric) {
      // Published every second by the serverless scaler while the variant has provisioned
      // concurrency; AWS tracks its Average.
      out.name = "ServerlessProvisionedConcurrencyUtilization";
      out.statistic = "Average";
      return out;
    }
    return std::nullopt;
  }
  if (!Has(configuration, "CustomizedMetricSpecification")) return std::nullopt;
  const json& spec = configuration["CustomizedMetricSpecification"];
  out.ns = StringOf(spec, "Namespace");
  out.name = StringOf(spec, "MetricName");
  out.statistic = StringOf(spec, "Statistic");
  out.unit = StringOf(spec, "Unit");
  if (Has(spec, "Dimensions") && spec["Dimensions"].is_array()) {
    for (const json& d : spec["Dimensions"]) out.dimensions[StringOf(d, "Name")] = StringOf(d, "Value");
  }
  if (out.ns.empty() || out.name.empty() || out.statistic.empty()) return std::nullopt;
  return out;
}

Result<std::vector<ScalingAlarm>> ListScalingAlarms(store::Database* database, int period_seconds) {
  store::AutoscalingRepository repo(database);
  ASSIGN_OR_RETURN(auto policies, repo.ListAll(AutoscalingKind::kPolicy));
  std::vector<ScalingAlarm> out;
  for (const AutoscalingRecord& policy : policies) {
    if (StringOf(policy.doc, "PolicyType") != "TargetTrackingScaling") continue;
    auto resource = ParseVariantResourceId(policy.resource_id);
    if (!resource) continue;
    const json& config = policy.doc["TargetTrackingScalingPolicyConfiguration"];
    auto metric = TrackedMetricOf(config, *resource);
    if (!metric || !Has(policy.doc, "Alarms")) continue;
    const double target = DoubleOf(config, "TargetValue", 0);
    for (const json& alarm : policy.doc["Alarms"]) {
      ScalingAlarm a;
      a.name = StringOf(alarm, "AlarmName");
      a.arn = StringOf(alarm, "AlarmARN");
      a.policy_arn = StringOf(policy.doc, "PolicyARN");
      const bool high = a.name.find("-AlarmHigh-") != std::string::npos;
      const char* prefix = high ? "high" : "low";
      a.state = StringOf(policy.state, (std::string(prefix) + "_state").c_str());
      if (a.state.empty()) a.state = "INSUFFICIENT_DATA";
      a.state_reason = StringOf(policy.state, (std::string(prefix) + "_reason").c_str());
      if (a.state_reason.empty()) a.state_reason = "Unchecked: Initial alarm creation";
      a.state_updated_millis = IntOf(policy.state, (std::string(prefix) + "_since").c_str(), policy.creation_millis);
      a.configuration_updated_millis = IntOf(policy.doc, "UpdatedMillis", policy.creation_millis);
      a.metric_name = metric->name;
      a.ns = metric->ns;
      a.dimensions = metric->dimensions;
      a.statistic = metric->statistic;
      a.unit = metric->unit;
      a.threshold = high ? target : kLowThresholdFraction * target;
      a.comparison = high ? "GreaterThanThreshold" : "LessThanThreshold";
      a.evaluation_periods = high ? kHighEvaluationPeriods : kLowEvaluationPeriods;
      a.period_seconds = period_seconds;
      out.push_back(std::move(a));
    }
  }
  return out;
}

namespace {

// A metric alarm in ALARM that names a step-scaling policy in its AlarmActions.
struct AlarmTrigger {
  std::string alarm;
  double value = 0;      // the latest datapoint
  double threshold = 0;  // the alarm's
};
using AlarmTriggers = std::map<std::string, AlarmTrigger>;  // by policy ARN

double StatisticOf(const observe::StatisticSet& s, const std::string& statistic) {
  if (statistic == "Average") return s.sample_count > 0 ? s.sum / s.sample_count : 0.0;
  if (statistic == "Minimum") return s.minimum;
  if (statistic == "Maximum") return s.maximum;
  if (statistic == "SampleCount") return s.sample_count;
  return s.sum;
}

std::string FormatValue(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return buffer;
}

// Evaluates every stored metric alarm (CloudWatch PutMetricAlarm) over its settled periods, keeps
// its state in its row, and returns the step-scaling policies the alarms in ALARM trigger.
AlarmTriggers EvaluateMetricAlarms(const AutoscalerOptions& options, const AutoscalerDeps& deps, int64_t now) {
  AlarmTriggers triggers;
  store::AutoscalingRepository repo(deps.database);
  auto alarms = repo.ListAll(AutoscalingKind::kAlarm);
  if (!alarms.ok() || deps.metrics == nullptr) return triggers;
  for (const AutoscalingRecord& alarm : *alarms) {
    const json& doc = alarm.doc;
    const int64_t period = std::max<int64_t>(1, IntOf(doc, "Period", 60)) * 1000;
    const int64_t evaluation = std::max<int64_t>(1, IntOf(doc, "EvaluationPeriods", 1));
    const int64_t needed = std::max<int64_t>(1, IntOf(doc, "DatapointsToAlarm", evaluation));
    const double threshold = DoubleOf(doc, "Threshold", 0);
    const std::string comparison = StringOf(doc, "ComparisonOperator");
    const std::string missing = Has(doc, "TreatMissingData") ? StringOf(doc, "TreatMissingData") : "missing";
    json state = alarm.state;
    const int64_t last = FloorDiv(now - options.settle_millis, period) - 1;
    int64_t through = std::max(IntOf(state, "through", last - 1), last - evaluation);
    json window = state.contains("window") && state["window"].is_array() ? state["window"] : json::array();
    for (int64_t p = through + 1; p <= last; ++p) {
      observe::MetricQuery query;
      query.ns = StringOf(doc, "Namespace");
      query.name = StringOf(doc, "MetricName");
      if (Has(doc, "Dimensions")) {
        for (const json& d : doc["Dimensions"]) query.dimensions[StringOf(d, "Name")] = StringOf(d, "Value");
      }
      if (Has(doc, "Unit")) query.unit = StringOf(doc, "Unit");
      query.start_millis = p * period;
      query.end_millis = (p + 1) * period;
      query.period_seconds = period / 1000;
      query.distributions = false;
      auto periods = deps.metrics->Aggregate(query);
      json point = nullptr;
      if (periods.ok() && !periods->empty()) {
        const double value = StatisticOf(periods->front().stats, StringOf(doc, "Statistic"));
        state["value"] = value;
        const bool breach = comparison == "GreaterThanThreshold"            ? value > threshold
                            : comparison == "GreaterThanOrEqualToThreshold" ? value >= threshold
                            : comparison == "LessThanThreshold"             ? value < threshold
                                                                            : value <= threshold;
        point = breach;
      } else if (missing == "breaching") {
        point = true;
      } else if (missing == "notBreaching") {
        point = false;
      }
      window.push_back(point);
      while (static_cast<int64_t>(window.size()) > evaluation) window.erase(window.begin());
    }
    if (last > IntOf(state, "through", last - 1)) state["through"] = last;
    state["window"] = window;
    int64_t breaching = 0;
    int64_t known = 0;
    for (const json& w : window) {
      if (w.is_boolean()) ++known;
      if (w.is_boolean() && w.get<bool>()) ++breaching;
    }
    std::string value = StringOf(state, "state");
    if (breaching >= needed) {
      value = "ALARM";
    } else if (known > 0) {
      value = "OK";
    } else if (missing != "ignore" || value.empty()) {
      value = "INSUFFICIENT_DATA";
    }
    if (value != StringOf(state, "state")) state["since"] = now;
    state["state"] = value;
    state["reason"] = "Threshold Crossed: " + std::to_string(breaching) + " out of the last " +
                      std::to_string(window.size()) + " datapoints were breaching the threshold (" +
                      FormatValue(threshold) + ")" +
                      (state.contains("value") && state["value"].is_number()
                           ? ". The most recent datapoint: " + FormatValue(state["value"].get<double>()) + "."
                           : ".");
    if (state != alarm.state) (void)repo.SetState(alarm, state);
    const bool enabled = !Has(doc, "ActionsEnabled") || FlagOf(doc, "ActionsEnabled");
    if (value != "ALARM" || !enabled || !Has(doc, "AlarmActions")) continue;
    for (const json& action : doc["AlarmActions"]) {
      if (!action.is_string()) continue;
      triggers[action.get<std::string>()] = AlarmTrigger{alarm.name, state.value("value", threshold), threshold};
    }
  }
  return triggers;
}

// One target's evaluation at `now`.
class TargetRun {
 public:
  TargetRun(const AutoscalerOptions& options, const AutoscalerDeps& deps, int64_t now, AutoscalingRecord target,
            const AlarmTriggers* triggers)
      : triggers_(triggers),
        options_(options),
        deps_(deps),
        repo_(deps.database),
        endpoints_(deps.database),
        now_(now),
        target_(std::move(target)) {}

  void Run(const std::vector<AutoscalingRecord>& policies, const std::vector<AutoscalingRecord>& actions) {
    auto resource = ParseVariantResourceId(target_.resource_id);
    if (!resource) return;
    resource_ = *resource;
    auto endpoint = endpoints_.Get(resource_.endpoint);
    if (endpoint.ok()) endpoint_ = std::move(endpoint).value();
    FinishActivity();
    for (const AutoscalingRecord& action : actions) RunScheduledAction(action);
    std::optional<Proposal> proposal = EvaluatePolicies(policies);
    if (!endpoint_ || endpoint_->status != store::EndpointStatus::kInService || endpoint_->pending) return;
    if (target_.state.contains("activity")) return;  // one activity at a time
    const int64_t current = CurrentCount();
    const int64_t min = IntOf(target_.doc, "MinCapacity", 1);
    const int64_t max = IntOf(target_.doc, "MaxCapacity", min);
    if (current < min) {
      Scale(min,
            "the " + Word() + " " + std::to_string(current) + " was below the minimum capacity " + std::to_string(min) +
                " of the scalable target",
            false);
    } else if (current > max) {
      Scale(max,
            "the " + Word() + " " + std::to_string(current) + " was above the maximum capacity " + std::to_string(max) +
                " of the scalable target",
            false);
    } else if (proposal) {
      if (Scale(proposal->count, proposal->cause, proposal->count > current) && proposal->step_policy) {
        json state = proposal->step_policy->state;
        state["last_scaled_millis"] = now_;
        (void)repo_.SetState(*proposal->step_policy, state);
      }
    }
  }

 private:
  struct Proposal {
    int64_t count = 0;
    std::string cause;
    const AutoscalingRecord* step_policy = nullptr;  // the step policy proposing it, if any
  };

  // A step-scaling policy whose alarm is in ALARM: the step adjustment its breach falls in
  // (bounds relative to the threshold), applied as AdjustmentType says, clamped; nullopt within
  // its Cooldown (default 300 s) or when it changes nothing.
  std::optional<Proposal> EvaluateStep(const AutoscalingRecord& policy) {
    if (triggers_ == nullptr || !endpoint_) return std::nullopt;
    auto trigger = triggers_->find(StringOf(policy.doc, "PolicyARN"));
    if (trigger == triggers_->end()) return std::nullopt;
    const json& config = policy.doc["StepScalingPolicyConfiguration"];
    const double delta = trigger->second.value - trigger->second.threshold;
    const json* step = nullptr;
    const json adjustments = config.value("StepAdjustments", json::array());
    for (const json& candidate : adjustments) {
      const double lower = DoubleOf(candidate, "MetricIntervalLowerBound", -HUGE_VAL);
      const double upper = DoubleOf(candidate, "MetricIntervalUpperBound", HUGE_VAL);
      if ((delta >= lower && delta < upper) || (delta < 0 && delta > lower && delta <= upper)) {
        step = &candidate;
        break;
      }
    }
    if (step == nullptr) return std::nullopt;
    const int64_t current = CurrentCount();
    const double adjustment = DoubleOf(*step, "ScalingAdjustment", 0);
    const std::string type = StringOf(config, "AdjustmentType");
    int64_t wanted = current;
    if (type == "ExactCapacity") {
      wanted = static_cast<int64_t>(adjustment);
    } else if (type == "PercentChangeInCapacity") {
      double change = static_cast<double>(current) * adjustment / 100.0;
      int64_t whole = static_cast<int64_t>(change);  // toward zero
      if (whole == 0 && change != 0) whole = change > 0 ? 1 : -1;
      const int64_t magnitude = IntOf(config, "MinAdjustmentMagnitude", 0);
      if (magnitude > 0 && std::llabs(whole) < magnitude) whole = whole > 0 ? magnitude : -magnitude;
      wanted = current + whole;
    } else {
      wanted = current + static_cast<int64_t>(adjustment);
    }
    wanted = Clamp(wanted);
    if (wanted == current) return std::nullopt;
    if (Suspended(wanted > current ? "DynamicScalingOutSuspended" : "DynamicScalingInSuspended")) return std::nullopt;
    const int64_t cooldown = IntOf(config, "Cooldown", kDefaultCooldownSeconds) * 1000;
    if (now_ - IntOf(policy.state, "last_scaled_millis", INT64_MIN / 2) < cooldown) return std::nullopt;
    return Proposal{
        wanted, "monitor alarm " + trigger->second.alarm + " in state ALARM triggered policy " + policy.name, &policy};
  }

  bool Provisioned() const { return target_.scalable_dimension == kProvisionedConcurrencyDimension; }
  std::string Word() const { return CapacityWord(target_.scalable_dimension); }

  // The dimension's value now: the desired instance count, or a serverless variant's
  // ProvisionedConcurrency (its configuration's with the desired override).
  int64_t CurrentCount() const {
    auto it = endpoint_->desired.find(resource_.variant);
    const bool found = it != endpoint_->desired.end();
    const json* variant = endpoint_->deployment.FindVariant(resource_.variant);
    if (Provisioned()) {
      if (variant == nullptr) return 1;
      const json serverless = store::EffectiveServerlessConfig(*variant, found ? &it->second : nullptr);
      return serverless.is_object() ? serverless.value("ProvisionedConcurrency", int64_t{1}) : 1;
    }
    if (found && it->second.instance_count) return *it->second.instance_count;
    return variant ? IntOf(*variant, "InitialInstanceCount", 1) : 1;
  }

  int64_t Clamp(int64_t count) const {
    const int64_t min = IntOf(target_.doc, "MinCapacity", 1);
    const int64_t max = IntOf(target_.doc, "MaxCapacity", min);
    return std::clamp(count, min, std::max(min, max));
  }

  bool Suspended(const char* flag) const {
    return Has(target_.doc, "SuspendedState") && FlagOf(target_.doc["SuspendedState"], flag);
  }

  void SaveTargetState() {
    Status saved = repo_.SetState(target_, target_.state);
    if (!saved.ok() && !saved.IsNotFound()) {
      KLOG(warn, "autoscaler: saving a target's state failed",
           {{"resource_id", target_.resource_id}, {"error", saved.message()}});
    }
  }

  // The activity in progress ends when the endpoint is InService again (or failed, or is gone).
  void FinishActivity() {
    if (!target_.state.contains("activity") || !target_.state["activity"].is_string()) return;
    const std::string id = target_.state["activity"].get<std::string>();
    auto activity = repo_.Get(AutoscalingKind::kActivity, target_.service_namespace, target_.resource_id,
                              target_.scalable_dimension, id);
    std::string code;
    std::string message;
    const int64_t count = activity.ok() ? IntOf(activity->doc, "DesiredCount", 0) : 0;
    if (!endpoint_) {
      code = "Failed";
      message = "Failed to set " + Word() + " to " + std::to_string(count) + ". The endpoint " + resource_.endpoint +
                " no longer exists.";
    } else if (endpoint_->status == store::EndpointStatus::kInService && !endpoint_->pending) {
      code = "Successful";
      message = "Successfully set " + Word() + " to " + std::to_string(count) +
                ". Change successfully fulfilled by sagemaker.";
    } else if (endpoint_->status == store::EndpointStatus::kFailed ||
               endpoint_->status == store::EndpointStatus::kDeleting) {
      code = "Failed";
      message = "Failed to set " + Word() + " to " + std::to_string(count) + ". The endpoint is " +
                std::string(store::ToString(endpoint_->status)) +
                (endpoint_->failure_reason.empty() ? "." : ": " + endpoint_->failure_reason);
    } else {
      return;  // still Updating
    }
    if (activity.ok()) {
      AutoscalingRecord done = *activity;
      done.doc["StatusCode"] = code;
      done.doc["StatusMessage"] = message;
      done.doc["EndMillis"] = now_;
      (void)repo_.Put(done);
    }
    target_.state.erase("activity");
    SaveTargetState();
  }

  void RecordActivity(const std::string& description, const std::string& cause, const std::string& code,
                      const std::string& message, int64_t count, bool in_progress) {
    AutoscalingRecord activity;
    activity.kind = AutoscalingKind::kActivity;
    activity.service_namespace = target_.service_namespace;
    activity.resource_id = target_.resource_id;
    activity.scalable_dimension = target_.scalable_dimension;
    activity.name = NewUuid();
    activity.creation_millis = now_;
    activity.doc = {{"ActivityId", activity.name},
                    {"ServiceNamespace", target_.service_namespace},
                    {"ResourceId", target_.resource_id},
                    {"ScalableDimension", target_.scalable_dimension},
                    {"Description", description},
                    {"Cause", cause},
                    {"StartMillis", now_},
                    {"StatusCode", code},
                    {"DesiredCount", count}};
    if (!message.empty()) activity.doc["StatusMessage"] = message;
    if (!in_progress) activity.doc["EndMillis"] = now_;
    Status inserted = repo_.Insert(activity);
    if (!inserted.ok()) {
      KLOG(warn, "autoscaler: recording an activity failed", {{"error", inserted.message()}});
      return;
    }
    (void)repo_.PruneActivities(target_.service_namespace, target_.resource_id, options_.max_activities);
    if (in_progress) target_.state["activity"] = activity.name;
  }

  // Sets the variant's desired count through the endpoint row (as UpdateEndpointWeightsAndCapacities).
  // True when the new count was committed.
  bool Scale(int64_t count, const std::string& cause, bool out) {
    const int64_t current = CurrentCount();
    if (count == current) return false;
    const std::string description = ActivityText(target_.scalable_dimension, count);
    std::string refused;
    auto updated = endpoints_.Mutate(resource_.endpoint, [&](store::EndpointRecord& r) {
      if (r.status != store::EndpointStatus::kInService || r.pending) {
        refused = "The endpoint is " + std::string(store::ToString(r.status)) + ".";
        return Status::FailedPrecondition("not updatable");
      }
      if (!r.deployment.FindVariant(resource_.variant)) {
        refused = "The endpoint has no production variant named " + resource_.variant + ".";
        return Status::FailedPrecondition("no variant");
      }
      if (Provisioned()) {
        // Not above the variant's MaxConcurrency (AWS refuses ProvisionedConcurrency over it).
        const json serverless = store::EffectiveServerlessConfig(*r.deployment.FindVariant(resource_.variant),
                                                                 &r.desired[resource_.variant]);
        if (!serverless.is_object() || count > serverless.value("MaxConcurrency", int64_t{1})) {
          refused = "ProvisionedConcurrency " + std::to_string(count) + " would exceed the variant's MaxConcurrency.";
          return Status::FailedPrecondition("over MaxConcurrency");
        }
        r.desired[resource_.variant].serverless_provisioned_concurrency = count;
      } else {
        r.desired[resource_.variant].instance_count = count;
      }
      SetStatus(r, store::EndpointStatus::kUpdating);
      r.failure_reason.clear();
      r.last_modified_millis = now_;
      return Status::Ok();
    });
    if (!updated.ok()) {
      if (refused.empty()) refused = updated.status().message();
      RecordActivity(description, cause, "Failed",
                     "Failed to set " + Word() + " to " + std::to_string(count) + ". " + refused, count, false);
      SaveTargetState();
      return false;
    }
    KLOG(info, "autoscaler: scaling",
         {{"resource_id", target_.resource_id}, {"from", std::to_string(current)}, {"to", std::to_string(count)}});
    if (deps_.notifier) deps_.notifier->EndpointChanged(updated->name);
    RecordActivity(description, cause, "InProgress", "", count, true);
    target_.state["last_activity_millis"] = now_;
    if (out) {
      target_.state["last_scale_out_millis"] = now_;
      target_.state["last_scale_out_count"] = count;
    }
    SaveTargetState();
    return true;
  }

  // ---- scheduled actions ----

  std::optional<int64_t> NextRun(const AutoscalingRecord& action, const ScalingSchedule& schedule, int64_t after) {
    const int64_t start = Has(action.doc, "StartMillis") ? action.doc["StartMillis"].get<int64_t>() : 0;
    switch (schedule.kind) {
      case ScalingSchedule::Kind::kAt:
        return schedule.at_millis > after ? std::optional(schedule.at_millis) : std::nullopt;
      case ScalingSchedule::Kind::kRate: {
        const int64_t anchor = start > 0 ? start : action.creation_millis;
        if (after < anchor) return anchor + schedule.rate_millis;
        return anchor + (FloorDiv(after - anchor, schedule.rate_millis) + 1) * schedule.rate_millis;
      }
      case ScalingSchedule::Kind::kCron: return NextCronMillis(schedule, std::max(after, start - 1));
    }
    return std::nullopt;
  }

  void RunScheduledAction(const AutoscalingRecord& action) {
    auto schedule = ParseScalingSchedule(StringOf(action.doc, "Schedule"));
    if (!schedule.ok()) return;
    json state = action.state;
    // The first time due: an at() in the past still runs once; others count from creation.
    if (!state.contains("next")) {
      auto next = schedule->kind == ScalingSchedule::Kind::kAt ? std::optional<int64_t>(schedule->at_millis)
                                                               : NextRun(action, *schedule, action.creation_millis);
      state["next"] = next ? json(*next) : json(nullptr);
    }
    if (!state["next"].is_number() || state["next"].get<int64_t>() > now_) {
      if (state != action.state) (void)repo_.SetState(action, state);
      return;
    }
    const int64_t end = Has(action.doc, "EndMillis") ? action.doc["EndMillis"].get<int64_t>() : 0;
    const bool expired = end > 0 && now_ > end;
    auto next = NextRun(action, *schedule, now_);
    state["next"] = next ? json(*next) : json(nullptr);
    (void)repo_.SetState(action, state);
    if (expired || Suspended("ScheduledScalingSuspended")) return;
    const json& bounds = Has(action.doc, "ScalableTargetAction") ? action.doc["ScalableTargetAction"] : json();
    std::string description = "Setting";
    if (Has(bounds, "MinCapacity")) {
      target_.doc["MinCapacity"] = bounds["MinCapacity"];
      description += " min capacity to " + std::to_string(bounds["MinCapacity"].get<int64_t>());
    }
    if (Has(bounds, "MaxCapacity")) {
      target_.doc["MaxCapacity"] = bounds["MaxCapacity"];
      description += std::string(Has(bounds, "MinCapacity") ? " and" : "") + " max capacity to " +
                     std::to_string(bounds["MaxCapacity"].get<int64_t>());
    }
    if (IntOf(target_.doc, "MaxCapacity", 0) < IntOf(target_.doc, "MinCapacity", 0)) {
      target_.doc["MaxCapacity"] = target_.doc["MinCapacity"];
    }
    auto stored = repo_.Put(target_);
    if (stored.ok()) target_ = std::move(stored).value();
    RecordActivity(description, "scheduled action name " + action.name + " was triggered", "Successful",
                   "Successfully set min and max capacity of the scalable target.", 0, false);
  }

  // ---- target tracking ----

  std::optional<double> PeriodValue(const TrackedMetric& metric, int64_t start, int64_t period_millis) {
    if (deps_.metrics == nullptr) return std::nullopt;
    observe::MetricQuery query;
    query.ns = metric.ns;
    query.name = metric.name;
    query.dimensions = metric.dimensions;
    query.start_millis = start;
    query.end_millis = start + period_millis;
    query.period_seconds = period_millis / 1000;
    query.distributions = false;
    if (!metric.unit.empty()) query.unit = metric.unit;
    auto periods = deps_.metrics->Aggregate(query);
    if (!periods.ok()) return std::nullopt;
    if (periods->empty()) return metric.missing_is_zero ? std::optional<double>(0.0) : std::nullopt;
    const observe::StatisticSet& s = periods->front().stats;
    if (metric.statistic == "Average") return s.sample_count > 0 ? s.sum / s.sample_count : 0.0;
    if (metric.statistic == "Minimum") return s.minimum;
    if (metric.statistic == "Maximum") return s.maximum;
    if (metric.statistic == "SampleCount") return s.sample_count;
    return s.sum;
  }

  static void SetAlarm(json& state, const char* which, const std::string& value, const std::string& reason,
                       int64_t now) {
    const std::string key = std::string(which) + "_state";
    if (StringOf(state, key.c_str()) != value) state[std::string(which) + "_since"] = now;
    state[key] = value;
    state[std::string(which) + "_reason"] = reason;
  }

  struct Vote {
    std::optional<Proposal> out;
    std::optional<Proposal> in;
    bool votes_in = true;  // takes part in scale-in decisions
  };

  std::string AlarmName(const AutoscalingRecord& policy, const char* kind) {
    const json alarms = policy.doc.value("Alarms", json::array());
    for (const json& alarm : alarms) {
      const std::string name = StringOf(alarm, "AlarmName");
      if (name.find(kind) != std::string::npos) return name;
    }
    return "";
  }

  Vote EvaluateTargetTracking(const AutoscalingRecord& policy) {
    Vote vote;
    const json& config = policy.doc["TargetTrackingScalingPolicyConfiguration"];
    auto metric = TrackedMetricOf(config, resource_);
    const double target = DoubleOf(config, "TargetValue", 0);
    if (FlagOf(config, "DisableScaleIn")) vote.votes_in = false;
    if (!metric || target <= 0) return vote;
    const int64_t period = static_cast<int64_t>(options_.period_seconds) * 1000;
    const int64_t last = FloorDiv(now_ - options_.settle_millis, period) - 1;  // the last settled period
    json state = policy.state;
    int64_t through = IntOf(state, "through", last - 1);
    through = std::max(through, last - kLowEvaluationPeriods);
    std::optional<double> value;
    bool evaluated = false;
    for (int64_t p = through + 1; p <= last; ++p) {
      if (p * period < policy.creation_millis - period) continue;
      evaluated = true;
      value = PeriodValue(*metric, p * period, period);
      if (!value) {
        state["high"] = 0;
        state["low"] = 0;
        continue;
      }
      state["high"] = *value > target ? IntOf(state, "high", 0) + 1 : 0;
      state["low"] = *value < kLowThresholdFraction * target ? IntOf(state, "low", 0) + 1 : 0;
    }
    if (last > IntOf(state, "through", last - 1)) state["through"] = last;
    if (evaluated) {
      const std::string shown = value ? FormatNumber(*value) : "no data";
      if (!value) {
        SetAlarm(state, "high", "INSUFFICIENT_DATA", "Insufficient Data: the last period had no data points.", now_);
        SetAlarm(state, "low", "INSUFFICIENT_DATA", "Insufficient Data: the last period had no data points.", now_);
      } else {
        const int64_t high = IntOf(state, "high", 0);
        const int64_t low = IntOf(state, "low", 0);
        SetAlarm(state, "high", high >= kHighEvaluationPeriods ? "ALARM" : "OK",
                 "Threshold Crossed: " + std::to_string(std::min<int64_t>(high, kHighEvaluationPeriods)) +
                     " of the last " + std::to_string(kHighEvaluationPeriods) +
                     " datapoints were greater than the threshold (" + FormatNumber(target) +
                     "). The most recent datapoint: " + shown + ".",
                 now_);
        SetAlarm(state, "low", low >= kLowEvaluationPeriods ? "ALARM" : "OK",
                 "Threshold Crossed: " + std::to_string(std::min<int64_t>(low, kLowEvaluationPeriods)) +
                     " of the last " + std::to_string(kLowEvaluationPeriods) +
                     " datapoints were less than the threshold (" + FormatNumber(kLowThresholdFraction * target) +
                     "). The most recent datapoint: " + shown + ".",
                 now_);
      }
      state["value"] = value ? json(*value) : json(nullptr);
    }
    if (state != policy.state) (void)repo_.SetState(policy, state);
    if (!endpoint_ || !state["value"].is_number()) return vote;
    const double v = state["value"].get<double>();
    const int64_t current = CurrentCount();
    const int64_t wanted = Clamp(static_cast<int64_t>(std::ceil(static_cast<double>(current) * v / target - 1e-9)));
    if (StringOf(state, "high_state") == "ALARM" && wanted > current && !Suspended("DynamicScalingOutSuspended")) {
      const int64_t cooldown = IntOf(config, "ScaleOutCooldown", kDefaultCooldownSeconds) * 1000;
      const bool cooled = now_ - IntOf(target_.state, "last_scale_out_millis", INT64_MIN / 2) >= cooldown;
      if (cooled || wanted > IntOf(target_.state, "last_scale_out_count", 0)) {
        vote.out = Proposal{wanted, "monitor alarm " + AlarmName(policy, "-AlarmHigh-") +
                                        " in state ALARM triggered policy " + policy.name};
      }
    }
    if (vote.votes_in && StringOf(state, "low_state") == "ALARM" && wanted < current &&
        !Suspended("DynamicScalingInSuspended")) {
      const int64_t cooldown = IntOf(config, "ScaleInCooldown", kDefaultCooldownSeconds) * 1000;
      if (now_ - IntOf(target_.state, "last_activity_millis", INT64_MIN / 2) >= cooldown) {
        const int64_t step = std::max<int64_t>(1, current / 10);
        vote.in = Proposal{std::max(wanted, current - step), "monitor alarm " + AlarmName(policy, "-AlarmLow-") +
                                                                 " in state ALARM triggered policy " + policy.name};
      }
    }
    return vote;
  }

  std::optional<Proposal> EvaluatePolicies(const std::vector<AutoscalingRecord>& policies) {
    std::optional<Proposal> out;
    std::optional<Proposal> in;
    std::optional<Proposal> step_in;
    bool all_in = true;
    bool any_voter = false;
    for (const AutoscalingRecord& policy : policies) {
      if (StringOf(policy.doc, "PolicyType") == "StepScaling") {
        auto step = EvaluateStep(policy);
        if (!step) continue;
        if (step->count > CurrentCount()) {
          if (!out || step->count > out->count) out = step;
        } else if (!step_in || step->count > step_in->count) {
          step_in = step;
        }
        continue;
      }
      if (StringOf(policy.doc, "PolicyType") != "TargetTrackingScaling") continue;
      Vote vote = EvaluateTargetTracking(policy);
      if (vote.out && (!out || vote.out->count > out->count)) out = vote.out;
      if (!vote.votes_in) continue;
      any_voter = true;
      if (!vote.in) {
        all_in = false;
      } else if (!in || vote.in->count > in->count) {
        in = vote.in;
      }
    }
    if (out) return out;
    if (step_in) return step_in;
    if (any_voter && all_in) return in;
    return std::nullopt;
  }

  static std::string FormatNumber(double value) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.6g", value);
    return buffer;
  }

  const AlarmTriggers* triggers_;
  const AutoscalerOptions& options_;
  const AutoscalerDeps& deps_;
  store::AutoscalingRepository repo_;
  store::EndpointRepository endpoints_;
  const int64_t now_;
  AutoscalingRecord target_;
  VariantResource resource_;
  std::optional<store::EndpointRecord> endpoint_;
};

std::string KeyOf(const AutoscalingRecord& r) {
  return r.service_namespace + '\n' + r.resource_id + '\n' + r.scalable_dimension;
}

}  // namespace

Autoscaler::Autoscaler(AutoscalerOptions options, AutoscalerDeps deps) : options_(std::move(options)), deps_(deps) {}

Autoscaler::~Autoscaler() { Stop(); }

void Autoscaler::Start() {
  MutexLock lock(mutex_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void Autoscaler::Stop() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
    cv_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Autoscaler::Run() {
  const auto interval = std::chrono::milliseconds(std::max(250, options_.period_seconds * 500));
  for (;;) {
    {
      MutexLock lock(mutex_);
      if (stop_) return;
      cv_.WaitFor(mutex_, interval);
      if (stop_) return;
    }
    RunOnce();
  }
}

void Autoscaler::RunOnce() {
  MutexLock run(run_mutex_);
  if (deps_.database == nullptr || options_.period_seconds <= 0) return;
  store::AutoscalingRepository repo(deps_.database);
  auto targets = repo.ListAll(AutoscalingKind::kTarget);
  auto policies = repo.ListAll(AutoscalingKind::kPolicy);
  auto actions = repo.ListAll(AutoscalingKind::kScheduledAction);
  if (!targets.ok() || !policies.ok() || !actions.ok()) {
    KLOG(warn, "autoscaler: reading the scalable targets failed", {});
    return;
  }
  std::map<std::string, std::vector<AutoscalingRecord>> policies_of;
  for (auto& p : *policies) policies_of[KeyOf(p)].push_back(std::move(p));
  std::map<std::string, std::vector<AutoscalingRecord>> actions_of;
  for (auto& a : *actions) actions_of[KeyOf(a)].push_back(std::move(a));
  const int64_t now = Now();
  const AlarmTriggers triggers = EvaluateMetricAlarms(options_, deps_, now);
  for (auto& target : *targets) {
    const std::string key = KeyOf(target);
    try {
      TargetRun(options_, deps_, now, std::move(target), &triggers).Run(policies_of[key], actions_of[key]);
    } catch (const std::exception& e) {
      KLOG(error, "autoscaler: evaluating a target threw", {{"what", e.what()}});
    }
  }
}

}  // namespace kiln::control
