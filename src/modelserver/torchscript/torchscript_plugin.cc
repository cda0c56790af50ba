// libkiln_torchscript.so: the TorchScript backend's libtorch half (torchscript_plugin.h says why it
// is a plugin). The only file that includes libtorch (~20 s of compile time). Under clang it is
// compiled as C++17 (CMakeLists.txt): keep it free of C++20-only library calls.

#include "modelserver/torchscript/torchscript_plugin.h"

#include <ATen/Parallel.h>
#include <torch/script.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <list>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "modelserver/npy.h"

namespace kiln::modelserver {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kJson = "application/json";
constexpr std::string_view kCsv = "text/csv";
constexpr std::string_view kNpy = "application/x-npy";

// "Application/JSON; charset=utf-8 " → "application/json".
std::string MediaType(std::string_view header) {
  std::string_view t = header.substr(0, header.find(';'));
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  std::string out(t);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// The toolkit's UnsupportedFormatError, word for word, so both backends answer the same.
InferenceResponse Unsupported(std::string_view what) {
  return ErrorResponse(415, "UnsupportedFormatError",
                       "Content type " + std::string(what) +
                           " is not supported by this framework. Please implement input_fn to deserialize the "
                           "request data or an output_fn to serialize the response. For more information, see the "
                           "SageMaker Python SDK README.");
}

// The type to answer in, as Kiln's Python worker picks it: `default_accept` for a missing Accept
// or exactly */*; else the first listed type that has an encoder (parameters such as q-values
// ignored, the client's order kept), */* in a list meaning application/json; empty for none.
std::string Negotiate(std::string_view accept, const std::string& default_accept) {
  if (accept.empty() || accept == "*/*") return default_accept;
  while (true) {
    size_t comma = accept.find(',');
    std::string t = MediaType(accept.substr(0, comma));
    if (t == kJson || t == kCsv || t == kNpy) return t;
    if (t == "*/*") return std::string(kJson);
    if (comma == std::string_view::npos) return "";
    accept.remove_prefix(comma + 1);
  }
}

// The line of a libtorch error that says what went wrong. TorchScript interpreter errors start
// with "The following operation failed in the TorchScript interpreter." and a traceback, and end
// with the Python-style exception line ("RuntimeError: mat1 and mat2 shapes cannot be multiplied").
std::string ErrorLine(std::string_view what) {
  std::vector<std::string_view> lines;
  while (!what.empty()) {
    size_t nl = what.find('\n');
    std::string_view line = what.substr(0, nl);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) lines.push_back(line);
    if (nl == std::string_view::npos) break;
    what.remove_prefix(nl + 1);
  }
  if (lines.empty()) return "unknown libtorch error";
  if (lines.front().rfind("The following operation failed in the TorchScript interpreter", 0) == 0) {
    return std::string(lines.back());
  }
  return std::string(lines.front());
}

Result<c10::ScalarType> TorchType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kInt64: return c10::ScalarType::Long;
    case DType::kInt32: return c10::ScalarType::Int;
    case DType::kInt16: return c10::ScalarType::Short;
    case DType::kInt8: return c10::ScalarType::Char;
    case DType::kUInt8: return c10::ScalarType::Byte;
    case DType::kBool: return c10::ScalarType::Bool;
  }
  return Status::Internal("unknown dtype");
}

Result<DType> KilnType(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Double: return DType::kFloat64;
    case c10::ScalarType::Long: return DType::kInt64;
    case c10::ScalarType::Int: return DType::kInt32;
    case c10::ScalarType::Short: return DType::kInt16;
    case c10::ScalarType::Char: return DType::kInt8;
    case c10::ScalarType::Byte: return DType::kUInt8;
    case c10::ScalarType::Bool: return DType::kBool;
    default:
      return Status::InvalidArgument(std::string("the model returned a tensor of dtype ") + c10::toString(t) +
                                     ", which the TorchScript backend cannot encode (float32, float64, int64, int32, "
                                     "int16, int8, uint8 and bool can be); convert it in forward()");
  }
}

struct Pending {
  InferenceRequest request;
  InferenceCallback done;
  Clock::time_point deadline;
  std::atomic<bool> answered{false};
  // Guarded by the backend's mu_ (not annotated: Pending is not a member of it).
  bool queued = false;
  std::list<std::shared_ptr<Pending>>::iterator queue_it;
  bool has_deadline_entry = false;
  std::multimap<Clock::time_point, std::shared_ptr<Pending>>::iterator deadline_it;
};

