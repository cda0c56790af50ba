#pragma once
// Private to src/net: what an EventLoop is made of.

#include <atomic>
#include <memory>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "net/async_http_client.h"
#include "net/event_loop.h"

namespace kiln::net {

struct EventLoop::Impl {
  // concurrency_hint 1: one thread runs this context, so Asio can skip its internal locking.
  boost::asio::io_context io{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::atomic<std::thread::id> thread_id{};
  std::unique_ptr<AsyncHttpClient> client;  // created with the loop; used on its thread
  HttpClientOptions upstream;
};

inline boost::asio::io_context& IoContextOf(EventLoop& loop) { return loop.impl().io; }

}  // namespace kiln::net
