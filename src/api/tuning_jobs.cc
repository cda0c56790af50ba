#include "api/tuning_jobs.h"

#include "base/json_parse.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <variant>
#include <vector>

#include "api/errors.h"
#include "api/paging.h"
#include "base/log.h"
#include "base/strings.h"
#include "control/training_hold.h"
#include "control/tuning_space.h"
#include "control/tuning_stopping.h"
#include "store/training_job_repository.h"
#include "store/tuning_job_state.h"

namespace kiln::api {
namespace {

using nlohmann::json;

constexpr const char* kConfig = "HyperParameterTuningJobConfig";
constexpr const char* kObjective = "HyperParameterTuningJobObjective";

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationException", std::move(message)); }

// §7: what AWS answers for a tuning job that does not exist (the model lists ResourceNotFound).
aws::AwsError TuningJobNotFound(const std::string& name) {
  return aws::AwsError("ResourceNotFound", "Amazon SageMaker can't find a tuning job with name " + name);
}

json Seconds(int64_t millis) { return static_cast<double>(millis) / 1000.0; }

bool Has(const json& object, const char* member) {
  return object.is_object() && object.contains(member) && !object[member].is_null();
}

std::string TrainingJobArn(const std::string& region, const std::string& account, const std::string& name) {
  return "arn:aws:sagemaker:" + region + ":" + account + ":training-job/" + name;
}

using control::TuningJobArn;

// ---- reading a stored (or incoming) request ----

bool SingleForm(const json& request) { return Has(request, "TrainingJobDefinition"); }

// The definitions of a request in order (the single form as a list of one).
std::vector<json> DefinitionsOf(const json& request) {
  if (SingleForm(request)) return {request["TrainingJobDefinition"]};
  std::vector<json> out;
  if (Has(request, "TrainingJobDefinitions") && request["TrainingJobDefinitions"].is_array()) {
    for (const json& d : request["TrainingJobDefinitions"]) out.push_back(d);
  }
  return out;
}

// The objective a definition's trials are judged by: the tuning job's objective, or the
// definition's TuningObjective (the form TrainingJobDefinitions uses). Null when there is none
// (Random and Grid may run without one).
json ObjectiveOf(const json& config, const json& definition) {
  if (Has(definition, "TuningObjective")) return definition["TuningObjective"];
  if (Has(config, kObjective)) return config[kObjective];
  return json();
}

// The parameter ranges a definition's trials are drawn from: its own HyperParameterRanges, or
// the tuning job's ParameterRanges. Null when there are none.
json RangesOf(const json& config, const json& definition) {
  if (Has(definition, "HyperParameterRanges")) return definition["HyperParameterRanges"];
  if (Has(config, "ParameterRanges")) return config["ParameterRanges"];
  return json();
}

// The definition a trial was launched from ("" = the single form's, or the first).
json DefinitionFor(const json& request, const std::string& definition_name) {
  std::vector<json> definitions = DefinitionsOf(request);
  for (const json& d : definitions) {
    if (d.value("DefinitionName", "") == definition_name) return d;
  }
  return definitions.empty() ? json::object() : definitions.front();
}

// ---- trials: status, objective, counters, best ----

bool TrialEnded(const std::string& status) {
  return status == "Completed" || status == "Failed" || status == "Stopped";
}

// The objective of `trial` (null when its tuning job has none).
json TrialObjective(const store::TuningJobRecord& record, const store::TuningTrial& trial) {
  const json config = record.request.value(kConfig, json::object());
  return ObjectiveOf(config, DefinitionFor(record.request, trial.definition_name));
}

// ObjectiveStatus (design page, "Semantics"): Pending until the trial ends; then Succeeded when it
// ended Completed or Stopped with an objective value, Failed otherwise. Without an objective
// metric nothing can be reported, so a Completed trial is what succeeds.
std::string ObjectiveStatusOf(const store::TuningTrial& trial, bool has_objective) {
  if (!TrialEnded(trial.status)) return "Pending";
  if (!has_objective) return trial.status == "Completed" ? "Succeeded" : "Failed";
  if ((trial.status == "Completed" || trial.status == "Stopped") && trial.objective) return "Succeeded";
  return "Failed";
}

// A retryable failure is a platform error (AWS: "InternalServerError: ..."); every other failure
// (the algorithm's, a client error, a trial that could not be created) is not.
bool RetryableFailure(const store::TuningTrial& trial) {
  return trial.failure_reason && StartsWith(*trial.failure_reason, "InternalServerError");
}

struct Counters {
  int completed = 0, in_progress = 0, retryable = 0, non_retryable = 0, stopped = 0;
  int succeeded = 0, pending = 0, failed = 0;
};

Counters CountTrials(const store::TuningJobRecord& record) {
  Counters c;
  for (const store::TuningTrial& trial : record.state.trials) {
    if (trial.status == "Completed") {
      ++c.completed;
    } else if (trial.status == "Stopped") {
      ++c.stopped;
    } else if (trial.status == "Failed") {
      ++(RetryableFailure(trial) ? c.retryable : c.non_retryable);
    } else {
      ++c.in_progress;  // InProgress, Stopping
    }
    const std::string objective_status = ObjectiveStatusOf(trial, !TrialObjective(record, trial).is_null());
    if (objective_status == "Succeeded") {
      ++c.succeeded;
    } else if (objective_status == "Pending") {
      ++c.pending;
    } else {
      ++c.failed;
    }
  }
  return c;
}

json TrainingJobStatusCounters(const Counters& c) {
  return {{"Completed", c.completed},
          {"InProgress", c.in_progress},
          {"RetryableError", c.retryable},
          {"NonRetryableError", c.non_retryable},
          {"Stopped", c.stopped}};
}

json ObjectiveStatusCounters(const Counters& c) {
  return {{"Succeeded", c.succeeded}, {"Pending", c.pending}, {"Failed", c.failed}};
}

// A trial that can be best: Succeeded with an objective value; its loss (lower is better).
std::optional<double> TrialLoss(const store::TuningJobRecord& record, const store::TuningTrial& trial) {
  if (trial.name.empty() || !trial.objective || !std::isfinite(*trial.objective)) return std::nullopt;
  const json objective = TrialObjective(record, trial);
  if (objective.is_null() || ObjectiveStatusOf(trial, true) != "Succeeded") return std::nullopt;
  return objective.value("Type", "Minimize") == "Maximize" ? -*trial.objective : *trial.objective;
}

// The best trial over `records` (ties: the earlier record, then the earlier trial).
std::optional<json> BestOf(const std::vector<const store::TuningJobRecord*>& records, const std::string& region,
                           const std::string& account) {
  const store::TuningJobRecord* best_record = nullptr;
  const store::TuningTrial* best_trial = nullptr;
  double best_loss = std::numeric_limits<double>::infinity();
  for (const store::TuningJobRecord* record : records) {
    for (const store::TuningTrial& trial : record->state.trials) {
      std::optional<double> loss = TrialLoss(*record, trial);
      if (loss && (best_trial == nullptr || *loss < best_loss)) {
        best_record = record;
        best_trial = &trial;
        best_loss = *loss;
      }
    }
  }
  if (best_trial == nullptr) return std::nullopt;
  return RenderTrialSummary(*best_record, *best_trial, region, account);
}

// ---- Describe's echo of the request, with AWS's defaults ----

// AWS answers all three range lists (the SageMaker SDK's attach and analytics read them without a
// default) and ScalingType Auto where none was given.
json WithRangeDefaults(json ranges) {
  if (!ranges.is_object()) ranges = json::object();
  for (const char* kind : {"IntegerParameterRanges", "ContinuousParameterRanges", "CategoricalParameterRanges"}) {
    if (!Has(ranges, kind)) ranges[kind] = json::array();
  }
  for (const char* kind : {"IntegerParameterRanges", "ContinuousParameterRanges"}) {
    for (json& range : ranges[kind]) {
      if (range.is_object() && !range.contains("ScalingType")) range["ScalingType"] = "Auto";
    }
  }
  return ranges;
}

// A definition as Describe shows it: StaticHyperParameters and MetricDefinitions are read
// unguarded by the SDK's attach, so they are always there.
json DefinitionEcho(json definition, const json& config, bool multi) {
  if (!Has(definition, "StaticHyperParameters")) definition["StaticHyperParameters"] = json::object();
  // As DescribeTrainingJob shows it: the SDK's attach reads MaxRuntimeInSeconds unguarded.
  if (Has(definition, "StoppingCondition") && definition["StoppingCondition"].is_object() &&
      !Has(definition["StoppingCondition"], "MaxRuntimeInSeconds")) {
    definition["StoppingCondition"]["MaxRuntimeInSeconds"] = 86400;
  }
  if (Has(definition, "AlgorithmSpecification") && !Has(definition["AlgorithmSpecification"], "MetricDefinitions")) {
    definition["AlgorithmSpecification"]["MetricDefinitions"] = json::array();
  }
  if (multi) {
    // What the trials of this definition actually used (the SDK reads both per definition).
    if (!Has(definition, "TuningObjective") && Has(config, kObjective))
      definition["TuningObjective"] = config[kObjective];
    if (!Has(definition, "HyperParameterRanges") && Has(config, "ParameterRanges")) {
      definition["HyperParameterRanges"] = config["ParameterRanges"];
    }
  }
  if (Has(definition, "HyperParameterRanges")) {
    definition["HyperParameterRanges"] = WithRangeDefaults(definition["HyperParameterRanges"]);
  }
  // The SageMaker SDK's tuner always sends HyperParameterTuningResourceConfig, and its
  // HyperparameterTuner.attach reads ResourceConfig.InstanceCount unguarded: show the resources
  // the trials run with (the plain members, or the first InstanceConfigs entry, which is what
  // Kiln uses) as ResourceConfig too.
  if (!Has(definition, "ResourceConfig") && Has(definition, "HyperParameterTuningResourceConfig")) {
    json rc = ResourceConfigFromTuningResources(definition["HyperParameterTuningResourceConfig"]);
    if (!rc.empty()) definition["ResourceConfig"] = std::move(rc);
  }
  // AWS shows the hyperparameter it adds to every trial among the static ones; the SDK's
  // HyperparameterTuner.attach deletes it from there unguarded (KeyError without it).
  const json objective =
      Has(definition, "TuningObjective") ? definition["TuningObjective"] : config.value(kObjective, json());
  if (objective.is_object() && objective.contains("MetricName") && definition["StaticHyperParameters"].is_object()) {
    definition["StaticHyperParameters"]["_tuning_objective_metric"] = objective["MetricName"];
  }
  return definition;
}

json ConfigEcho(const json& request) {
  json config = request.value(kConfig, json::object());
  if (!Has(config, "TrainingJobEarlyStoppingType")) config["TrainingJobEarlyStoppingType"] = "Off";
  if (SingleForm(request) && !Has(config, "ParameterRanges") &&
      Has(request["TrainingJobDefinition"], "HyperParameterRanges")) {
    config["ParameterRanges"] = request["TrainingJobDefinition"]["HyperParameterRanges"];
  }
  if (Has(config, "ParameterRanges")) config["ParameterRanges"] = WithRangeDefaults(config["ParameterRanges"]);
  return config;
}

}  // namespace

json RenderTrialSummary(const store::TuningJobRecord& record, const store::TuningTrial& trial,
                        const std::string& region, const std::string& account_id) {
  const json objective = TrialObjective(record, trial);
  json tuned = json::object();
  for (const auto& [key, value] : trial.tuned) tuned[key] = value;
  json s = {{"TrainingJobName", trial.name},
            {"TrainingJobArn", TrainingJobArn(region, account_id, trial.name)},
            {"TuningJobName", record.name},
            {"CreationTime", Seconds(trial.creation_millis)},
            {"TrainingJobStatus", trial.status},
            {"TunedHyperParameters", tuned},
            {"ObjectiveStatus", ObjectiveStatusOf(trial, !objective.is_null())}};
  if (!trial.definition_name.empty()) s["TrainingJobDefinitionName"] = trial.definition_name;
  if (trial.start_millis) s["TrainingStartTime"] = Seconds(*trial.start_millis);
  if (trial.end_millis) s["TrainingEndTime"] = Seconds(*trial.end_millis);
  if (trial.failure_reason) s["FailureReason"] = *trial.failure_reason;
  if (!objective.is_null() && trial.objective && std::isfinite(*trial.objective)) {
    s["FinalHyperParameterTuningJobObjectiveMetric"] = {{"Type", objective.value("Type", "Minimize")},
                                                        {"MetricName", objective.value("MetricName", "")},
                                                        {"Value", *trial.objective}};
  }
  return s;
}

json RenderTuningJob(const store::TuningJobRecord& record, const std::vector<store::TuningJobRecord>& parents,
                     const std::string& region, const std::string& account_id, int64_t now_millis) {
  const json& in = record.request;
  json out = json::object();
  out["HyperParameterTuningJobName"] = record.name;
  out["HyperParameterTuningJobArn"] = record.arn;
  const json config = ConfigEcho(in);
  out[kConfig] = config;
  if (SingleForm(in)) {
    out["TrainingJobDefinition"] = DefinitionEcho(in["TrainingJobDefinition"], config, false);
  } else {
    json definitions = json::array();
    for (const json& d : DefinitionsOf(in)) definitions.push_back(DefinitionEcho(d, config, true));
    out["TrainingJobDefinitions"] = definitions;
  }
  out["HyperParameterTuningJobStatus"] = std::string(store::ToString(record.status));
  out["CreationTime"] = Seconds(record.creation_millis);
  std::optional<int64_t> end = record.end_millis ? record.end_millis : record.state.end_millis;
  if (end) out["HyperParameterTuningEndTime"] = Seconds(*end);
  out["LastModifiedTime"] = Seconds(record.last_modified_millis);
  const Counters counters = CountTrials(record);
  out["TrainingJobStatusCounters"] = TrainingJobStatusCounters(counters);
  out["ObjectiveStatusCounters"] = ObjectiveStatusCounters(counters);
  if (auto best = BestOf({&record}, region, account_id)) out["BestTrainingJob"] = *best;
  if (Has(in, "WarmStartConfig")) {
    out["WarmStartConfig"] = in["WarmStartConfig"];
    std::vector<const store::TuningJobRecord*> all = {&record};
    for (const store::TuningJobRecord& parent : parents) all.push_back(&parent);
    if (auto best = BestOf(all, region, account_id)) out["OverallBestTrainingJob"] = *best;
  }
  if (record.state.failure_reason) out["FailureReason"] = *record.state.failure_reason;
  json details = {{"NumberOfTrainingJobsObjectiveNotImproving", record.state.not_improving}};
  if (record.state.convergence_detected_millis) {
    details["ConvergenceDetectedTime"] = Seconds(*record.state.convergence_detected_millis);
  }
  out["TuningJobCompletionDetails"] = details;
  // The tuning job's wall time: up to its end, or `now_millis` while it runs (the controller's
  // runtime_ms_consumed when it keeps a larger figure).
  const int64_t until = end ? *end : std::max(now_millis, record.creation_millis);
  const int64_t runtime_ms = std::max(record.state.runtime_ms_consumed, until - record.creation_millis);
  out["ConsumedResources"] = {{"RuntimeInSeconds", runtime_ms / 1000}};
  return out;
}

namespace {

// What the operations share: the context (defaults resolved) and the repositories.
struct Operations {
  explicit Operations(const TuningJobsContext& context) : ctx(context), jobs(context.database), tags(context.database) {
    TrainingJobsContext& t = ctx.training_context;
    if (t.database == nullptr) t.database = ctx.database;
    if (t.controller == nullptr) t.controller = ctx.training;
    if (t.catalog == nullptr) t.catalog = ctx.catalog;
    if (t.clock == nullptr) t.clock = ctx.clock;
    if (t.account_id.empty()) t.account_id = ctx.account_id;
    if (t.region.empty()) t.region = ctx.region;
  }
  int64_t Now() const { return ctx.clock ? ctx.clock->NowMillis() : Clock::System().NowMillis(); }
  std::string Arn(const std::string& name) const { return TuningJobArn(ctx.region, ctx.account_id, name); }

