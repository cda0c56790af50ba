#include "modelserver/worker_pool.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <deque>
#include <optional>
#include <span>
#include <thread>

#include "base/fs.h"
#include "base/log.h"
#include "base/mutex.h"
#include "modelserver/frame.h"
#include "modelserver/worker_process.h"

// Design (README.md, "Worker protocol"; worker_pool.h is the contract):
//
// Threads: one starter (runs `prepare`, then starts the slots), one dispatch thread per worker
// slot, and one sweeper. A slot's thread owns its WorkerProcess: it spawns it, waits for `ready`,
// then loops taking requests from the shared queue, writing one invoke frame, and waiting (poll)
// for the result. When the worker dies, hangs past a deadline or breaks the protocol, the same
// thread reaps it and starts its replacement. No other thread touches the process, so there is no
// kill/reap race. The sweeper answers 504 to queued requests whose deadline passes while every
// worker is busy (dispatch threads only see the queue when they are free).
//
// The request path takes the mutex twice: Invoke pushes and wakes one dispatch thread; the thread
// pops. Everything else (encoding, I/O, decoding, the callbacks) runs outside the mutex.
//
// Direct hand-off (batch_size 1, the common case): an idle slot's thread waits in poll on its
// worker's socket, its own `wake` eventfd and the shutdown event, listed in `idle_slots`. Invoke,
// finding the queue empty and an idle slot, takes the slot out of the list and, under the mutex,
// encodes the invoke frame and writes it to the worker's socket non-blocking (Handoff): whole, the
// slot's thread next wakes when the answer (or EOF) arrives, which saves a thread wake-up per
// request; partly or not at all (full socket, frame over kMaxInlineFrame, dead worker), it wakes
// the slot, whose Exchange writes the rest with today's loop (EPIPE with nothing written: requeue).
// The frame is never written twice nor interleaved: only one of Invoke (while the slot is listed
// idle, under the mutex) and the slot's thread (after it took the hand-off) writes to the socket.
// While the slot is idle its thread does not touch the process, so the fd stays valid for Invoke.
// Deadlines: the idle poll times out every min(kIdleCheck, timeout); Invoke wakes the slot when
// the request's deadline comes before that, so Exchange times every request as before.
//
// Shutdown: Stop sets `stopping_`, answers the queue 503 and writes `shutdown_event_` (an eventfd
// never read, so it stays readable): every poll in the slots and the starter includes it. A slot
// waiting for a result then keeps waiting until the request's own deadline or the grace, whichever
// comes first; one loading a model gives up at once. Each slot ends its worker (SIGTERM, a short
// wait, SIGKILL, reap) and Stop joins the threads. A load failure before any worker was ready
// (kFailed) writes the same event so the other slots stop loading.

namespace kiln::modelserver {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kInitialBackoff = std::chrono::milliseconds(100);
constexpr auto kMaxBackoff = std::chrono::seconds(5);
// How long a worker that closed its socket (or was asked to stop) may take to exit before SIGKILL.
constexpr int kExitWaitMs = 2000;
// Reads from a worker go into a buffer of this size, reused for every read of that slot.
constexpr size_t kReadChunk = 256 * 1024;
// How often an idle dispatch thread checks that its worker is still there.
constexpr auto kIdleCheck = std::chrono::milliseconds(1000);
// The captured stderr of `prepare` kept for the error message.
constexpr size_t kPrepareTailBytes = 2048;
// Invoke writes a request to an idle worker's socket itself only when its frame is at most this
// big (a memcpy into the socket under the pool's lock); larger ones are written by the slot.
constexpr size_t kMaxInlineFrame = 256 * 1024;

int MillisUntil(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  // Round up so a poll never returns a hair before the deadline and spins.
  return static_cast<int>(std::min<int64_t>(left + 1, 24 * 3600 * 1000));
}

std::string Seconds(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000) + " s";
  return std::to_string(ms.count()) + " ms";
}

// The last `max_lines` lines of `text`, trimmed.
std::string LastLines(std::string_view text, int max_lines) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.remove_suffix(1);
  size_t pos = text.size();
  for (int i = 0; i < max_lines && pos > 0; ++i) {
    size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string_view::npos) {
      pos = 0;
      break;
    }
    pos = nl;
  }
  if (pos > 0) ++pos;
  return std::string(text.substr(pos));
}

struct Pending {
  InferenceRequest request;
  InferenceCallback done;
  Clock::time_point deadline;
};

// What ended one exchange with a worker.
enum class Outcome { kAnswered, kReplace, kStop };

}  // namespace

struct WorkerPool::Impl {
  explicit Impl(WorkerPoolOptions o) : options(std::move(o)) {}

  // One worker position; its thread owns `process` and the read state.
  struct Slot {
    int index = 0;
    std::thread thread;
    std::unique_ptr<WorkerProcess> process;
    FrameDecoder decoder;
    std::unique_ptr<char[]> read_buffer = std::make_unique<char[]>(kReadChunk);
    uint64_t next_id = 1;
    std::vector<Pending> batch;     // reused between invokes
    std::vector<struct iovec> iov;  // reused between invokes
    // Direct hand-off (batch_size 1): written by the slot's thread in LeaveIdleWait. Readable when
    // Invoke has a request for this slot that only the slot thread can finish sending.
    UniqueFd wake;
    // Guarded by the pool's mu. `idle`: the slot is in idle_slots, its thread waiting in poll
    // with no request; while it is, Invoke may write an invoke frame to its socket and leave it
    // in `handoff` (the slot thread does not touch the socket, the process or next_id then).
    bool idle = false;
    Clock::time_point idle_until;  // when its idle poll times out by itself
    std::optional<Pending> handoff;
    std::string handoff_head;  // the invoke frame's head, as (partly) written
    uint64_t handoff_id = 0;
    size_t handoff_sent = 0;  // bytes of the frame already on the socket
    // Slot-thread-only: slot.batch[0] came from `handoff`.
    bool handed = false;
  };

