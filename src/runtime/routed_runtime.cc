#include "runtime/routed_runtime.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/mutex.h"

namespace kiln::runtime {
namespace {

// Why a container image cannot run when no engine is configured.
Status NoEngine(const std::string& image) {
  return Status::FailedPrecondition(
      "the container image " + image +
      " cannot run: no container engine is configured. Set container_engine.socket in the Kiln config file "
      "(e.g. \"unix:///run/podman/podman.sock\" for Podman, \"unix:///var/run/docker.sock\" for Docker), or "
      "narrow container_engine.images so that this image maps to an environment.");
}

class RoutedRuntime final : public Runtime {
 public:
  RoutedRuntime(std::unique_ptr<Runtime> processes, std::unique_ptr<Runtime> containers)
      : processes_(std::move(processes)), containers_(std::move(containers)) {}

  // Runtime

  Status PrepareImage(const ContainerImage& image, const std::function<void(const std::string&)>& progress,
                      const std::function<bool()>& cancelled) override {
    if (containers_ == nullptr) return NoEngine(image.requested);
    return containers_->PrepareImage(image, progress, cancelled);
  }

  Status Launch(const InstanceSpec& spec) override {
    if (!spec.container) {
      Status launched = processes_->Launch(spec);
      if (launched.ok()) Forget(spec.instance_id);
      return launched;
    }
    if (containers_ == nullptr) return NoEngine(spec.container->requested);
    Status launched = containers_->Launch(spec);
    if (launched.ok()) Remember(spec.instance_id);
    return launched;
  }

  Result<InstanceStatus> Inspect(const std::string& instance_id) override {
    if (containers_ != nullptr) {
      Result<InstanceStatus> status = containers_->Inspect(instance_id);
      if (status.ok() || status.status().code() != StatusCode::kNotFound) {
        Remember(instance_id);
        return status;
      }
      Forget(instance_id);
    }
    return processes_->Inspect(instance_id);
  }

  Status Signal(const std::string& instance_id, int signal) override {
    return Owner(instance_id).Signal(instance_id, signal);
  }

  Status Stop(const std::string& instance_id, std::chrono::seconds grace) override {
    return Owner(instance_id).Stop(instance_id, grace);
  }

  Result<InstanceStatus> Wait(const std::string& instance_id, std::chrono::milliseconds timeout) override {
    return Owner(instance_id).Wait(instance_id, timeout);
  }

  std::string OutputPath(const std::string& instance_id) const override {
    return Owner(instance_id).OutputPath(instance_id);
  }

  Result<std::vector<std::string>> List() override {
    ASSIGN_OR_RETURN(std::vector<std::string> ids, processes_->List());
    if (containers_ != nullptr) {
      ASSIGN_OR_RETURN(std::vector<std::string> more, containers_->List());
      ids.insert(ids.end(), more.begin(), more.end());
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    }
    return ids;
  }

  Status Remove(const std::string& instance_id) override {
    Runtime& owner = Owner(instance_id);
    Status removed = owner.Remove(instance_id);
    if (&owner == containers_.get() && (removed.ok() || removed.code() == StatusCode::kNotFound)) {
      Forget(instance_id);
    }
    return removed;
  }

  Result<InstanceUsage> Usage(const std::string& instance_id) override { return Owner(instance_id).Usage(instance_id); }
  Result<AccessPoint> Access(const std::string& instance_id) override { return Owner(instance_id).Access(instance_id); }

 private:
  // The backend that has the instance: the container runtime when it knows the id (remembered
  // from its Launch or an Inspect, else asked: for an unknown id that is a stat of its state
  // directory), the process runtime otherwise (which answers NotFound for ids nobody has).
  Runtime& Owner(const std::string& instance_id) const {
    if (containers_ == nullptr) return *processes_;
    {
      MutexLock lock(mu_);
      if (container_ids_.count(instance_id) != 0) return *containers_;
    }
    Result<InstanceStatus> status = containers_->Inspect(instance_id);
    if (status.ok() || status.status().code() != StatusCode::kNotFound) {
      Remember(instance_id);
      return *containers_;
    }
    return *processes_;
  }

  void Remember(const std::string& instance_id) const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    container_ids_.insert(instance_id);
  }
  void Forget(const std::string& instance_id) const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    container_ids_.erase(instance_id);
  }

  const std::unique_ptr<Runtime> processes_;
  const std::unique_ptr<Runtime> containers_;  // null: no engine configured

  // Ids the container runtime is known to have, so that the calls after Launch (Wait every
  // 250 ms in the training monitor, Stop, Remove...) do not cost it an extra Inspect each. An id
  // leaves the set when the container runtime no longer knows it or Removes it.
  mutable Mutex mu_;
  mutable std::set<std::string> container_ids_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Runtime> MakeRoutedRuntime(std::unique_ptr<Runtime> processes, std::unique_ptr<Runtime> containers) {
  return std::make_unique<RoutedRuntime>(std::move(processes), std::move(containers));
}

}  // namespace kiln::runtime
