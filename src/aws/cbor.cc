#include "aws/cbor.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "base/encoding.h"
#include "base/time.h"

namespace kiln::aws {
namespace {

constexpr uint8_t kBreak = 0xff;

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // the continuation bytes are s[i+1 .. i+n]
    for (size_t k = 1; k <= n; ++k) {
      auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

double HalfToDouble(uint16_t half) {
  int exponent = (half >> 10) & 0x1f;
  int mantissa = half & 0x3ff;
  double value;
  if (exponent == 0) {
    value = std::ldexp(mantissa, -24);
  } else if (exponent != 31) {
    value = std::ldexp(mantissa + 1024, exponent - 25);
  } else {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  }
  return (half & 0x8000) ? -value : value;
}

class Decoder {
 public:
  Decoder(std::string_view bytes, const CborLimits& limits) : bytes_(bytes), limits_(limits) {}

  Result<nlohmann::json> Document() {
    nlohmann::json value;
    RETURN_IF_ERROR(Item(&value, 0));
    if (pos_ != bytes_.size()) return Error("trailing bytes after the data item");
    return value;
  }

 private:
  Status Error(std::string_view what) const {
    return Status::InvalidArgument("malformed CBOR at byte " + std::to_string(pos_) + ": " + std::string(what));
  }

  Status Byte(uint8_t* out) {
    if (pos_ >= bytes_.size()) return Error("unexpected end of input");
    *out = static_cast<uint8_t>(bytes_[pos_++]);
    return Status::Ok();
  }

  Status Be(int n, uint64_t* out) {
    if (bytes_.size() - pos_ < static_cast<size_t>(n)) return Error("unexpected end of input");
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(bytes_[pos_++]);
    *out = v;
    return Status::Ok();
  }

  // The argument of a head whose low five bits are `info` (24..27 read 1/2/4/8 bytes).
  Status Argument(uint8_t info, uint64_t* out) {
    if (info < 24) {
      *out = info;
      return Status::Ok();
    }
    switch (info) {
      case 24: return Be(1, out);
      case 25: return Be(2, out);
      case 26: return Be(4, out);
      case 27: return Be(8, out);
      default: return Error("reserved additional information value");
    }
  }

  Status Count() {
    if (++values_ > limits_.max_values) {
      return Error("more than " + std::to_string(limits_.max_values) + " data items");
    }
    return Status::Ok();
  }

  bool AtBreak() const { return pos_ < bytes_.size() && static_cast<uint8_t>(bytes_[pos_]) == kBreak; }

  // A byte or text string of major type `major` (definite or indefinite) appended to *out.
  Status String(int major, uint8_t info, std::string* out) {
    if (info == 31) {
      for (;;) {
        if (AtBreak()) {
          ++pos_;
          return Status::Ok();
        }
        uint8_t head = 0;
        RETURN_IF_ERROR(Byte(&head));
        if ((head >> 5) != major || (head & 0x1f) == 31) return Error("bad chunk in an indefinite-length string");
        RETURN_IF_ERROR(String(major, head & 0x1f, out));
      }
    }
    uint64_t length = 0;
    RETURN_IF_ERROR(Argument(info, &length));
    if (length > bytes_.size() - pos_) return Error("string longer than the input");
    out->append(bytes_.substr(pos_, static_cast<size_t>(length)));
    pos_ += static_cast<size_t>(length);
    return Status::Ok();
  }

  Status Item(nlohmann::json* out, int depth) {
    if (depth > limits_.max_depth) return Error("nested deeper than " + std::to_string(limits_.max_depth));
    RETURN_IF_ERROR(Count());
    uint8_t head = 0;
    RETURN_IF_ERROR(Byte(&head));
    const int major = head >> 5;
    const uint8_t info = head & 0x1f;
    switch (major) {
      case 0: {
        uint64_t v = 0;
        RETURN_IF_ERROR(Argument(info, &v));
        *out = v;
        return Status::Ok();
      }
      case 1: {
        uint64_t v = 0;
        RETURN_IF_ERROR(Argument(info, &v));
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return Error("negative integer out of range");
        *out = -1 - static_cast<int64_t>(v);
        return Status::Ok();
      }
      case 2: {
        std::string bytes;
        RETURN_IF_ERROR(String(2, info, &bytes));
        *out = Base64Encode(bytes);
        return Status::Ok();
      }
      case 3: {
        std::string text;
        RETURN_IF_ERROR(String(3, info, &text));
        if (!ValidUtf8(text)) return Error("text string is not valid UTF-8");
        *out = std::move(text);
        return Status::Ok();
      }
      case 4: {
        *out = nlohmann::json::array();
        if (info == 31) {
          while (!AtBreak()) {
            nlohmann::json element;
            RETURN_IF_ERROR(Item(&element, depth + 1));
            out->push_back(std::move(element));
          }
          ++pos_;  // AtBreak() was false only at the end of input, which Item reported
          return Status::Ok();
        }
        uint64_t size = 0;
        RETURN_IF_ERROR(Argument(info, &size));
        for (uint64_t i = 0; i < size; ++i) {
          nlohmann::json element;
          RETURN_IF_ERROR(Item(&element, depth + 1));
          out->push_back(std::move(element));
        }
        return Status::Ok();
      }
      case 5: {
        *out = nlohmann::json::object();
        uint64_t size = 0;
        const bool indefinite = info == 31;
        if (!indefinite) RETURN_IF_ERROR(Argument(info, &size));
        for (uint64_t i = 0; indefinite || i < size; ++i) {
          if (indefinite && AtBreak()) {
            ++pos_;
            break;
          }
          uint8_t key_head = 0;
          RETURN_IF_ERROR(Count());
          RETURN_IF_ERROR(Byte(&key_head));
          if ((key_head >> 5) != 3) return Error("map key is not a text string");
          std::string key;
          RETURN_IF_ERROR(String(3, key_head & 0x1f, &key));
          if (!ValidUtf8(key)) return Error("map key is not valid UTF-8");
          if (out->contains(key)) return Error("duplicate map key \"" + key.substr(0, 64) + "\"");
          nlohmann::json value;
          RETURN_IF_ERROR(Item(&value, depth + 1));
          (*out)[key] = std::move(value);
        }
        return Status::Ok();
      }
      case 6: {
        uint64_t tag = 0;
        RETURN_IF_ERROR(Argument(info, &tag));
        if (tag != 1) return Error("unsupported tag " + std::to_string(tag));
        RETURN_IF_ERROR(Item(out, depth + 1));
        if (!out->is_number()) return Error("tag 1 (epoch timestamp) over a value that is not a number");
        return Status::Ok();
      }
      default: {  // 7: simple values and floats
        switch (info) {
          case 20: *out = false; return Status::Ok();
          case 21: *out = true; return Status::Ok();
          case 22:
          case 23: *out = nullptr; return Status::Ok();
          case 25: {
            uint64_t v = 0;
            RETURN_IF_ERROR(Be(2, &v));
            *out = HalfToDouble(static_cast<uint16_t>(v));
            return Status::Ok();
          }
          case 26: {
            uint64_t v = 0;
            RETURN_IF_ERROR(Be(4, &v));
            uint32_t bits = static_cast<uint32_t>(v);
            float f;
            std::memcpy(&f, &bits, sizeof f);
            *out = static_cast<double>(f);
            return Status::Ok();
          }
          case 27: {
            uint64_t bits = 0;
            RETURN_IF_ERROR(Be(8, &bits));
            double d;
            std::memcpy(&d, &bits, sizeof d);
            *out = d;
            return Status::Ok();
          }
          case 31: return Error("break outside an indefinite-length item");
          default: return Error("unsupported simple value");
        }
      }
    }
  }

  std::string_view bytes_;
  const CborLimits& limits_;
  size_t pos_ = 0;
  size_t values_ = 0;
};

const nlohmann::json* FindShape(const nlohmann::json& shapes, std::string_view name) {
  auto it = shapes.find(std::string(name));
  return it == shapes.end() || !it->is_object() ? nullptr : &*it;
}

std::string RefShape(const nlohmann::json& shape, const char* key) {
  auto it = shape.find(key);
  if (it == shape.end() || !it->is_object()) return "";
  auto name = it->find("shape");
  return name != it->end() && name->is_string() ? name->get<std::string>() : "";
}

void WriteShaped(CborWriter& w, const nlohmann::json& shapes, std::string_view shape_name, const nlohmann::json& value,
                 int depth) {
  const nlohmann::json* shape = depth < 64 ? FindShape(shapes, shape_name) : nullptr;
  if (shape == nullptr) {
    w.Json(value);
    return;
  }
  const std::string type = shape->value("type", "");
  if (type == "structure" && value.is_object()) {
    const nlohmann::json& members = (*shape)["members"];
    size_t count = 0;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (members.contains(it.key()) && !it.value().is_null()) ++count;
    }
    w.MapHeader(count);
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!members.contains(it.key()) || it.value().is_null()) continue;
      w.Text(it.key());
      WriteShaped(w, shapes, members[it.key()].value("shape", ""), it.value(), depth + 1);
    }
  } else if (type == "list" && value.is_array()) {
    const std::string member = RefShape(*shape, "member");
    w.ArrayHeader(value.size());
    for (const auto& element : value) WriteShaped(w, shapes, member, element, depth + 1);
  } else if (type == "map" && value.is_object()) {
    const std::string element_shape = RefShape(*shape, "value");
    w.MapHeader(value.size());
    for (auto it = value.begin(); it != value.end(); ++it) {
      w.Text(it.key());
      WriteShaped(w, shapes, element_shape, it.value(), depth + 1);
    }
  } else if (type == "timestamp" && value.is_number()) {
    w.Timestamp(value.get<double>());
  } else if (type == "timestamp" && value.is_string()) {
    auto millis = ParseIso8601(value.get<std::string>());
    if (millis) {
      w.Timestamp(static_cast<double>(*millis) / 1000.0);
    } else {
      w.Json(value);
    }
  } else if ((type == "double" || type == "float") && value.is_number()) {
    w.Double(value.get<double>());
  } else if (type == "blob" && value.is_string()) {
    auto decoded = Base64Decode(value.get<std::string>());
    if (decoded) {
      w.Bytes(*decoded);
    } else {
      w.Json(value);
    }
  } else {
    w.Json(value);
  }
}

}  // namespace

