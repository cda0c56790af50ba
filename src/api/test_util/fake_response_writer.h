#pragma once
// A ResponseWriter that keeps the response in memory, for handler tests.

#include <optional>
#include <string>

#include "net/http_server.h"

namespace kiln::api {

class FakeResponseWriter final : public net::ResponseWriter {
 public:
  Status Start(int status, const HeaderMap& headers, std::optional<uint64_t> content_length) override {
    status_ = status;
    headers_ = headers;
    content_length_ = content_length;
    started_ = true;
    return Status::Ok();
  }
  Status Write(std::string_view data) override {
    body_.append(data);
    return Status::Ok();
  }
  Status Finish() override {
    finished_ = true;
    return Status::Ok();
  }
  bool started() const override { return started_; }
  void CloseAfterResponse() override { close_ = true; }

  int status() const { return status_; }
  const HeaderMap& headers() const { return headers_; }
  const std::string& body() const { return body_; }
  bool finished() const { return finished_; }
  bool close_requested() const { return close_; }

 private:
  int status_ = 0;
  HeaderMap headers_;
  std::optional<uint64_t> content_length_;
  std::string body_;
  bool started_ = false;
  bool finished_ = false;
  bool close_ = false;
};

}  // namespace kiln::api
