#include "control/tuning_controller.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>

#include "base/json_parse.h"
#include "base/log.h"
#include "control/tuning_space.h"
#include "control/tuning_stopping.h"
#include "control/tuning_strategy.h"
#include "store/training_job_repository.h"

namespace kiln::control {

using nlohmann::json;
using store::TuningJobRecord;
using store::TuningJobState;
using store::TuningJobStatus;
using store::TuningTrial;

namespace {

constexpr char kTrainingMetricNamespace[] = "/aws/sagemaker/TrainingJobs";
constexpr size_t kMaxCurvePoints = 1000;
// Trials failing for their own reasons before any reports the objective: after this many the
// search stops launching and the job fails (AWS ends a tuning job whose trials keep failing with
// client errors; it does not burn its whole budget on them).
constexpr int kFailuresBeforeGivingUp = 3;

bool IsTerminalTrialStatus(const std::string& status) {
  return status == "Completed" || status == "Failed" || status == "Stopped";
}

// FNV-1a: the default RandomSeed of a job (stable across restarts) and the trials' name suffixes.
uint64_t Fnv1a(std::string_view text, uint64_t hash = 1469598103934665603ull) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string TrialName(const std::string& tuning_name, int seq, int64_t now_millis) {
  uint64_t hash = Fnv1a(tuning_name + "/" + std::to_string(seq) + "/" + std::to_string(now_millis));
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "-%03d-%08" PRIx32, seq, static_cast<uint32_t>(hash ^ (hash >> 32)));
  return tuning_name + buffer;
}

}  // namespace

std::string TuningJobArn(const std::string& region, const std::string& account_id, const std::string& name) {
  return "arn:aws:sagemaker:" + region + ":" + account_id + ":hyper-parameter-tuning-job/" + name;
}

// One TrainingJobDefinition as the search uses it.
struct TuningDefinition {
  json definition;
  std::string name;  // DefinitionName ("" for the single form)
  std::unique_ptr<tuning::SearchSpace> space;
  std::unique_ptr<tuning::Strategy> strategy;
  std::string metric;  // objective MetricName ("" when none)
  bool maximize = false;
};

struct TuningController::ParsedJob {
  std::string arn;
  std::vector<TuningDefinition> definitions;
  std::string strategy;
  int max_parallel = 1;
  int max_jobs = 1;
  std::optional<int64_t> max_runtime_millis;
  bool early_stopping_auto = false;
  std::optional<tuning::Hyperband> hyperband;
  tuning::CompletionCriteria criteria;
  std::vector<tuning::Observation> warm_start;  // the parents' trials that reported the objective
  std::optional<std::string> error;             // the request could not be parsed: the job fails with this
};

