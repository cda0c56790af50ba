#pragma once
// Multi-model endpoints (spec/serving-contract.md §7.3): which instance serves a TargetModel, and
// getting the model there — the disk tier (ModelDataUrl + TargetModel unpacked into the instance's
// /opt/ml/models/<name>/model) and the memory tier (the container's multi-model API, §7.2: POST
// /models, 507 → DELETE the least recently used model and retry, 409 = loaded) — plus the MME
// metrics of §15.2/§15.3.
//
// Router::Invoke asks Acquire for every request to a multi-model variant that carries a
// TargetModel (the front door serves such endpoints on worker threads: Acquire blocks while a
// model loads), sends the request to POST /models/<name>/invoke of the instance it got, and hands
// the lease back with Release once answered.
//
//   1. Route: among the variant's routable instances, those holding the model loaded with fewer
//      in-flight requests than their vCPUs (InstanceTarget::vcpus) — the least loaded of them;
//      else an instance already loading it that is not saturated; else the least loaded instance
//      of the variant (AWS: requests stick to holders and spill over under load).
//   2-3. When the model is not loaded there, one load job per (instance, model) runs on a thread
//      of its own (concurrent requests for it wait on the same job, so there is one download and
//      one POST /models): download + unpack through the ModelArtifactFetcher (control/ implements
//      it over the object store) unless <models_dir>/<name>/model exists — before a download,
//      while the filesystem is over `disk_high_water` full, the directories of models not loaded
//      go, least recently used first —, then POST /models; on 507 the least recently used model
//      loaded on that instance and not in use by a request is unloaded (DELETE /models/<lru>;
//      its files stay) and the load retried, until it succeeds or nothing is left to unload.
//   5. A request waits at most `load_wait` from its arrival: then ModelNotReadyException (429)
//      while the job goes on; the next request finds the model loaded (or the job still running).
//   ModelCacheSetting Disabled (VariantRoute::model_cache_enabled false): once the last request
//   using it is answered, the model is unloaded and its directory deleted, on a job thread.
//
// The container's model name is the first 32 hex characters of SHA-256(TargetModel) (§7.2); the
// container sees its files at /opt/ml/models/<name>/model.
//
// Errors Acquire answers (AWS-shaped, runtime-api.md §3): ValidationError 400 "Failed to download
// model data ..." for a missing object (no retry); ModelNotReadyException 429 past the wait;
// ModelError 424 for a download that failed otherwise or a load the container refused (its status
// and message, e.g. 507 with nothing left to unload); ServiceUnavailable 503 with no instance.
//
// Metrics, written to the MetricStore once a second (`flush_interval`), only for seconds that had
// samples: AWS/SageMaker {EndpointName, VariantName}: ModelCacheHit (Count, 1 per request: 1 when
// the model was loaded), ModelLoadingWaitTime (per request that waited), ModelDownloadingTime,
// ModelLoadingTime, ModelUnloadingTime (per download/load/unload; all Microseconds);
// /aws/sagemaker/Endpoints {EndpointName, VariantName} and + Host=<endpoint>/<variant>/<instance>:
// LoadedModelCount (Count) when it changes and at least once a minute while the instance lives.
//
// Kiln keeps what is loaded where in memory: an instance it has not seen (a restarted server's
// adopted one) starts empty, a POST /models answered 409 counts as loaded, and on a 507 with
// nothing known to unload the container's own list (GET /models) names the models to unload
// (least recently used first: those Kiln did not load itself). A request whose
// container answers 404 (the model went away) is told to Release with `lost`, which forgets the
// model on that instance; the router then acquires it once more.
//
// Thread-safety: every method may be called from any thread. One mutex guards the placement
// state (held for map updates only, never across I/O); jobs run on their own threads, joined by
// Stop.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

#include "aws/errors.h"
#include "base/mutex.h"
#include "base/status.h"
#include "net/http_client.h"
#include "observe/metric_store.h"
#include "serving/routing.h"