  TuningJobsContext ctx;
  store::TuningJobRepository jobs;
  store::TagRepository tags;
};

// ---- CreateHyperParameterTuningJob's checks ----

// Where a definition is, for messages: "TrainingJobDefinition" or
// "TrainingJobDefinitions[1] (DefinitionName 'xgb')".
std::string DefinitionLocation(bool single, size_t index, const json& definition) {
  if (single) return "TrainingJobDefinition";
  std::string where = "TrainingJobDefinitions[" + std::to_string(index) + "]";
  if (Has(definition, "DefinitionName")) where += " (DefinitionName '" + definition.value("DefinitionName", "") + "')";
  return where;
}

// The objective metric must be one the trials report: a MetricDefinition of the definition's
// algorithm (Kiln registers no built-in algorithms whose metrics it would know).
std::optional<aws::AwsError> CheckObjectiveMetric(const std::string& where, const json& definition,
                                                  const json& objective) {
  const std::string metric = objective.value("MetricName", "");
  std::vector<std::string> defined;
  const json algorithm = definition.value("AlgorithmSpecification", json::object());
  if (Has(algorithm, "MetricDefinitions")) {
    for (const json& m : algorithm["MetricDefinitions"]) {
      if (m.value("Name", "") == metric) return std::nullopt;
      defined.push_back(m.value("Name", ""));
    }
  }
  return Validation("The objective metric '" + metric + "' is not defined by " + where +
                    ".AlgorithmSpecification.MetricDefinitions (" +
                    (defined.empty() ? std::string("none are defined") : "defined: " + Join(defined, ", ")) +
                    "). Add a MetricDefinition named '" + metric +
                    "' whose Regex matches the value in the training log, or choose a defined metric.");
}

std::set<std::string> StaticNames(const json& definition) {
  std::set<std::string> names;
  if (Has(definition, "StaticHyperParameters") && definition["StaticHyperParameters"].is_object()) {
    for (auto it = definition["StaticHyperParameters"].begin(); it != definition["StaticHyperParameters"].end(); ++it) {
      names.insert(it.key());
    }
  }
  return names;
}

struct CheckedDefinitions {
  uint64_t grid_points = 0;  // Grid: the sum over definitions of their grid sizes
};

// Every definition: its ranges, objective, Hyperband resources, and the sample trial request
// CreateTrainingJob's checks run on.
std::variant<CheckedDefinitions, aws::AwsError> CheckDefinitions(Operations& ops, const json& in,
                                                                 const std::string& arn) {
  const json& config = in[kConfig];
  const std::string strategy = config.value("Strategy", "");
  const bool single = SingleForm(in);
  const std::vector<json> definitions = DefinitionsOf(in);
  const json tags = in.value("Tags", json::array());
  const json criteria = config.value("TuningJobCompletionCriteria", json::object());
  const bool needs_objective_for_criteria =
      Has(criteria, "TargetObjectiveMetricValue") || Has(criteria, "BestObjectiveNotImproving") ||
      (Has(criteria, "ConvergenceDetected") &&
       criteria["ConvergenceDetected"].value("CompleteOnConvergence", "Disabled") == "Enabled");
  CheckedDefinitions checked;
  std::set<std::string> definition_names;
  for (size_t i = 0; i < definitions.size(); ++i) {
    const json& definition = definitions[i];
    const std::string where = DefinitionLocation(single, i, definition);
    if (!single) {
      if (!Has(definition, "DefinitionName")) {
        return Validation(where +
                          ": DefinitionName is required when TrainingJobDefinitions is given (it names the "
                          "definition each training job comes from).");
      }
      const std::string name = definition["DefinitionName"].get<std::string>();
      if (!definition_names.insert(name).second) {
        return Validation("DefinitionName '" + name +
                          "' is used by more than one of TrainingJobDefinitions; give each definition its own name.");
      }
    }
    const json objective = ObjectiveOf(config, definition);
    if (objective.is_null()) {
      if (strategy != "Random" && strategy != "Grid") {
        return Validation(where + " has no objective metric: the " + strategy +
                          " strategy needs HyperParameterTuningJobConfig.HyperParameterTuningJobObjective" +
                          (single ? "" : " or the definition's TuningObjective") +
                          " (only Random and Grid can run without one).");
      }
      if (config.value("TrainingJobEarlyStoppingType", "Off") == "Auto") {
        return Validation(where +
                          " has no objective metric: TrainingJobEarlyStoppingType Auto compares training jobs by "
                          "their objective metric; give HyperParameterTuningJobObjective or set it to Off.");
      }
      if (needs_objective_for_criteria) {
        return Validation(where +
                          " has no objective metric: TuningJobCompletionCriteria are judged on the objective "
                          "metric; give HyperParameterTuningJobObjective or remove the criteria.");
      }
    } else if (auto error = CheckObjectiveMetric(where, definition, objective)) {
      return *error;
    }
    const json ranges = RangesOf(config, definition);
    if (ranges.is_null()) {
      return Validation(where + " has no hyperparameter ranges: give HyperParameterTuningJobConfig.ParameterRanges" +
                        (single ? "" : " or the definition's HyperParameterRanges") + ".");
    }
    const std::string ranges_where = Has(definition, "HyperParameterRanges")
                                         ? where + ".HyperParameterRanges"
                                         : "HyperParameterTuningJobConfig.ParameterRanges";
    const std::set<std::string> statics = StaticNames(definition);
    auto space = control::tuning::SearchSpace::Parse(ranges, statics);
    if (!space.ok()) return Validation(ranges_where + ": " + space.status().message());
    if (strategy == "Grid") {
      if (!space->all_categorical()) {
        return Validation(ranges_where +
                          ": the Grid strategy searches CategoricalParameterRanges only; turn the integer and "
                          "continuous ranges into categorical values, or choose the Random or Bayesian strategy.");
      }
      checked.grid_points += space->grid_size();
    }
    if (strategy == "Hyperband") {
      const json hyperband =
          config.value("StrategyConfig", json::object()).value("HyperbandStrategyConfig", json::object());
      auto max_resource =
          control::tuning::InferMaxResource(hyperband, definition.value("StaticHyperParameters", json::object()));
      if (!max_resource.ok()) return Validation(where + ": " + max_resource.status().message());
      const int min_resource = hyperband.value("MinResource", 1);
      auto bands = control::tuning::Hyperband::Create(min_resource, *max_resource);
      if (!bands.ok()) {
        return Validation("HyperParameterTuningJobConfig.StrategyConfig.HyperbandStrategyConfig: " +
                          bands.status().message());
      }
    }
    const bool has_rc = Has(definition, "ResourceConfig");
    const bool has_tuning_rc = Has(definition, "HyperParameterTuningResourceConfig");
    if (has_rc && has_tuning_rc) {
      return Validation(where + ": give either ResourceConfig or HyperParameterTuningResourceConfig, not both.");
    }
    if (!has_rc && !has_tuning_rc) {
      return Validation(where +
                        ": ResourceConfig (or HyperParameterTuningResourceConfig) is required: give InstanceType, "
                        "InstanceCount and VolumeSizeInGB.");
    }
    // The trials are CreateTrainingJob requests: check one now, with the space's midpoint, so that
    // what would fail every trial fails the create instead.
    const control::tuning::Assignment midpoint = space->Decode(std::vector<double>(space->encoded_dimensions(), 0.5));
    const json sample =
        TrialRequestFromDefinition(definition, in["HyperParameterTuningJobName"].get<std::string>() + "-001-00000000",
                                   arn, midpoint, objective.is_null() ? "" : objective.value("MetricName", ""), tags);
    if (auto error = CheckTrainingJobRequest(sample, ops.ctx.training_context)) {
      aws::AwsError named = *error;
      named.message = where + ": " + error->message;
      return named;
    }
  }
  return checked;
}

// ResourceLimits: Kiln's caps, and MaxNumberOfTrainingJobs resolved (Grid: its grid size).
std::optional<aws::AwsError> ResolveLimits(const Operations& ops, json& config, uint64_t grid_points) {
  json& limits = config["ResourceLimits"];
  const std::string strategy = config.value("Strategy", "");
  const int64_t parallel = limits.value("MaxParallelTrainingJobs", int64_t{1});
  if (parallel > ops.ctx.max_parallel_training_jobs) {
    return aws::AwsError("ResourceLimitExceeded",
                         "HyperParameterTuningJobConfig.ResourceLimits.MaxParallelTrainingJobs is " +
                             std::to_string(parallel) + " but Kiln runs at most " +
                             std::to_string(ops.ctx.max_parallel_training_jobs) +
                             " training jobs of a tuning job at once; lower it to at most " +
                             std::to_string(ops.ctx.max_parallel_training_jobs) + ".");
  }
  int64_t number = 0;
  if (Has(limits, "MaxNumberOfTrainingJobs")) {
    number = limits["MaxNumberOfTrainingJobs"].get<int64_t>();
    if (strategy == "Grid" && static_cast<uint64_t>(number) > grid_points) {
      return Validation("HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs is " +
                        std::to_string(number) + " but the Grid strategy has only " + std::to_string(grid_points) +
                        " combinations of the categorical values to try; lower it to at most " +
                        std::to_string(grid_points) + ", or leave it out to try them all.");
    }
  } else if (strategy == "Grid") {
    number = static_cast<int64_t>(std::min<uint64_t>(grid_points, std::numeric_limits<int32_t>::max()));
  } else {
    return Validation("HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs is required for the " +
                      strategy + " strategy (only Grid defaults it, to the number of combinations); give it.");
  }
  if (number > ops.ctx.max_number_of_training_jobs) {
    return aws::AwsError("ResourceLimitExceeded",
                         "HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs is " +
                             std::to_string(number) + " but Kiln launches at most " +
                             std::to_string(ops.ctx.max_number_of_training_jobs) +
                             " training jobs per tuning job; lower it to at most " +
                             std::to_string(ops.ctx.max_number_of_training_jobs) +
                             (strategy == "Grid" && !Has(limits, "MaxNumberOfTrainingJobs")
                                  ? " (Grid defaults it to the number of combinations, " + std::to_string(number) + ")"
                                  : std::string()) +
                             ".");
  }
  limits["MaxNumberOfTrainingJobs"] = number;
  return std::nullopt;
}

// Warm start: parents that exist and have ended, with the same objective metric, and for
// IdenticalDataAndAlgorithm the same image and input data.
std::optional<aws::AwsError> CheckWarmStart(Operations& ops, const json& in) {
  if (!Has(in, "WarmStartConfig")) return std::nullopt;
  const json& warm = in["WarmStartConfig"];
  const std::string type = warm.value("WarmStartType", "");
  const json config = in[kConfig];
  const std::vector<json> definitions = DefinitionsOf(in);
  const json objective = definitions.empty() ? json() : ObjectiveOf(config, definitions.front());
  std::set<std::string> seen;
  for (const json& parent_ref : warm.value("ParentHyperParameterTuningJobs", json::array())) {
    const std::string parent = parent_ref.value("HyperParameterTuningJobName", "");
    if (parent.empty()) {
      return Validation(
          "WarmStartConfig.ParentHyperParameterTuningJobs: every entry needs a HyperParameterTuningJobName.");
    }
    if (!seen.insert(ToLower(parent)).second) {
      return Validation("WarmStartConfig.ParentHyperParameterTuningJobs names '" + parent +
                        "' more than once; give each parent once.");
    }
    if (EqualsIgnoreCase(parent, in["HyperParameterTuningJobName"].get<std::string>())) {
      return Validation("A tuning job cannot be its own warm-start parent ('" + parent + "').");
    }
    auto record = ops.jobs.Get(parent);
    if (record.status().IsNotFound()) {
      return Validation("The parent hyperparameter tuning job '" + parent +
                        "' was not found: WarmStartConfig.ParentHyperParameterTuningJobs must name existing tuning "
                        "jobs.");
    }
    if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);
    if (!store::IsTerminal(record->status)) {
      return Validation("The parent hyperparameter tuning job '" + parent + "' is " +
                        std::string(store::ToString(record->status)) +
                        "; a warm-start parent must have ended (Completed, Failed or Stopped).");
    }
    const json parent_config = record->request.value(kConfig, json::object());
    const std::vector<json> parent_definitions = DefinitionsOf(record->request);
    const json parent_objective =
        parent_definitions.empty() ? json() : ObjectiveOf(parent_config, parent_definitions.front());
    if (!objective.is_null() && !parent_objective.is_null() &&
        objective.value("MetricName", "") != parent_objective.value("MetricName", "")) {
      return Validation("The objective metric '" + objective.value("MetricName", "") +
                        "' differs from that of the warm-start parent '" + parent + "' ('" +
                        parent_objective.value("MetricName", "") +
                        "'): a warm start needs the same objective metric as its parents.");
    }
    if (type == "IdenticalDataAndAlgorithm") {
      for (size_t i = 0; i < definitions.size(); ++i) {
        const json& definition = definitions[i];
        const json image = definition.value("AlgorithmSpecification", json::object()).value("TrainingImage", json());
        const json data = definition.value("InputDataConfig", json::array());
        const bool same = std::any_of(parent_definitions.begin(), parent_definitions.end(), [&](const json& p) {
          return p.value("AlgorithmSpecification", json::object()).value("TrainingImage", json()) == image &&
                 p.value("InputDataConfig", json::array()) == data;
        });
        if (!same) {
          return Validation(
              "WarmStartType IdenticalDataAndAlgorithm needs the training image and input data of "
              "the parent '" +
              parent + "', but " + DefinitionLocation(SingleForm(in), i, definition) +
              " changes them; use TransferLearning to change them.");
        }
      }
    }
  }
  return std::nullopt;
}

// Kiln's own tags (hold, idle stop) are checked here: every trial carries the tuning job's tags,
// so a bad value fails the create, not each trial.
std::optional<aws::AwsError> CheckKilnTags(const json& in) {
  if (!Has(in, "Tags") || !in["Tags"].is_array()) return std::nullopt;
  std::vector<store::Tag> tags;
  for (const json& t : in["Tags"]) tags.push_back({t.value("Key", ""), t.value("Value", "")});
  if (auto hold = control::HoldStartSeconds(tags); !hold.ok()) return Validation(hold.status().message());
  if (auto idle = control::IdleStopSeconds(tags); !idle.ok()) return Validation(idle.status().message());
  if (auto hold = control::HoldExitSeconds(tags); !hold.ok()) return Validation(hold.status().message());
  return std::nullopt;
}

JsonOutcome CreateHyperParameterTuningJob(Operations& ops, const json& request) {
  // A null member is an absent one (the service model treats it so): drop them before anything
  // reads or stores the request, so no later reader meets a null where it expects a value.
  const json input = WithoutNulls(request);
  const std::string name = input["HyperParameterTuningJobName"].get<std::string>();
  if (Has(input, "Autotune")) {
    return Validation(
        "Autotune is not supported by Kiln; give HyperParameterTuningJobConfig.Strategy and ParameterRanges.");
  }
  const bool single = Has(input, "TrainingJobDefinition");
  const bool multi = Has(input, "TrainingJobDefinitions");
  if (single == multi) {
    return Validation(std::string("Exactly one of TrainingJobDefinition or TrainingJobDefinitions is required; "
                                  "this request gives ") +
                      (single ? "both" : "neither") + ".");
  }
  json in = input;
  json& config = in[kConfig];
  const std::string strategy = config.value("Strategy", "");
  if (Has(config, "ParameterRanges") && Has(config["ParameterRanges"], "AutoParameters")) {
    return Validation(
        "HyperParameterTuningJobConfig.ParameterRanges.AutoParameters is not supported by Kiln; give "
        "IntegerParameterRanges, ContinuousParameterRanges or CategoricalParameterRanges.");
  }
  if (Has(config, "StrategyConfig") && strategy != "Hyperband") {
    return Validation(
        "HyperParameterTuningJobConfig.StrategyConfig is only for the Hyperband strategy; remove it or "
        "set Strategy to Hyperband.");
  }
  if (strategy == "Hyperband" && config.value("TrainingJobEarlyStoppingType", "Off") != "Off") {
    return Validation(
        "TrainingJobEarlyStoppingType must be Off with the Hyperband strategy, which stops training jobs itself.");
  }
  const std::string arn = ops.Arn(name);
  auto checked = CheckDefinitions(ops, in, arn);
  if (auto* error = std::get_if<aws::AwsError>(&checked)) return *error;
  if (auto error = ResolveLimits(ops, config, std::get<CheckedDefinitions>(checked).grid_points)) return *error;
  if (auto error = CheckWarmStart(ops, in)) return *error;
  if (auto error = CheckKilnTags(in)) return *error;
  if (!Has(config, "TrainingJobEarlyStoppingType")) config["TrainingJobEarlyStoppingType"] = "Off";

  const int64_t now = ops.Now();
  store::TuningJobRecord record;
  record.name = name;
  record.arn = arn;
  record.request = in;
  record.request.erase("Tags");  // kept in the tag table (the controller reads them there)
  record.status = store::TuningJobStatus::kInProgress;
  record.creation_millis = now;
  record.last_modified_millis = now;
  Status inserted = ops.jobs.Insert(record);
  if (inserted.IsAlreadyExists()) {
    return aws::AwsError("ResourceInUse",
                         "Hyperparameter tuning job names must be unique within an AWS account and region, and a "
                         "hyperparameter tuning job with this name already exists (" +
                             inserted.message() + ")");
  }
  if (!inserted.ok()) return AwsErrorFromStatus(inserted, ErrorService::kSageMaker);
  if (Has(in, "Tags") && in["Tags"].is_array() && !in["Tags"].empty()) {
    std::vector<store::Tag> list;
    for (const json& t : in["Tags"]) list.push_back({t.value("Key", ""), t.value("Value", "")});
    Status tagged = ops.tags.Add(record.arn, list);
    if (!tagged.ok()) KLOG(warn, "tags not stored", {{"tuning_job", record.name}, {"error", tagged.ToString()}});
  }
  if (ops.ctx.on_created) ops.ctx.on_created(record.name);
  return json{{"HyperParameterTuningJobArn", record.arn}};
}

// ---- Describe, List, Stop, Delete ----

JsonOutcome DescribeHyperParameterTuningJob(Operations& ops, const json& in) {
  const std::string name = in["HyperParameterTuningJobName"].get<std::string>();
  auto record = ops.jobs.Get(name);
  if (record.status().IsNotFound()) return TuningJobNotFound(name);
  if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);
  std::vector<store::TuningJobRecord> parents;
  if (Has(record->request, "WarmStartConfig")) {
    for (const json& p : record->request["WarmStartConfig"].value("ParentHyperParameterTuningJobs", json::array())) {
      // A parent deleted since counts no more (its trials are gone from Kiln's view).
      auto parent = ops.jobs.Get(p.value("HyperParameterTuningJobName", ""));
      if (parent.ok()) parents.push_back(std::move(parent).value());
    }
  }
  return RenderTuningJob(*record, parents, ops.ctx.region, ops.ctx.account_id, ops.Now());
}