namespace {

// Reads what a tuning job's request asks for. Errors (which the API's validation should have
// refused) come back in `error`, so the job fails saying why instead of looping.
std::shared_ptr<TuningController::ParsedJob> ParseJob(const TuningJobRecord& record,
                                                      const TuningControllerOptions& options,
                                                      store::Database* database) {
  auto parsed = std::make_shared<TuningController::ParsedJob>();
  parsed->arn = record.arn;
  // Null members are absent ones (the API stores requests without them; older rows may have them).
  const json in = WithoutNulls(record.request);
  const json config = in.value("HyperParameterTuningJobConfig", json::object());
  parsed->strategy = config.value("Strategy", "Bayesian");
  const json limits = config.value("ResourceLimits", json::object());
  parsed->max_parallel = std::max(1, limits.value("MaxParallelTrainingJobs", 1));
  const json job_objective = config.value("HyperParameterTuningJobObjective", json());
  uint64_t seed = in.contains("HyperParameterTuningJobConfig") && config.contains("RandomSeed")
                      ? config["RandomSeed"].get<uint64_t>()
                      : Fnv1a(record.name);

  std::vector<json> definitions;
  if (in.contains("TrainingJobDefinitions") && in["TrainingJobDefinitions"].is_array()) {
    for (const json& d : in["TrainingJobDefinitions"]) definitions.push_back(d);
  } else if (in.contains("TrainingJobDefinition")) {
    definitions.push_back(in["TrainingJobDefinition"]);
  }
  if (definitions.empty()) {
    parsed->error = "The tuning job has no TrainingJobDefinition.";
    return parsed;
  }
  uint64_t grid_total = 0;
  for (size_t i = 0; i < definitions.size(); ++i) {
    TuningDefinition def;
    def.definition = definitions[i];
    def.name = def.definition.value("DefinitionName", "");
    const json ranges = def.definition.contains("HyperParameterRanges")
                            ? def.definition["HyperParameterRanges"]
                            : config.value("ParameterRanges", json::object());
    std::set<std::string> static_names;
    const json statics = def.definition.value("StaticHyperParameters", json::object());
    if (statics.is_object()) {
      for (const auto& [key, value] : statics.items()) static_names.insert(key);
    }
    auto space = tuning::SearchSpace::Parse(ranges, static_names);
    if (!space.ok()) {
      parsed->error = space.status().message();
      return parsed;
    }
    def.space = std::make_unique<tuning::SearchSpace>(std::move(space).value());
    const json objective =
        def.definition.contains("TuningObjective") ? def.definition["TuningObjective"] : job_objective;
    if (objective.is_object()) {
      def.metric = objective.value("MetricName", "");
      def.maximize = objective.value("Type", "Minimize") == "Maximize";
    }
    // Hyperband samples its configurations at random; its rungs do the judging.
    auto strategy = tuning::MakeStrategy(parsed->strategy == "Hyperband" ? "Random" : parsed->strategy, *def.space,
                                         seed + 1000003ull * i);
    if (!strategy.ok()) {
      parsed->error = strategy.status().message();
      return parsed;
    }
    def.strategy = std::move(strategy).value();
    if (parsed->strategy == "Grid") grid_total += def.space->grid_size();
    parsed->definitions.push_back(std::move(def));
  }
  if (limits.contains("MaxNumberOfTrainingJobs")) {
    parsed->max_jobs = std::max(1, limits["MaxNumberOfTrainingJobs"].get<int>());
  } else if (parsed->strategy == "Grid") {
    parsed->max_jobs = static_cast<int>(std::min<uint64_t>(grid_total, options.max_number_of_training_jobs));
  } else {
    parsed->max_jobs = options.max_number_of_training_jobs;
  }
  if (limits.contains("MaxRuntimeInSeconds")) {
    parsed->max_runtime_millis = limits["MaxRuntimeInSeconds"].get<int64_t>() * 1000;
  }
  parsed->early_stopping_auto = config.value("TrainingJobEarlyStoppingType", "Off") == "Auto";
  if (parsed->strategy == "Hyperband") {
    const json hyperband =
        config.value("StrategyConfig", json::object()).value("HyperbandStrategyConfig", json::object());
    auto max_resource = tuning::InferMaxResource(
        hyperband, parsed->definitions[0].definition.value("StaticHyperParameters", json::object()));
    if (!max_resource.ok()) {
      parsed->error = max_resource.status().message();
      return parsed;
    }
    auto created = tuning::Hyperband::Create(hyperband.value("MinResource", 1), *max_resource);
    if (!created.ok()) {
      parsed->error = created.status().message();
      return parsed;
    }
    parsed->hyperband = std::move(created).value();
  }
  parsed->criteria = tuning::CompletionCriteriaFromJson(config.value("TuningJobCompletionCriteria", json::object()),
                                                        parsed->definitions[0].maximize);

  // Warm start: the parents' trials that reported their objective, as observations of this
  // job's search (in this job's direction; a configuration outside this job's ranges is
  // skipped by the strategy).
  if (in.contains("WarmStartConfig")) {
    store::TuningJobRepository parents(database);
    for (const json& parent : in["WarmStartConfig"].value("ParentHyperParameterTuningJobs", json::array())) {
      auto row = parents.Get(parent.value("HyperParameterTuningJobName", ""));
      if (!row.ok()) continue;
      for (const TuningTrial& trial : row->state.trials) {
        if (!trial.objective) continue;
        const bool maximize = parsed->definitions[0].maximize;
        parsed->warm_start.push_back({trial.tuned, maximize ? -*trial.objective : *trial.objective});
      }
    }
  }

  return parsed;
}

// Errors of Kiln's own that another pass may not meet (the database busy): never the trial's fault.
bool IsTransient(const Status& status) {
  return status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kInternal;
}

double LossOf(double value, bool maximize) { return maximize ? -value : value; }

std::vector<double> LossCurve(const std::vector<double>& curve, bool maximize) {
  std::vector<double> losses;
  losses.reserve(curve.size());
  for (double v : curve) losses.push_back(LossOf(v, maximize));
  return losses;
}

}  // namespace

