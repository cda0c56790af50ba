#include "modelserver/torchscript_backend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "modelserver/npy.h"

namespace kiln::modelserver {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

#if !KILN_HAVE_LIBTORCH

TEST(TorchScriptTest, BuiltWithoutLibtorchSaysSo) {
  EXPECT_FALSE(TorchScriptAvailable());
  auto backend = CreateTorchScriptBackend({.model_dir = "/nonexistent"});
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(backend.status().message().find("install libtorch-dev"), std::string::npos);
}

#else

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The models and the answers PyTorch itself computes for the same inputs, written by python3-torch
// once for the suite: what the Python path (the SageMaker PyTorch toolkit's defaults) answers.
constexpr const char* kFixtureScript = R"(
import io, json, os, sys
import numpy as np
import torch
D = sys.argv[1]
torch.manual_seed(3)

class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
    def forward(self, x):
        return self.lin(x)

class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2

class Pair(torch.nn.Module):
    def forward(self, x):
        return (x, x)

class Slow(torch.nn.Module):
    # Runs x[0] matrix products of 256 x 256: as slow as the test needs.
    def forward(self, x):
        n = int(x.reshape(-1)[0])
        w = torch.ones(256, 256) / 256
        y = torch.ones(256, 256)
        for i in range(n):
            y = y @ w
        return y.sum().reshape(1)

lin = Linear().eval()
for name, m in [('linear', lin), ('double', Double()), ('pair', Pair()), ('slow', Slow())]:
    os.makedirs(os.path.join(D, name))
    torch.jit.save(torch.jit.script(m), os.path.join(D, name, 'model.pt'))

def npy(a):
    b = io.BytesIO(); np.save(b, a); return b.getvalue()

x = [[1.0, 2.0, 3.0], [4.0, -5.5, 0.25]]
with torch.no_grad():
    y = lin(torch.FloatTensor(np.array(x))).numpy()
open(os.path.join(D, 'linear_in.json'), 'w').write(json.dumps(x))
open(os.path.join(D, 'linear_out.json'), 'w').write(json.dumps(y.tolist()))
open(os.path.join(D, 'linear_in.npy'), 'wb').write(npy(np.array(x, dtype=np.float32)))
open(os.path.join(D, 'linear_out.npy'), 'wb').write(npy(y))
s = io.StringIO(); np.savetxt(s, y, delimiter=',', fmt='%s')
open(os.path.join(D, 'linear_out.csv'), 'w').write(s.getvalue())
i = np.arange(-3, 3, dtype=np.int64).reshape(2, 3)
open(os.path.join(D, 'double_in.npy'), 'wb').write(npy(i))
open(os.path.join(D, 'double_out.npy'), 'wb').write(npy((torch.from_numpy(i) * 2).numpy()))
open(os.path.join(D, 'linear_param_bytes'), 'w').write(str(sum(p.numel() * p.element_size() for p in lin.parameters())))
)";

class TorchScriptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("kiln_torchscript_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    std::ofstream(*dir_ / "gen.py") << kFixtureScript;
    std::string cmd = "/usr/bin/python3 '" + (*dir_ / "gen.py").string() + "' '" + dir_->string() + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string output;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) output.append(buf, n);
    fixtures_ok_ = pclose(p) == 0;
    if (!fixtures_ok_) std::fprintf(stderr, "fixture script failed (python3-torch missing?):\n%s\n", output.c_str());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(TorchScriptAvailable());
    if (!fixtures_ok_) GTEST_SKIP() << "python3-torch could not write the test models";
  }

  static std::unique_ptr<InferenceBackend> Load(const std::string& model, TorchScriptOptions o = {}) {
    o.model_dir = (*dir_ / model).string();
    auto b = CreateTorchScriptBackend(o);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    EXPECT_TRUE((*b)->Start().ok());
    Status s = (*b)->WaitUntilLoaded(milliseconds(60'000));
    EXPECT_TRUE(s.ok()) << s.ToString();
    return std::move(*b);
  }

  static InferenceRequest Req(std::string content_type, std::string body, std::string accept = "") {
    InferenceRequest r;
    r.content_type = std::move(content_type);
    r.body = std::move(body);
    r.accept = std::move(accept);
    return r;
  }

  static InferenceResponse Call(InferenceBackend& b, InferenceRequest r) {
    auto promise = std::make_shared<std::promise<InferenceResponse> >();
    auto future = promise->get_future();
    b.Invoke(std::move(r), [promise](InferenceResponse resp) { promise->set_value(std::move(resp)); });
    if (future.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      ADD_FAILURE() << "no answer within 60 s";
      return {};
    }
    return future.get();
  }

  static std::string Fixture(const std::string& name) { return ReadFile(*dir_ / name); }

  static fs::path* dir_;
  static bool fixtures_ok_;
};

fs::path* TorchScriptTest::dir_ = nullptr;
bool TorchScriptTest::fixtures_ok_ = false;

TEST_F(TorchScriptTest, JsonAndCsvInAnswerWhatPyTorchComputes) {
  auto b = Load("linear");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->state(), BackendState::kReady);
  EXPECT_EQ(b->workers(), 1);
  EXPECT_EQ(b->MemoryBytes(), std::stoull(Fixture("linear_param_bytes")));

  InferenceResponse r = Call(*b, Req("application/json", Fixture("linear_in.json")));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(r.body, Fixture("linear_out.json"));

  r = Call(*b, Req("text/csv", "1,2,3\n4,-5.5,0.25\n", "application/json"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, Fixture("linear_out.json"));

  r = Call(*b, Req("application/json; charset=utf-8", Fixture("linear_in.json"), "text/csv"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "text/csv");
  EXPECT_EQ(r.body, Fixture("linear_out.csv"));
}

TEST_F(TorchScriptTest, NpyInKeepsItsDtypeAndNpyOutIsWhatNumpyWrites) {
  auto linear = Load("linear");
  ASSERT_NE(linear, nullptr);
  InferenceResponse r = Call(*linear, Req("application/x-npy", Fixture("linear_in.npy"), "application/x-npy"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "application/x-npy");
  EXPECT_EQ(r.body, Fixture("linear_out.npy"));

  auto dbl = Load("double");
  ASSERT_NE(dbl, nullptr);
  r = Call(*dbl, Req("application/x-npy", Fixture("double_in.npy"), "application/x-npy"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, Fixture("double_out.npy"));
  r = Call(*dbl, Req("application/x-npy", Fixture("double_in.npy"), "application/json"));
  EXPECT_EQ(r.body, "[[-6, -4, -2], [0, 2, 4]]");
  // JSON decodes to float32, as torch.FloatTensor does.
  r = Call(*dbl, Req("application/json", "[1, 2]"));
  EXPECT_EQ(r.body, "[2.0, 4.0]");
  // A bare number is a 0-d tensor.
  r = Call(*dbl, Req("application/json", "5"));
  EXPECT_EQ(r.body, "10.0");
}

// The same model, the same requests: Kiln's Python path (python/kiln_toolkit, the PyTorch defaults
// a worker runs without inference.py) and this backend answer the same status and bytes. Where they
// differ on purpose, not compared here: a bare JSON number (the toolkit's torch.FloatTensor(5) is an
// uninitialised tensor of five elements; here a 0-d tensor) and tuple outputs (the Python path
// JSON-encodes them as nested lists; here 500, NonTensorOutputIs500).
constexpr const char* kParityScript = R"(
import io, json, os, sys
import numpy as np
D, TOOLKIT = sys.argv[1], sys.argv[2]
sys.path.insert(0, TOOLKIT)
import kiln_serve_codecs as codecs
from kiln_serve_handlers import PytorchDefaults

def npy(a):
    b = io.BytesIO(); np.save(b, a); return b.getvalue()

cases = [
    ('linear', 'application/json', b'[[1, 2, 3], [4, -5.5, 0.25]]', 'application/json'),
    ('linear', 'text/csv', b'1,2,3\n4,-5.5,0.25\n', 'text/csv'),
    ('linear', 'text/csv', b'1,2,3', 'application/json'),
    ('linear', 'text/csv; charset=utf-8', b'0.5,"2",3\r\n', 'application/x-npy'),
    ('linear', 'application/x-npy', npy(np.array([[0.1, 0.2, 0.3]], dtype=np.float32)), 'application/x-npy'),
    ('linear', 'application/x-npy', npy(np.ones((2, 3), dtype=np.float64)), 'application/json'),
    ('double', 'application/x-npy', npy(np.arange(-3, 3, dtype=np.int64).reshape(2, 3)), 'application/json'),
    ('double', 'application/x-npy', npy(np.array([[1, 2]], dtype=np.int8)), 'text/csv'),
    ('double', 'application/x-npy', npy(np.array([0.1, 1e300, -2.5e-7])), 'text/csv'),
    ('double', 'application/json', b'[true, false, 2]', 'text/csv'),
    ('double', 'application/json', b'[0.1, 1e20, 3, 1e-05, 123456789]', 'application/json'),
    ('double', 'application/json', b'[[0.1, 1e20], [3, 1e-05]]', 'text/csv'),
    ('double', 'application/json', b'[]', 'application/x-npy'),
    ('linear', 'application/json', b'[[1, 2], [3]]', 'application/json'),
    ('linear', 'application/json', b'[1, null]', 'application/json'),
    ('linear', 'text/csv', b'1,x,3', 'application/json'),
    ('linear', 'text/plain', b'1,2,3', 'application/json'),
    ('linear', 'application/json', b'[[1, 2, 3]]', 'text/html'),
    ('linear', 'application/json', b'[[1, 2, 3]]', 'text/html, application/x-npy'),
    ('linear', 'application/json', b'[[1, 2, 3, 4]]', 'application/json'),
]
handlers = {}
for i, (model, ct, body, accept) in enumerate(cases):
    if model not in handlers:
        d = PytorchDefaults(os.path.join(D, model))
        d.setup(True)
        handlers[model] = (d, d.model_fn(os.path.join(D, model)))
    d, m = handlers[model]
    try:
        data = body.decode() if codecs.media_type(ct) in codecs.UTF8_TYPES else body
        out, out_ct = d.output_fn(d.predict_fn(d.input_fn(data, ct), m), accept)
        status = 200
    except Exception as e:
        status, out, out_ct = codecs.status_of(e), b'', ''
    open(os.path.join(D, 'parity_%d.in' % i), 'wb').write(body)
    open(os.path.join(D, 'parity_%d.out' % i), 'wb').write(out)
    json.dump({'model': model, 'content_type': ct, 'accept': accept, 'status': status, 'out_type': out_ct},
              open(os.path.join(D, 'parity_%d.json' % i), 'w'))
open(os.path.join(D, 'parity_count'), 'w').write(str(len(cases)))
)";

TEST_F(TorchScriptTest, AnswersWhatKilnsPythonPathAnswers) {
  fs::path toolkit = fs::path(__FILE__).parent_path() / ".." / ".." / "python" / "kiln_toolkit";
  if (!fs::exists(toolkit / "kiln_serve_handlers.py")) GTEST_SKIP() << "no python/kiln_toolkit beside the sources";
  std::ofstream(*dir_ / "parity.py") << kParityScript;
  std::string cmd = "/usr/bin/python3 '" + (*dir_ / "parity.py").string() + "' '" + dir_->string() + "' '" +
                    toolkit.string() + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string output;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) output.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << output;

  std::map<std::string, std::unique_ptr<InferenceBackend> > backends;
  int count = std::stoi(Fixture("parity_count"));
  ASSERT_EQ(count, 20);
  for (int i = 0; i < count; ++i) {
    std::string prefix = "parity_" + std::to_string(i);
    auto meta = nlohmann::json::parse(Fixture(prefix + ".json"));
    SCOPED_TRACE(prefix + ": " + meta.dump());
    std::string model = meta["model"];
    if (!backends.count(model)) backends[model] = Load(model);
    ASSERT_NE(backends[model], nullptr);
    InferenceResponse r = Call(*backends[model], Req(meta["content_type"], Fixture(prefix + ".in"), meta["accept"]));
    EXPECT_EQ(r.status, meta["status"].get<int>()) << r.body;
    if (r.status == 200) {
      EXPECT_EQ(r.content_type, meta["out_type"].get<std::string>());
      EXPECT_EQ(r.body, Fixture(prefix + ".out"));
    }
  }
}

TEST_F(TorchScriptTest, NegotiatesAcceptLikeTheToolkit) {
  auto b = Load("double", {.default_accept = "application/x-npy"});
  ASSERT_NE(b, nullptr);
  struct Case {
    const char* accept;
    int status;
    const char* content_type;
  } cases[] = {
      {"", 200, "application/x-npy"},
      {"*/*", 200, "application/x-npy"},
      {"text/html, text/csv;q=0.9, application/json", 200, "text/csv"},
      {"Application/JSON", 200, "application/json"},
      {"text/html, */*", 200, "application/json"},
      {"text/html", 415, "application/json"},
      {"image/png, text/plain", 415, "application/json"},
  };
  for (const Case& c : cases) {
    InferenceResponse r = Call(*b, Req("application/json", "[1, 2]", c.accept));
    EXPECT_EQ(r.status, c.status) << c.accept << ": " << r.body;
    EXPECT_EQ(r.content_type, c.content_type) << c.accept;
    if (c.status == 415) {
      auto body = nlohmann::json::parse(r.body);
      EXPECT_EQ(body["code"], 415);
      EXPECT_EQ(body["type"], "UnsupportedFormatError");
      EXPECT_NE(body["message"].get<std::string>().find(c.accept), std::string::npos) << r.body;
    }
  }
}

TEST_F(TorchScriptTest, BadInputAnswers4xxAndModelErrors500) {
  auto b = Load("linear");
  ASSERT_NE(b, nullptr);
  InferenceResponse r = Call(*b, Req("text/plain", "1,2,3"));
  EXPECT_EQ(r.status, 415);
  EXPECT_NE(r.body.find("text/plain"), std::string::npos);
  r = Call(*b, Req("", "[1, 2, 3]"));
  EXPECT_EQ(r.status, 415);
  EXPECT_NE(r.body.find("no Content-Type"), std::string::npos) << r.body;

  r = Call(*b, Req("application/json", "[[1, 2], [3]]"));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("BadRequestError"), std::string::npos);
  EXPECT_NE(r.body.find("not rectangular"), std::string::npos) << r.body;
  r = Call(*b, Req("application/x-npy", "not npy"));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("not a NumPy .npy"), std::string::npos) << r.body;
  r = Call(*b, Req("text/csv", "1,x"));
  EXPECT_EQ(r.status, 400);

  // Four features into Linear(3, 2): libtorch's own message, one line.
  r = Call(*b, Req("application/json", "[[1, 2, 3, 4]]"));
  EXPECT_EQ(r.status, 500);
  auto body = nlohmann::json::parse(r.body);
  EXPECT_EQ(body["type"], "ModelError");
  std::string message = body["message"];
  EXPECT_NE(message.find("mat1 and mat2 shapes cannot be multiplied"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;

  // The backend keeps serving after errors.
  r = Call(*b, Req("application/json", Fixture("linear_in.json")));
  EXPECT_EQ(r.status, 200);
}

TEST_F(TorchScriptTest, NonTensorOutputIs500) {
  auto b = Load("pair");
  ASSERT_NE(b, nullptr);
  InferenceResponse r = Call(*b, Req("application/json", "[1]"));
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("returned a Tuple"), std::string::npos) << r.body;
}

TEST_F(TorchScriptTest, FullQueueAnswers503Inline) {
  auto b = Load("slow", {.workers = 1, .queue_size = 2});
  ASSERT_NE(b, nullptr);
  std::mutex mu;
  std::vector<int> statuses;
  std::atomic<int> answered{0};
  auto done = [&](InferenceResponse r) {
    std::lock_guard<std::mutex> lock(mu);
    statuses.push_back(r.status);
    ++answered;
  };
  // One running and two waiting at most: of five sent at once, the last two are refused within
  // Invoke, and the third as well when the worker had not taken the first yet.
  for (int i = 0; i < 5; ++i) b->Invoke(Req("application/json", "[100]"), done);
  int inline_refusals;
  {
    std::lock_guard<std::mutex> lock(mu);
    inline_refusals = static_cast<int>(statuses.size());
    for (int s : statuses) EXPECT_EQ(s, 503);
  }
  EXPECT_GE(inline_refusals, 2);
  EXPECT_LE(inline_refusals, 3);
  for (int i = 0; i < 600 && answered.load() < 5; ++i) std::this_thread::sleep_for(milliseconds(100));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(statuses.size(), 5u);
  EXPECT_EQ(std::count(statuses.begin(), statuses.end(), 200), 5 - inline_refusals);
}

TEST_F(TorchScriptTest, RequestsPastTheTimeoutAnswer504Once) {
  auto b = Load("slow", {.workers = 1, .timeout = milliseconds(100)});
  ASSERT_NE(b, nullptr);
  std::mutex mu;
  std::vector<std::string> bodies;
  std::vector<int> statuses;
  auto done = [&](InferenceResponse r) {
    std::lock_guard<std::mutex> lock(mu);
    statuses.push_back(r.status);
    bodies.push_back(r.body);
  };
  auto start = std::chrono::steady_clock::now();
  b->Invoke(Req("application/json", "[300]"), done);  // runs for 0.2 s or more
  b->Invoke(Req("application/json", "[1]"), done);    // waits behind it
  for (int i = 0; i < 300; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (statuses.size() == 2) break;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(statuses.size(), 2u);
    EXPECT_EQ(statuses[0], 504);
    EXPECT_EQ(statuses[1], 504);
    std::string all = bodies[0] + bodies[1];
    EXPECT_NE(all.find("the request ran past"), std::string::npos) << all;
    EXPECT_NE(all.find("the request waited past"), std::string::npos) << all;
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(100));
  // Stop waits for the running forward(); its late result must not answer a second time.
  b->Stop(milliseconds(0));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(statuses.size(), 2u);
}

TEST_F(TorchScriptTest, ManyThreadsGetTheirOwnAnswers) {
  auto b = Load("double", {.workers = 4, .queue_size = 1000});
  ASSERT_NE(b, nullptr);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        int v = t * 100 + i;
        InferenceResponse r = Call(*b, Req("application/json", "[" + std::to_string(v) + "]"));
        if (r.status == 200 && r.body == "[" + std::to_string(2 * v) + ".0]") ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 16 * 25);
}

