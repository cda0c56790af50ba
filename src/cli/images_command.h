#pragma once
// `kiln images [--json]`: the images the configured container engine has (config
// "container_engine.socket"), i.e. what training jobs and endpoints on container images start
// without a pull. One row per tag, newest first, as `docker images` prints them:
//   REPOSITORY:TAG                 IMAGE ID      SIZE      CREATED
//   localhost/kiln-byo-train:1     3f1c2a9b8d7e  55.2MB    3 minutes ago
// An image without a tag shows as <none>:<none>. --json prints one object per image instead:
//   [{"id": "sha256:...", "repo_tags": [...], "size_bytes": N, "created": "2026-12-02T11:04:28Z"}]

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/docker/engine.h"

namespace kiln::cli {

// Writes the engine's images to `out` (`now_seconds`: the unix time the ages are counted from).
// Errors: Unavailable when the engine cannot be reached, its message saying where and how to start
// Podman's service; the engine's other errors as they come.
Status RunImagesCommand(runtime::docker::Engine& engine, bool json, int64_t now_seconds, std::ostream& out);

// The table (or JSON) of `images` as RunImagesCommand prints it.
void PrintImages(std::vector<runtime::docker::ImageInfo> images, bool json, int64_t now_seconds, std::ostream& out);

// The message for `kiln images` without an engine in the config (says what to set).
std::string NoEngineConfiguredMessage();

// "55.2MB", "1.07GB", "812kB", "0B": decimal units with three significant digits, as Docker's CLI.
std::string HumanSize(int64_t bytes);
// "12 seconds ago", "3 minutes ago", "About an hour ago", "5 days ago", "2 years ago".
std::string HumanAge(int64_t seconds);

}  // namespace kiln::cli
