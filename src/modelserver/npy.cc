#include "modelserver/npy.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <cstdlib>

#include "base/json_parse.h"

namespace kiln::modelserver {

static_assert(std::endian::native == std::endian::little,
              "NdArray keeps little-endian bytes and reads them as native values");

namespace {

// Largest element count any codec accepts: far above what a request body can carry (bodies are
// bounded by SAGEMAKER_MAX_PAYLOAD_IN_MB), low enough that numel * 8 never overflows.
constexpr int64_t kMaxElements = int64_t{1} << 50;
constexpr size_t kMaxJsonDims = 32;

std::string ShapeString(const std::vector<int64_t>& shape) {
  // Python's tuple repr: (), (3,), (2, 3).
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ",";
  out += ")";
  return out;
}

std::string_view DescrOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kInt64: return "<i8";
    case DType::kInt32: return "<i4";
    case DType::kInt16: return "<i2";
    case DType::kInt8: return "|i1";
    case DType::kUInt8: return "|u1";
    case DType::kBool: return "|b1";
  }
  return "?";
}

// --- Python's float repr (and numpy's str of a float scalar, which follows the same rules) ---

// `sci` is std::to_chars's shortest scientific form of a finite, non-negative value ("1.5e+20",
// "1e-05"). Positional between 1e-4 and 1e16, scientific otherwise, as repr() and numpy do.
std::string ReprFromScientific(std::string_view sci) {
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exp = 0;
  std::string_view exp_text = sci.substr(e + 1);
  if (!exp_text.empty() && exp_text[0] == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp);
  if (digits == "0") return "0.0";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() < static_cast<size_t>(exp) + 1) digits.append(exp + 1 - digits.size(), '0');
      std::string out = digits.substr(0, exp + 1) + ".";
      std::string frac = digits.substr(exp + 1);
      return out + (frac.empty() ? "0" : frac);
    }
    return "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  }
  std::string out(1, digits[0]);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += exp < 0 ? "e-" : "e+";
  int a = exp < 0 ? -exp : exp;
  if (a < 10) out += "0";
  out += std::to_string(a);
  return out;
}

template <typename F>
std::string FormatFloat(F value, bool python_json) {
  if (std::isnan(value)) return python_json ? "NaN" : "nan";
  if (std::isinf(value)) {
    if (python_json) return value < 0 ? "-Infinity" : "Infinity";
    return value < 0 ? "-inf" : "inf";
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), std::fabs(value), std::chars_format::scientific);
  std::string out = std::signbit(value) ? "-" : "";
  return out + ReprFromScientific(std::string_view(buf, r.ptr - buf));
}

enum class TextStyle { kJson, kCsv };

// One element as json.dumps(tolist()) (kJson) or numpy's str (kCsv) writes it.
void AppendElement(const NdArray& a, int64_t index, TextStyle style, std::string& out) {
  const char* p = a.data.data() + index * static_cast<int64_t>(DTypeSize(a.dtype));
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (a.dtype) {
    case DType::kFloat32:
      // tolist() widens float32 to a Python float (a double); numpy's str prints the float32's own
      // shortest digits.
      out += style == TextStyle::kJson ? FormatFloat(static_cast<double>(load(float{})), true)
                                       : FormatFloat(load(float{}), false);
      return;
    case DType::kFloat64: out += FormatFloat(load(double{}), style == TextStyle::kJson); return;
    case DType::kInt64: out += std::to_string(load(int64_t{})); return;
    case DType::kInt32: out += std::to_string(load(int32_t{})); return;
    case DType::kInt16: out += std::to_string(load(int16_t{})); return;
    case DType::kInt8: out += std::to_string(load(int8_t{})); return;
    case DType::kUInt8: out += std::to_string(load(uint8_t{})); return;
    case DType::kBool:
      if (style == TextStyle::kJson) {
        out += *p ? "true" : "false";
      } else {
        out += *p ? "True" : "False";
      }
      return;
  }
}

// --- .npy header (a Python dict literal) ---