Result<nlohmann::json> DecodeCbor(std::string_view bytes, const CborLimits& limits) {
  if (bytes.empty()) return Status::InvalidArgument("malformed CBOR at byte 0: empty input");
  Decoder decoder(bytes, limits);
  return decoder.Document();
}

void CborWriter::Head(int major, uint64_t value) {
  const auto m = static_cast<uint8_t>(major << 5);
  auto put = [&](uint8_t info, int n) {
    out_.push_back(static_cast<char>(m | info));
    for (int i = n - 1; i >= 0; --i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  };
  if (value < 24) {
    out_.push_back(static_cast<char>(m | value));
  } else if (value <= 0xff) {
    put(24, 1);
  } else if (value <= 0xffff) {
    put(25, 2);
  } else if (value <= 0xffffffffULL) {
    put(26, 4);
  } else {
    put(27, 8);
  }
}

void CborWriter::Int(int64_t value) {
  if (value >= 0) {
    Head(0, static_cast<uint64_t>(value));
  } else {
    Head(1, static_cast<uint64_t>(-1 - value));
  }
}

void CborWriter::Double(double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  out_.push_back(static_cast<char>(0xfb));
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void CborWriter::Text(std::string_view text) {
  Head(3, text.size());
  out_.append(text);
}

void CborWriter::Bytes(std::string_view bytes) {
  Head(2, bytes.size());
  out_.append(bytes);
}

void CborWriter::Timestamp(double epoch_seconds) {
  Tag(1);
  double whole;
  if (std::isfinite(epoch_seconds) && std::modf(epoch_seconds, &whole) == 0.0 && std::fabs(whole) < 9.0e15) {
    Int(static_cast<int64_t>(whole));
  } else {
    Double(epoch_seconds);
  }
}

void CborWriter::Json(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: Null(); break;
    case nlohmann::json::value_t::boolean: Bool(value.get<bool>()); break;
    case nlohmann::json::value_t::number_integer: Int(value.get<int64_t>()); break;
    case nlohmann::json::value_t::number_unsigned: Uint(value.get<uint64_t>()); break;
    case nlohmann::json::value_t::number_float: Double(value.get<double>()); break;
    case nlohmann::json::value_t::string: Text(value.get_ref<const std::string&>()); break;
    case nlohmann::json::value_t::array:
      ArrayHeader(value.size());
      for (const auto& element : value) Json(element);
      break;
    case nlohmann::json::value_t::object:
      MapHeader(value.size());
      for (auto it = value.begin(); it != value.end(); ++it) {
        Text(it.key());
        Json(it.value());
      }
      break;
    case nlohmann::json::value_t::binary: {
      const auto& binary = value.get_binary();
      Bytes(std::string_view(reinterpret_cast<const char*>(binary.data()), binary.size()));
      break;
    }
    case nlohmann::json::value_t::discarded: Null(); break;
  }
}

WireResponse SerializeCborError(const AwsError& error, std::string_view request_id) {
  WireResponse response = SerializeError(Protocol::kJson10, error, request_id);
  response.headers.erase("Content-Type");
  response.headers.emplace("Content-Type", "application/cbor");
  response.headers.emplace("smithy-protocol", "rpc-v2-cbor");
  CborWriter writer;
  writer.MapHeader(2);
  writer.Text("__type");
  writer.Text(error.code);
  writer.Text("message");
  writer.Text(error.message);
  response.body = writer.Take();
  return response;
}

std::string EncodeCborShaped(const nlohmann::json& shapes, std::string_view shape_name, const nlohmann::json& value) {
  CborWriter writer;
  WriteShaped(writer, shapes, shape_name, value, 0);
  return writer.Take();
}

}  // namespace kiln::aws
