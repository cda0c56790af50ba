#pragma once
// Test fixture for controller unit tests: what cli/server.cc gives the controllers, without a
// server and without processes. A fresh database, an fs object store (bucket "bkt") and a log
// store in one temp directory, a metric store, the built-in instance catalog, a fake runtime
// (runtime/test_util/fake_runtime.h) whose output stamps come from a fake clock, and instance
// credentials. The scheduler is made by the test (its capacity is what a test is about);
// Restart() replaces what a server restart replaces (scheduler, credentials) and keeps what
// outlives the server (database, object store, the runtime's instances).

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "control/instance_catalog.h"
#include "control/instance_credentials.h"
#include "control/scheduler.h"
#include "objects/fs_object_store.h"
#include "observe/log_store.h"
#include "observe/metric_store.h"
#include "runtime/environments.h"
#include "runtime/test_util/fake_clock.h"
#include "runtime/test_util/fake_runtime.h"
#include "store/test_util/temp_database.h"

namespace kiln::control::testing {

inline constexpr uint64_t kGiB = 1ull << 30;

// A host of `cpus` CPUs and `memory_gib` GiB, no GPUs.
inline HostCapacity SmallHost(int cpus, double memory_gib) {
  HostCapacity h;
  for (int i = 0; i < cpus; ++i) h.cpus.push_back(i);
  h.memory_bytes = static_cast<uint64_t>(memory_gib * static_cast<double>(kGiB));
  return h;
}

class ControllerTest : public ::testing::Test {
 protected:
  // How long a wait for a controller's progress may take before the test fails. Generous (a
  // loaded machine); a passing test returns as soon as the condition holds.
  static constexpr std::chrono::milliseconds kPatience{10000};

  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    objects::FsObjectStore::Options o;
    o.root = dir_.path() + "/objects";
    o.database = db_.get();
    o.sync = false;
    auto objects = objects::FsObjectStore::Open(o);
    ASSERT_TRUE(objects.ok()) << objects.status().ToString();
    object_store_ = std::move(objects).value();
    ASSERT_TRUE(object_store_->CreateBucket("bkt", "us-east-1").ok());
    auto logs = observe::LogStore::Open({dir_.path() + "/logs", db_.get(), &clock_});
    ASSERT_TRUE(logs.ok()) << logs.status().ToString();
    log_store_ = std::move(logs).value();
    metric_store_ = std::make_unique<observe::MetricStore>(db_.get());
    runtime_ = std::make_unique<runtime::testing::FakeRuntime>(dir_.path() + "/instances", &clock_);
    environments_ = std::make_unique<runtime::EnvironmentTable>(runtime::EnvironmentTable::Default());
    credentials_ = std::make_unique<InstanceCredentials>("000000000000");
  }

  // A scheduler over `capacity` (strict shapes), replacing any earlier one.
  void MakeScheduler(HostCapacity capacity) {
    capacity_ = capacity;
    SchedulerOptions options;
    options.capacity = std::move(capacity);
    scheduler_ = std::make_unique<Scheduler>(options, &InstanceCatalog::BuiltIn());
  }

  // What a server restart renews (call after the controller is gone).
  void RenewServerState() {
    MakeScheduler(capacity_);
    credentials_ = std::make_unique<InstanceCredentials>("000000000000");
  }

  // Waits (polling, woken by every runtime event) until `done()` holds.
  bool WaitFor(const std::function<bool()>& done) const { return runtime_->WaitUntil(done, kPatience); }

  std::string work_dir() const { return dir_.path() + "/work"; }

  store::testing::TempDir dir_;
  runtime::testing::FakeClock clock_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<objects::FsObjectStore> object_store_;
  std::unique_ptr<observe::LogStore> log_store_;
  std::unique_ptr<observe::MetricStore> metric_store_;
  std::unique_ptr<runtime::testing::FakeRuntime> runtime_;
  std::unique_ptr<runtime::EnvironmentTable> environments_;
  std::unique_ptr<InstanceCredentials> credentials_;
  HostCapacity capacity_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace kiln::control::testing
