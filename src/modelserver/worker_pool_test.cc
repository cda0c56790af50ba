#include "modelserver/worker_pool.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "modelserver/worker_process.h"

namespace kiln::modelserver {
namespace {

using namespace std::chrono_literals;

// The fake worker sits beside this file (CMake compiles sources by absolute path).
const std::string kFakeWorker =
    (std::filesystem::path(__FILE__).parent_path() / "test_util" / "fake_worker.py").string();

WorkerPoolOptions FakeOptions(std::map<std::string, std::string> env = {}) {
  WorkerPoolOptions options;
  options.model_name = "fake-model";
  options.model_dir = "/nonexistent/model";
  options.worker_command = {"/usr/bin/python3", "-u", kFakeWorker};
  options.env = std::move(env);
  options.workers = 1;
  options.timeout = 10s;
  options.batch_delay = 0ms;
  options.run_prepare = false;
  return options;
}

InferenceRequest Request(std::string body, std::string content_type = "text/plain") {
  InferenceRequest request;
  request.body = std::move(body);
  request.content_type = std::move(content_type);
  return request;
}

// Invoke, with the answer as a future.
std::future<InferenceResponse> InvokeAsync(WorkerPool& pool, InferenceRequest request) {
  auto promise = std::make_shared<std::promise<InferenceResponse>>();
  std::future<InferenceResponse> future = promise->get_future();
  pool.Invoke(std::move(request), [promise](InferenceResponse r) { promise->set_value(std::move(r)); });
  return future;
}

InferenceResponse Await(std::future<InferenceResponse>& future, std::chrono::seconds limit = 10s) {
  if (future.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "no answer within " << limit.count() << " s";
    InferenceResponse none;
    none.status = 0;
    return none;
  }
  return future.get();
}

InferenceResponse Call(WorkerPool& pool, InferenceRequest request) {
  std::future<InferenceResponse> future = InvokeAsync(pool, std::move(request));
  return Await(future);
}

std::string ErrorType(const InferenceResponse& r) {
  nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
  return body.is_object() ? body.value("type", "") : "";
}

int Pid(WorkerPool& pool) {
  InferenceResponse r = Call(pool, Request("pid"));
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? std::stoi(r.body) : -1;
}

bool Eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = 5000ms) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

class StartedPool {
 public:
  explicit StartedPool(WorkerPoolOptions options) : pool(std::move(options)) {
    EXPECT_TRUE(pool.Start().ok());
    Status loaded = pool.WaitUntilLoaded(10s);
    EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  }
  WorkerPool pool;
};

TEST(WorkerPoolTest, EchoesBodyContentTypeAndCustomAttributes) {
  StartedPool p(FakeOptions());
  EXPECT_EQ(p.pool.state(), BackendState::kReady);
  InferenceRequest request = Request(std::string("bytes\0\xff as they came", 20), "application/x-npy");
  request.custom_attributes = "trace=1";
  InferenceResponse r = Call(p.pool, request);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, std::string("bytes\0\xff as they came", 20));
  EXPECT_EQ(r.content_type, "application/x-npy");
  EXPECT_EQ(r.custom_attributes, "trace=1");
  // An empty body is a request too.
  InferenceResponse empty = Call(p.pool, Request(""));
  EXPECT_EQ(empty.status, 200);
  EXPECT_EQ(empty.body, "");
  // The handler's own error status passes through.
  InferenceResponse teapot = Call(p.pool, Request("status:418"));
  EXPECT_EQ(teapot.status, 418);
  EXPECT_EQ(teapot.content_type, "application/json");
}

