#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"

namespace kiln::objects {

// Runs the digests of one upload (the MD5 of the ETag, requested checksums) on a second thread
// while the caller receives the next buffer and writes the last one to disk, so that hashing —
// about 1.5 s of CPU per GiB for MD5 alone — overlaps the transfer instead of adding to it.
//
// The caller cycles through a fixed ring of buffers: NextBuffer() hands out a free one (blocking
// while every buffer still waits to be hashed: backpressure, bounded memory), the caller fills it,
// Submit()s it, and may go on reading the submitted bytes (write them to the file) until its next
// NextBuffer() call, which returns a different buffer. The hash function sees every submitted
// chunk exactly once, in submission order.
//
// Small uploads pay nothing: buffers are allocated on first use, and the thread starts only when a
// chunk is submitted that is not the last one — an upload that fits in one buffer is hashed inline
// on the caller's thread, as is everything if the thread cannot be started.
//
// Not thread-safe itself: one caller thread drives it.
class HashPipeline {
 public:
  using HashFn = std::function<void(std::string_view)>;

  // `buffers` (at least 2) buffers of `buffer_size` (> 0) bytes. `hash` runs on the pipeline's
  // thread from the first non-last Submit() until Finish() or destruction returns; whatever it
  // updates belongs to the pipeline until then.
  HashPipeline(size_t buffers, size_t buffer_size, HashFn hash);
  // Abandons the chunks not hashed yet (an upload that failed) and joins the thread.
  ~HashPipeline();
  HashPipeline(const HashPipeline&) = delete;
  HashPipeline& operator=(const HashPipeline&) = delete;

  size_t buffer_size() const { return buffer_size_; }

  // The buffer to fill next, buffer_size() bytes. Blocks while all buffers wait to be hashed.
  char* NextBuffer() EXCLUDES(mu_);

  // Queues the first `size` bytes (<= buffer_size()) of the buffer NextBuffer() returned last.
  // `last`: no more chunks follow, so a pipeline whose thread has not started hashes it inline.
  void Submit(size_t size, bool last) EXCLUDES(mu_);

  // Returns once every submitted chunk has been hashed, and joins the thread. Call it once, after
  // the last Submit(); the hash function's state is the caller's again afterwards.
  void Finish() EXCLUDES(mu_);

 private:
  void Run() EXCLUDES(mu_);
  void Stop(bool drain) EXCLUDES(mu_);

  const size_t buffer_size_;
  const HashFn hash_;
  // buffers_[i] is written by the caller only while it is free (between NextBuffer() and Submit())
  // and read by the thread only while it is queued, so the strings themselves need no lock; the
  // vector is never resized after construction.
  std::vector<std::string> buffers_;
  std::vector<size_t> sizes_ GUARDED_BY(mu_);
  std::thread thread_;        // joinable from the first threaded Submit() until Stop()
  bool inline_only_ = false;  // the thread could not be started: Submit() hashes inline

  Mutex mu_;
  CondVar changed_;
  uint64_t submitted_ GUARDED_BY(mu_) = 0;  // chunks queued so far (ring index = count % size)
  uint64_t hashed_ GUARDED_BY(mu_) = 0;     // chunks the thread has finished
  bool stopping_ GUARDED_BY(mu_) = false;   // no more chunks will come
  bool abandon_ GUARDED_BY(mu_) = false;    // exit without hashing what is queued
};

}  // namespace kiln::objects
