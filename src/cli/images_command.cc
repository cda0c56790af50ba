#include "cli/images_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/time.h"

namespace kiln::cli {

std::string HumanSize(int64_t bytes) {
  static const char* const kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  double size = bytes < 0 ? 0 : static_cast<double>(bytes);
  size_t unit = 0;
  // 999.5 and up would print as "1e+03" with three significant digits: the next unit instead.
  while (size >= 999.5 && unit + 1 < std::size(kUnits)) {
    size /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g%s", size, kUnits[unit]);
  return text;
}

std::string HumanAge(int64_t seconds) {
  // Docker's CLI wording (go-units HumanDuration), so the column reads the same.
  auto plural = [](int64_t n, const char* unit) { return std::to_string(n) + " " + unit + (n == 1 ? "" : "s"); };
  std::string age;
  const double hours = std::round(static_cast<double>(seconds) / 3600);
  const int64_t minutes = seconds / 60;
  if (seconds < 1) {
    age = "Less than a second";
  } else if (seconds < 60) {
    age = plural(seconds, "second");
  } else if (minutes == 1) {
    age = "About a minute";
  } else if (minutes < 60) {
    age = plural(minutes, "minute");
  } else if (hours == 1) {
    age = "About an hour";
  } else if (hours < 48) {
    age = plural(static_cast<int64_t>(hours), "hour");
  } else if (hours < 24 * 7 * 2) {
    age = plural(static_cast<int64_t>(hours / 24), "day");
  } else if (hours < 24 * 30 * 2) {
    age = plural(static_cast<int64_t>(hours / 24 / 7), "week");
  } else if (hours < 24 * 365 * 2) {
    age = plural(static_cast<int64_t>(hours / 24 / 30), "month");
  } else {
    age = plural(static_cast<int64_t>(hours / 24 / 365), "year");
  }
  return age + " ago";
}

std::string NoEngineConfiguredMessage() {
  return "no container engine is configured: set container_engine.socket in the config file and pass it with "
         "--config, e.g. {\"container_engine\": {\"socket\": \"unix:///run/podman/podman.sock\"}} (Podman) or "
         "{\"container_engine\": {\"socket\": \"unix:///var/run/docker.sock\"}} (Docker)";
}

Status RunImagesCommand(runtime::docker::Engine& engine, bool json, int64_t now_seconds, std::ostream& out) {
  Result<std::vector<runtime::docker::ImageInfo>> images = engine.ListImages();
  if (!images.ok()) {
    if (images.status().code() == StatusCode::kUnavailable) {
      // The engine's message names the address and why; say how to bring Podman's service up.
      return Status::Unavailable(images.status().message() +
                                 ". Start Podman's API service (podman system service --time=0 " + engine.address() +
                                 " &, or systemctl start podman.socket) or Docker (systemctl start docker), or fix "
                                 "container_engine.socket in the config");
    }
    return images.status();
  }
  PrintImages(std::move(images).value(), json, now_seconds, out);
  return Status::Ok();
}

void PrintImages(std::vector<runtime::docker::ImageInfo> images, bool json, int64_t now_seconds, std::ostream& out) {
  // Newest first, as `docker images` lists them.
  std::stable_sort(images.begin(), images.end(),
                   [](const auto& a, const auto& b) { return a.created_seconds > b.created_seconds; });
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& image : images) {
      list.push_back({{"id", image.id},
                      {"repo_tags", image.repo_tags},
                      {"size_bytes", image.size_bytes},
                      {"created", FormatIso8601Millis(image.created_seconds * 1000).substr(0, 19) + "Z"}});
    }
    out << list.dump(2) << "\n";
    return;
  }
  struct Row {
    std::string name, id, size, created;
  };
  std::vector<Row> rows;
  for (const auto& image : images) {
    std::string id = image.id.rfind("sha256:", 0) == 0 ? image.id.substr(7) : image.id;
    Row row{"", id.substr(0, 12), HumanSize(image.size_bytes), HumanAge(now_seconds - image.created_seconds)};
    if (image.repo_tags.empty()) {
      row.name = "<none>:<none>";
      rows.push_back(row);
    }
    for (const std::string& tag : image.repo_tags) {
      row.name = tag;
      rows.push_back(row);
    }
  }
  size_t name_width = std::string("REPOSITORY:TAG").size();
  for (const Row& row : rows) name_width = std::max(name_width, row.name.size());
  auto line = [&](const std::string& name, const std::string& id, const std::string& size, const std::string& created) {
    char text[64];
    std::snprintf(text, sizeof(text), "  %-12s  %-8s  ", id.c_str(), size.c_str());
    out << name << std::string(name_width - name.size(), ' ') << text << created << "\n";
  };
  line("REPOSITORY:TAG", "IMAGE ID", "SIZE", "CREATED");
  for (const Row& row : rows) line(row.name, row.id, row.size, row.created);
}

}  // namespace kiln::cli