TEST(WorkerPoolTest, LargeBodiesGoBothWaysWhole) {
  // Far beyond a socket buffer: the write waits for room and the answer comes in many reads.
  WorkerPoolOptions options = FakeOptions();
  options.batch_size = 3;
  options.batch_delay = 200ms;
  StartedPool p(options);
  std::vector<std::string> bodies;
  std::vector<std::future<InferenceResponse>> futures;
  for (int i = 0; i < 3; ++i) {
    std::string body(6'000'000 + i, '\0');
    for (size_t j = 0; j < body.size(); j += 997) body[j] = static_cast<char>('a' + (j / 997 + i) % 26);
    bodies.push_back(body);
    futures.push_back(InvokeAsync(p.pool, Request(std::move(body), "application/octet-stream")));
  }
  for (int i = 0; i < 3; ++i) {
    InferenceResponse r = Await(futures[i]);
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(r.body == bodies[i]) << "item " << i << ": " << r.body.size() << " bytes";
  }
}

TEST(WorkerPoolTest, WorkerGetsItsCommandLineHeadersEnvironmentAndOnlyFd3) {
  std::vector<int> expected_fds = {0, 1, 2, 3};
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = std::stoi(entry.path().filename().string());
    int flags = fcntl(fd, F_GETFD);
    if (fd > 3 && flags >= 0 && (flags & FD_CLOEXEC) == 0) expected_fds.push_back(fd);
  }
  std::sort(expected_fds.begin(), expected_fds.end());
  WorkerPoolOptions options =
      FakeOptions({{"KILN_TEST_WORKER_VAR", "from-options"}, {"FAKE_ENV_PROBE", "KILN_TEST_WORKER_VAR"}});
  options.framework = "pytorch";
  StartedPool p(options);
  InferenceRequest request = Request("info");
  request.accept = "application/json";
  request.inference_id = "inf-1";
  request.target_model = "m.tar.gz";
  InferenceResponse r = Call(p.pool, request);
  ASSERT_EQ(r.status, 200) << r.body;
  nlohmann::json info = nlohmann::json::parse(r.body);
  EXPECT_EQ(info["argv"], nlohmann::json({"work", "--fd", "3", "--model-dir", "/nonexistent/model", "--model-name",
                                          "fake-model", "--framework", "pytorch"}));
  EXPECT_EQ(info["accept"], "application/json");
  EXPECT_EQ(info["inference_id"], "inf-1");
  EXPECT_EQ(info["target_model"], "m.tar.gz");
  // 0, 1, 2, 3, and what this test process had inherited without close-on-exec before the pool
  // existed (a test runner's descriptors): nothing the pool opened leaked.
  EXPECT_EQ(info["fds"].get<std::vector<int>>(), expected_fds);
  EXPECT_EQ(Call(p.pool, Request("env")).body, "from-options");
  EXPECT_GT(p.pool.MemoryBytes(), 1u << 20);  // a Python interpreter is megabytes
  EXPECT_EQ(p.pool.worker_pids().size(), 1u);
  EXPECT_EQ(p.pool.workers(), 1);
}

TEST(WorkerPoolTest, EachWorkerKnowsItsIndex) {
  // The Python worker spreads a model's workers over the GPUs by this number.
  StartedPool p(FakeOptions({{"FAKE_ENV_PROBE", "KILN_MODEL_SERVER_WORKER_INDEX"}}));
  EXPECT_EQ(Call(p.pool, Request("env")).body, "0");
}

TEST(WorkerPoolTest, ManyThreadsAtOnce) {
  WorkerPoolOptions options = FakeOptions();
  options.workers = 3;
  StartedPool p(options);
  EXPECT_TRUE(Eventually([&] { return p.pool.stats().live_workers == 3; }, 10000ms));
  constexpr int kThreads = 8, kPerThread = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string body = "t" + std::to_string(t) + "-" + std::to_string(i);
        InferenceResponse r = Call(p.pool, Request(body));
        if (r.status == 200 && r.body == body) ++ok;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  EXPECT_EQ(p.pool.stats().restarts, 0u);
  EXPECT_EQ(p.pool.worker_pids().size(), 3u);
}