// Calls `done` unless the request was answered already (the timeout and the result race).
void Answer(Pending& p, InferenceResponse response) {
  if (!p.answered.exchange(true)) p.done(std::move(response));
}

class TorchScriptBackend final : public InferenceBackend {
 public:
  TorchScriptBackend(TorchScriptOptions options, TorchScriptPluginHost host)
      : options_(std::move(options)), host_(host) {}
  ~TorchScriptBackend() override { Stop(std::chrono::milliseconds(0)); }

  Status Start() override {
    MutexLock lock(mu_);
    if (started_) return Status::FailedPrecondition("the TorchScript backend was started already");
    started_ = true;
    loader_ = std::thread([this] { Load(); });
    for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { WorkLoop(); });
    reaper_ = std::thread([this] { ReapLoop(); });
    return Status::Ok();
  }

  Status WaitUntilLoaded(std::chrono::milliseconds timeout) override {
    auto deadline = Clock::now() + timeout;
    MutexLock lock(mu_);
    while (state_ == BackendState::kLoading) {
      if (state_cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout && state_ == BackendState::kLoading) {
        return Status::DeadlineExceeded("the TorchScript model " + ModelPath() + " did not load within " +
                                        std::to_string(timeout.count()) + " ms");
      }
    }
    if (state_ == BackendState::kReady) return Status::Ok();
    if (state_ == BackendState::kFailed) return load_error_;
    return Status::FailedPrecondition("the TorchScript backend is stopped");
  }

  void Invoke(InferenceRequest request, InferenceCallback done) override {
    auto p = std::make_shared<Pending>();
    p->deadline = request.arrived + options_.timeout;
    p->request = std::move(request);
    p->done = std::move(done);
    std::string refused;
    {
      MutexLock lock(mu_);
      if (stopping_ || state_ == BackendState::kStopped) {
        refused = "the model server is stopping";
      } else if (state_ == BackendState::kFailed) {
        refused = "the model failed to load: " + load_error_.message();
      } else if (queue_.size() >= options_.queue_size) {
        refused = "the model's request queue is full (" + std::to_string(options_.queue_size) +
                  " waiting); retry later or add instances";
      } else {
        queue_.push_back(p);
        p->queued = true;
        p->queue_it = std::prev(queue_.end());
        p->deadline_it = deadlines_.emplace(p->deadline, p);
        p->has_deadline_entry = true;
        if (p->deadline_it == deadlines_.begin()) reaper_cv_.NotifyOne();
        work_cv_.NotifyOne();
      }
    }
    if (!refused.empty()) Answer(*p, ErrorResponse(503, "ServiceUnavailable", refused));
  }

  BackendState state() const override {
    MutexLock lock(mu_);
    return state_;
  }

  Status load_error() const override {
    MutexLock lock(mu_);
    return load_error_;
  }

  uint64_t MemoryBytes() const override { return memory_bytes_.load(); }

  int workers() const override { return options_.workers; }

  void Stop(std::chrono::milliseconds grace) override {
    std::vector<std::shared_ptr<Pending>> refused;
    {
      MutexLock lock(mu_);
      if (!stopping_) {
        stopping_ = true;
        for (auto& p : queue_) {
          p->queued = false;
          refused.push_back(p);
        }
        queue_.clear();
        work_cv_.NotifyAll();
        reaper_cv_.NotifyAll();
      }
    }
    for (auto& p : refused) Answer(*p, ErrorResponse(503, "ServiceUnavailable", "the model server is stopping"));
    {
      // Requests in flight may finish within the grace period; those that do not are answered 503
      // now, and their forward() is waited for below (a running forward() cannot be interrupted).
      auto deadline = Clock::now() + grace;
      MutexLock lock(mu_);
      while (!running_.empty() && Clock::now() < deadline) idle_cv_.WaitUntil(mu_, deadline);
      refused.assign(running_.begin(), running_.end());
    }
    for (auto& p : refused) {
      Answer(*p, ErrorResponse(503, "ServiceUnavailable", "the model server stopped before the model answered"));
    }
    std::vector<std::thread> threads;
    {
      MutexLock lock(mu_);
      threads.swap(workers_);
      if (loader_.joinable()) threads.push_back(std::move(loader_));
      if (reaper_.joinable()) threads.push_back(std::move(reaper_));
    }
    for (auto& t : threads) {
      if (!t.joinable()) continue;
      // Stop called from a callback on one of our own threads: that thread ends by itself once
      // the callback returns (stopping_ is set); it must not touch the backend after its owner
      // destroys it, so owners do not destroy a backend from its own callback.
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();
      } else {
        t.join();
      }
    }
    MutexLock lock(mu_);
    if (state_ != BackendState::kFailed) state_ = BackendState::kStopped;
    state_cv_.NotifyAll();
    deadlines_.clear();
  }

 private:
  std::string ModelPath() const { return (std::filesystem::path(options_.model_dir) / options_.model_file).string(); }

  void Load() {
    auto started = Clock::now();
    Status error;
    uint64_t bytes = 0;
    try {
      at::set_num_threads(std::max(1, options_.intra_op_threads));
      auto module = std::make_shared<torch::jit::Module>(torch::jit::load(ModelPath(), torch::kCPU));
      module->eval();
      for (const auto& t : module->parameters()) bytes += t.nbytes();
      for (const auto& t : module->buffers()) bytes += t.nbytes();
      MutexLock lock(mu_);
      module_ = std::move(module);
    } catch (const c10::Error& e) {
      error = Status::InvalidArgument("cannot load the TorchScript model " + ModelPath() + ": " +
                                      ErrorLine(e.what_without_backtrace()));
    } catch (const std::bad_alloc&) {
      error = Status::ResourceExhausted("out of memory loading the TorchScript model " + ModelPath());
    } catch (const std::exception& e) {
      error = Status::InvalidArgument("cannot load the TorchScript model " + ModelPath() + ": " + ErrorLine(e.what()));
    }
    std::vector<std::shared_ptr<Pending>> failed;
    {
      MutexLock lock(mu_);
      if (error.ok()) {
        memory_bytes_.store(bytes);
        if (!stopping_) state_ = BackendState::kReady;
      } else {
        load_error_ = error;
        state_ = BackendState::kFailed;
        for (auto& p : queue_) {
          p->queued = false;
          failed.push_back(p);
        }
        queue_.clear();
      }
      state_cv_.NotifyAll();
      work_cv_.NotifyAll();
    }
    if (error.ok()) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
      host_.log(false, "TorchScript model loaded",
                {{"path", ModelPath()}, {"load_ms", std::to_string(ms)}, {"parameter_bytes", std::to_string(bytes)}});
    } else {
      host_.log(true, "TorchScript model failed to load", {{"path", ModelPath()}, {"error", error.message()}});
    }
    for (auto& p : failed) Answer(*p, ErrorResponse(503, "ServiceUnavailable", error.message()));
  }

  void WorkLoop() {
    while (true) {
      std::shared_ptr<Pending> p;
      std::shared_ptr<torch::jit::Module> module;
      {
        MutexLock lock(mu_);
        while (!stopping_ && (queue_.empty() || state_ != BackendState::kReady)) {
          if (state_ == BackendState::kFailed) return;
          work_cv_.Wait(mu_);
        }
        if (stopping_) return;
        p = queue_.front();
        queue_.pop_front();
        p->queued = false;
        running_.insert(p);
        module = module_;
      }
      if (!p->answered.load()) Answer(*p, Run(*module, p->request));
      MutexLock lock(mu_);
      running_.erase(p);
      if (p->has_deadline_entry) {
        deadlines_.erase(p->deadline_it);
        p->has_deadline_entry = false;
      }
      if (running_.empty()) idle_cv_.NotifyAll();
    }
  }

  // Answers 504 for every request, waiting or running, whose deadline passed.
  void ReapLoop() {
    MutexLock lock(mu_);
    while (!stopping_) {
      if (deadlines_.empty()) {
        reaper_cv_.Wait(mu_);
        continue;
      }
      auto first = deadlines_.begin();
      if (Clock::now() < first->first) {
        reaper_cv_.WaitUntil(mu_, first->first);
        continue;
      }
      std::shared_ptr<Pending> p = first->second;
      deadlines_.erase(first);
      p->has_deadline_entry = false;
      bool was_queued = p->queued;
      if (was_queued) {
        queue_.erase(p->queue_it);
        p->queued = false;
      }
      lock.Unlock();
      Answer(*p, ErrorResponse(504, "ModelTimeout",
                               std::string("the request ") + (was_queued ? "waited" : "ran") +
                                   " past the model server's " + std::to_string(options_.timeout.count()) +
                                   " ms timeout (SAGEMAKER_MODEL_SERVER_TIMEOUT)"));
      lock.Lock();
    }
  }

  InferenceResponse Run(torch::jit::Module& module, const InferenceRequest& request) {
    // Decode.
    std::string content_type = MediaType(request.content_type);
    Result<NdArray> input = Status::InvalidArgument("");
    if (content_type == kJson) {
      input = ParseJsonArray(request.body);
    } else if (content_type == kCsv) {
      input = ParseCsv(request.body);
    } else if (content_type == kNpy) {
      input = ParseNpy(request.body);
    } else {
      return Unsupported(content_type.empty() ? "(none: the request has no Content-Type)" : request.content_type);
    }
    if (!input.ok()) return ErrorResponse(400, "BadRequestError", input.status().message());
    // Negotiate before running the model: an answer nobody can take is not worth computing.
    std::string accept = Negotiate(request.accept, options_.default_accept);
    if (accept.empty()) return Unsupported(request.accept);

    NdArray output;
    try {
      auto holder = std::make_shared<NdArray>(std::move(*input));
      auto type = TorchType(holder->dtype);
      if (!type.ok()) return ErrorResponse(500, "InternalServerError", type.status().message());
      // The tensor borrows the decoded bytes; the holder lives as long as the tensor does.
      at::Tensor tensor = torch::from_blob(
          holder->data.data(), holder->shape, [holder](void*) {}, torch::TensorOptions().dtype(*type));
      c10::InferenceMode guard;
      std::vector<torch::jit::IValue> inputs{std::move(tensor)};
      torch::jit::IValue result = module.forward(std::move(inputs));
      if (!result.isTensor()) {
        return ErrorResponse(500, "ModelError",
                             std::string("the model's forward() returned a ") + result.tagKind() +
                                 "; the TorchScript backend serves models whose forward() returns one tensor "
                                 "(serve the model through inference.py to encode other outputs)");
      }
      at::Tensor out = result.toTensor().detach().to(torch::kCPU).contiguous();
      auto dtype = KilnType(out.scalar_type());
      if (!dtype.ok()) return ErrorResponse(500, "ModelError", dtype.status().message());
      output.dtype = *dtype;
      output.shape.assign(out.sizes().begin(), out.sizes().end());
      output.data.assign(static_cast<const char*>(out.data_ptr()), out.nbytes());
    } catch (const c10::Error& e) {
      return ErrorResponse(500, "ModelError", ErrorLine(e.what_without_backtrace()));
    } catch (const std::bad_alloc&) {
      return ErrorResponse(500, "ModelError", "out of memory running the model");
    } catch (const std::exception& e) {
      return ErrorResponse(500, "ModelError", ErrorLine(e.what()));
    }

    InferenceResponse response;
    response.content_type = accept;
    if (accept == kJson) {
      response.body = WriteJson(output);
    } else if (accept == kNpy) {
      response.body = WriteNpy(output);
    } else {
      auto csv = WriteCsv(output);
      if (!csv.ok()) return ErrorResponse(500, "ModelError", csv.status().message());
      response.body = std::move(*csv);
    }
    return response;
  }

  const TorchScriptOptions options_;
  const TorchScriptPluginHost host_;
  std::atomic<uint64_t> memory_bytes_{0};

  mutable Mutex mu_;
  CondVar state_cv_;   // state_ changed
  CondVar work_cv_;    // queue_ grew, or the state or stopping_ changed
  CondVar reaper_cv_;  // deadlines_ has a new first entry, or stopping_
  CondVar idle_cv_;    // running_ became empty
  bool started_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  BackendState state_ GUARDED_BY(mu_) = BackendState::kLoading;
  Status load_error_ GUARDED_BY(mu_);
  std::shared_ptr<torch::jit::Module> module_ GUARDED_BY(mu_);
  std::list<std::shared_ptr<Pending>> queue_ GUARDED_BY(mu_);
  std::multimap<Clock::time_point, std::shared_ptr<Pending>> deadlines_ GUARDED_BY(mu_);
  std::set<std::shared_ptr<Pending>> running_ GUARDED_BY(mu_);
  std::thread loader_ GUARDED_BY(mu_);
  std::thread reaper_ GUARDED_BY(mu_);
  std::vector<std::thread> workers_ GUARDED_BY(mu_);
};

}  // namespace

InferenceBackend* CreatePluginBackend(const TorchScriptOptions& options, const TorchScriptPluginHost& host) {
  try {
    return new TorchScriptBackend(options, host);
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace kiln::modelserver

extern "C" __attribute__((visibility("default"))) const kiln::modelserver::TorchScriptPluginApi*
KilnTorchScriptPlugin() {
  static const kiln::modelserver::TorchScriptPluginApi api{kiln::modelserver::kTorchScriptPluginVersion,
                                                           &kiln::modelserver::CreatePluginBackend};
  return &api;
}