TEST_F(TorchScriptTest, StopAnswersQueuedRequests503) {
  auto b = Load("slow", {.workers = 1, .queue_size = 10});
  ASSERT_NE(b, nullptr);
  std::mutex mu;
  std::vector<int> statuses;
  auto done = [&](InferenceResponse r) {
    std::lock_guard<std::mutex> lock(mu);
    statuses.push_back(r.status);
  };
  for (int i = 0; i < 4; ++i) b->Invoke(Req("application/json", "[300]"), done);
  b->Stop(milliseconds(0));
  EXPECT_EQ(b->state(), BackendState::kStopped);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(statuses.size(), 4u);
  EXPECT_GE(std::count(statuses.begin(), statuses.end(), 503), 3);
  // After Stop, Invoke answers 503 inline.
  int after = 0;
  b->Invoke(Req("application/json", "[1]"), [&](InferenceResponse r) { after = r.status; });
  EXPECT_EQ(after, 503);
}

TEST_F(TorchScriptTest, ModelThatDoesNotLoadFailsWithTheReason) {
  fs::path bad = *dir_ / "bad";
  fs::create_directories(bad);
  std::ofstream(bad / "model.pt") << "not a zip archive";
  auto b = CreateTorchScriptBackend({.model_dir = bad.string()});
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->Start().ok());
  Status s = (*b)->WaitUntilLoaded(milliseconds(60'000));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot load the TorchScript model"), std::string::npos) << s.message();
  EXPECT_EQ((*b)->state(), BackendState::kFailed);
  EXPECT_EQ((*b)->load_error().message(), s.message());
  InferenceResponse r = Call(**b, Req("application/json", "[1]"));
  EXPECT_EQ(r.status, 503);
}

TEST_F(TorchScriptTest, FactoryChecksItsOptions) {
  auto missing = CreateTorchScriptBackend({.model_dir = (*dir_ / "nothing").string()});
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
  EXPECT_NE(missing.status().message().find("model.pt"), std::string::npos);
  EXPECT_TRUE(
      CreateTorchScriptBackend({.model_dir = (*dir_ / "linear").string(), .workers = 0}).status().IsInvalidArgument());
  EXPECT_TRUE(CreateTorchScriptBackend({.model_dir = (*dir_ / "linear").string(), .default_accept = "text/html"})
                  .status()
                  .IsInvalidArgument());
}

// Where libtorch or the plugin is missing, the factory says what to install. In a fresh process:
// the plugin is loaded once per process.
TEST(TorchScriptPluginTest, AMissingPluginSaysWhatToInstall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        fs::path dir = fs::temp_directory_path() / ("kiln_torchscript_plugin_test_" + std::to_string(getpid()));
        fs::create_directories(dir);
        std::ofstream(dir / "model.pt") << "x";
        setenv("KILN_MODEL_SERVER_TORCHSCRIPT_PLUGIN", "/nonexistent/libkiln_torchscript.so", 1);
        auto b = CreateTorchScriptBackend({.model_dir = dir.string()});
        fs::remove_all(dir);
        bool ok = !b.ok() && b.status().code() == StatusCode::kUnimplemented &&
                  b.status().message().find("/nonexistent/libkiln_torchscript.so: no such file") != std::string::npos &&
                  b.status().message().find("install libtorch-dev") != std::string::npos;
        if (!b.ok()) std::fprintf(stderr, "%s\n", b.status().message().c_str());
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "install libtorch-dev");
}

#endif  // KILN_HAVE_LIBTORCH

}  // namespace
}  // namespace kiln::modelserver
