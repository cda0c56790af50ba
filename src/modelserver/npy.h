#pragma once
// Dense N-d arrays and the codecs of the SageMaker inference toolkit's default content types, for
// the native TorchScript backend (torchscript_backend.h): NumPy `.npy` (application/x-npy), JSON
// nested lists (application/json) and CSV (text/csv). No libtorch dependency.
//
// Semantics follow the toolkit so both backends answer the same bytes for the same model:
// - JSON and CSV decode to float32 (the PyTorch toolkit's torch.FloatTensor for UTF-8 types);
//   `.npy` keeps its dtype.
// - CSV decodes to a 2-D array, rows x columns, even for one row or one column, as Kiln's Python
//   path does (python/kiln_toolkit/kiln_serve_codecs.py: the toolkit's genfromtxt squeezed such
//   input to 1-D, which models given samples as rows reject).
// - JSON encodes like json.dumps(array.tolist()) (Python float repr of each value widened to
//   double, ", " separators, NaN/Infinity as Python writes them); CSV like
//   np.savetxt(delimiter=",", fmt="%s") (each value's numpy str, one row per line, 1-D arrays one
//   value per line).
//
// Thread-safe (no shared state). Every parser bounds what it allocates by its input's size.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kiln::modelserver {

enum class DType { kFloat32, kFloat64, kInt64, kInt32, kInt16, kInt8, kUInt8, kBool };

// Bytes per element.
size_t DTypeSize(DType dtype);
// NumPy's name: "float32", "int64", "bool", ...
std::string_view DTypeName(DType dtype);

// A dense array in C (row-major) order. `data` holds numel() elements, little-endian, exactly
// numel() * DTypeSize(dtype) bytes (bool: one byte, 0 or 1). An empty shape is a 0-d scalar.
struct NdArray {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;

  int64_t numel() const;
};

// Parses a NumPy .npy file (format versions 1.0, 2.0 and 3.0). InvalidArgument, with what is wrong,
// for: a bad magic or version, a header that is not the dict NumPy writes, fortran_order True,
// big-endian or unsupported dtypes (objects, strings, float16, complex, unsigned wider than a
// byte), a shape whose size overflows, and data shorter or longer than the shape says.
Result<NdArray> ParseNpy(std::string_view bytes);

// Writes `array` as NumPy's np.save does (version 1.0, or 2.0 when the header passes 64 KiB; header
// padded to a multiple of 64 bytes). Precondition: array.data.size() matches shape and dtype.
std::string WriteNpy(const NdArray& array);

// Parses JSON nested lists of numbers (booleans count as 1 and 0) into a float32 array. A bare
// number gives a 0-d array. InvalidArgument for malformed JSON, non-numeric values, ragged lists
// and nesting deeper than 32 levels.
Result<NdArray> ParseJsonArray(std::string_view text);

// Parses comma-separated numbers, one row per line, into a 2-D float32 array. Cells split as
// Python's csv.reader splits them (double-quoted cells, empty lines skipped) and read as float()
// reads them (blanks around, nan, inf). InvalidArgument for empty or non-numeric cells, rows of
// different lengths, and text without any row.
Result<NdArray> ParseCsv(std::string_view text);

// json.dumps(array.tolist()).
std::string WriteJson(const NdArray& array);

// np.savetxt(stream, array, delimiter=",", fmt="%s"). InvalidArgument for 0-d arrays and arrays of
// more than 2 dimensions (np.savetxt refuses them as well).
Result<std::string> WriteCsv(const NdArray& array);

}  // namespace kiln::modelserver