class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  void SkipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return i_ < s_.size() && s_[i_] == c;
  }
  Result<std::string> String() {
    SkipSpace();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return Error("a quoted string");
    char quote = s_[i_++];
    size_t end = s_.find(quote, i_);
    if (end == std::string_view::npos) return Error("a closing quote");
    std::string out(s_.substr(i_, end - i_));
    i_ = end + 1;
    return out;
  }
  Result<bool> Bool() {
    SkipSpace();
    for (auto [word, value] : {std::pair{std::string_view("True"), true}, {"False", false}}) {
      if (s_.substr(i_, word.size()) == word) {
        i_ += word.size();
        return value;
      }
    }
    return Error("True or False");
  }
  Result<std::vector<int64_t>> Shape() {
    if (!Consume('(')) return Error("a shape tuple");
    std::vector<int64_t> shape;
    while (!Consume(')')) {
      SkipSpace();
      uint64_t v = 0;
      size_t start = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        if (v > static_cast<uint64_t>(kMaxElements)) return Status::InvalidArgument("the .npy shape is too large");
        v = v * 10 + static_cast<uint64_t>(s_[i_++] - '0');
      }
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 longs
      if (i_ == start) return Error("a non-negative dimension");
      if (v > static_cast<uint64_t>(kMaxElements)) return Status::InvalidArgument("the .npy shape is too large");
      shape.push_back(static_cast<int64_t>(v));
      if (shape.size() > 64) return Status::InvalidArgument("the .npy shape has more than 64 dimensions");
      if (!Consume(',') && !Peek(')')) return Error("',' or ')' in the shape");
    }
    return shape;
  }
  bool AtEnd() {
    SkipSpace();
    return i_ == s_.size();
  }
  Status Error(std::string_view expected) const {
    return Status::InvalidArgument("malformed .npy header: expected " + std::string(expected) + " at offset " +
                                   std::to_string(i_) + " of \"" + std::string(s_.substr(0, 200)) + "\"");
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

Result<DType> DTypeFromDescr(std::string_view descr) {
  if (descr.size() < 2) return Status::InvalidArgument("the .npy dtype '" + std::string(descr) + "' is not supported");
  char order = descr[0];
  std::string_view kind = descr.substr(1);
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    order = '|';
    kind = descr;
  }
  if (kind.starts_with("O")) {
    return Status::InvalidArgument(
        "the .npy holds an object array (dtype 'O'), which cannot be decoded without pickle; send a numeric "
        "array");
  }
  struct Known {
    std::string_view kind;
    DType dtype;
  };
  static constexpr Known kKnown[] = {{"f4", DType::kFloat32}, {"f8", DType::kFloat64}, {"i8", DType::kInt64},
                                     {"i4", DType::kInt32},   {"i2", DType::kInt16},   {"i1", DType::kInt8},
                                     {"u1", DType::kUInt8},   {"b1", DType::kBool}};
  for (const Known& k : kKnown) {
    if (kind != k.kind) continue;
    if (order == '>' && DTypeSize(k.dtype) > 1) {
      return Status::InvalidArgument(
          "the .npy dtype '" + std::string(descr) +
          "' is big-endian; send little-endian data (array.astype(array.dtype.newbyteorder('<')))");
    }
    return k.dtype;
  }
  return Status::InvalidArgument("the .npy dtype '" + std::string(descr) +
                                 "' is not supported; use float32, float64, int64, int32, int16, int8, uint8 or bool");
}

Result<int64_t> CheckedNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return Status::InvalidArgument("negative dimension in shape " + ShapeString(shape));
    if (d != 0 && n > kMaxElements / d) {
      return Status::InvalidArgument("the shape " + ShapeString(shape) + " has too many elements");
    }
    n *= d;
  }
  return n;
}

// --- JSON ---