json TuningJobSummary(const store::TuningJobRecord& r) {
  const json config = r.request.value(kConfig, json::object());
  const Counters counters = CountTrials(r);
  json s = {{"HyperParameterTuningJobName", r.name},
            {"HyperParameterTuningJobArn", r.arn},
            {"HyperParameterTuningJobStatus", std::string(store::ToString(r.status))},
            {"Strategy", config.value("Strategy", "")},
            {"CreationTime", Seconds(r.creation_millis)},
            {"LastModifiedTime", Seconds(r.last_modified_millis)},
            {"TrainingJobStatusCounters", TrainingJobStatusCounters(counters)},
            {"ObjectiveStatusCounters", ObjectiveStatusCounters(counters)}};
  std::optional<int64_t> end = r.end_millis ? r.end_millis : r.state.end_millis;
  if (end) s["HyperParameterTuningEndTime"] = Seconds(*end);
  if (Has(config, "ResourceLimits")) s["ResourceLimits"] = config["ResourceLimits"];
  return s;
}

JsonOutcome ListHyperParameterTuningJobs(Operations& ops, const json& in) {
  // AWS's defaults for this list: SortBy Name, SortOrder Ascending (the model's documentation).
  const std::string sort_by = in.value("SortBy", "Name");
  const store::ListSortKey sort_key = sort_by == "CreationTime" ? store::ListSortKey::kCreationTime
                                      : sort_by == "Status"     ? store::ListSortKey::kStatus
                                                                : store::ListSortKey::kName;
  const bool descending = in.value("SortOrder", "Ascending") == "Descending";
  const int64_t now = ops.Now();
  auto parsed = ParseListPaging(in, sort_key, descending, now);
  if (auto* error = std::get_if<aws::AwsError>(&parsed)) return *error;
  ListPaging& paging = std::get<ListPaging>(parsed);
  paging.query.filter = ListFilterFromRequest(in);
  auto listed = ops.jobs.ListPageRecords(paging.query);
  if (!listed.ok()) return AwsErrorFromStatus(listed.status(), ErrorService::kSageMaker);
  // The page's cursor comes from the typed columns (CutPage); the summary needs the documents.
  std::vector<store::TuningJobSummaryRow> rows;
  for (const store::TuningJobRecord& r : *listed) {
    rows.push_back({r.name, r.arn, std::string(store::ToString(r.status)), r.creation_millis, r.last_modified_millis,
                    r.end_millis});
  }
  std::optional<std::string> next_token = CutPage(rows, paging, in, now);
  json summaries = json::array();
  for (size_t i = 0; i < rows.size(); ++i) summaries.push_back(TuningJobSummary((*listed)[i]));
  json out = {{"HyperParameterTuningJobSummaries", summaries}};
  if (next_token) out["NextToken"] = *next_token;
  return out;
}

