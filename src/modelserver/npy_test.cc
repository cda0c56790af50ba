#include "modelserver/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::modelserver {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<float> Floats(const NdArray& a) {
  std::vector<float> v(a.data.size() / sizeof(float));
  std::memcpy(v.data(), a.data.data(), v.size() * sizeof(float));
  return v;
}

NdArray F32(std::vector<int64_t> shape, std::vector<float> values) {
  NdArray a;
  a.dtype = DType::kFloat32;
  a.shape = std::move(shape);
  a.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return a;
}

// numpy 1.24's np.save of np.arange(6, dtype=np.float32).reshape(2, 3).
std::string GoldenArange6() {
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  h += std::string(117 - h.size(), ' ') + "\n";
  std::string out = std::string("\x93NUMPY\x01\x00", 8) + "v" + std::string(1, '\0') + h;
  for (int i = 0; i < 6; ++i) {
    float f = static_cast<float>(i);
    out.append(reinterpret_cast<const char*>(&f), 4);
  }
  return out;
}

TEST(NpyTest, ParsesAndWritesGoldenBytes) {
  std::string golden = GoldenArange6();
  ASSERT_EQ(golden.size(), 128u + 24u);
  auto a = ParseNpy(golden);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dtype, DType::kFloat32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Floats(*a), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(WriteNpy(*a), golden);
  EXPECT_EQ(WriteJson(*a), "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]");
  auto csv = WriteCsv(*a);
  ASSERT_TRUE(csv.ok());
  EXPECT_EQ(*csv, "0.0,1.0,2.0\n3.0,4.0,5.0\n");
}

TEST(NpyTest, FloatsPrintAsPythonAndNumpyDo) {
  // Values and strings from numpy 1.24: json.dumps(a.tolist()) and np.savetxt(fmt="%s").
  NdArray a = F32({6}, {0.1f, 1e20f, 1e-5f, 1e16f, 123456789.0f, 3.0f});
  EXPECT_EQ(WriteJson(a),
            "[0.10000000149011612, 1.0000000200408773e+20, 9.999999747378752e-06, 1.0000000272564224e+16, "
            "123456792.0, 3.0]");
  EXPECT_EQ(*WriteCsv(a), "0.1\n1e+20\n1e-05\n1e+16\n123456790.0\n3.0\n");
  NdArray special = F32({4}, {NAN, INFINITY, -INFINITY, -0.0f});
  EXPECT_EQ(WriteJson(special), "[NaN, Infinity, -Infinity, -0.0]");
  EXPECT_EQ(*WriteCsv(special), "nan\ninf\n-inf\n-0.0\n");
}

// Runs /usr/bin/python3 with numpy to write fixtures into `dir`; false when numpy is missing.
bool RunNumpy(const fs::path& dir, const std::string& script) {
  fs::path py = dir / "gen.py";
  std::ofstream(py) << "import numpy as np, json, io, os, sys\nD = sys.argv[1]\n" << script;
  std::string cmd = "/usr/bin/python3 '" + py.string() + "' '" + dir.string() + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  char buf[4096];
  std::string output;
  while (size_t n = fread(buf, 1, sizeof(buf), p)) output.append(buf, n);
  int rc = pclose(p);
  if (rc != 0) std::fprintf(stderr, "python3 fixture script failed: %s\n", output.c_str());
  return rc == 0;
}

class NpyNumpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_npy_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "python3-numpy is not installed";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Every dtype and several shapes: our parse, re-write, JSON and CSV agree byte for byte with numpy.
TEST_F(NpyNumpyTest, RoundTripsEveryDtypeLikeNumpy) {
  ASSERT_TRUE(RunNumpy(dir_, R"(
rng = np.random.default_rng(7)
cases = []
for dt in ['float32', 'float64', 'int64', 'int32', 'int16', 'int8', 'uint8', 'bool']:
    for shape in [(), (3,), (2, 3), (0,), (2, 0, 3), (2, 2, 2)]:
        a = (rng.standard_normal(shape) * 1000).astype(dt) if dt != 'bool' else rng.standard_normal(shape) > 0
        cases.append((dt, shape, a))
big = np.array([1e-7, 3.4e38, -2.5e-3, 12345.678, 1e15, 7e-5], dtype=np.float32)
cases.append(('float32', big.shape, big))
cases.append(('float64', big.shape, big.astype(np.float64) * 1.1))
for i, (dt, shape, a) in enumerate(cases):
    b = io.BytesIO(); np.save(b, a); open(os.path.join(D, '%d.npy' % i), 'wb').write(b.getvalue())
    open(os.path.join(D, '%d.json' % i), 'w').write(json.dumps(a.tolist()))
    if 1 <= a.ndim <= 2:
        s = io.StringIO(); np.savetxt(s, a, delimiter=',', fmt='%s'); open(os.path.join(D, '%d.csv' % i), 'w').write(s.getvalue())
open(os.path.join(D, 'count'), 'w').write(str(len(cases)))
)"));
  int count = std::stoi(ReadFile(dir_ / "count"));
  ASSERT_EQ(count, 50);
  for (int i = 0; i < count; ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    std::string npy = ReadFile(dir_ / (std::to_string(i) + ".npy"));
    auto a = ParseNpy(npy);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(static_cast<int64_t>(a->data.size()), a->numel() * static_cast<int64_t>(DTypeSize(a->dtype)));
    EXPECT_EQ(WriteNpy(*a), npy);
    EXPECT_EQ(WriteJson(*a), ReadFile(dir_ / (std::to_string(i) + ".json")));
    fs::path csv = dir_ / (std::to_string(i) + ".csv");
    if (fs::exists(csv)) {
      auto out = WriteCsv(*a);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(*out, ReadFile(csv));
    } else {
      EXPECT_FALSE(WriteCsv(*a).ok());
    }
  }
}

TEST_F(NpyNumpyTest, ReadsVersion2And3Headers) {
  ASSERT_TRUE(RunNumpy(dir_, R"(
a = np.arange(12, dtype=np.int16).reshape(3, 4)
for v in [(2, 0), (3, 0)]:
    with open(os.path.join(D, 'v%d.npy' % v[0]), 'wb') as f:
        np.lib.format.write_array(f, a, version=v)
)"));
  for (const char* name : {"v2.npy", "v3.npy"}) {
    auto a = ParseNpy(ReadFile(dir_ / name));
    ASSERT_TRUE(a.ok()) << name << ": " << a.status().ToString();
    EXPECT_EQ(a->dtype, DType::kInt16);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(WriteJson(*a), "[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]");
  }
}

TEST_F(NpyNumpyTest, RejectsWhatItCannotDecodeWithReasons) {
  ASSERT_TRUE(RunNumpy(dir_, R"(
def save(name, a):
    b = io.BytesIO(); np.save(b, a, allow_pickle=True); open(os.path.join(D, name), 'wb').write(b.getvalue())
save('fortran.npy', np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
save('big_endian.npy', np.ones(3, dtype='>f4'))
save('object.npy', np.array([1, 'a'], dtype=object))
save('half.npy', np.ones(3, dtype=np.float16))
save('complex.npy', np.ones(3, dtype=np.complex64))
save('structured.npy', np.zeros(2, dtype=[('a', '<i4'), ('b', '<f4')]))
)"));
  struct Case {
    const char* file;
    const char* needle;
  } cases[] = {{"fortran.npy", "Fortran order"},    {"big_endian.npy", "big-endian"},
               {"object.npy", "object array"},      {"half.npy", "'<f2' is not supported"},
               {"complex.npy", "is not supported"}, {"structured.npy", "structured"}};
  for (const Case& c : cases) {
    auto a = ParseNpy(ReadFile(dir_ / c.file));
    ASSERT_FALSE(a.ok()) << c.file;
    EXPECT_TRUE(a.status().IsInvalidArgument());
    EXPECT_NE(a.status().message().find(c.needle), std::string::npos) << c.file << ": " << a.status().message();
  }
}

TEST(NpyTest, RejectsTruncatedLongAndAbsurdInput) {
  std::string golden = GoldenArange6();
  auto truncated = ParseNpy(golden.substr(0, golden.size() - 1));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(
      truncated.status().message().find("is truncated: shape (2, 3) of float32 needs 24 bytes, the file holds 23"),
      std::string::npos)
      << truncated.status().message();
  EXPECT_NE(ParseNpy(golden + "x").status().message().find("too long"), std::string::npos);
  EXPECT_NE(ParseNpy(golden.substr(0, 60)).status().message().find("header says 118 bytes"), std::string::npos);
  EXPECT_NE(ParseNpy("hello world").status().message().find("not a NumPy .npy"), std::string::npos);
  EXPECT_FALSE(ParseNpy("").ok());

  auto with_header = [](const std::string& dict) {
    std::string h = dict + "\n";
    return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size()) + std::string(1, '\0') + h;
  };
  // 2^40 x 2^40 elements: the product overflows the bound, no allocation happens.
  auto absurd =
      ParseNpy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }"));
  ASSERT_FALSE(absurd.ok());
  EXPECT_NE(absurd.status().message().find("too many elements"), std::string::npos) << absurd.status().message();
  auto huge_dim =
      ParseNpy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }"));
  EXPECT_NE(huge_dim.status().message().find("too large"), std::string::npos) << huge_dim.status().message();
  // A plausible shape whose data is absent is truncated, not allocated.
  auto empty_data = ParseNpy(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000), }"));
  EXPECT_NE(empty_data.status().message().find("truncated"), std::string::npos);
  EXPECT_NE(ParseNpy(with_header("{'descr': '<f4', 'shape': (1,), }")).status().message().find("lacks"),
            std::string::npos);
  EXPECT_NE(ParseNpy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"))
                .status()
                .message()
                .find("unknown key 'x'"),
            std::string::npos);
  EXPECT_NE(ParseNpy(with_header("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,)}"))
                .status()
                .message()
                .find("malformed .npy header: expected True or False"),
            std::string::npos);
  EXPECT_NE(ParseNpy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"))
                .status()
                .message()
                .find("non-negative dimension"),
            std::string::npos);
  std::string v9 = golden;
  v9[6] = 9;
  EXPECT_NE(ParseNpy(v9).status().message().find("version 9.0"), std::string::npos);
}

