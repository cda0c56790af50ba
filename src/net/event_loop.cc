// EventLoop: see event_loop.h.

#include "net/event_loop.h"

#include <boost/asio/post.hpp>

#include "net/event_loop_internal.h"

namespace kiln::net {

EventLoop::EventLoop(size_t index, HttpClientOptions upstream) : index_(index), impl_(std::make_unique<Impl>()) {
  impl_->upstream = upstream;
  // Created here, not on first use, so that idle_connections() may be read from any thread.
  impl_->client = std::make_unique<AsyncHttpClient>(impl_->io, impl_->upstream);
}

EventLoop::~EventLoop() {
  // The client's connections belong to io; close them before io goes.
  impl_->client.reset();
}

void EventLoop::Post(std::function<void()> fn) { boost::asio::post(impl_->io, std::move(fn)); }

bool EventLoop::InLoopThread() const {
  return impl_->thread_id.load(std::memory_order_relaxed) == std::this_thread::get_id();
}

AsyncHttpClient& EventLoop::client() { return *impl_->client; }

void EventLoop::Run() {
  impl_->thread_id.store(std::this_thread::get_id(), std::memory_order_relaxed);
  for (;;) {
    try {
      impl_->io.run();
      break;
    } catch (const std::exception&) {
      // A completion handler threw: handlers catch their own errors, so this is a bug; keep the
      // loop serving its other connections rather than take them all down.
      continue;
    }
  }
  if (impl_->client) {
    impl_->client->Shutdown();
  }
  impl_->thread_id.store(std::thread::id(), std::memory_order_relaxed);
}

void EventLoop::Stop() {
  impl_->work.reset();
  impl_->io.stop();
}

}  // namespace kiln::net
