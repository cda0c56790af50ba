#include "objects/hash_pipeline.h"

#include <system_error>
#include <utility>

#include "base/log.h"

namespace kiln::objects {

HashPipeline::HashPipeline(size_t buffers, size_t buffer_size, HashFn hash)
    : buffer_size_(buffer_size), hash_(std::move(hash)), buffers_(buffers < 2 ? 2 : buffers) {
  MutexLock lock(mu_);
  sizes_.assign(buffers_.size(), 0);
}

HashPipeline::~HashPipeline() { Stop(/*drain=*/false); }

char* HashPipeline::NextBuffer() {
  size_t index;
  {
    MutexLock lock(mu_);
    // Only the caller submits, so once a slot frees up it stays free until the caller fills it.
    while (submitted_ - hashed_ >= buffers_.size()) changed_.Wait(mu_);
    index = submitted_ % buffers_.size();
  }
  std::string& buffer = buffers_[index];
  if (buffer.size() != buffer_size_) buffer.resize(buffer_size_);
  return buffer.data();
}

void HashPipeline::Submit(size_t size, bool last) {
  if (!thread_.joinable()) {
    uint64_t index;
    {
      MutexLock lock(mu_);
      index = submitted_ % buffers_.size();
    }
    bool started = false;
    if (!last && !inline_only_) {
      try {
        thread_ = std::thread([this] { Run(); });
        started = true;
      } catch (const std::system_error& e) {
        // No thread to be had (thread limit): hashing inline is slower but still correct.
        inline_only_ = true;
        std::string error = e.what();
        KLOG(warn, "could not start the upload hashing thread; hashing inline", {{"error", error}});
      }
    }
    if (!started) {
      hash_(std::string_view(buffers_[index].data(), size));
      MutexLock lock(mu_);
      ++submitted_;
      ++hashed_;
      return;
    }
  }
  MutexLock lock(mu_);
  sizes_[submitted_ % buffers_.size()] = size;
  ++submitted_;
  changed_.NotifyAll();
}

void HashPipeline::Finish() { Stop(/*drain=*/true); }

void HashPipeline::Stop(bool drain) {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    if (!drain) abandon_ = true;
    changed_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

void HashPipeline::Run() {
  MutexLock lock(mu_);
  for (;;) {
    while (hashed_ == submitted_ && !stopping_) changed_.Wait(mu_);
    if (abandon_ || hashed_ == submitted_) return;
    size_t index = hashed_ % buffers_.size();
    std::string_view chunk(buffers_[index].data(), sizes_[index]);
    lock.Unlock();
    hash_(chunk);
    lock.Lock();
    ++hashed_;
    changed_.NotifyAll();
  }
}

}  // namespace kiln::objects
