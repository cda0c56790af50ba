// Fuzzes the TorchScript backend's body decoders (src/modelserver/npy.h): the request bodies a
// client sends to a model served in process, as application/x-npy, application/json or text/csv.
//
// Input layout: byte 0 % 3 = the decoder (0 ParseNpy, 1 ParseJsonArray, 2 ParseCsv); the rest = the body.
//
// Checks besides "no crash, no sanitizer report": refusals are InvalidArgument; an accepted array
// holds exactly numel * itemsize bytes (JSON and CSV: float32, CSV 2-D, JSON at most 32
// dimensions); WriteNpy of it parses back to the same array; WriteJson of a finite float32 array
// parses back to the same bytes; WriteCsv accepts exactly the 1-D and 2-D arrays.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "modelserver/npy.h"

namespace {

using kiln::modelserver::DType;
using kiln::modelserver::DTypeSize;
using kiln::modelserver::NdArray;

void Check(bool condition) {
  if (!condition) std::abort();
}

bool Same(const NdArray& a, const NdArray& b) { return a.dtype == b.dtype && a.shape == b.shape && a.data == b.data; }

void CheckAccepted(const NdArray& a) {
  int64_t numel = 1;
  for (int64_t d : a.shape) {
    Check(d >= 0);
    numel *= d;
  }
  Check(a.numel() == numel);
  Check(a.data.size() == static_cast<size_t>(numel) * DTypeSize(a.dtype));

  auto again = kiln::modelserver::ParseNpy(kiln::modelserver::WriteNpy(a));
  Check(again.ok() && Same(*again, a));

  std::string json = kiln::modelserver::WriteJson(a);
  Check(!json.empty());
  auto csv = kiln::modelserver::WriteCsv(a);
  Check(csv.ok() == (a.shape.size() == 1 || a.shape.size() == 2));

  if (a.dtype == DType::kFloat32) {
    bool finite = true;
    for (size_t i = 0; i < a.data.size(); i += 4) {
      float f;
      std::memcpy(&f, a.data.data() + i, 4);
      finite = finite && std::isfinite(f);
    }
    // JSON cannot say NaN or Infinity (Python writes them anyway; nothing standard reads them
    // back), nor the trailing dimensions of an empty array ([] is (0,) whatever followed the 0).
    bool shape_spoken = true;
    for (size_t i = 0; i + 1 < a.shape.size(); ++i) shape_spoken = shape_spoken && a.shape[i] > 0;
    if (finite && shape_spoken) {
      auto back = kiln::modelserver::ParseJsonArray(json);
      Check(back.ok() && Same(*back, a));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  kiln::Result<NdArray> parsed = kiln::Status::Internal("unset");
  switch (data[0] % 3) {
    case 0: parsed = kiln::modelserver::ParseNpy(body); break;
    case 1:
      parsed = kiln::modelserver::ParseJsonArray(body);
      if (parsed.ok()) Check(parsed->dtype == DType::kFloat32 && parsed->shape.size() <= 32);
      break;
    default:
      parsed = kiln::modelserver::ParseCsv(body);
      if (parsed.ok()) Check(parsed->dtype == DType::kFloat32 && parsed->shape.size() == 2);
      break;
  }
  if (!parsed.ok()) {
    Check(parsed.status().IsInvalidArgument());
    return 0;
  }
  CheckAccepted(*parsed);
  return 0;
}
