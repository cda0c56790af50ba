#pragma once
// Request bodies sent with `Content-Encoding: gzip`. botocore compresses the bodies of operations
// whose model has the `requestcompression` trait (CloudWatch PutMetricData) once they pass
// 10 KiB; AWS accepts them for every protocol. The signature covers the compressed bytes, so the
// front door verifies first and decodes after.

#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kiln::aws {

// Whether a Content-Encoding value names gzip (case-insensitive; "gzip" alone or in a list).
bool IsGzipEncoding(std::string_view content_encoding);

// Decodes one or more concatenated gzip members. More than `max_bytes` of output →
// ResourceExhausted (decoding stops there: a small bomb cannot grow memory past the bound);
// corrupt, truncated or non-gzip input → InvalidArgument.
Result<std::string> Gunzip(std::string_view data, size_t max_bytes);

}  // namespace kiln::aws
