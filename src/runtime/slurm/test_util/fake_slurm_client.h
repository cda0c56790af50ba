#pragma once
// A SlurmClient for tests: keeps jobs in memory; tests move them through Slurm's states
// (SetState) and see what was submitted and cancelled. Thread-safe.

#include <map>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "runtime/slurm/slurm_client.h"

namespace kiln::runtime::slurm {

class FakeSlurmClient : public SlurmClient {
 public:
  Result<std::string> Submit(const SubmitRequest& request) override {
    MutexLock lock(mu_);
    if (!submit_error_.ok()) return submit_error_;
    std::string id = std::to_string(next_id_++);
    submitted_.push_back(request);
    JobInfo info;
    info.job_id = id;
    info.state = "PENDING";
    info.reason = "Priority";
    jobs_[id] = info;
    return id;
  }
  Result<std::map<std::string, JobInfo>> Query(const std::vector<std::string>& job_ids) override {
    MutexLock lock(mu_);
    ++queries_;
    if (!query_error_.ok()) return query_error_;
    std::map<std::string, JobInfo> out;
    for (const std::string& id : job_ids) {
      auto it = jobs_.find(id);
      if (it != jobs_.end()) out[id] = it->second;
    }
    return out;
  }
  Status Cancel(const std::string& job_id, int signal) override {
    MutexLock lock(mu_);
    cancelled_.push_back(job_id);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end() && signal == 0 && !IsTerminalState(it->second.state)) it->second.state = "CANCELLED";
    return Status::Ok();
  }

  void SetState(const std::string& id, const std::string& state, const std::string& reason = "",
                const std::string& nodes = "") {
    MutexLock lock(mu_);
    JobInfo& info = jobs_[id];
    info.job_id = id;
    info.state = state;
    info.reason = reason;
    if (!nodes.empty()) info.node_list = nodes;
  }
  void Forget(const std::string& id) {
    MutexLock lock(mu_);
    jobs_.erase(id);
  }
  void SetSubmitError(Status s) {
    MutexLock lock(mu_);
    submit_error_ = std::move(s);
  }
  void SetQueryError(Status s) {
    MutexLock lock(mu_);
    query_error_ = std::move(s);
  }
  std::vector<SubmitRequest> submitted() {
    MutexLock lock(mu_);
    return submitted_;
  }
  std::vector<std::string> cancelled() {
    MutexLock lock(mu_);
    return cancelled_;
  }
  JobInfo job(const std::string& id) {
    MutexLock lock(mu_);
    return jobs_[id];
  }
  int queries() {
    MutexLock lock(mu_);
    return queries_;
  }

 private:
  Mutex mu_;
  int next_id_ GUARDED_BY(mu_) = 100;
  int queries_ GUARDED_BY(mu_) = 0;
  Status submit_error_ GUARDED_BY(mu_);
  Status query_error_ GUARDED_BY(mu_);
  std::map<std::string, JobInfo> jobs_ GUARDED_BY(mu_);
  std::vector<SubmitRequest> submitted_ GUARDED_BY(mu_);
  std::vector<std::string> cancelled_ GUARDED_BY(mu_);
};

}  // namespace kiln::runtime::slurm