  const WorkerPoolOptions options;

  mutable Mutex mu;
  CondVar work_cv;   // the queue gained a request, or stopping_: dispatch threads
  CondVar state_cv;  // state changed: WaitUntilLoaded, backoff sleeps
  CondVar sweep_cv;  // the queue became non-empty, or stopping_: the sweeper
  std::deque<Pending> queue GUARDED_BY(mu);
  BackendState state GUARDED_BY(mu) = BackendState::kLoading;
  Status load_error GUARDED_BY(mu);
  bool started GUARDED_BY(mu) = false;
  bool stopping GUARDED_BY(mu) = false;
  bool ever_ready GUARDED_BY(mu) = false;
  Clock::time_point stop_deadline GUARDED_BY(mu);
  int live_workers GUARDED_BY(mu) = 0;
  uint64_t restarts GUARDED_BY(mu) = 0;
  uint64_t batches GUARDED_BY(mu) = 0;
  std::vector<pid_t> ready_pids GUARDED_BY(mu);  // by slot index; -1: none ready
  // With batch_size 1: the slots whose thread waits in PollIdle with no request (Slot::idle).
  std::vector<Slot*> idle_slots GUARDED_BY(mu);

  // Written once (Stop, or the pool failing to load) and never read: stays readable.
  UniqueFd shutdown_event;

  // Threads. Created by Start and joined by Stop (serialised by stop_mu).
  Mutex stop_mu;
  bool stopped GUARDED_BY(stop_mu) = false;
  std::thread starter;
  std::thread sweeper;
  std::vector<std::unique_ptr<Slot>> slots;  // filled by the starter before it returns

  // ---- helpers ----
  std::vector<std::string> Command(std::string_view step) const {
    std::vector<std::string> argv = options.worker_command;
    argv.emplace_back(step);
    if (step == "work") {
      argv.emplace_back("--fd");
      argv.emplace_back("3");
    }
    argv.emplace_back("--model-dir");
    argv.emplace_back(options.model_dir);
    argv.emplace_back("--model-name");
    argv.emplace_back(options.model_name);
    if (!options.framework.empty()) {
      argv.emplace_back("--framework");
      argv.emplace_back(options.framework);
    }
    return argv;
  }

  void SignalShutdown() {
    uint64_t one = 1;
    ssize_t n = write(shutdown_event.get(), &one, sizeof one);
    (void)n;  // the counter cannot overflow with a handful of writes
  }

  // Moves the pool to kFailed and answers what waits 503, when no worker has been ready yet (true);
  // false when one has (the caller retries) or the pool is stopping.
  bool FailLoad(Status error) EXCLUDES(mu) {
    std::deque<Pending> refused;
    {
      MutexLock lock(mu);
      if (state != BackendState::kLoading || ever_ready) return false;
      state = BackendState::kFailed;
      load_error = error;
      refused.swap(queue);
      state_cv.NotifyAll();
      work_cv.NotifyAll();
    }
    KLOG(error, "model load failed", {{"model", options.model_name}, {"error", error.ToString()}});
    SignalShutdown();
    for (Pending& p : refused) {
      p.done(ErrorResponse(503, "ServiceUnavailable", "the model failed to load: " + error.message()));
    }
    return true;
  }

  // Batching off: Invoke hands a request to an idle worker itself (Handoff), idle slots wait in
  // PollIdle instead of on work_cv.
  bool DirectHandoff() const { return options.batch_size <= 1; }

  // Takes `slot` out of idle_slots (it must be there).
  void LeaveIdle(Slot& slot) REQUIRES(mu) {
    slot.idle = false;
    auto it = std::find(idle_slots.begin(), idle_slots.end(), &slot);
    if (it != idle_slots.end()) idle_slots.erase(it);
  }

  static void Wake(Slot& slot) {
    uint64_t one = 1;
    ssize_t n = write(slot.wake.get(), &one, sizeof one);
    (void)n;  // EAGAIN only at a counter of 2^64-2: it is readable then anyway
  }

  // With direct hand-off: wakes an idle slot (if any) for a request just queued.
  void WakeOneIdle() REQUIRES(mu) {
    if (!DirectHandoff() || idle_slots.empty()) return;
    Slot& slot = *idle_slots.back();
    LeaveIdle(slot);
    Wake(slot);
  }

