#pragma once
// EventLoop: one thread running one Boost.Asio io_context. HttpServer owns a small fixed set of
// them (HttpServerOptions::event_loops, one per core by default); every accepted connection lives
// on one loop for its whole life, and each loop owns its own upstream client (AsyncHttpClient), so
// a request proxied to a serving container never leaves the thread that read it.
//
// Nothing here exposes Asio: code outside src/net sees only Post() and client(). Inside src/net,
// event_loop_internal.h gives the io_context.
//
// Thread-safety: Post() and index() from any thread; client() on the loop's own thread only.

#include <cstddef>
#include <functional>
#include <memory>

#include "net/http_client.h"

namespace kiln::net {

class AsyncHttpClient;

class EventLoop {
 public:
  // `upstream` configures this loop's AsyncHttpClient (its idle pool is per loop).
  EventLoop(size_t index, HttpClientOptions upstream);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // 0 .. loops-1, stable.
  size_t index() const { return index_; }
  // Runs `fn` on the loop's thread, later (never inline, even from the loop's thread).
  void Post(std::function<void()> fn);
  // True on the thread currently running this loop.
  bool InLoopThread() const;
  // This loop's upstream client. Loop thread only.
  AsyncHttpClient& client();

  // For the owner (HttpServer): runs the loop on the calling thread until Stop(); Stop() is
  // thread-safe and makes Run() return once the handlers already running have returned.
  void Run();
  void Stop();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  const size_t index_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::net
