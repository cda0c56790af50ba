#pragma once
// WorkerPool: the InferenceBackend of one model served by Python worker processes
// (python/kiln_toolkit/serve_worker.py) speaking frame.h over a Unix socketpair each.
//
// - Start() runs the `prepare` step once (fetch SAGEMAKER_SUBMIT_DIRECTORY, install
//   code/requirements.txt), then starts `workers` workers; each loads the model (model_fn) and sends
//   `ready`. state() is kReady once one has. When the first load fails (load_failed frame, or the
//   process exits before ready), the pool is kFailed with that error (507 → ResourceExhausted).
// - Invoke() queues the request (at most `queue_size` waiting; beyond that it answers 503 at once).
//   A free worker takes the oldest request; with batching on (batch_size > 1) it also takes those
//   already queued and waits up to batch_delay for more, up to batch_size, and sends them as one
//   invoke frame. With batching off, a request that finds the queue empty and a worker idle is
//   given to that worker inside Invoke (its frame written to the worker's socket without blocking;
//   what does not fit is written by the worker's thread), so no thread wakes to pass it on.
// - A request past `timeout` since it arrived answers 504; a worker busy past it is killed and
//   replaced. A worker that dies answers its requests 500 ("the worker serving this request exited
//   ..."), and is replaced (backoff from 100 ms up to 5 s while replacements keep failing).
//   A batch is bounded by its earliest deadline: when that passes, all its requests answer 504.
//   A worker that dies while idle is replaced without failing a request (noticed within a second,
//   or when the next invoke cannot be written; that invoke then goes back to the queue). One that
//   exits in the instant after an answer can still take the next invoke with it (that one: 500).
// - Stop(grace): queued requests answer 503 at once; requests in flight get until the grace (or
//   their own deadline) and then answer 503; the workers get SIGTERM, SIGKILL 2 s later.
//
// Threads (worker_pool.cc): one dispatch thread per worker (it owns that process: spawn, I/O,
// kill, reap; Invoke writes to an idle one's socket only under the pool's lock), a starter
// (prepare, then the workers) and a sweeper (504 for queued requests whose deadline passes while
// every worker is busy). Callbacks run on those threads or inline in Invoke
// and Stop, never under the pool's lock.
//
// Thread-safety: as InferenceBackend.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "modelserver/backend.h"

namespace kiln::modelserver {

struct WorkerPoolOptions {
  std::string model_name = "model";  // --model-name; also in log lines
  std::string model_dir;             // --model-dir: /opt/ml/model, or /opt/ml/models/<name>/model
  // The worker program: {interpreter, "-u", "/path/serve_worker.py"}; the pool appends
  // "work --fd 3 --model-dir D --model-name N [--framework F]" (or "prepare --model-dir D ...").
  std::vector<std::string> worker_command;
  std::string framework;  // --framework when not empty
  // Variables added to the server's own environment for the workers.
  std::map<std::string, std::string> env;
  int workers = 1;
  size_t queue_size = 100;
  std::chrono::milliseconds timeout{60'000};
  int batch_size = 1;  // 1: no batching
  std::chrono::milliseconds batch_delay{100};
  bool run_prepare = true;  // run `prepare` before the workers
};

class WorkerPool final : public InferenceBackend {
 public:
  explicit WorkerPool(WorkerPoolOptions options);
  ~WorkerPool() override;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  Status Start() override;
  Status WaitUntilLoaded(std::chrono::milliseconds timeout) override;
  void Invoke(InferenceRequest request, InferenceCallback done) override;
  BackendState state() const override;
  Status load_error() const override;
  uint64_t MemoryBytes() const override;
  int workers() const override;
  void Stop(std::chrono::milliseconds grace) override;

  // For tests and logs.
  struct Stats {
    int live_workers = 0;
    size_t queued = 0;
    uint64_t restarts = 0;  // workers replaced after dying or hanging
    uint64_t batches = 0;   // invoke frames with more than one item
  };
  Stats stats() const;
  // The worker processes' pids (tests kill one).
  std::vector<int> worker_pids() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::modelserver