namespace kiln::serving {

// The disk tier's source (implemented by the control plane over the object store:
// control/multi_model_fetcher.h). Called from job threads, concurrently.
class ModelArtifactFetcher {
 public:
  virtual ~ModelArtifactFetcher() = default;
  // Downloads the gzip tar `s3_uri` (ModelDataUrl + TargetModel) and unpacks it into `dir`, which
  // does not exist before and exists afterwards only when the call succeeded (its parent does).
  // NotFound: no such object (or bucket). Other errors carry the reason (unsafe archive, disk).
  virtual Status Fetch(const std::string& s3_uri, const std::string& dir) = 0;
};

struct MultiModelOptions {
  // How long a request waits for its model (download + load) from its arrival before
  // ModelNotReadyException (Kiln: 60 s, spec/limits.md). The load goes on regardless.
  std::chrono::milliseconds load_wait{60000};
  // The budget of one POST /models (the container's own load timeout is 10 minutes) and of one
  // DELETE /models/<name>.
  int load_timeout_ms = 900000;
  int unload_timeout_ms = 120000;
  int connect_timeout_ms = 1000;
  // Before a download, directories of models not loaded are deleted (LRU) while the instance's
  // filesystem is fuller than this (§7.3: 90 %).
  double disk_high_water = 0.9;
  // The metrics' flush period; LoadedModelCount is rewritten at least every `count_refresh`.
  std::chrono::milliseconds flush_interval{1000};
  std::chrono::milliseconds count_refresh{60000};
};

// The container's model name for a TargetModel: hex(SHA-256(target))[0:32].
std::string ContainerModelName(std::string_view target_model);

// What Acquire gives a request: the instance to send it to and the model's name there.
struct ModelLease {
  std::shared_ptr<const InstanceTarget> instance;
  std::string model_name;
  bool cache_hit = false;  // it was loaded when the request came
};

class MultiModelManager {
 public:
  // `fetcher` and `client` must outlive the manager; `metrics` and `routes` may be null (no
  // metrics; instance state never dropped).
  MultiModelManager(MultiModelOptions options, ModelArtifactFetcher* fetcher, net::HttpClient* client,
                    observe::MetricStore* metrics, const RoutingTable* routes);
  ~MultiModelManager();  // Stop()
  MultiModelManager(const MultiModelManager&) = delete;
  MultiModelManager& operator=(const MultiModelManager&) = delete;

  // Starts the metrics thread. Stop waits for running jobs (their container calls end at their
  // budgets or an instance's failure signal), flushes the metrics and joins everything.
  void Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_, jobs_mu_);

  // Steps 1-3 and 5 for one request (see the file comment). `arrival_steady_ns` is when the request
  // came (steady_clock ns; 0: now). On success the model is loaded on lease.instance and counted as
  // in use until Release. Otherwise the error to answer (the lease is empty; nothing to release).
  // Blocks while the model loads, at most until arrival + load_wait.
  std::variant<ModelLease, aws::AwsError> Acquire(const EndpointRoute& route, const VariantRoute& variant,
                                                  std::string_view target_model, int64_t arrival_steady_ns)
      EXCLUDES(mu_);
  // The request is answered. `lost`: the container said the model is not loaded (404): forget it
  // there. ModelCacheSetting Disabled: the last user's release unloads it and deletes its files.
  void Release(const EndpointRoute& route, const VariantRoute& variant, const ModelLease& lease, bool lost)
      EXCLUDES(mu_);

  // After a 404 from POST /models/<name>/invoke: false when the container says (GET /models/<name>
  // → 404) that it does not hold the model, true otherwise (the 404 was the model's own answer).
  bool StillLoaded(const ModelLease& lease) const;

  // The models Kiln holds as loaded on an instance, least recently used first (tests, bench).
  std::vector<std::string> LoadedModelsForTest(const std::string& instance_id) const EXCLUDES(mu_);
  // Writes the metrics samples now (tests; the thread does it every flush_interval).
  void FlushForTest() EXCLUDES(mu_, metrics_mu_);