Status WalkJson(const nlohmann::json& node, size_t depth, const std::vector<int64_t>& shape, std::string& out) {
  if (depth == shape.size()) {
    float v;
    if (node.is_number()) {
      v = static_cast<float>(node.get<double>());
    } else if (node.is_boolean()) {
      v = node.get<bool>() ? 1.0f : 0.0f;
    } else if (node.is_array()) {
      return Status::InvalidArgument("the JSON array is not rectangular: a list where a number was expected at depth " +
                                     std::to_string(depth) + " (shape " + ShapeString(shape) + ")");
    } else {
      return Status::InvalidArgument(std::string("the JSON array holds a ") + node.type_name() +
                                     "; application/json bodies must be (nested lists of) numbers");
    }
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return Status::Ok();
  }
  if (!node.is_array() || static_cast<int64_t>(node.size()) != shape[depth]) {
    return Status::InvalidArgument("the JSON array is not rectangular: at depth " + std::to_string(depth) +
                                   " expected a list of " + std::to_string(shape[depth]) + " (shape " +
                                   ShapeString(shape) + ")");
  }
  for (const auto& child : node) {
    Status s = WalkJson(child, depth + 1, shape, out);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

void AppendRows(const NdArray& a, TextStyle style, std::string& out) {
  // Nested lists, recursively by dimension; `index` walks the elements in C order.
  int64_t index = 0;
  auto rec = [&](auto&& self, size_t dim) -> void {
    if (dim == a.shape.size()) {
      AppendElement(a, index++, style, out);
      return;
    }
    out += '[';
    for (int64_t i = 0; i < a.shape[dim]; ++i) {
      if (i > 0) out += ", ";
      self(self, dim + 1);
    }
    out += ']';
  };
  rec(rec, 0);
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kInt16: return 2;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool: return 1;
  }
  return 1;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kInt16: return "int16";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "?";
}

int64_t NdArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<NdArray> ParseNpy(std::string_view bytes) {
  static constexpr std::string_view kMagic("\x93NUMPY", 6);
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return Status::InvalidArgument("the body is not a NumPy .npy file (it does not start with \\x93NUMPY)");
  }
  uint8_t major = static_cast<uint8_t>(bytes[6]);
  uint8_t minor = static_cast<uint8_t>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return Status::InvalidArgument("unsupported .npy format version " + std::to_string(major) + "." +
                                   std::to_string(minor) + " (1.0, 2.0 and 3.0 are)");
  }
  size_t prefix = major == 1 ? 10 : 12;
  if (bytes.size() < prefix) return Status::InvalidArgument("the .npy file is truncated in its header");
  size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
  if (major > 1) {
    header_len |= (static_cast<size_t>(static_cast<uint8_t>(bytes[10])) << 16) |
                  (static_cast<size_t>(static_cast<uint8_t>(bytes[11])) << 24);
  }
  if (bytes.size() - prefix < header_len) {
    return Status::InvalidArgument("the .npy file is truncated: its header says " + std::to_string(header_len) +
                                   " bytes but " + std::to_string(bytes.size() - prefix) + " follow");
  }
  HeaderParser p(bytes.substr(prefix, header_len));
  if (!p.Consume('{')) return p.Error("'{'");
  std::string descr;
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  std::vector<int64_t> shape;
  while (!p.Consume('}')) {
    ASSIGN_OR_RETURN(std::string key, p.String());
    if (!p.Consume(':')) return p.Error("':'");
    if (key == "descr") {
      if (p.Peek('[')) {
        return Status::InvalidArgument("the .npy holds a structured array; send a plain numeric array");
      }
      ASSIGN_OR_RETURN(descr, p.String());
      have_descr = true;
    } else if (key == "fortran_order") {
      ASSIGN_OR_RETURN(fortran, p.Bool());
      have_order = true;
    } else if (key == "shape") {
      ASSIGN_OR_RETURN(shape, p.Shape());
      have_shape = true;
    } else {
      return Status::InvalidArgument("the .npy header has an unknown key '" + key + "'");
    }
    if (!p.Consume(',') && !p.Peek('}')) return p.Error("',' or '}'");
  }
  if (!p.AtEnd()) return p.Error("the end of the header");
  if (!have_descr || !have_order || !have_shape) {
    return Status::InvalidArgument("the .npy header lacks one of 'descr', 'fortran_order', 'shape'");
  }
  if (fortran) {
    return Status::InvalidArgument(
        "the .npy array is in Fortran order; send a C-ordered array (np.ascontiguousarray(array))");
  }
  NdArray out;
  ASSIGN_OR_RETURN(out.dtype, DTypeFromDescr(descr));
  ASSIGN_OR_RETURN(int64_t numel, CheckedNumel(shape));
  out.shape = std::move(shape);
  uint64_t need = static_cast<uint64_t>(numel) * DTypeSize(out.dtype);
  std::string_view data = bytes.substr(prefix + header_len);
  if (data.size() != need) {
    return Status::InvalidArgument(std::string("the .npy data ") +
                                   (data.size() < need ? "is truncated" : "is too long") + ": shape " +
                                   ShapeString(out.shape) + " of " + std::string(DTypeName(out.dtype)) + " needs " +
                                   std::to_string(need) + " bytes, the file holds " + std::to_string(data.size()));
  }
  out.data.assign(data);
  return out;
}

std::string WriteNpy(const NdArray& array) {
  std::string header = "{'descr': '" + std::string(DescrOf(array.dtype)) +
                       "', 'fortran_order': False, 'shape': " + ShapeString(array.shape) + ", }";
  // As numpy.lib.format: pad with spaces so that magic + version + length + header + '\n' is a
  // multiple of 64 (a full 64 when it already is).
  auto padded = [&](size_t prefix) {
    size_t hlen = header.size() + 1;
    size_t pad = 64 - ((prefix + hlen) % 64);
    return header + std::string(pad, ' ') + "\n";
  };
  std::string h = padded(10);
  std::string out("\x93NUMPY", 6);
  if (h.size() <= 0xffff) {
    out += '\x01';
    out += '\x00';
    out += static_cast<char>(h.size() & 0xff);
    out += static_cast<char>(h.size() >> 8);
  } else {
    h = padded(12);
    out += '\x02';
    out += '\x00';
    for (int i = 0; i < 4; ++i) out += static_cast<char>((h.size() >> (8 * i)) & 0xff);
  }
  out += h;
  out += array.data;
  return out;
}

