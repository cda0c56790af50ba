#include "api/console.h"

#include "base/strings.h"

namespace kiln::api {

namespace {

constexpr std::string_view kConsolePath = "/console";
constexpr std::string_view kConsolePrefix = "/console/";
constexpr std::string_view kAssetsPrefix = "assets/";

constexpr std::string_view kNotBuiltPage =
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Kiln console</title></head>\n"
    "<body><h1>Kiln console</h1>\n"
    "<p>The console was not built: run scripts/build.sh (it needs npm; scripts/install-deps.sh installs "
    "it), then restart the server.</p>\n"
    "<p>The APIs on this port work as usual.</p></body></html>\n";

// The quality the Accept-Encoding header gives `coding` (0 when it is absent or refused). Only
// the exact coding name or "*" count; identity is always acceptable to us.
double EncodingQuality(std::string_view accept_encoding, std::string_view coding) {
  double star = 0, exact = -1;
  for (std::string_view part : Split(accept_encoding, ',')) {
    std::string_view name = part;
    double q = 1;
    size_t semi = part.find(';');
    if (semi != std::string_view::npos) {
      name = part.substr(0, semi);
      std::string_view params = Trim(part.substr(semi + 1));
      if (params.size() >= 2 && (params[0] == 'q' || params[0] == 'Q') && params[1] == '=') {
        std::string value(Trim(params.substr(2)));
        char* end = nullptr;
        q = std::strtod(value.c_str(), &end);
        if (end == value.c_str()) q = 0;
      }
    }
    name = Trim(name);
    if (EqualsIgnoreCase(name, coding)) exact = q;
    if (name == "*") star = q;
  }
  return exact >= 0 ? exact : star;
}

// True when If-None-Match (a list of entity tags, or "*") matches `etag` (quoted). Weak
// comparison, as RFC 9110 §13.1.2 asks for If-None-Match.
bool NoneMatchHits(const std::string* if_none_match, std::string_view etag) {
  if (if_none_match == nullptr) return false;
  for (std::string_view tag : Split(*if_none_match, ',')) {
    tag = Trim(tag);
    if (tag == "*") return true;
    if (StartsWith(tag, "W/")) tag.remove_prefix(2);
    if (tag == etag) return true;
  }
  return false;
}

}  // namespace

Console::Console(Options options, const aws::CredentialProvider* credentials)
    : sessions_(std::move(options.sessions), credentials), assets_(options.assets) {
  for (const ConsoleAsset& asset : assets_.files) by_path_.emplace(asset.path, &asset);
  auto index = by_path_.find("index.html");
  index_ = index == by_path_.end() ? nullptr : index->second;
}

void Console::AddSecurityHeaders(HeaderMap& headers) {
  headers.emplace("Content-Security-Policy",
                  "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
                  "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'");
  headers.emplace("X-Content-Type-Options", "nosniff");
  headers.emplace("Referrer-Policy", "no-referrer");
}

void Console::ServeStatic(const net::HttpRequest& request, net::ResponseWriter& response) const {
  const bool head = request.method == "HEAD";
  HeaderMap headers;
  AddSecurityHeaders(headers);
  auto send = [&](int status, std::string_view body) {
    if (head) {
      (void)response.Start(status, headers, body.size());
      (void)response.Finish();
    } else {
      (void)response.Send(status, headers, body);
    }
  };
  if (request.raw_path == kConsolePath) {
    headers.emplace("Location", std::string(kConsolePrefix));
    headers.emplace("Content-Type", "text/plain; charset=utf-8");
    send(301, "The console is at /console/\n");
    return;
  }
  if (!assets_.built || index_ == nullptr) {
    headers.emplace("Content-Type", "text/html; charset=utf-8");
    headers.emplace("Cache-Control", "no-store");
    send(503, kNotBuiltPage);
    return;
  }
  std::string_view path = request.raw_path;
  path.remove_prefix(std::min(path.size(), kConsolePrefix.size()));
  const ConsoleAsset* asset = index_;
  if (!path.empty()) {
    auto it = by_path_.find(path);
    if (it != by_path_.end()) {
      asset = it->second;
    } else if (StartsWith(path, kAssetsPrefix)) {
      // A page cached from an older build asking for its bundle: index.html in its place would
      // be HTML read as a script. A plain 404 lets the page fail visibly (a reload fixes it).
      headers.emplace("Content-Type", "text/plain; charset=utf-8");
      headers.emplace("Cache-Control", "no-store");
      send(404, "Not found: this console file is not part of this server's build. Reload the page.\n");
      return;
    }
  }
  const std::string etag = "\"" + std::string(asset->sha256_hex) + "\"";
  headers.emplace("ETag", etag);
  headers.emplace("Cache-Control", asset->immutable ? "public, max-age=31536000, immutable" : "no-cache");
  if (!asset->gzip.empty() || !asset->br.empty()) headers.emplace("Vary", "Accept-Encoding");
  if (NoneMatchHits(request.Header("If-None-Match"), etag)) {
    if (head) {
      (void)response.Start(304, headers, std::nullopt);
      (void)response.Finish();
    } else {
      (void)response.Send(304, headers, {});
    }
    return;
  }
  headers.emplace("Content-Type", std::string(asset->content_type));
  std::string_view body = asset->identity;
  const std::string accept = request.HeaderOr("Accept-Encoding", "");
  if (!asset->br.empty() && EncodingQuality(accept, "br") > 0) {
    headers.emplace("Content-Encoding", "br");
    body = asset->br;
  } else if (!asset->gzip.empty() && EncodingQuality(accept, "gzip") > 0) {
    headers.emplace("Content-Encoding", "gzip");
    body = asset->gzip;
  }
  send(200, body);
}

std::optional<std::string_view> Console::SessionCookie(const net::HttpRequest& request) {
  auto range = request.headers.equal_range("Cookie");
  for (auto it = range.first; it != range.second; ++it) {
    for (std::string_view pair : Split(it->second, ';')) {
      pair = Trim(pair);
      size_t eq = pair.find('=');
      if (eq == std::string_view::npos) continue;
      if (Trim(pair.substr(0, eq)) != kCookieName) continue;
      std::string_view value = Trim(pair.substr(eq + 1));
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
      if (value.empty()) continue;
      return value;
    }
  }
  return std::nullopt;
}

std::string Console::SessionSetCookie(std::string_view token, int64_t max_age_seconds) {
  return std::string(kCookieName) + "=" + std::string(token) +
         "; Path=/; HttpOnly; SameSite=Strict; Max-Age=" + std::to_string(max_age_seconds);
}

std::string Console::ClearSessionSetCookie() {
  return std::string(kCookieName) + "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0";
}

}  // namespace kiln::api