// ListTrainingJobsForHyperParameterTuningJob reads the trials from the tuning job's state and
// orders them in memory (at most MaxNumberOfTrainingJobs of them). A page's cursor is the last
// trial's sort key and name, so pages stay right while trials are added or change status.
struct TrialRow {
  json key;  // the sort key: lower-cased name, creation millis, status or objective value
  std::string name;
  const store::TuningTrial* trial = nullptr;
};

bool RowBefore(const json& key_a, const std::string& name_a, const json& key_b, const std::string& name_b,
               bool descending) {
  if (key_a != key_b) return descending ? key_b < key_a : key_a < key_b;
  const std::string a = ToLower(name_a), b = ToLower(name_b);
  return descending ? b < a : a < b;
}

JsonOutcome ListTrainingJobsForHyperParameterTuningJob(Operations& ops, const json& in) {
  const std::string name = in["HyperParameterTuningJobName"].get<std::string>();
  const int64_t now = ops.Now();
  size_t max_results = 10;
  if (in.contains("MaxResults") && in["MaxResults"].is_number_integer()) {
    max_results = static_cast<size_t>(std::max<int64_t>(1, in["MaxResults"].get<int64_t>()));
  }
  std::optional<json> cursor;
  if (in.contains("NextToken") && in["NextToken"].is_string()) {
    cursor = DecodeNextToken(in["NextToken"].get<std::string>(), in, now);
    if (!cursor || !cursor->is_object() || !cursor->contains("k") || !cursor->contains("n") ||
        !(*cursor)["n"].is_string()) {
      return InvalidNextToken();
    }
  }
  auto record = ops.jobs.Get(name);
  if (record.status().IsNotFound()) return TuningJobNotFound(name);
  if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);

  const std::string sort_by = in.value("SortBy", "Name");
  const bool descending = in.value("SortOrder", "Ascending") == "Descending";
  const std::optional<std::string> status_equals =
      in.contains("StatusEquals") && in["StatusEquals"].is_string()
          ? std::optional<std::string>(in["StatusEquals"].get<std::string>())
          : std::nullopt;
  std::vector<TrialRow> rows;
  for (const store::TuningTrial& trial : record->state.trials) {
    if (trial.name.empty()) continue;  // never created: no training job to list
    if (status_equals && trial.status != *status_equals) continue;
    TrialRow row{json(), trial.name, &trial};
    if (sort_by == "CreationTime") {
      row.key = trial.creation_millis;
    } else if (sort_by == "Status") {
      row.key = trial.status;
    } else if (sort_by == "FinalObjectiveMetricValue") {
      // Training jobs that reported no objective value are not listed (the model's documentation).
      if (!trial.objective || !std::isfinite(*trial.objective) || TrialObjective(*record, trial).is_null()) continue;
      row.key = *trial.objective;
    } else {
      row.key = ToLower(trial.name);
    }
    rows.push_back(std::move(row));
  }
  std::sort(rows.begin(), rows.end(),
            [&](const TrialRow& a, const TrialRow& b) { return RowBefore(a.key, a.name, b.key, b.name, descending); });
  auto begin = rows.begin();
  if (cursor) {
    const json& key = (*cursor)["k"];
    const std::string last = (*cursor)["n"].get<std::string>();
    begin = std::find_if(rows.begin(), rows.end(),
                         [&](const TrialRow& row) { return RowBefore(key, last, row.key, row.name, descending); });
  }
  json summaries = json::array();
  auto it = begin;
  for (; it != rows.end() && summaries.size() < max_results; ++it) {
    summaries.push_back(RenderTrialSummary(*record, *it->trial, ops.ctx.region, ops.ctx.account_id));
  }
  json out = {{"TrainingJobSummaries", summaries}};
  if (it != rows.end() && it != begin) {
    const TrialRow& last = *(it - 1);
    out["NextToken"] = EncodeNextToken({{"k", last.key}, {"n", last.name}}, in, now);
  }
  return out;
}

