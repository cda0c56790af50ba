#pragma once
// Pipe-mode input (training-contract.md §6.3): one FIFO per channel and epoch,
// <opt_ml>/input/data/<channel>_<epoch>, fed from the ObjectStore while the program runs.
//
// Per Pipe channel a feeding thread runs epochs k = 0, 1, 2, ...:
//   1. <channel>_k exists (Start() creates _0 so it is there before the program starts; the
//      thread creates _k for k > 0).
//   2. It opens the FIFO for writing without blocking (O_NONBLOCK, retried every poll interval
//      while there is no reader), so Stop() can always interrupt it.
//   3. It streams this host's share of the channel's objects: key order, or with
//      ShuffleConfig.Seed a permutation drawn from (Seed, k) (shuffled before sharding, so a
//      ShardedByS3Key host may see other objects each epoch). CompressionType Gzip: each object is
//      decompressed while streaming. RecordWrapperType RecordIO: each object (its decompressed
//      bytes) is one record: u32 LE 0xced7230a, u32 LE length (< 2^29, upper 3 bits 0), payload,
//      zero padding to 4 bytes; RecordIO of a Gzip object reads it twice (once to learn the
//      length). An object of 2^29 bytes or more fails the channel.
//   4. It closes its end (the reader sees EOF). If the reader closed early, write() fails with
//      EPIPE (SIGPIPE is blocked in feeding threads, so it never reaches the process) and the
//      epoch ends there.
//   5. It waits until no reader has <channel>_k open (an O_NONBLOCK open for write failing with
//      ENXIO), then removes <channel>_k and goes on with k+1. Kiln decision: old epoch FIFOs are
//      removed, so a reader that reopens a finished epoch gets ENOENT instead of hanging forever
//      on a FIFO nobody will write again. _{k+1} is never created while _k is open by a reader.
// Resumption (a restarted server adopting a running job): each feeding thread records its
// progress in <opt_ml>/.kiln/pipe-<channel>.json ({"epoch": k, "phase": "waiting" | "open"})
// before waiting for a reader and once the FIFO is open. Started with Options::resume, a feeder
// reads that record instead of creating _0: an epoch still "waiting" is fed from its existing
// FIFO (a reader may already block in open() on it, so it is not recreated); an epoch that was
// "open" when the old server died has been cut short for the reader (it saw EOF early and that
// cannot be undone), so the feeder waits for the reader to close it and goes on with k+1.
// Channels are independent. A feeding error (object vanished, corrupt gzip, record too large)
// ends that channel's feeding and is reported once through Options::on_error; the controller
// then fails the job with the message.
//
// Thread-safety: Start/Stop from one controlling thread; on_error is called from feeding threads.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/staging.h"
#include "base/status.h"
#include "objects/object_store.h"

namespace kiln::agent {

class PipeFeeder {
 public:
  struct Options {
    // How often a feeder retries opening a FIFO without reader / checks for the reader's close.
    // Shorter reacts faster at the cost of wake-ups.
    std::chrono::milliseconds poll_interval{20};
    size_t buffer_size = 256 * 1024;
    // Called once per failed channel with the channel name and the error ("ClientError: ..." for
    // bad data). May be empty (errors are then only logged).
    std::function<void(const std::string& channel, const Status& error)> on_error;
    // Stop after this many epochs per channel (tests); 0: until Stop().
    int max_epochs = 0;
    // Continue from the progress recorded by an earlier feeder of the same instance (see above).
    bool resume = false;
  };

  // `request` is the validated CreateTrainingJob request; host_index is this host's position in
  // the sorted hosts list of host_count hosts. `store` must outlive the feeder.
  PipeFeeder(objects::ObjectStore& store, nlohmann::json request, int host_index, int host_count, std::string opt_ml,
             Options options);
  ~PipeFeeder();  // Stop()s
  PipeFeeder(const PipeFeeder&) = delete;
  PipeFeeder& operator=(const PipeFeeder&) = delete;

  // Selects every Pipe channel's objects and creates its FIFO <channel>_0, then starts the
  // feeding threads and returns. Errors (nothing is started, FIFOs created so far are removed):
  // the selection errors of SelectChannelObjects ("ClientError: No S3 objects found ..."),
  // mkfifo failures. A request without Pipe channels is OK and starts nothing.
  Status Start();

  // Ends all feeding promptly (a blocked open or write is abandoned within a poll interval) and
  // joins the threads. Idempotent.
  void Stop();

  // Names of the Pipe channels fed (after Start).
  std::vector<std::string> channels() const;

 private:
  struct Channel;
  void Feed(Channel& channel);
  std::string ProgressPath(const std::string& channel) const;
  void RecordProgress(const std::string& channel, int epoch, const char* phase) const;

  objects::ObjectStore& store_;
  nlohmann::json request_;
  int host_index_;
  int host_count_;
  std::string opt_ml_;
  Options options_;
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<std::thread> threads_;
};

// The RecordIO header for a payload of `length` bytes (8 bytes), and the padding after it.
std::string RecordIoHeader(uint32_t length);
size_t RecordIoPadding(uint64_t length);

// The order of `count` objects in `epoch` for ShuffleConfig.Seed `seed`: a permutation of
// 0..count-1 that depends only on (seed, epoch, count).
std::vector<size_t> ShuffledOrder(size_t count, int64_t seed, int epoch);

}  // namespace kiln::agent