TEST(WorkerPoolTest, QueuedRequestsGoAsOneBatch) {
  // Requests queued while the worker loads are all there when it is ready: one invoke of four.
  WorkerPoolOptions options = FakeOptions({{"FAKE_LOAD_DELAY", "0.3"}});
  options.batch_size = 4;
  options.batch_delay = 50ms;
  WorkerPool pool(options);
  ASSERT_TRUE(pool.Start().ok());
  std::vector<std::future<InferenceResponse>> futures;
  for (int i = 0; i < 4; ++i) futures.push_back(InvokeAsync(pool, Request(i == 2 ? "status:400" : "info")));
  std::set<int> indexes;
  for (int i = 0; i < 4; ++i) {
    InferenceResponse r = Await(futures[i]);
    if (i == 2) {
      // One item's error does not fail the others.
      EXPECT_EQ(r.status, 400);
      continue;
    }
    ASSERT_EQ(r.status, 200) << r.body;
    nlohmann::json info = nlohmann::json::parse(r.body);
    EXPECT_EQ(info["batch"], 4);
    EXPECT_EQ(info["index"], i);  // answers go back to their own requests, in order
    indexes.insert(info["index"].get<int>());
  }
  EXPECT_EQ(indexes.size(), 3u);
  EXPECT_EQ(pool.stats().batches, 1u);
}

TEST(WorkerPoolTest, ABatchWaitsUpToTheDelayForMore) {
  WorkerPoolOptions options = FakeOptions();
  options.batch_size = 2;
  options.batch_delay = 2000ms;
  StartedPool p(options);
  std::future<InferenceResponse> first = InvokeAsync(p.pool, Request("info"));
  std::this_thread::sleep_for(100ms);
  std::future<InferenceResponse> second = InvokeAsync(p.pool, Request("info"));
  InferenceResponse a = Await(first), b = Await(second);
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(b.status, 200);
  EXPECT_EQ(nlohmann::json::parse(a.body)["batch"], 2);
  EXPECT_EQ(nlohmann::json::parse(b.body)["index"], 1);
  EXPECT_EQ(p.pool.stats().batches, 1u);
  // Alone, a request waits the delay out and goes by itself (not a batch).
  auto started = std::chrono::steady_clock::now();
  InferenceResponse alone = Call(p.pool, Request("info"));
  EXPECT_EQ(nlohmann::json::parse(alone.body)["batch"], 1);
  EXPECT_GE(std::chrono::steady_clock::now() - started, 1900ms);
  EXPECT_EQ(p.pool.stats().batches, 1u);
}

TEST(WorkerPoolTest, AWorkerKilledMidRequestAnswers500AndIsReplaced) {
  StartedPool p(FakeOptions());
  int old_pid = Pid(p.pool);
  std::future<InferenceResponse> slow = InvokeAsync(p.pool, Request("sleep:5"));
  std::this_thread::sleep_for(200ms);
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  InferenceResponse r = Await(slow);
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(ErrorType(r), "WorkerDied");
  EXPECT_NE(r.body.find("killed by signal 9"), std::string::npos) << r.body;
  int new_pid = Pid(p.pool);
  EXPECT_NE(new_pid, old_pid);
  EXPECT_EQ(p.pool.stats().restarts, 1u);
  // The old one was reaped: no zombie left behind.
  EXPECT_NE(kill(old_pid, 0), 0);

  // A worker that exits by itself in the middle of a request: its exit status is in the answer.
  InferenceResponse exited = Call(p.pool, Request("exit"));
  EXPECT_EQ(exited.status, 500);
  EXPECT_NE(exited.body.find("exit status 3"), std::string::npos) << exited.body;
  EXPECT_EQ(Call(p.pool, Request("again")).body, "again");
  EXPECT_EQ(p.pool.stats().restarts, 2u);

  // One that answers and exits right after: the answer counts; the death is noticed while idle
  // (a request sent in the instant before the exit would be lost with it: not tested, a race).
  InferenceResponse last_words = Call(p.pool, Request("answer-then-exit"));
  EXPECT_EQ(last_words.status, 200);
  EXPECT_EQ(last_words.body, "answer-then-exit");
  EXPECT_TRUE(Eventually([&] { return p.pool.stats().restarts == 3; }));
  EXPECT_EQ(Call(p.pool, Request("after")).body, "after");
}