JsonOutcome StopHyperParameterTuningJob(Operations& ops, const json& in) {
  const std::string name = in["HyperParameterTuningJobName"].get<std::string>();
  const int64_t now = ops.Now();
  std::string refused;
  auto updated = ops.jobs.Mutate(name, [&](store::TuningJobRecord& r) {
    if (r.status != store::TuningJobStatus::kInProgress) {
      refused = "The hyperparameter tuning job " + r.name + " is " + std::string(store::ToString(r.status)) +
                "; only InProgress tuning jobs can be stopped.";
      return Status::FailedPrecondition(refused);
    }
    // The controller stops the running training jobs and ends the tuning job Stopped.
    r.status = store::TuningJobStatus::kStopping;
    r.state.stop_requested = true;
    r.last_modified_millis = now;
    return Status::Ok();
  });
  if (updated.status().IsNotFound()) return TuningJobNotFound(name);
  if (!refused.empty()) return Validation(refused);
  if (!updated.ok()) return AwsErrorFromStatus(updated.status(), ErrorService::kSageMaker);
  if (ops.ctx.on_stop_requested) ops.ctx.on_stop_requested(updated->name);
  return json::object();
}

JsonOutcome DeleteHyperParameterTuningJob(Operations& ops, const json& in) {
  const std::string name = in["HyperParameterTuningJobName"].get<std::string>();
  std::string refused;
  auto marked = ops.jobs.Mutate(name, [&](store::TuningJobRecord& r) {
    // DeleteFailed may be retried; Deleting is another delete under way.
    if (!store::IsTerminal(r.status)) {
      refused = "The hyperparameter tuning job " + r.name + " is " + std::string(store::ToString(r.status)) +
                ". Only tuning jobs that have ended (Completed, Failed, Stopped) can be deleted; stop it first.";
      return Status::FailedPrecondition(refused);
    }
    r.status = store::TuningJobStatus::kDeleting;
    r.last_modified_millis = ops.Now();
    return Status::Ok();
  });
  if (marked.status().IsNotFound()) return TuningJobNotFound(name);
  if (!refused.empty()) return Validation(refused);
  if (!marked.ok()) return AwsErrorFromStatus(marked.status(), ErrorService::kSageMaker);
  // Only the tuning job's entry goes (AWS): its training jobs, artifacts and logs stay.
  Status deleted = ops.jobs.Delete(marked->name);
  if (!deleted.ok() && !deleted.IsNotFound()) {
    auto failed = ops.jobs.Mutate(marked->name, [](store::TuningJobRecord& r) {
      r.status = store::TuningJobStatus::kDeleteFailed;
      return Status::Ok();
    });
    if (!failed.ok()) KLOG(warn, "tuning job not marked DeleteFailed", {{"tuning_job", name}});
    return AwsErrorFromStatus(deleted, ErrorService::kSageMaker);
  }
  return json::object();
}

}  // namespace

void RegisterTuningJobOperations(JsonService* service, const TuningJobsContext& context) {
  auto ops = std::make_shared<Operations>(context);
  using Operation = JsonOutcome (*)(Operations&, const json&);
  for (auto [name, op] :
       {std::pair<const char*, Operation>{"CreateHyperParameterTuningJob", CreateHyperParameterTuningJob},
        {"DescribeHyperParameterTuningJob", DescribeHyperParameterTuningJob},
        {"ListHyperParameterTuningJobs", ListHyperParameterTuningJobs},
        {"StopHyperParameterTuningJob", StopHyperParameterTuningJob},
        {"DeleteHyperParameterTuningJob", DeleteHyperParameterTuningJob},
        {"ListTrainingJobsForHyperParameterTuningJob", ListTrainingJobsForHyperParameterTuningJob}}) {
    // `op = op`: clang before 16 cannot capture a structured binding by name.
    service->Register(
        name, [ops, op = op](const aws::RequestContext&, const json& in) -> JsonOutcome { return op(*ops, in); });
  }
}

}  // namespace kiln::api