Result<NdArray> ParseJsonArray(std::string_view text) {
  auto doc = ParseJsonBounded(text, {.max_depth = kMaxJsonDims});
  if (!doc.ok()) {
    return Status::InvalidArgument("the application/json body is not a JSON array of numbers: " +
                                   doc.status().message());
  }
  NdArray out;
  out.dtype = DType::kFloat32;
  const nlohmann::json* node = &*doc;
  while (node->is_array()) {
    out.shape.push_back(static_cast<int64_t>(node->size()));
    if (node->empty()) break;
    node = &(*node)[0];
  }
  // Every element is one JSON value of at least one byte: numel is bounded by the text size.
  out.data.reserve(static_cast<size_t>(out.numel()) * sizeof(float));
  RETURN_IF_ERROR(WalkJson(*doc, 0, out.shape, out.data));
  return out;
}

Result<NdArray> ParseCsv(std::string_view text) {
  NdArray out;
  out.dtype = DType::kFloat32;
  int64_t rows = 0, cols = -1;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // csv.reader yields no cells for an empty line
    int64_t n = 0;
    size_t i = 0;
    while (true) {
      // One cell as Python's csv.reader splits it: a cell that starts with '"' is quoted ("" for a
      // quote); the cell is then read as float() reads it (surrounding blanks allowed).
      std::string cell;
      if (i < line.size() && line[i] == '"') {
        ++i;
        while (i < line.size()) {
          if (line[i] == '"') {
            if (i + 1 < line.size() && line[i + 1] == '"') {
              cell += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          cell += line[i++];
        }
        while (i < line.size() && line[i] != ',') cell += line[i++];
      } else {
        size_t comma = line.find(',', i);
        size_t stop = comma == std::string_view::npos ? line.size() : comma;
        cell.assign(line.substr(i, stop - i));
        i = stop;
      }
      std::string_view field = Trim(cell);
      if (!field.empty() && field.front() == '+') field.remove_prefix(1);
      double v = 0;
      auto r = std::from_chars(field.data(), field.data() + field.size(), v);
      bool whole = !field.empty() && r.ptr == field.data() + field.size();
      if (whole && r.ec == std::errc::result_out_of_range) {
        // 1e999 or 1e-999: Python's float() gives inf or 0 (or a subnormal); so does strtod.
        v = std::strtod(std::string(field).c_str(), nullptr);
      } else if (!whole || r.ec != std::errc()) {
        return Status::InvalidArgument("text/csv line " + std::to_string(line_no) + ": cell " + std::to_string(n + 1) +
                                       " ('" + std::string(field.substr(0, 40)) + "') is not a number");
      }
      float f = static_cast<float>(v);
      out.data.append(reinterpret_cast<const char*>(&f), sizeof(f));
      ++n;
      if (i >= line.size()) break;
      ++i;  // the comma
    }
    if (cols >= 0 && n != cols) {
      return Status::InvalidArgument("text/csv line " + std::to_string(line_no) + " has " + std::to_string(n) +
                                     " cells where the lines before have " + std::to_string(cols) +
                                     "; every row needs the same number");
    }
    cols = n;
    ++rows;
  }
  if (rows == 0) return Status::InvalidArgument("the text/csv body holds no rows");
  out.shape = {rows, cols};
  return out;
}

std::string WriteJson(const NdArray& array) {
  std::string out;
  AppendRows(array, TextStyle::kJson, out);
  return out;
}

Result<std::string> WriteCsv(const NdArray& array) {
  if (array.shape.empty() || array.shape.size() > 2) {
    return Status::InvalidArgument("text/csv can carry only 1-D and 2-D arrays; this one has shape " +
                                   ShapeString(array.shape) + " (ask for application/json or application/x-npy)");
  }
  int64_t rows = array.shape[0];
  int64_t cols = array.shape.size() == 2 ? array.shape[1] : 1;
  std::string out;
  int64_t index = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (c > 0) out += ',';
      AppendElement(array, index++, TextStyle::kCsv, out);
    }
    out += '\n';
  }
  return out;
}

}  // namespace kiln::modelserver