  // Called by Invoke under mu with the queue empty and an idle slot: gives `pending` to that
  // slot and writes its invoke frame to the worker's socket without blocking (all of it, or as
  // much as fits; the slot's thread, woken, writes the rest). The idle slot's thread then wakes
  // only when the worker answers. Callbacks are not run here.
  void Handoff(Pending pending) REQUIRES(mu) {
    Slot& slot = *idle_slots.back();
    LeaveIdle(slot);
    slot.handoff_id = slot.next_id++;
    slot.handoff_head = InvokeHead(slot.handoff_id, std::span<const Pending>(&pending, 1));
    slot.handoff_sent = 0;
    const std::string& body = pending.request.body;
    const size_t total = slot.handoff_head.size() + body.size();
    if (total <= kMaxInlineFrame) {
      struct iovec iov[2] = {{slot.handoff_head.data(), slot.handoff_head.size()},
                             {const_cast<char*>(body.data()), body.size()}};
      struct msghdr message = {};
      message.msg_iov = iov;
      message.msg_iovlen = body.empty() ? 1 : 2;
      ssize_t n;
      do {
        n = sendmsg(slot.process->socket_fd(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
      } while (n < 0 && errno == EINTR);
      // An error (a dead worker) is left to the slot: it retries the write and sees it.
      if (n > 0) slot.handoff_sent = static_cast<size_t>(n);
    }
    const bool complete = slot.handoff_sent == total;
    if (complete) std::string().swap(pending.request.body);  // sent: bounded memory
    // Fully sent: the slot wakes on the answer (or the worker's death) on its socket, or when its
    // idle poll times out; woken now when the request's deadline comes before that, so a hung
    // worker still answers 504 at the deadline.
    const bool wake = !complete || pending.deadline < slot.idle_until;
    slot.handoff = std::move(pending);
    if (wake) Wake(slot);
  }

  // The invoke frame's head for `items` (request i's body is the i-th part of the payload).
  static std::string InvokeHead(uint64_t id, std::span<const Pending> batch) {
    nlohmann::json items = nlohmann::json::array();
    size_t payload_size = 0;
    for (const Pending& p : batch) {
      const InferenceRequest& r = p.request;
      nlohmann::json item = nlohmann::json::object();
      if (!r.content_type.empty()) item["content_type"] = r.content_type;
      if (!r.accept.empty()) item["accept"] = r.accept;
      if (!r.custom_attributes.empty()) item["custom_attributes"] = r.custom_attributes;
      if (!r.inference_id.empty()) item["inference_id"] = r.inference_id;
      if (!r.target_model.empty()) item["target_model"] = r.target_model;
      item["size"] = r.body.size();
      items.push_back(std::move(item));
      payload_size += r.body.size();
    }
    nlohmann::json meta = {{"id", id}, {"items", std::move(items)}};
    return EncodeFrameHead(FrameType::kInvoke, meta, payload_size);
  }

  bool ShuttingDown() EXCLUDES(mu) {
    MutexLock lock(mu);
    return stopping || state == BackendState::kFailed;
  }

  // ---- the starter ----
  void RunStarter() {
    if (options.run_prepare) {
      Status prepared = RunPrepare();
      if (!prepared.ok()) {
        (void)FailLoad(prepared);
        return;
      }
    }
    if (ShuttingDown()) return;
    // The slots vector is written here only, before any slot thread exists, and read by Stop only
    // after joining this thread.
    for (int i = 0; i < std::max(1, options.workers); ++i) {
      auto slot = std::make_unique<Slot>();
      slot->index = i;
      if (DirectHandoff()) {
        slot->wake = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        if (!slot->wake.valid()) {
          (void)FailLoad(ErrnoStatus("eventfd", errno));
          return;
        }
      }
      slots.push_back(std::move(slot));
    }
    for (auto& slot : slots) {
      Slot* s = slot.get();
      s->thread = std::thread([this, s] { RunSlot(*s); });
    }
  }

  // Runs `prepare` to completion: OK, or FailedPrecondition with the tail of its stderr.
  Status RunPrepare() {
    WorkerSpawnOptions spawn{.argv = Command("prepare"), .env = options.env, .socket = false, .capture_stderr = true};
    Result<std::unique_ptr<WorkerProcess>> process = WorkerProcess::Spawn(spawn);
    if (!process.ok()) return Status::FailedPrecondition("cannot run the prepare step: " + process.status().message());
    std::string tail;
    char buf[4096];
    bool cancelled = false;
    while (true) {
      struct pollfd fds[2] = {{(*process)->stderr_fd(), POLLIN, 0}, {shutdown_event.get(), POLLIN, 0}};
      int rc = poll(fds, 2, -1);
      if (rc < 0 && errno == EINTR) continue;
      if (fds[1].revents != 0) {
        cancelled = true;
        break;
      }
      ssize_t n = read((*process)->stderr_fd(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      // Echo to our stderr (the instance log) as it comes; keep the end for the error message.
      ssize_t w = write(STDERR_FILENO, buf, static_cast<size_t>(n));
      (void)w;
      tail.append(buf, static_cast<size_t>(n));
      if (tail.size() > 2 * kPrepareTailBytes) tail.erase(0, tail.size() - kPrepareTailBytes);
    }
    if (cancelled) {
      (*process)->Kill(SIGKILL);
      (*process)->Wait();
      return Status::Unavailable("the model server stopped during the prepare step");
    }
    int status = (*process)->WaitOrKill(kExitWaitMs);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
    std::string message = "the prepare step failed (" + DescribeWaitStatus(status) + ")";
    std::string last = LastLines(
        tail.size() > kPrepareTailBytes ? std::string_view(tail).substr(tail.size() - kPrepareTailBytes) : tail, 10);
    if (!last.empty()) message += ": " + last;
    return Status::FailedPrecondition(message);
  }

  // ---- a slot ----
  void RunSlot(Slot& slot) {
    auto backoff = std::chrono::milliseconds(kInitialBackoff);
    while (!ShuttingDown()) {
      Status loaded = StartWorker(slot);
      if (ShuttingDown()) break;
      if (!loaded.ok()) {
        EndWorker(slot, Ending::kLetExit);
        // The first load failing fails the pool; once a worker has been ready, replacements retry.
        if (FailLoad(loaded) || ShuttingDown()) break;
        KLOG(warn, "worker failed to load; retrying",
             {{"model", options.model_name},
              {"error", loaded.ToString()},
              {"backoff_ms", std::to_string(backoff.count())}});
        MutexLock lock(mu);
        Clock::time_point until = Clock::now() + backoff;
        while (!stopping && Clock::now() < until) state_cv.WaitUntil(mu, until);
        backoff = std::min<std::chrono::milliseconds>(backoff * 2, kMaxBackoff);
        continue;
      }
      backoff = kInitialBackoff;
      {
        MutexLock lock(mu);
        ever_ready = true;
        ++live_workers;
        ready_pids[slot.index] = slot.process->pid();
        if (state == BackendState::kLoading) {
          state = BackendState::kReady;
          KLOG(info, "model ready", {{"model", options.model_name}});
        }
        state_cv.NotifyAll();
      }
      Outcome outcome = Serve(slot);
      {
        MutexLock lock(mu);
        --live_workers;
        ready_pids[slot.index] = -1;
        if (outcome == Outcome::kReplace && !stopping) ++restarts;
      }
      EndWorker(slot, outcome == Outcome::kStop ? Ending::kTerm : Ending::kKill);
    }
    if (slot.process) EndWorker(slot, Ending::kTerm);
  }

  enum class Ending {
    kLetExit,  // it is exiting by itself (load_failed): let it finish writing its traceback
    kTerm,     // the pool is stopping: SIGTERM
    kKill,     // hung, broken or already dead: SIGKILL
  };
  // Ends the slot's worker: a signal to its group (none for kLetExit), up to kExitWaitMs for it
  // to exit (not for kKill), SIGKILL, and reaps it.
  void EndWorker(Slot& slot, Ending how) {
    if (!slot.process) return;
    if (how != Ending::kLetExit) slot.process->Kill(how == Ending::kTerm ? SIGTERM : SIGKILL);
    slot.process->CloseSocket();
    slot.process->WaitOrKill(how == Ending::kKill ? 0 : kExitWaitMs);
    slot.process.reset();
    slot.decoder = FrameDecoder();
  }

  // Spawns the slot's worker and waits for `ready`. OK when ready; else the load error, with the
  // process left for EndWorker.
  Status StartWorker(Slot& slot) {
    WorkerSpawnOptions spawn{.argv = Command("work"), .env = options.env, .socket = true, .capture_stderr = false};
    // The worker's number (its slot; a replacement keeps it): the worker uses GPU index mod the
    // instance's GPUs, as TorchServe spreads a model's workers (python/kiln_toolkit).
    spawn.env["KILN_MODEL_SERVER_WORKER_INDEX"] = std::to_string(slot.index);
    Result<std::unique_ptr<WorkerProcess>> process = WorkerProcess::Spawn(spawn);
    if (!process.ok()) return Status::FailedPrecondition(process.status().message());
    slot.process = std::move(*process);
    slot.decoder = FrameDecoder();
    const int fd = slot.process->socket_fd();
    while (true) {
      Result<std::optional<Frame>> next = slot.decoder.Next();
      if (!next.ok())
        return Status::Internal("the worker broke the protocol while loading: " + next.status().message());
      if (next->has_value()) {
        Frame& frame = **next;
        if (frame.type == FrameType::kReady) return Status::Ok();
        if (frame.type == FrameType::kLoadFailed) return LoadFailedStatus(frame.meta);
        return Status::Internal("the worker sent frame type " + std::to_string(static_cast<int>(frame.type)) +
                                " before it was ready");
      }
      struct pollfd fds[2] = {{fd, POLLIN, 0}, {shutdown_event.get(), POLLIN, 0}};
      int rc = poll(fds, 2, -1);
      if (rc < 0 && errno == EINTR) continue;
      if (fds[1].revents != 0) return Status::Unavailable("the model server is stopping");
      ssize_t n = read(fd, slot.read_buffer.get(), kReadChunk);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        int status = slot.process->WaitOrKill(kExitWaitMs);
        return Status::Internal("the worker exited before it loaded the model (" + DescribeWaitStatus(status) +
                                "); see its traceback in the log above");
      }
      slot.decoder.Append(std::string_view(slot.read_buffer.get(), static_cast<size_t>(n)));
    }
  }

  static Status LoadFailedStatus(const nlohmann::json& meta) {
    std::string message = "the model failed to load";
    auto m = meta.find("message");
    auto t = meta.find("type");
    std::string type = t != meta.end() && t->is_string() ? t->get<std::string>() : "";
    std::string text = m != meta.end() && m->is_string() ? m->get<std::string>() : "";
    if (!text.empty() || !type.empty()) {
      message = type.empty() ? text : text.empty() ? type : type + ": " + text;
    }
    auto s = meta.find("status");
    if (s != meta.end() && s->is_number_integer() && s->get<int64_t>() == 507)
      return Status::ResourceExhausted(message);
    return Status::FailedPrecondition(message);
  }

  // Takes the next batch from the queue into slot.batch (blocking); expired requests go to
  // `expired`. kAnswered: something to handle; kStop: the pool is stopping; kReplace: the idle
  // worker hung up (or spoke out of turn) and must be replaced.
  Outcome TakeBatch(Slot& slot, std::vector<Pending>& expired) EXCLUDES(mu) {
    const size_t max_items = static_cast<size_t>(std::max(1, options.batch_size));
    MutexLock lock(mu);
    auto take = [&]() REQUIRES(mu) {
      Clock::time_point now = Clock::now();
      while (!queue.empty() && slot.batch.size() < max_items) {
        Pending& front = queue.front();
        if (front.deadline <= now) {
          expired.push_back(std::move(front));
        } else {
          slot.batch.push_back(std::move(front));
        }
        queue.pop_front();
      }
    };
    while (true) {
      while (queue.empty() && !stopping) {
        if (DirectHandoff()) {
          const std::chrono::milliseconds period = EnterIdle(slot);
          lock.Unlock();
          const IdlePoll polled = PollIdle(slot, period);
          lock.Lock();
          Outcome waited = LeaveIdleWait(slot, polled);
          if (waited == Outcome::kReplace) return waited;
          if (slot.handed) return Outcome::kAnswered;
          continue;
        }
        // An idle worker that dies is noticed within kIdleCheck, not by the next request.
        if (work_cv.WaitFor(mu, kIdleCheck) == std::cv_status::timeout && queue.empty() && !stopping &&
            IdleWorkerGone(slot)) {
          return Outcome::kReplace;
        }
      }
      if (stopping) return Outcome::kStop;
      take();
      if (!slot.batch.empty()) break;
      if (!expired.empty()) return Outcome::kAnswered;  // answer those first, outside the lock
    }
    if (slot.batch.size() < max_items && options.batch_delay.count() > 0) {
      Clock::time_point until = Clock::now() + options.batch_delay;
      for (const Pending& p : slot.batch) until = std::min(until, p.deadline);
      while (slot.batch.size() < max_items && !stopping && Clock::now() < until) {
        work_cv.WaitUntil(mu, until);
        take();
      }
    }
    if (slot.batch.size() > 1) ++batches;
    return Outcome::kAnswered;
  }

  // Direct hand-off, in three steps around the caller's unlock (so the lock analysis sees the
  // release and the retake in one scope): EnterIdle lists the slot as idle, one Invoke may hand a
  // request to; PollIdle waits outside mu in poll on the worker's socket, the slot's wake event
  // and the shutdown event; LeaveIdleWait takes the slot out of idle_slots and says what happened:
  // slot.handed with slot.batch = the request Invoke gave it (kAnswered); kReplace when the idle
  // worker's socket became readable with nothing given (it exited); otherwise kAnswered with
  // nothing taken (the caller looks at the queue and `stopping` again).
  std::chrono::milliseconds EnterIdle(Slot& slot) REQUIRES(mu) {
    // Bounded so that a request handed over (whose deadline is at least this far) is timed by
    // Exchange in time; the idle worker's death wakes the poll anyway (its socket: EOF).
    // (At least 10 ms: with a tinier timeout, Handoff wakes the slot for each request instead.)
    using std::chrono::milliseconds;
    const milliseconds period = std::max(std::min<milliseconds>(kIdleCheck, options.timeout), milliseconds(10));
    slot.idle = true;
    slot.idle_until = Clock::now() + period;
    idle_slots.push_back(&slot);
    return period;
  }

  struct IdlePoll {
    bool socket_readable = false;
  };

  IdlePoll PollIdle(Slot& slot, std::chrono::milliseconds period) EXCLUDES(mu) {
    struct pollfd fds[3] = {
        {slot.process->socket_fd(), POLLIN, 0}, {slot.wake.get(), POLLIN, 0}, {shutdown_event.get(), POLLIN, 0}};
    int rc = poll(fds, 3, static_cast<int>(period.count()));
    if (rc > 0 && fds[1].revents != 0) {
      uint64_t count;
      ssize_t n = read(slot.wake.get(), &count, sizeof count);
      (void)n;
    }
    return IdlePoll{.socket_readable = rc > 0 && fds[0].revents != 0};
  }

  Outcome LeaveIdleWait(Slot& slot, const IdlePoll& polled) REQUIRES(mu) {
    if (slot.idle) LeaveIdle(slot);
    if (slot.handoff) {
      slot.batch.push_back(std::move(*slot.handoff));
      slot.handoff.reset();
      slot.handed = true;
      return Outcome::kAnswered;
    }
    if (polled.socket_readable && queue.empty() && !stopping) return Outcome::kReplace;
    return Outcome::kAnswered;
  }

  // True when the idle worker's socket is readable: EOF (it exited) or bytes nobody asked for.
  static bool IdleWorkerGone(Slot& slot) {
    struct pollfd pfd = {slot.process->socket_fd(), POLLIN, 0};
    return poll(&pfd, 1, 0) > 0;
  }

  void LogIdleDeath(Slot& slot) {
    int status = slot.process->WaitOrKill(kExitWaitMs);
    KLOG(warn, "idle worker exited; replacing it",
         {{"model", options.model_name}, {"status", DescribeWaitStatus(status)}});
  }

  // Puts slot.batch back at the front of the queue, in order (the worker never got it).
  // When the pool is stopping they answer 503 instead (Stop has already emptied the queue).
  void Requeue(Slot& slot) EXCLUDES(mu) {
    {
      MutexLock lock(mu);
      if (!stopping) {
        for (auto it = slot.batch.rbegin(); it != slot.batch.rend(); ++it) queue.push_front(std::move(*it));
        slot.batch.clear();
        work_cv.NotifyAll();
        WakeOneIdle();
        sweep_cv.NotifyOne();
        return;
      }
    }
    AnswerAll(slot, ErrorResponse(503, "ServiceUnavailable", "the model server is stopping"));
    slot.batch.clear();
  }

  // The worker loop of a ready worker: until it must be replaced or the pool stops.
  Outcome Serve(Slot& slot) {
    std::vector<Pending> expired;
    while (true) {
      slot.batch.clear();
      expired.clear();
      Outcome taken = TakeBatch(slot, expired);
      for (Pending& p : expired) p.done(TimeoutResponse(/*worker_stopped=*/false));
      if (taken == Outcome::kReplace) LogIdleDeath(slot);
      if (taken != Outcome::kAnswered) return taken;
      if (slot.batch.empty()) continue;
      Outcome outcome = Exchange(slot);
      slot.batch.clear();
      if (outcome != Outcome::kAnswered) return outcome;
    }
  }

  InferenceResponse TimeoutResponse(bool worker_stopped) const {
    std::string message = "the request did not complete within SAGEMAKER_MODEL_SERVER_TIMEOUT (" +
                          Seconds(options.timeout) + ", queue wait included)";
    if (worker_stopped) message += "; the worker serving it was stopped and is being replaced";
    message += ". Raise SAGEMAKER_MODEL_SERVER_TIMEOUT or make the handler faster";
    return ErrorResponse(504, "ModelTimeout", message);
  }

  void AnswerAll(Slot& slot, const InferenceResponse& response) {
    for (Pending& p : slot.batch) p.done(response);
  }

  // Sends slot.batch as one invoke and answers every request in it.
  // With slot.handed, the frame is Invoke's (Handoff): its head and the bytes it already wrote.
  Outcome Exchange(Slot& slot) {
    uint64_t id;
    std::string head;
    size_t already_sent = 0;
    if (slot.handed) {
      slot.handed = false;
      id = slot.handoff_id;
      head = std::move(slot.handoff_head);
      already_sent = slot.handoff_sent;
    } else {
      id = slot.next_id++;
      head = InvokeHead(id, slot.batch);
    }
    Clock::time_point deadline = Clock::time_point::max();
    for (const Pending& p : slot.batch) deadline = std::min(deadline, p.deadline);

    slot.iov.clear();
    slot.iov.push_back({head.data(), head.size()});
    for (Pending& p : slot.batch) {
      if (!p.request.body.empty()) slot.iov.push_back({p.request.body.data(), p.request.body.size()});
    }
    bool stop_seen = false;
    Clock::time_point stop_at = Clock::time_point::max();
    // The stop grace, once Stop has been called: in-flight requests may finish until then.
    auto effective_deadline = [&] { return std::min(deadline, stop_at); };
    auto notice_stop = [&] {
      stop_seen = true;
      MutexLock lock(mu);
      stop_at = stop_deadline;
    };
    auto on_deadline = [&]() -> Outcome {
      if (Clock::now() >= deadline) {
        AnswerAll(slot, TimeoutResponse(/*worker_stopped=*/true));
        KLOG(warn, "worker timed out; replacing it",
             {{"model", options.model_name}, {"pid", std::to_string(slot.process->pid())}});
        slot.process->Kill(SIGKILL);
        return Outcome::kReplace;
      }
      AnswerAll(slot,
                ErrorResponse(503, "ServiceUnavailable", "the model server stopped before the request completed"));
      return Outcome::kStop;
    };
    auto on_death = [&](std::string_view what) -> Outcome {
      int status = slot.process->WaitOrKill(kExitWaitMs);
      std::string message = "the worker serving this request exited (" + DescribeWaitStatus(status) + ")" +
                            std::string(what) + "; it is being replaced. See the traceback in the log";
      KLOG(warn, "worker died; replacing it", {{"model", options.model_name}, {"status", DescribeWaitStatus(status)}});
      AnswerAll(slot, ErrorResponse(500, "WorkerDied", message));
      return Outcome::kReplace;
    };

    // Write: head and bodies straight from the requests (one gather write), waiting for room up to the deadline.
    const int fd = slot.process->socket_fd();
    size_t iov_index = 0;
    bool any_written = already_sent > 0;
    auto advance = [&](size_t written) {
      while (written > 0 && iov_index < slot.iov.size()) {
        struct iovec& v = slot.iov[iov_index];
        if (written >= v.iov_len) {
          written -= v.iov_len;
          ++iov_index;
        } else {
          v.iov_base = static_cast<char*>(v.iov_base) + written;
          v.iov_len -= written;
          written = 0;
        }
      }
    };
    // A fully handed-off frame had its body released: only the head is left, and skipped whole.
    advance(already_sent);
    while (iov_index < slot.iov.size()) {
      // sendmsg for MSG_NOSIGNAL: a dead worker is an EPIPE to handle, not a SIGPIPE.
      struct msghdr message = {};
      message.msg_iov = slot.iov.data() + iov_index;
      message.msg_iovlen = std::min<size_t>(slot.iov.size() - iov_index, IOV_MAX);
      ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) {
          if (!any_written) {
            // It died before this invoke: nothing ran, so the requests wait for another worker.
            LogIdleDeath(slot);
            Requeue(slot);
            return Outcome::kReplace;
          }
          return on_death(" while the request was being sent");
        }
        struct pollfd fds[2] = {{fd, POLLOUT, 0}, {shutdown_event.get(), POLLIN, 0}};
        int rc = poll(fds, stop_seen ? 1 : 2, MillisUntil(effective_deadline()));
        if (rc < 0 && errno == EINTR) continue;
        if (!stop_seen && fds[1].revents != 0) {
          notice_stop();
          continue;
        }
        if (rc == 0 && Clock::now() >= effective_deadline()) return on_deadline();
        continue;
      }
      any_written = any_written || n > 0;
      advance(static_cast<size_t>(n));
    }
    // Sent: the bodies are not needed any more (bounded memory while the model runs).
    for (Pending& p : slot.batch) std::string().swap(p.request.body);

    // Read the result.
    bool eof = false;
    while (true) {
      Result<std::optional<Frame>> next = slot.decoder.Next();
      if (!next.ok()) return Malformed(slot, next.status().message());
      // A result that came just before the worker exited still counts (its death is noticed next).
      if (next->has_value()) return Deliver(slot, id, **next);
      if (eof) return on_death("");
      struct pollfd fds[2] = {{fd, POLLIN, 0}, {shutdown_event.get(), POLLIN, 0}};
      int rc = poll(fds, stop_seen ? 1 : 2, MillisUntil(effective_deadline()));
      if (rc < 0 && errno == EINTR) continue;
      if (!stop_seen && fds[1].revents != 0) {
        notice_stop();
        continue;
      }
      if (rc == 0) {
        if (Clock::now() >= effective_deadline()) return on_deadline();
        continue;
      }
      // Drain what is there: a large result arrives in several reads.
      while (true) {
        ssize_t n = read(fd, slot.read_buffer.get(), kReadChunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) {
          eof = true;
          break;
        }
        slot.decoder.Append(std::string_view(slot.read_buffer.get(), static_cast<size_t>(n)));
        if (static_cast<size_t>(n) < kReadChunk) break;
      }
    }
  }

  Outcome Malformed(Slot& slot, const std::string& why) {
    KLOG(error, "worker broke the protocol; replacing it",
         {{"model", options.model_name}, {"pid", std::to_string(slot.process->pid())}, {"error", why}});
    AnswerAll(slot, ErrorResponse(500, "InternalServerError",
                                  "the worker answered with a malformed result (" + why + "); it is being replaced"));
    slot.process->Kill(SIGKILL);
    return Outcome::kReplace;
  }

  // Checks the result frame against the invoke and answers each request.
  Outcome Deliver(Slot& slot, uint64_t id, Frame& frame) {
    if (frame.type != FrameType::kResult) {
      return Malformed(slot, "frame type " + std::to_string(static_cast<int>(frame.type)) + " where a result was due");
    }
    const nlohmann::json& meta = frame.meta;
    auto id_it = meta.find("id");
    if (id_it == meta.end() || !id_it->is_number_unsigned() || id_it->get<uint64_t>() != id) {
      return Malformed(slot, "the result's id is not the invoke's " + std::to_string(id));
    }
    auto items_it = meta.find("items");
    if (items_it == meta.end() || !items_it->is_array() || items_it->size() != slot.batch.size()) {
      return Malformed(slot,
                       "the result does not have one item per request (" + std::to_string(slot.batch.size()) + ")");
    }
    std::vector<InferenceResponse> responses(slot.batch.size());
    std::vector<size_t> sizes(slot.batch.size());
    size_t total = 0;
    for (size_t i = 0; i < slot.batch.size(); ++i) {
      const nlohmann::json& item = (*items_it)[i];
      if (!item.is_object()) return Malformed(slot, "result item " + std::to_string(i) + " is not an object");
      auto status = item.find("status");
      auto size = item.find("size");
      if (status == item.end() || !status->is_number_integer() || status->get<int64_t>() < 100 ||
          status->get<int64_t>() > 599) {
        return Malformed(slot, "result item " + std::to_string(i) + " has no valid status");
      }
      if (size == item.end() || !size->is_number_unsigned() || size->get<uint64_t>() > frame.payload.size()) {
        return Malformed(slot, "result item " + std::to_string(i) + " has no valid size");
      }
      responses[i].status = static_cast<int>(status->get<int64_t>());
      auto ct = item.find("content_type");
      if (ct != item.end() && ct->is_string()) responses[i].content_type = ct->get<std::string>();
      auto ca = item.find("custom_attributes");
      if (ca != item.end() && ca->is_string()) responses[i].custom_attributes = ca->get<std::string>();
      sizes[i] = size->get<uint64_t>();
      total += sizes[i];
    }
    if (total != frame.payload.size()) {
      return Malformed(slot, "the result's item sizes sum to " + std::to_string(total) + " bytes, its payload has " +
                                 std::to_string(frame.payload.size()));
    }
    if (slot.batch.size() == 1) {
      responses[0].body = std::move(frame.payload);  // the common case: no copy
    } else {
      size_t offset = 0;
      for (size_t i = 0; i < slot.batch.size(); ++i) {
        responses[i].body.assign(frame.payload, offset, sizes[i]);
        offset += sizes[i];
      }
    }
    for (size_t i = 0; i < slot.batch.size(); ++i) slot.batch[i].done(std::move(responses[i]));
    return Outcome::kAnswered;
  }

  // ---- the sweeper ----
  void RunSweeper() {
    std::vector<Pending> expired;
    MutexLock lock(mu);
    while (!stopping) {
      if (queue.empty()) {
        sweep_cv.Wait(mu);
        continue;
      }
      Clock::time_point now = Clock::now();
      // The queue is in arrival order, so its front expires first.
      while (!queue.empty() && queue.front().deadline <= now) {
        expired.push_back(std::move(queue.front()));
        queue.pop_front();
      }
      if (!expired.empty()) {
        lock.Unlock();
        for (Pending& p : expired) p.done(TimeoutResponse(/*worker_stopped=*/false));
        expired.clear();
        lock.Lock();
        continue;
      }
      // A copy: the wait releases mu, a dispatch thread may pop (and free) the front meanwhile, and
      // the condition variable reads the time point again when it wakes.
      const Clock::time_point next_deadline = queue.front().deadline;
      sweep_cv.WaitUntil(mu, next_deadline);
    }
  }
};

WorkerPool::WorkerPool(WorkerPoolOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

WorkerPool::~WorkerPool() { Stop(std::chrono::milliseconds(0)); }

Status WorkerPool::Start() {
  Impl& d = *impl_;
  if (d.options.worker_command.empty()) {
    return Status::InvalidArgument("the worker command is empty (set KILN_MODEL_SERVER_WORKER)");
  }
  // Under stop_mu: a concurrent Stop sees either no threads or all of them.
  MutexLock stop_lock(d.stop_mu);
  if (d.stopped) return Status::FailedPrecondition("the worker pool was stopped");
  {
    MutexLock lock(d.mu);
    if (d.started) return Status::FailedPrecondition("the worker pool was already started");
  }
  d.shutdown_event = UniqueFd(eventfd(0, EFD_CLOEXEC));
  if (!d.shutdown_event.valid()) return ErrnoStatus("eventfd", errno);
  {
    MutexLock lock(d.mu);
    d.started = true;
    d.ready_pids.assign(static_cast<size_t>(std::max(1, d.options.workers)), -1);
  }
  d.sweeper = std::thread([&d] { d.RunSweeper(); });
  d.starter = std::thread([&d] { d.RunStarter(); });
  return Status::Ok();
}

Status WorkerPool::WaitUntilLoaded(std::chrono::milliseconds timeout) {
  Impl& d = *impl_;
  Clock::time_point until = Clock::now() + timeout;
  MutexLock lock(d.mu);
  while (d.state == BackendState::kLoading) {
    if (d.state_cv.WaitUntil(d.mu, until) == std::cv_status::timeout && d.state == BackendState::kLoading) {
      return Status::DeadlineExceeded("model " + d.options.model_name + " did not load within " + Seconds(timeout));
    }
  }
  switch (d.state) {
    case BackendState::kReady: return Status::Ok();
    case BackendState::kFailed: return d.load_error;
    default: return Status::Unavailable("the model server is stopping");
  }
}

void WorkerPool::Invoke(InferenceRequest request, InferenceCallback done) {
  Impl& d = *impl_;
  std::optional<InferenceResponse> refusal;
  {
    MutexLock lock(d.mu);
    if (d.stopping || d.state == BackendState::kStopped) {
      refusal = ErrorResponse(503, "ServiceUnavailable", "the model server is stopping");
    } else if (d.state == BackendState::kFailed) {
      refusal = ErrorResponse(503, "ServiceUnavailable", "the model failed to load: " + d.load_error.message());
    } else if (d.queue.size() >= d.options.queue_size) {
      refusal = ErrorResponse(503, "ServiceUnavailable",
                              "too many requests are waiting for model " + d.options.model_name + " (" +
                                  std::to_string(d.options.queue_size) +
                                  "); retry later, or raise KILN_MODEL_SERVER_QUEUE_SIZE or "
                                  "SAGEMAKER_MODEL_SERVER_WORKERS");
    } else {
      Clock::time_point deadline = request.arrived + d.options.timeout;
      const bool was_empty = d.queue.empty();
      if (was_empty && !d.idle_slots.empty() && deadline > Clock::now()) {
        // An idle worker and nobody waiting before this request: straight to it (Handoff).
        // (One already past its deadline goes through the queue: 504 from a slot, never sent.)
        d.Handoff(Pending{std::move(request), std::move(done), deadline});
        return;
      }
      d.queue.push_back(Pending{std::move(request), std::move(done), deadline});
      d.work_cv.NotifyOne();
      d.WakeOneIdle();
      if (was_empty) d.sweep_cv.NotifyOne();
      return;
    }
  }
  done(std::move(*refusal));
}

BackendState WorkerPool::state() const {
  MutexLock lock(impl_->mu);
  return impl_->state;
}

Status WorkerPool::load_error() const {
  MutexLock lock(impl_->mu);
  return impl_->load_error;
}

uint64_t WorkerPool::MemoryBytes() const {
  uint64_t total = 0;
  // By pid: the slot threads own the processes. A pid read here may just have been reaped; its
  // /proc entry is then gone (0) or, rarely, a stranger's for one reading.
  for (pid_t pid : worker_pids()) total += ProcessRssBytes(pid);
  return total;
}

int WorkerPool::workers() const { return std::max(1, impl_->options.workers); }

void WorkerPool::Stop(std::chrono::milliseconds grace) {
  Impl& d = *impl_;
  MutexLock stop_lock(d.stop_mu);
  if (d.stopped) return;
  d.stopped = true;
  std::deque<Pending> refused;
  bool was_started;
  {
    MutexLock lock(d.mu);
    was_started = d.started;
    d.stopping = true;
    d.stop_deadline = Clock::now() + grace;
    d.state = BackendState::kStopped;
    refused.swap(d.queue);
    d.work_cv.NotifyAll();
    d.state_cv.NotifyAll();
    d.sweep_cv.NotifyAll();
  }
  for (Pending& p : refused) p.done(ErrorResponse(503, "ServiceUnavailable", "the model server is stopping"));
  if (!was_started) return;
  if (d.shutdown_event.valid()) d.SignalShutdown();
  if (d.starter.joinable()) d.starter.join();
  for (auto& slot : d.slots) {
    if (slot->thread.joinable()) slot->thread.join();
  }
  if (d.sweeper.joinable()) d.sweeper.join();
}

WorkerPool::Stats WorkerPool::stats() const {
  MutexLock lock(impl_->mu);
  Stats s;
  s.live_workers = impl_->live_workers;
  s.queued = impl_->queue.size();
  s.restarts = impl_->restarts;
  s.batches = impl_->batches;
  return s;
}

std::vector<int> WorkerPool::worker_pids() const {
  MutexLock lock(impl_->mu);
  std::vector<int> pids;
  for (pid_t pid : impl_->ready_pids) {
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

}  // namespace kiln::modelserver
