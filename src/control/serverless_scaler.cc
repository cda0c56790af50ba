#include "control/serverless_scaler.h"

#include <algorithm>

#include "base/log.h"
#include "base/time.h"

namespace kiln::control {

namespace {

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr std::string_view kNamespace = "AWS/SageMaker";

}  // namespace

ServerlessScaler::ServerlessScaler(ServerlessScalerOptions options, ServerlessScalerDeps deps)
    : options_(options), deps_(deps), endpoints_(deps.database) {}

ServerlessScaler::~ServerlessScaler() { Stop(); }

void ServerlessScaler::Start() {
  {
    MutexLock lock(mu_);
    if (thread_.joinable()) return;
    stopping_ = false;
  }
  thread_ = std::thread([this] {
    while (true) {
      {
        MutexLock lock(mu_);
        const auto end = std::chrono::steady_clock::now() + options_.tick;
        while (!dirty_ && !stopping_) {
          if (wake_.WaitUntil(mu_, end) == std::cv_status::timeout) break;
        }
        if (stopping_) return;
        dirty_ = false;
      }
      RunOnce();
    }
  });
}

void ServerlessScaler::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

ServerlessScaler::Pool& ServerlessScaler::PoolOf(const serving::EndpointRoute& route, int64_t now) {
  Pool& pool = pools_[route.name];
  pool.max = std::max(1, route.serverless_max_concurrency);
  pool.provisioned = route.serverless_provisioned;
  if (!route.variants.empty()) pool.variant = route.variants.front().name;
  if (pool.seen.size() != static_cast<size_t>(pool.max)) pool.seen.resize(static_cast<size_t>(pool.max), 0);
  (void)now;
  return pool;
}

void ServerlessScaler::Mark(Pool& pool, int64_t now) {
  const int level = std::min<int>(pool.in_flight, static_cast<int>(pool.seen.size()));
  for (int k = 1; k <= level; ++k) pool.seen[static_cast<size_t>(k - 1)] = now;
}

int ServerlessScaler::Target(const Pool& pool, int64_t now) const {
  int target = std::max(pool.provisioned, pool.in_flight);
  for (int k = static_cast<int>(pool.seen.size()); k > target; --k) {
    const int64_t at = pool.seen[static_cast<size_t>(k - 1)];
    if (at != 0 && now - at < options_.idle.count()) {
      target = k;
      break;
    }
  }
  return std::min(target, pool.max);
}

bool ServerlessScaler::Admit(const serving::EndpointRoute& route) {
  MutexLock lock(mu_);
  const int64_t now = SteadyMillis();
  Pool& pool = PoolOf(route, now);
  if (pool.in_flight >= pool.max) return false;
  if (TotalInFlight() >= options_.account_max_concurrency) return false;
  ++pool.in_flight;
  pool.tick_peak = std::max(pool.tick_peak, pool.in_flight);
  Mark(pool, now);
  // More requests than instances: the loop raises the pool now, not at its next tick.
  if (pool.in_flight > pool.written) {
    dirty_ = true;
    wake_.NotifyAll();
  }
  return true;
}

int ServerlessScaler::TotalInFlight() const {
  int total = 0;
  for (const auto& [name, pool] : pools_) total += pool.in_flight;
  return total;
}

void ServerlessScaler::Leave(const serving::EndpointRoute& route) {
  MutexLock lock(mu_);
  auto it = pools_.find(route.name);
  if (it == pools_.end()) return;
  // The request was in flight until now.
  Mark(it->second, SteadyMillis());
  if (it->second.in_flight > 0) --it->second.in_flight;
}

void ServerlessScaler::ColdStart(const serving::EndpointRoute& route, const std::string& variant, int64_t micros) {
  MutexLock lock(mu_);
  setup_samples_.push_back({.endpoint = route.name, .variant = variant, .micros = micros, .wall_millis = NowMillis()});
}

int ServerlessScaler::WrittenSize(const std::string& endpoint) {
  MutexLock lock(mu_);
  auto it = pools_.find(endpoint);
  return it == pools_.end() ? -1 : it->second.written;
}

void ServerlessScaler::RunOnce() {
  const int64_t now = SteadyMillis();
  std::shared_ptr<const serving::RoutingTable::Map> routes = deps_.routes->All();
  struct Change {
    std::string endpoint;
    std::string variant;
    int size = 0;
  };
  std::vector<Change> changes;
  std::vector<SetupSample> samples;
  std::vector<observe::MetricDatum> provisioned_batch;
  const int64_t wall = NowMillis();
  {
    MutexLock lock(mu_);
    // Pools of endpoints no longer routed (deleted) are dropped.
    for (auto it = pools_.begin(); it != pools_.end();) {
      auto route = routes->find(it->first);
      if (route == routes->end() || route->second->serverless_max_concurrency == 0) {
        it = pools_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [name, route] : *routes) {
      if (route->serverless_max_concurrency == 0) continue;
      const bool known = pools_.count(name) > 0;
      Pool& pool = PoolOf(*route, now);
      if (!known) {
        // First seen: its routable instances count as used now (a restarted server keeps them
        // for `idle`, then shrinks).
        int routable = 0;
        for (const serving::VariantRoute& v : route->variants) routable += static_cast<int>(v.instances.size());
        routable = std::min(routable, pool.max);
        for (int k = 1; k <= routable; ++k) pool.seen[static_cast<size_t>(k - 1)] = now;
      }
      const int target = Target(pool, now);
      if (target != pool.written && !pool.variant.empty()) changes.push_back({name, pool.variant, target});
      if (pool.provisioned > 0 && !pool.variant.empty()) {
        const int executions = std::min(pool.tick_peak, pool.provisioned);
        const observe::Dimensions dims = {{"EndpointName", name}, {"VariantName", pool.variant}};
        provisioned_batch.push_back({.name = "ServerlessProvisionedConcurrencyExecutions",
                                     .dimensions = dims,
                                     .timestamp_millis = wall,
                                     .value = static_cast<double>(executions),
                                     .unit = "Count"});
        provisioned_batch.push_back({.name = "ServerlessProvisionedConcurrencyUtilization",
                                     .dimensions = dims,
                                     .timestamp_millis = wall,
                                     .value = static_cast<double>(executions) / pool.provisioned,
                                     .unit = "None"});
      }
      pool.tick_peak = pool.in_flight;
    }
    samples.swap(setup_samples_);
  }
  for (const Change& change : changes) {
    if (!Write(change.endpoint, change.variant, change.size)) continue;
    MutexLock lock(mu_);
    auto it = pools_.find(change.endpoint);
    if (it != pools_.end()) it->second.written = change.size;
  }
  if (!provisioned_batch.empty() && deps_.metrics != nullptr) {
    if (Status put = deps_.metrics->Put(kNamespace, provisioned_batch); !put.ok()) {
      KLOG(warn, "serverless: provisioned concurrency metrics not recorded", {{"error", put.ToString()}});
    }
  }
  if (!samples.empty() && deps_.metrics != nullptr) {
    std::vector<observe::MetricDatum> batch;
    for (const SetupSample& s : samples) {
      batch.push_back({.name = "ModelSetupTime",
                       .dimensions = {{"EndpointName", s.endpoint}, {"VariantName", s.variant}},
                       .timestamp_millis = s.wall_millis,
                       .value = static_cast<double>(s.micros),
                       .unit = "Microseconds"});
    }
    if (Status put = deps_.metrics->Put(kNamespace, batch); !put.ok()) {
      KLOG(warn, "serverless: ModelSetupTime not recorded", {{"error", put.ToString()}});
    }
  }
}

bool ServerlessScaler::Write(const std::string& endpoint, const std::string& variant, int size) {
  bool unchanged = false;
  auto updated = endpoints_.Mutate(endpoint, [&](store::EndpointRecord& r) {
    // Only a serving endpoint's pool moves; an update or delete in progress owns the row's counts.
    if ((r.status != store::EndpointStatus::kInService && r.status != store::EndpointStatus::kUpdating) || r.pending ||
        r.deployment.FindVariant(variant) == nullptr) {
      return Status::FailedPrecondition("not serving");
    }
    auto& desired = r.desired[variant];
    if (desired.instance_count && *desired.instance_count == size) {
      unchanged = true;
      return Status::FailedPrecondition("unchanged");
    }
    desired.instance_count = size;
    return Status::Ok();
  });
  if (unchanged) return true;
  if (!updated.ok()) return false;
  KLOG(info, "serverless: pool size", {{"endpoint", endpoint}, {"variant", variant}, {"size", std::to_string(size)}});
  if (deps_.notifier != nullptr) deps_.notifier->EndpointChanged(updated->name);
  return true;
}

}  // namespace kiln::control
