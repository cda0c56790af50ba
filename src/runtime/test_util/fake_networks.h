#pragma once
// Test helper: runtime::InstanceNetworks in memory, for controller unit tests.
//
// Network k (in creation order, from 1) gets subnet 127.<k>.0.0/24-like addresses: gateway
// 127.0.<k>.1, instances 127.0.<k>.2 upwards, so that a fake endpoint instance can really listen
// on its address (every 127/8 address is loopback on Linux; FakeRuntime listens on
// spec.network->address when a network is set). Records every call for assertions; FailNext()
// makes the next Ensure or Attach fail with the given status.
//
// Thread-safety: every method may be called from any thread.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "runtime/networks.h"

namespace kiln::runtime {

class FakeNetworks final : public InstanceNetworks {
 public:
  Result<NetworkInfo> Ensure(const std::string& name, bool isolated) override EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    calls_.push_back("ensure " + name);
    if (!fail_next_.ok()) return TakeFailure();
    auto it = networks_.find(name);
    if (it != networks_.end()) {
      if (it->second.info.isolated != isolated) {
        return Status::FailedPrecondition("network " + name + " exists with the other isolation setting");
      }
      return it->second.info;
    }
    Network& n = networks_[name];
    n.index = ++created_;
    n.info = {.name = name,
              .bridge = "kb-" + std::to_string(n.index),
              .subnet = "127.0." + std::to_string(n.index) + ".0/24",
              .gateway = "127.0." + std::to_string(n.index) + ".1",
              .prefix_length = 24,
              .isolated = isolated};
    return n.info;
  }

  Result<NetworkAttachment> Attach(const std::string& name, const std::string& instance_id,
                                   const std::vector<int>& loopback_forwards) override EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    calls_.push_back("attach " + name + " " + instance_id);
    if (!fail_next_.ok()) return TakeFailure();
    auto it = networks_.find(name);
    if (it == networks_.end()) return Status::NotFound("no network " + name);
    Network& n = it->second;
    int octet = 0;
    if (auto lease = n.leases.find(instance_id); lease != n.leases.end()) {
      octet = lease->second;
    } else {
      std::set<int> used;
      for (const auto& [id, o] : n.leases) used.insert(o);
      octet = 2;
      while (used.count(octet)) ++octet;
      if (octet > 254) return Status::ResourceExhausted("network " + name + " is full");
      n.leases[instance_id] = octet;
    }
    NetworkAttachment a;
    a.network = name;
    a.bridge = n.info.bridge;
    a.host_veth = "kv" + std::to_string(n.index) + "-" + std::to_string(octet);
    a.address = "127.0." + std::to_string(n.index) + "." + std::to_string(octet);
    a.prefix_length = 24;
    a.gateway = n.info.gateway;
    a.isolated = n.info.isolated;
    if (!a.isolated) a.loopback_forwards = loopback_forwards;
    return a;
  }

  Status Detach(const std::string& name, const std::string& instance_id) override EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    calls_.push_back("detach " + name + " " + instance_id);
    auto it = networks_.find(name);
    if (it != networks_.end()) it->second.leases.erase(instance_id);
    return Status::Ok();
  }

  Status Remove(const std::string& name) override EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    calls_.push_back("remove " + name);
    networks_.erase(name);
    return Status::Ok();
  }

  Result<std::set<std::string>> Sweep(const std::set<std::string>& live_instance_ids) override EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    calls_.push_back("sweep");
    std::set<std::string> removed;
    for (auto it = networks_.begin(); it != networks_.end();) {
      bool live = false;
      for (const auto& [id, octet] : it->second.leases) live |= live_instance_ids.count(id) > 0;
      if (!live) {
        removed.insert(it->first);
        it = networks_.erase(it);
      } else {
        ++it;
      }
    }
    return removed;
  }

  // Test controls.
  void FailNext(Status status) EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    fail_next_ = std::move(status);
  }
  std::vector<std::string> calls() const EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return calls_;
  }
  bool Exists(const std::string& name) const EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return networks_.count(name) > 0;
  }
  std::map<std::string, int> Leases(const std::string& name) const EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    auto it = networks_.find(name);
    return it == networks_.end() ? std::map<std::string, int>{} : it->second.leases;
  }

 private:
  struct Network {
    int index = 0;
    NetworkInfo info;
    std::map<std::string, int> leases;  // instance id -> last octet
  };

  Status TakeFailure() REQUIRES(mutex_) {
    Status s = std::move(fail_next_);
    fail_next_ = Status::Ok();
    return s;
  }

  mutable Mutex mutex_;
  std::map<std::string, Network> networks_ GUARDED_BY(mutex_);
  std::vector<std::string> calls_ GUARDED_BY(mutex_);
  Status fail_next_ GUARDED_BY(mutex_);
  int created_ GUARDED_BY(mutex_) = 0;
};

}  // namespace kiln::runtime