TuningController::TuningController(TuningControllerOptions options, TuningControllerDeps deps)
    : options_(std::move(options)), deps_(deps) {}

TuningController::~TuningController() { Shutdown(); }

int64_t TuningController::NowMillis() const {
  return deps_.clock != nullptr ? deps_.clock->NowMillis() : Clock::System().NowMillis();
}

Status TuningController::Start() {
  {
    MutexLock lock(mutex_);
    if (thread_.joinable()) return Status::FailedPrecondition("tuning controller already started");
    stopping_ = false;
    wake_requested_ = true;
  }
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void TuningController::Shutdown() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    wake_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

void TuningController::Submit(const std::string& /*name*/) {
  MutexLock lock(mutex_);
  wake_requested_ = true;
  wake_.NotifyAll();
}

void TuningController::RequestStop(const std::string& name) { Submit(name); }

void TuningController::Run() {
  for (;;) {
    {
      MutexLock lock(mutex_);
      const auto deadline = std::chrono::steady_clock::now() + options_.tick;
      while (!stopping_ && !wake_requested_) {
        if (wake_.WaitUntil(mutex_, deadline) == std::cv_status::timeout) break;
      }
      if (stopping_) return;
      wake_requested_ = false;
    }
    ReconcileAll();
  }
}

void TuningController::ReconcileAll() {
  store::TuningJobRepository jobs(deps_.database);
  auto active = jobs.ListActive();
  if (!active.ok()) {
    KLOG(warn, "tuning jobs not read", {{"error", active.status().ToString()}});
    return;
  }
  std::set<std::string> names;
  for (const TuningJobRecord& record : *active) {
    names.insert(record.name + "@" + std::to_string(record.creation_millis));
    Reconcile(record);
  }
  // Forget the parsed requests of jobs that ended (or were deleted).
  for (auto it = parsed_.begin(); it != parsed_.end();) {
    it = names.count(it->first) ? std::next(it) : parsed_.erase(it);
  }
}

void TuningController::Reconcile(const TuningJobRecord& record) {
  // A request no check foresaw must fail its own job, never end the server (whose next start
  // would meet the same row).
  try {
    ReconcileJob(record);
  } catch (const std::exception& e) {
    KLOG(error, "tuning job failed unexpectedly", {{"tuning_job", record.name}, {"error", e.what()}});
    const int64_t now = NowMillis();
    (void)store::TuningJobRepository(deps_.database).Mutate(record.name, [&](TuningJobRecord& fresh) {
      if (!store::IsActive(fresh.status)) return Status::FailedPrecondition("ended meanwhile");
      fresh.status = TuningJobStatus::kFailed;
      fresh.state.failure_reason = std::string("InternalServerError: the tuning job could not be run: ") + e.what();
      fresh.state.end_millis = now;
      fresh.end_millis = now;
      fresh.last_modified_millis = now;
      return Status::Ok();
    });
  }
}

void TuningController::ReconcileJob(const TuningJobRecord& record) {
  const int64_t now = NowMillis();
  // Keyed by name and creation time: a job deleted and created again under its name is new.
  std::shared_ptr<ParsedJob>& slot = parsed_[record.name + "@" + std::to_string(record.creation_millis)];
  if (!slot) slot = ParseJob(record, options_, deps_.database);
  const ParsedJob& job = *slot;
  // The tuning job's tags go to every trial; read when a trial is created (tags may be added
  // after the row, and AddTags may change them).
  auto tags_of_job = [&]() {
    json tags = json::array();
    if (auto list = store::TagRepository(deps_.database).List(record.arn); list.ok()) {
      for (const store::Tag& tag : *list) tags.push_back({{"Key", tag.key}, {"Value", tag.value}});
    }
    return tags;
  };
  TuningJobState state = record.state;
  const bool user_stop = state.stop_requested || record.status == TuningJobStatus::kStopping;
  std::optional<TuningJobStatus> final_status;

  if (job.error) {
    state.failure_reason = *job.error;
    final_status = TuningJobStatus::kFailed;
  }

  // 1. Refresh the unfinished trials. A trial with a name whose training job does not exist was
  //    written before its job was created (the server died in between): create it now.
  store::TrainingJobRepository training(deps_.database);
  std::map<int, std::vector<double>> running_curves;  // seq → objective values (as reported)
  auto definition_of = [&](const TuningTrial& trial) -> const TuningDefinition* {
    for (const TuningDefinition& d : job.definitions) {
      if (d.name == trial.definition_name) return &d;
    }
    return job.definitions.empty() ? nullptr : &job.definitions[0];
  };
  for (TuningTrial& trial : state.trials) {
    if (IsTerminalTrialStatus(trial.status) || trial.name.empty()) continue;
    const TuningDefinition* def = definition_of(trial);
    auto row = training.Get(trial.name);
    if (row.status().IsNotFound() && def != nullptr && deps_.launcher != nullptr) {
      Status created =
          deps_.launcher->Create({def->definition, trial.name, record.arn, trial.tuned, def->metric, tags_of_job()});
      if (!created.ok() && !created.IsAlreadyExists() && !IsTransient(created)) {
        trial.status = "Failed";
        trial.failure_reason = created.message();
        trial.end_millis = now;
      }
      continue;
    }
    if (!row.ok()) continue;
    trial.status = std::string(store::ToString(row->status));
    trial.failure_reason = row->state.failure_reason;
    trial.start_millis = row->state.training_start_millis;
    trial.end_millis = row->training_end_millis;
    std::vector<double> curve;
    // Intermediate values are read for the rules that judge running trials, and once at the end
    // (kept in the row for those rules and for the analytics).
    const bool judged = job.early_stopping_auto || job.hyperband.has_value();
    if (deps_.metric_store != nullptr && def != nullptr && !def->metric.empty() &&
        (judged || !store::IsActive(row->status))) {
      auto points = deps_.metric_store->Query(kTrainingMetricNamespace, def->metric, {{"Host", trial.name + "/algo-1"}},
                                              0, std::numeric_limits<int64_t>::max());
      if (points.ok()) {
        for (const observe::SeriesPoint& p : *points) curve.push_back(p.value);
      }
    }
    if (def != nullptr && !def->metric.empty()) {
      if (auto it = row->state.final_metrics.find(def->metric); it != row->state.final_metrics.end()) {
        trial.objective = it->second.value;
      } else if (!curve.empty()) {
        trial.objective = curve.back();
      }
    }
    if (IsTerminalTrialStatus(trial.status)) {
      // The rules compare reports by position from the first: keep the beginning of the curve
      // (Hyperband needs up to MaxResource reports), and only for jobs that judge trials.
      const size_t keep =
          job.hyperband ? std::max<size_t>(kMaxCurvePoints, job.hyperband->max_resource()) : kMaxCurvePoints;
      if (curve.size() > keep) curve.resize(keep);
      if (judged) trial.curve = std::move(curve);
    } else {
      running_curves[trial.seq] = std::move(curve);
    }
  }

  auto stop_trial = [&](TuningTrial& trial, const std::string& reason) {
    if (trial.early_stopped || trial.status != "InProgress" || deps_.launcher == nullptr) return;
    Status stopped = deps_.launcher->Stop(trial.name);
    if (!stopped.ok() && stopped.code() != StatusCode::kFailedPrecondition && !stopped.IsNotFound()) {
      KLOG(warn, "tuning trial not stopped", {{"trial", trial.name}, {"error", stopped.ToString()}});
      return;
    }
    trial.early_stopped = reason;
    KLOG(info, "tuning trial stopped", {{"tuning_job", record.name}, {"trial", trial.name}, {"reason", reason}});
  };

  // 2. Judge the running trials.
  const bool searching = !final_status && !user_stop && !state.stop_reason;
  if (searching && (job.early_stopping_auto || job.hyperband)) {
    for (TuningTrial& trial : state.trials) {
      if (trial.status != "InProgress" || trial.early_stopped) continue;
      const TuningDefinition* def = definition_of(trial);
      if (def == nullptr || def->metric.empty()) continue;
      const std::vector<double> curve = LossCurve(running_curves[trial.seq], def->maximize);
      if (curve.empty()) continue;
      if (job.hyperband) {
        std::vector<std::vector<double>> bracket_curves;
        for (const TuningTrial& other : state.trials) {
          if (other.seq == trial.seq || other.bracket != trial.bracket) continue;
          const std::vector<double>& raw =
              IsTerminalTrialStatus(other.status) ? other.curve : running_curves[other.seq];
          if (!raw.empty()) bracket_curves.push_back(LossCurve(raw, def->maximize));
        }
        tuning::Hyperband::Verdict verdict =
            job.hyperband->Judge(trial.bracket, trial.judged_rung, curve, bracket_curves);
        trial.judged_rung = verdict.judged_rung;
        if (verdict.stop) stop_trial(trial, "Hyperband: " + verdict.reason);
      } else {
        std::vector<std::vector<double>> completed;
        for (const TuningTrial& other : state.trials) {
          if (other.status == "Completed" && !other.curve.empty())
            completed.push_back(LossCurve(other.curve, def->maximize));
        }
        if (auto reason = tuning::MedianStop(curve, completed)) stop_trial(trial, "Early stopping: " + *reason);
      }
    }
  }

  // 3. What ends the search: the completion criteria, MaxRuntimeInSeconds, a user's stop.
  std::vector<std::pair<int64_t, double>> ended;  // (end time, loss) of trials with an objective
  int nonretryable = 0;
  bool any_objective = false;
  bool any_completed = false;
  for (const TuningTrial& trial : state.trials) {
    if (!IsTerminalTrialStatus(trial.status)) continue;
    if (trial.status == "Completed") any_completed = true;
    if (trial.status == "Failed" &&
        !(trial.failure_reason && trial.failure_reason->rfind("InternalServerError", 0) == 0)) {
      ++nonretryable;
    }
    const TuningDefinition* def = definition_of(trial);
    if (trial.objective && def != nullptr && trial.status != "Failed") {
      any_objective = true;
      ended.push_back({trial.end_millis.value_or(trial.creation_millis), LossOf(*trial.objective, def->maximize)});
    }
  }
  std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (!final_status && !state.stop_reason) {
    std::vector<double> losses;
    for (const auto& e : ended) losses.push_back(e.second);
    tuning::CompletionCheck check = tuning::CheckCompletion(job.criteria, losses);
    state.not_improving = check.not_improving;
    if (check.converged && !state.convergence_detected_millis) state.convergence_detected_millis = now;
    if (check.reason) state.stop_reason = *check.reason;
    if (!state.stop_reason && job.max_runtime_millis && now - record.creation_millis >= *job.max_runtime_millis) {
      state.stop_reason = "MaxRuntimeInSeconds (" + std::to_string(*job.max_runtime_millis / 1000) + ") was reached.";
    }
  }
  if (final_status || user_stop || state.stop_reason) {
    const std::string why =
        user_stop ? "The tuning job was stopped."
                  : (state.stop_reason ? "The tuning job completed: " + *state.stop_reason : "The tuning job failed.");
    for (TuningTrial& trial : state.trials) stop_trial(trial, why);
  }

  // 4. Launch trials while the limits allow.
  const bool has_objective = !job.definitions.empty() && !job.definitions[0].metric.empty();
  const bool giving_up = nonretryable >= kFailuresBeforeGivingUp && !(has_objective ? any_objective : any_completed);
  bool exhausted = false;
  if (!final_status && !user_stop && !state.stop_reason && !giving_up && deps_.launcher != nullptr) {
    int running = 0;
    for (const TuningTrial& trial : state.trials) running += IsTerminalTrialStatus(trial.status) ? 0 : 1;
    std::vector<TuningTrial> launched;
    while (running < job.max_parallel && static_cast<int>(state.trials.size()) < job.max_jobs) {
      // Definitions take turns; one whose search is exhausted (Grid) is skipped.
      const size_t n = job.definitions.size();
      std::optional<tuning::Assignment> choice;
      const TuningDefinition* def = nullptr;
      for (size_t k = 0; k < n && !choice; ++k) {
        def = &job.definitions[(state.trials.size() + k) % n];
        std::vector<tuning::Observation> observations = job.warm_start;
        int index = 0;
        for (const TuningTrial& trial : state.trials) {
          if (trial.definition_name != def->name) continue;
          ++index;
          if (!IsTerminalTrialStatus(trial.status)) {
            observations.push_back({trial.tuned, std::nullopt});
          } else if (trial.objective && trial.status != "Failed") {
            observations.push_back({trial.tuned, LossOf(*trial.objective, def->maximize)});
          }
        }
        choice = def->strategy->Next(observations, index);
      }
      if (!choice) {
        exhausted = true;
        break;
      }
      TuningTrial trial;
      trial.seq = static_cast<int>(state.trials.size()) + 1;
      trial.name = TrialName(record.name, trial.seq, now);
      trial.definition_name = def->name;
      trial.tuned = *choice;
      trial.creation_millis = now;
      trial.status = "InProgress";
      if (job.hyperband) trial.bracket = job.hyperband->BracketOf(trial.seq - 1);
      state.trials.push_back(trial);
      launched.push_back(trial);
      ++running;
    }
    if (!launched.empty()) {
      // The trials are in the row before their jobs exist (a restart creates what is missing).
      auto written = store::TuningJobRepository(deps_.database).Mutate(record.name, [&](TuningJobRecord& fresh) {
        if (fresh.state.stop_requested || fresh.status != TuningJobStatus::kInProgress) {
          return Status::FailedPrecondition("stopped meanwhile");
        }
        const bool stop_requested = fresh.state.stop_requested;
        fresh.state = state;
        fresh.state.stop_requested = stop_requested;
        fresh.last_modified_millis = now;
        return Status::Ok();
      });
      if (!written.ok()) return;  // a stop came in between: the next pass handles it
      for (TuningTrial& trial : launched) {
        const TuningDefinition* def = definition_of(trial);
        Status created =
            deps_.launcher->Create({def->definition, trial.name, record.arn, trial.tuned, def->metric, tags_of_job()});
        // Transient trouble: the trial stays, and the next pass creates it (its row is missing).
        if (!created.ok() && !created.IsAlreadyExists() && !IsTransient(created)) {
          for (TuningTrial& t : state.trials) {
            if (t.seq != trial.seq) continue;
            t.status = "Failed";
            t.failure_reason = created.message();
            t.end_millis = now;
          }
          KLOG(warn, "tuning trial not created", {{"trial", trial.name}, {"error", created.ToString()}});
        }
      }
    }
  } else if (!final_status) {
    exhausted = true;
  }
  if (static_cast<int>(state.trials.size()) >= job.max_jobs) exhausted = true;

  // 5. The end: every trial has ended and nothing more will be launched.
  bool all_ended = true;
  for (const TuningTrial& trial : state.trials) all_ended = all_ended && IsTerminalTrialStatus(trial.status);
  if (!final_status && all_ended && (exhausted || user_stop || state.stop_reason || giving_up)) {
    if (user_stop) {
      final_status = TuningJobStatus::kStopped;
    } else if (!state.trials.empty() && !(has_objective ? any_objective : any_completed)) {
      final_status = TuningJobStatus::kFailed;
      std::string first_failure;
      for (const TuningTrial& trial : state.trials) {
        if (trial.failure_reason) {
          first_failure = *trial.failure_reason;
          break;
        }
      }
      state.failure_reason =
          nonretryable > 0
              ? std::to_string(nonretryable) + " of " + std::to_string(state.trials.size()) +
                    " training jobs failed with non-retryable errors and none reported the objective metric" +
                    (first_failure.empty() ? std::string(".") : "; the first failure: " + first_failure)
              : "None of the " + std::to_string(state.trials.size()) + " training jobs reported the objective metric " +
                    job.definitions[0].metric +
                    ": check that a MetricDefinition's Regex matches what the training script prints.";
    } else if (state.trials.empty() && state.stop_reason) {
      final_status = TuningJobStatus::kCompleted;
    } else {
      final_status = TuningJobStatus::kCompleted;
    }
  }
  if (final_status) state.end_millis = now;

  // Write only what changed.
  if (!final_status && state == record.state) return;
  auto written = store::TuningJobRepository(deps_.database).Mutate(record.name, [&](TuningJobRecord& fresh) {
    const bool stop_requested = fresh.state.stop_requested;
    // Keep trials a concurrent writer may not know (none today: this thread is the only one that
    // adds them), and the user's stop request.
    fresh.state = state;
    fresh.state.stop_requested = stop_requested || state.stop_requested;
    fresh.last_modified_millis = now;
    if (final_status) {
      if (*final_status != TuningJobStatus::kStopped && fresh.state.stop_requested && !job.error) {
        // A stop arrived after this pass read the row: finish it on the next pass instead.
        fresh.state.end_millis.reset();
        fresh.status = TuningJobStatus::kStopping;
        return Status::Ok();
      }
      fresh.status = *final_status;
      fresh.end_millis = now;
    }
    return Status::Ok();
  });
  if (!written.ok()) {
    KLOG(warn, "tuning job not written", {{"tuning_job", record.name}, {"error", written.status().ToString()}});
  } else if (final_status) {
    KLOG(info, "tuning job ended",
         {{"tuning_job", record.name},
          {"status", std::string(store::ToString(written->status))},
          {"trials", std::to_string(state.trials.size())}});
  }
}

}  // namespace kiln::control