 private:
  enum class SlotState { kIdle, kWorking, kLoaded, kUnloading };
  // One model on one instance.
  struct Slot {
    SlotState state = SlotState::kIdle;
    std::string target_model;
    int in_use = 0;                      // leases not yet released
    int waiters = 0;                     // requests in Acquire on this slot
    int64_t last_used = 0;               // steady ns of the last acquire or release (LRU)
    int64_t jobs_ended = 0;              // load jobs finished (waiters tell their job's end by it)
    std::optional<aws::AwsError> error;  // the last job's failure (cleared by the next job)
  };
  struct InstanceState {
    std::string endpoint;
    std::string variant;
    std::string models_dir;
    std::map<std::string, Slot> slots;  // by container model name
    int64_t last_count_write = 0;       // steady ns; 0: never
    int written_count = -1;
  };
  struct Job;
  struct Running {
    std::thread thread;
    std::shared_ptr<Job> job;
  };

  // The instance for a request (step 1), or null when the variant has none.
  std::shared_ptr<const InstanceTarget> PickInstanceLocked(const VariantRoute& variant, const std::string& name)
      REQUIRES(mu_);
  InstanceState& StateLocked(const EndpointRoute& route, const VariantRoute& variant, const InstanceTarget& instance)
      REQUIRES(mu_);
  // Starts a job on its own thread (load, or unload+delete for Disabled).
  void Spawn(std::shared_ptr<Job> job) EXCLUDES(jobs_mu_);
  // Joins the jobs that ended; cuts the container calls of jobs whose instance failed (each job's
  // own signal; Stop cuts all). Called by the metrics thread every flush_interval.
  void CancelJobsOfFailedInstances() EXCLUDES(jobs_mu_);
  void RunLoad(Job& job) EXCLUDES(mu_);
  void RunDrop(Job& job) EXCLUDES(mu_);
  // One POST /models round, with LRU unloads on 507; the error to give waiters, or none.
  std::optional<aws::AwsError> LoadIntoContainer(Job& job) EXCLUDES(mu_);
  // Deletes unloaded models' directories (LRU) while the filesystem of `models_dir` is too full.
  void FreeDisk(const Job& job) EXCLUDES(mu_);
  // Marks the models the container lists (GET /models) and Kiln holds as not loaded as loaded and
  // least recently used (a restarted server's adopted instance); how many.
  int AdoptListedModels(const Job& job) EXCLUDES(mu_);
  // DELETE /models/<name> on job's instance; the slot (kUnloading) becomes kIdle, or kLoaded
  // again on failure.
  Status Unload(const Job& job, const std::string& name) EXCLUDES(mu_);
  void EndJob(Job& job, std::optional<aws::AwsError> error) EXCLUDES(mu_);

  void Sample(const std::string& endpoint, const std::string& variant, std::string_view metric, double value)
      EXCLUDES(metrics_mu_);
  void FlushLoop() EXCLUDES(mu_);
  void Flush() EXCLUDES(mu_, metrics_mu_);

  const MultiModelOptions options_;
  ModelArtifactFetcher* const fetcher_;
  net::HttpClient* const client_;
  observe::MetricStore* const metrics_;
  const RoutingTable* const routes_;

  mutable Mutex mu_;
  CondVar changed_;                                                 // a slot changed state, or Stop
  CondVar stop_cv_;                                                 // Stop (the flusher's sleep)
  std::map<std::string, InstanceState> instances_ GUARDED_BY(mu_);  // by instance id
  bool stopping_ GUARDED_BY(mu_) = false;

  Mutex jobs_mu_;
  std::vector<Running> jobs_ GUARDED_BY(jobs_mu_);

  Mutex metrics_mu_;
  // (endpoint, variant, metric) → the samples of the second being collected.
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<double>> samples_ GUARDED_BY(metrics_mu_);

  std::thread flusher_;
};

}  // namespace kiln::serving
