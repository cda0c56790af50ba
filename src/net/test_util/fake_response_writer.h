#pragma once
// A ResponseWriter that records what a handler wrote, for unit tests of HTTP handlers (the
// front door, the S3 front). Not thread-safe.

#include <optional>
#include <string>

#include "net/http_server.h"

namespace kiln::net {

class FakeResponseWriter : public ResponseWriter {
 public:
  Status Start(int status, const HeaderMap& headers, std::optional<uint64_t> content_length) override {
    if (started_) return Status::Internal("Start called twice");
    started_ = true;
    status_ = status;
    headers_ = headers;
    content_length_ = content_length;
    return Status::Ok();
  }
  Status Write(std::string_view data) override {
    if (!started_ || finished_) return Status::Internal("Write outside Start/Finish");
    body_.append(data);
    return Status::Ok();
  }
  Status Finish() override {
    if (!started_) return Status::Internal("Finish before Start");
    finished_ = true;
    return Status::Ok();
  }
  bool started() const override { return started_; }
  void CloseAfterResponse() override { close_ = true; }

  int status() const { return status_; }
  const HeaderMap& headers() const { return headers_; }
  std::string header(std::string_view name) const {
    const std::string* v = FindHeader(headers_, name);
    return v ? *v : std::string();
  }
  bool has_header(std::string_view name) const { return FindHeader(headers_, name) != nullptr; }
  const std::string& body() const { return body_; }
  std::optional<uint64_t> content_length() const { return content_length_; }
  bool finished() const { return finished_; }
  bool close() const { return close_; }

 private:
  bool started_ = false;
  bool finished_ = false;
  bool close_ = false;
  int status_ = 0;
  HeaderMap headers_;
  std::string body_;
  std::optional<uint64_t> content_length_;
};

}  // namespace kiln::net