TEST(NpyTest, ParsesJsonAsFloat32) {
  auto a = ParseJsonArray("[[1, 2.5, true], [false, -3e2, 0.1]]");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dtype, DType::kFloat32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Floats(*a), (std::vector<float>{1, 2.5f, 1, 0, -300, 0.1f}));

  auto scalar = ParseJsonArray(" 4.5 ");
  ASSERT_TRUE(scalar.ok());
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(Floats(*scalar), std::vector<float>{4.5f});

  auto empty = ParseJsonArray("[]");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->shape, std::vector<int64_t>{0});
  auto empty2 = ParseJsonArray("[[], []]");
  ASSERT_TRUE(empty2.ok());
  EXPECT_EQ(empty2->shape, (std::vector<int64_t>{2, 0}));
}

TEST(NpyTest, RejectsJsonThatIsNotARectangularNumberArray) {
  struct Case {
    const char* text;
    const char* needle;
  } cases[] = {
      {"[[1, 2], [3]]", "not rectangular"},
      {"[[1, 2], 3]", "not rectangular"},
      {"[1, [2]]", "not rectangular"},
      {"[[], [1]]", "not rectangular"},
      {"[1, \"a\"]", "holds a string"},
      {"{\"instances\": [1]}", "holds a object"},
      {"[1, null]", "holds a null"},
      {"[1, 2", "not a JSON array"},
      {"", "not a JSON array"},
  };
  for (const Case& c : cases) {
    auto a = ParseJsonArray(c.text);
    ASSERT_FALSE(a.ok()) << c.text;
    EXPECT_TRUE(a.status().IsInvalidArgument());
    EXPECT_NE(a.status().message().find(c.needle), std::string::npos) << c.text << ": " << a.status().message();
  }
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto d = ParseJsonArray(deep);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("deeper"), std::string::npos) << d.status().message();
}

TEST(NpyTest, ParsesCsvAsRowsOfNumbers) {
  struct Case {
    const char* text;
    std::vector<int64_t> shape;
    std::vector<float> values;
  } cases[] = {
      {"1,2\n3,4\n", {2, 2}, {1, 2, 3, 4}},
      {"1,2,3", {1, 3}, {1, 2, 3}},
      {"1\n2\n3\n", {3, 1}, {1, 2, 3}},
      {"5", {1, 1}, {5}},
      {" 1.5 , -2e3 ,+4\r\n\n0.1,nan,inf\r\n", {2, 3}, {1.5f, -2000, 4, 0.1f, NAN, INFINITY}},
      {"\"1\", 2,\" 3 \"", {1, 3}, {1, 2, 3}},
      {"1e999,-1e999,1e-999", {1, 3}, {INFINITY, -INFINITY, 0}},
  };
  for (const Case& c : cases) {
    auto a = ParseCsv(c.text);
    ASSERT_TRUE(a.ok()) << c.text << ": " << a.status().ToString();
    EXPECT_EQ(a->dtype, DType::kFloat32);
    EXPECT_EQ(a->shape, c.shape) << c.text;
    std::vector<float> got = Floats(*a);
    ASSERT_EQ(got.size(), c.values.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(c.values[i])) {
        EXPECT_TRUE(std::isnan(got[i]));
      } else {
        EXPECT_EQ(got[i], c.values[i]) << c.text << " [" << i << "]";
      }
    }
  }
}

TEST(NpyTest, RejectsBadCsv) {
  struct Case {
    const char* text;
    const char* needle;
  } cases[] = {
      {"1,2\n3\n", "line 2 has 1 cells where the lines before have 2"},
      {"1,,3", "cell 2 ('') is not a number"},
      {"1,abc", "cell 2 ('abc') is not a number"},
      {"0x10", "is not a number"},
      {"# comment\n1", "cell 1 ('# comment') is not a number"},
      {"1,\"2\"x\"", "cell 2 ('2x\"') is not a number"},
      {"\n\r\n\n", "holds no rows"},
      {"", "holds no rows"},
  };
  for (const Case& c : cases) {
    auto a = ParseCsv(c.text);
    ASSERT_FALSE(a.ok()) << c.text;
    EXPECT_NE(a.status().message().find(c.needle), std::string::npos) << c.text << ": " << a.status().message();
  }
}

TEST(NpyTest, CsvRefusesScalarsAndHigherRanks) {
  EXPECT_FALSE(WriteCsv(F32({}, {1})).ok());
  auto r = WriteCsv(F32({1, 1, 2}, {1, 2}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shape (1, 1, 2)"), std::string::npos);
}

}  // namespace
}  // namespace kiln::modelserver
