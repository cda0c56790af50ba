#pragma once
// A ResponseWriter that records what a handler wrote, for unit tests of HTTP handlers (the
// front door, the S3 front). Not thread-safe.

#include <sys/socket.h>

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
  // Records a 101 with `headers` and hands out one end of a socketpair; peer() is the client's
  // end. Refused as the server refuses: after Start, or a second time.
  Result<UpgradedConnection> Upgrade(const HeaderMap& headers) override {
    if (started_) return Status::FailedPrecondition("cannot upgrade: a response was already started");
    if (FindHeader(headers, "Upgrade") == nullptr) return Status::InvalidArgument("no Upgrade header");
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return Status::Internal("socketpair failed");
    started_ = finished_ = true;
    status_ = 101;
    headers_ = headers;
    peer_.Reset(fds[1]);
    UpgradedConnection up;
    up.fd.Reset(fds[0]);
    return up;
  }

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
  // After Upgrade: the client's end of the upgraded connection (invalid before).
  UniqueFd& peer() { return peer_; }

 private:
  bool started_ = false;
  bool finished_ = false;
  bool close_ = false;
  int status_ = 0;
  HeaderMap headers_;
  std::string body_;
  std::optional<uint64_t> content_length_;
  UniqueFd peer_;
};

}  // namespace kiln::net
