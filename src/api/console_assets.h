#pragma once
// The web console's files (issue 22), as embedded into the binary at build time: the generated
// console_assets.cc (cmake/embed_console.cmake, from ui/dist/manifest.json — its format is at the
// top of that script) defines EmbeddedConsoleAssets(). Each asset's bytes are pulled in by the
// assembler's .incbin (base/embed.h); every view below points into the binary's read-only data.

#include <span>
#include <string_view>

namespace kiln::api {

struct ConsoleAsset {
  std::string_view path;          // relative to /console/: "index.html", "assets/app-3F2A1B9C.js"
  std::string_view content_type;  // "text/javascript; charset=utf-8"
  std::string_view sha256_hex;    // of `identity`: the strong ETag
  bool immutable = false;         // a content-hashed name: cached for a year, never revalidated
  std::string_view identity;      // the file's bytes
  std::string_view gzip;          // its gzip variant; empty when the build made none
  std::string_view br;            // its brotli variant; empty when the build made none
};

struct ConsoleAssets {
  // False when the binary was built without ui/dist (no npm): the console answers 503.
  bool built = false;
  std::span<const ConsoleAsset> files;  // sorted by nothing in particular; few dozen at most
};

// The assets embedded in this binary (defined in the generated console_assets.cc).
const ConsoleAssets& EmbeddedConsoleAssets();

}  // namespace kiln::api