TEST(WorkerPoolTest, AnIdleWorkerThatDiesIsReplacedWithoutFailingTheNextRequest) {
  StartedPool p(FakeOptions());
  int old_pid = Pid(p.pool);
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  std::this_thread::sleep_for(50ms);
  // Sent to the dead worker first (EPIPE): the request goes back to the queue, not to a 500.
  InferenceResponse r = Call(p.pool, Request("still fine"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(Pid(p.pool), old_pid);
  // And noticed while idle, without a request.
  int second_pid = Pid(p.pool);
  ASSERT_EQ(kill(second_pid, SIGKILL), 0);
  EXPECT_TRUE(Eventually([&] {
    std::vector<int> pids = p.pool.worker_pids();
    return pids.size() == 1 && pids[0] != second_pid;
  }));
  EXPECT_EQ(p.pool.stats().restarts, 2u);
}

// Batching off, an idle worker: Invoke writes the invoke frame to the worker's socket itself, so
// the request never enters the queue; frames too big for one non-blocking write (partly written,
// or beyond the inline limit) are finished by the worker's thread.
TEST(WorkerPoolTest, InvokeHandsARequestToAnIdleWorkerDirectly) {
  StartedPool p(FakeOptions());
  ASSERT_GT(Pid(p.pool), 0);
  std::this_thread::sleep_for(100ms);  // its thread is back to waiting
  std::future<InferenceResponse> slow = InvokeAsync(p.pool, Request("sleep:0.3"));
  EXPECT_EQ(p.pool.stats().queued, 0u);  // handed over inside Invoke, not queued
  // The worker is busy now: the next one waits in the queue behind it.
  std::future<InferenceResponse> next = InvokeAsync(p.pool, Request("behind"));
  EXPECT_EQ(p.pool.stats().queued, 1u);
  EXPECT_EQ(Await(slow).body, "sleep:0.3");
  EXPECT_EQ(Await(next).body, "behind");
  for (size_t size : {size_t{1}, size_t{100'000}, size_t{200'000}, size_t{250'000}, size_t{2'000'000}}) {
    std::this_thread::sleep_for(20ms);
    std::string body(size, '\0');
    for (size_t j = 0; j < body.size(); j += 89) body[j] = static_cast<char>('a' + (j / 89) % 26);
    InferenceResponse r = Call(p.pool, Request(body, "application/octet-stream"));
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(r.body == body) << size << " bytes sent, " << r.body.size() << " back";
  }
  EXPECT_EQ(p.pool.stats().restarts, 0u);
}

TEST(WorkerPoolTest, AWorkerKilledDuringAHandedOverRequestFailsOnlyThatRequest) {
  StartedPool p(FakeOptions());
  int old_pid = Pid(p.pool);
  std::this_thread::sleep_for(100ms);
  std::future<InferenceResponse> slow = InvokeAsync(p.pool, Request("sleep:5"));
  ASSERT_EQ(p.pool.stats().queued, 0u);
  std::future<InferenceResponse> queued = InvokeAsync(p.pool, Request("queued"));
  std::this_thread::sleep_for(200ms);
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  InferenceResponse r = Await(slow);
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(ErrorType(r), "WorkerDied");
  EXPECT_NE(r.body.find("killed by signal 9"), std::string::npos) << r.body;
  // The request behind it is served by the replacement.
  InferenceResponse after = Await(queued);
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.body, "queued");
  EXPECT_NE(Pid(p.pool), old_pid);
  EXPECT_EQ(p.pool.stats().restarts, 1u);
}

TEST(WorkerPoolTest, ARequestPastTheTimeoutAnswers504AndTheWorkerIsReplaced) {
  WorkerPoolOptions options = FakeOptions();
  options.timeout = 700ms;
  StartedPool p(options);
  int old_pid = Pid(p.pool);
  auto started = std::chrono::steady_clock::now();
  InferenceResponse r = Call(p.pool, Request("sleep:30"));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  EXPECT_EQ(r.status, 504);
  EXPECT_EQ(ErrorType(r), "ModelTimeout");
  EXPECT_NE(r.body.find("SAGEMAKER_MODEL_SERVER_TIMEOUT (700 ms"), std::string::npos) << r.body;
  // The replacement's start is not charged to the next request (a loaded machine starts Python slowly).
  ASSERT_TRUE(Eventually([&] { return p.pool.stats().live_workers == 1; }, 10000ms));
  EXPECT_NE(Pid(p.pool), old_pid);
  EXPECT_EQ(p.pool.stats().restarts, 1u);
}

TEST(WorkerPoolTest, ARequestWhoseDeadlinePassedInTheQueueIsNotSent) {
  WorkerPoolOptions options = FakeOptions();
  options.timeout = 1000ms;
  StartedPool p(options);
  int pid = Pid(p.pool);
  InferenceRequest stale = Request("never sent");
  stale.arrived = std::chrono::steady_clock::now() - 2s;
  InferenceResponse r = Call(p.pool, stale);
  EXPECT_EQ(r.status, 504);
  EXPECT_EQ(Pid(p.pool), pid);
  EXPECT_EQ(p.pool.stats().restarts, 0u);
}

TEST(WorkerPoolTest, QueuedRequestsTimeOutWhileEveryWorkerIsBusy) {
  WorkerPoolOptions options = FakeOptions();
  options.timeout = 3000ms;
  StartedPool p(options);
  std::future<InferenceResponse> busy = InvokeAsync(p.pool, Request("sleep:2"));
  ASSERT_TRUE(Eventually([&] { return p.pool.stats().queued == 0; }));
  InferenceRequest waiting = Request("queued");
  waiting.arrived = std::chrono::steady_clock::now() - 2700ms;  // 300 ms left, the worker busy 2 s
  std::future<InferenceResponse> queued = InvokeAsync(p.pool, waiting);
  InferenceResponse r = Await(queued);
  EXPECT_EQ(r.status, 504);
  EXPECT_EQ(ErrorType(r), "ModelTimeout");
  // Answered by the sweeper while the only worker was still busy, not when it got free.
  EXPECT_EQ(busy.wait_for(0ms), std::future_status::timeout);
  EXPECT_EQ(Await(busy).status, 200);
}

TEST(WorkerPoolTest, AFullQueueAnswers503AtOnce) {
  WorkerPoolOptions options = FakeOptions();
  options.queue_size = 2;
  StartedPool p(options);
  std::future<InferenceResponse> busy = InvokeAsync(p.pool, Request("sleep:0.5"));
  ASSERT_TRUE(Eventually([&] { return p.pool.stats().queued == 0; }));
  std::future<InferenceResponse> q1 = InvokeAsync(p.pool, Request("one"));
  std::future<InferenceResponse> q2 = InvokeAsync(p.pool, Request("two"));
  bool inline_answer = false;
  InferenceResponse refused;
  p.pool.Invoke(Request("three"), [&](InferenceResponse r) {
    inline_answer = true;
    refused = std::move(r);
  });
  EXPECT_TRUE(inline_answer);
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(ErrorType(refused), "ServiceUnavailable");
  EXPECT_NE(refused.body.find("KILN_MODEL_SERVER_QUEUE_SIZE"), std::string::npos);
  EXPECT_EQ(Await(busy).status, 200);
  EXPECT_EQ(Await(q1).body, "one");
  EXPECT_EQ(Await(q2).body, "two");
}

TEST(WorkerPoolTest, AMalformedResultAnswers500AndReplacesTheWorker) {
  StartedPool p(FakeOptions());
  for (const char* body : {"garbage", "badsizes"}) {
    int old_pid = Pid(p.pool);
    InferenceResponse r = Call(p.pool, Request(body));
    EXPECT_EQ(r.status, 500) << body;
    EXPECT_NE(r.body.find("malformed result"), std::string::npos) << r.body;
    EXPECT_NE(Pid(p.pool), old_pid) << body;
  }
  EXPECT_EQ(p.pool.stats().restarts, 2u);
}

TEST(WorkerPoolTest, LoadFailureFailsThePoolWithTheHandlersMessage) {
  WorkerPool pool(FakeOptions({{"FAKE_LOAD_FAIL", "model.pth is missing"}}));
  ASSERT_TRUE(pool.Start().ok());
  Status loaded = pool.WaitUntilLoaded(10s);
  EXPECT_EQ(loaded.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(loaded.message(), "ValueError: model.pth is missing");
  EXPECT_EQ(pool.state(), BackendState::kFailed);
  EXPECT_EQ(pool.load_error().message(), loaded.message());
  InferenceResponse r = Call(pool, Request("x"));
  EXPECT_EQ(r.status, 503);
}

TEST(WorkerPoolTest, A507LoadFailureIsResourceExhausted) {
  WorkerPoolOptions options = FakeOptions({{"FAKE_LOAD_FAIL", "out of memory"}, {"FAKE_LOAD_STATUS", "507"}});
  options.workers = 2;
  WorkerPool pool(options);
  ASSERT_TRUE(pool.Start().ok());
  Status loaded = pool.WaitUntilLoaded(10s);
  EXPECT_EQ(loaded.code(), StatusCode::kResourceExhausted) << loaded.ToString();
  EXPECT_NE(loaded.message().find("out of memory"), std::string::npos);
}

TEST(WorkerPoolTest, AWorkerExitingBeforeReadyFailsThePool) {
  WorkerPool pool(FakeOptions({{"FAKE_LOAD_EXIT", "4"}}));
  ASSERT_TRUE(pool.Start().ok());
  Status loaded = pool.WaitUntilLoaded(10s);
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.message().find("exit status 4"), std::string::npos) << loaded.ToString();
  EXPECT_EQ(pool.state(), BackendState::kFailed);
}

TEST(WorkerPoolTest, AMissingInterpreterFailsThePool) {
  WorkerPoolOptions options = FakeOptions();
  options.worker_command = {"/nonexistent/python3", kFakeWorker};
  WorkerPool pool(options);
  ASSERT_TRUE(pool.Start().ok());
  Status loaded = pool.WaitUntilLoaded(10s);
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.message().find("/nonexistent/python3"), std::string::npos) << loaded.ToString();
}

TEST(WorkerPoolTest, WaitUntilLoadedTimesOutWhileLoading) {
  WorkerPool pool(FakeOptions({{"FAKE_LOAD_DELAY", "5"}}));
  ASSERT_TRUE(pool.Start().ok());
  Status loaded = pool.WaitUntilLoaded(100ms);
  EXPECT_EQ(loaded.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(pool.state(), BackendState::kLoading);
  auto started = std::chrono::steady_clock::now();
  pool.Stop(0ms);  // does not wait for the load
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  EXPECT_EQ(pool.state(), BackendState::kStopped);
}

TEST(WorkerPoolTest, PrepareRunsFirstWithItsArguments) {
  std::string mark = ::testing::TempDir() + "/prepare_mark_" + std::to_string(getpid());
  std::filesystem::remove(mark);
  WorkerPoolOptions options = FakeOptions({{"FAKE_PREPARE_MARK", mark}});
  options.run_prepare = true;
  options.framework = "sklearn";
  StartedPool p(options);
  std::ifstream in(mark);
  std::string argv((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(argv, "prepare --model-dir /nonexistent/model --model-name fake-model --framework sklearn");
  std::filesystem::remove(mark);
}

TEST(WorkerPoolTest, StopDuringPrepareEndsItAtOnce) {
  WorkerPoolOptions options = FakeOptions({{"FAKE_PREPARE_SLEEP", "30"}});
  options.run_prepare = true;
  WorkerPool pool(options);
  ASSERT_TRUE(pool.Start().ok());
  std::future<InferenceResponse> waiting = InvokeAsync(pool, Request("x"));
  std::this_thread::sleep_for(100ms);
  auto started = std::chrono::steady_clock::now();
  pool.Stop(0ms);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  EXPECT_EQ(pool.state(), BackendState::kStopped);
  EXPECT_EQ(Await(waiting).status, 503);
  EXPECT_EQ(pool.WaitUntilLoaded(1s).code(), StatusCode::kUnavailable);
}

TEST(WorkerPoolTest, PrepareFailureFailsThePoolWithTheEndOfItsStderr) {
  WorkerPoolOptions options = FakeOptions({{"FAKE_PREPARE_FAIL", "ERROR: No matching distribution for nopkg"}});
  options.run_prepare = true;
  WorkerPool pool(options);
  ASSERT_TRUE(pool.Start().ok());
  Status loaded = pool.WaitUntilLoaded(10s);
  EXPECT_EQ(loaded.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(loaded.message().find("exit status 1"), std::string::npos) << loaded.message();
  EXPECT_NE(loaded.message().find("No matching distribution for nopkg"), std::string::npos) << loaded.message();
  EXPECT_NE(loaded.message().find("noise line 29"), std::string::npos);
  EXPECT_EQ(loaded.message().find("noise line 3\n"), std::string::npos);  // only the last lines
  EXPECT_TRUE(pool.worker_pids().empty());
}

TEST(WorkerPoolTest, StopAnswersQueuedRequests503AndEndsTheWorkers) {
  StartedPool p(FakeOptions());
  int pid = Pid(p.pool);
  std::future<InferenceResponse> in_flight = InvokeAsync(p.pool, Request("sleep:5"));
  ASSERT_TRUE(Eventually([&] { return p.pool.stats().queued == 0; }));
  std::vector<std::future<InferenceResponse>> queued;
  for (int i = 0; i < 3; ++i) queued.push_back(InvokeAsync(p.pool, Request("q")));
  auto started = std::chrono::steady_clock::now();
  p.pool.Stop(0ms);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  for (auto& f : queued) {
    InferenceResponse r = Await(f);
    EXPECT_EQ(r.status, 503);
  }
  EXPECT_EQ(Await(in_flight).status, 503);
  EXPECT_NE(kill(pid, 0), 0);  // ended and reaped
  EXPECT_EQ(Call(p.pool, Request("late")).status, 503);
  EXPECT_EQ(p.pool.state(), BackendState::kStopped);
  p.pool.Stop(0ms);  // idempotent
}

TEST(WorkerPoolTest, StopLetsRequestsInFlightFinishWithinTheGrace) {
  StartedPool p(FakeOptions());
  std::future<InferenceResponse> in_flight = InvokeAsync(p.pool, Request("sleep:0.3"));
  ASSERT_TRUE(Eventually([&] { return p.pool.stats().queued == 0; }));
  p.pool.Stop(5000ms);
  InferenceResponse r = Await(in_flight);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "sleep:0.3");
}

TEST(WorkerPoolTest, ReplacementsThatFailToLoadAreRetriedUntilOneLoads) {
  std::string fail_file = ::testing::TempDir() + "/fail_load_" + std::to_string(getpid());
  std::filesystem::remove(fail_file);
  StartedPool p(FakeOptions({{"FAKE_LOAD_FAIL_IF_EXISTS", fail_file}}));
  int old_pid = Pid(p.pool);
  std::ofstream(fail_file) << "x";
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  ASSERT_TRUE(Eventually([&] { return p.pool.stats().live_workers == 0; }));
  std::this_thread::sleep_for(400ms);               // a few failed replacements (100, 200 ms backoff)
  EXPECT_EQ(p.pool.state(), BackendState::kReady);  // it did load once: not failed for good
  std::filesystem::remove(fail_file);
  ASSERT_TRUE(Eventually([&] { return p.pool.stats().live_workers == 1; }));
  EXPECT_NE(Pid(p.pool), old_pid);
}

TEST(WorkerProcessTest, DescribesWaitStatuses) {
  EXPECT_EQ(DescribeWaitStatus(1 << 8), "exit status 1");
  EXPECT_EQ(DescribeWaitStatus(SIGKILL), "killed by signal 9 (SIGKILL)");
}

}  // namespace
}  // namespace kiln::modelserver
