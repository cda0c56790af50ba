#pragma once
// The web console (issue 22): the single-page app in ui/, embedded into the binary
// (console_assets.h), and its sign-in sessions (console_sessions.h). The FrontDoor routes to it:
//   unsigned GET|HEAD /console            → 301 to /console/
//   unsigned GET|HEAD /console/<path>     → ServeStatic: the embedded file <path>, else index.html
//                                            (the app's own history-API routes); 404 for a
//                                            missing /console/assets/... file; 503 with a small
//                                            page when the binary was built without the app
//   /_kiln/console/session                → the sign-in protocol (front_door.cc)
// and accepts the `kiln_session` cookie as a credential on every API route (FrontDoor's
// Authenticate). The app only calls the public APIs, so what a console user may do is exactly
// what their access key may do.
//
// Thread-safe; the asset table is read-only after construction.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "api/console_assets.h"
#include "api/console_sessions.h"
#include "aws/credentials.h"
#include "base/io.h"
#include "net/http_server.h"

namespace kiln::api {

class Console {
 public:
  struct Options {
    ConsoleSessions::Options sessions;
    // The files to serve: EmbeddedConsoleAssets() in the server, a table of the test's own in tests.
    ConsoleAssets assets;
  };

  // `credentials` (not owned) must outlive the Console; so must the bytes `options.assets` views.
  Console(Options options, const aws::CredentialProvider* credentials);
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  ConsoleSessions& sessions() { return sessions_; }
  bool built() const { return assets_.built; }

  // Answers GET or HEAD `request` for /console or /console/<path> (request.raw_path), with the
  // console's security headers on every answer: 301 to /console/ for /console; 503 (HTML) when
  // the app was not built; else the asset (or index.html) with ETag, Cache-Control and
  // Content-Encoding (br, else gzip, when Accept-Encoding allows and the build made the variant),
  // 304 when If-None-Match names its ETag, 404 for a missing assets/ file.
  void ServeStatic(const net::HttpRequest& request, net::ResponseWriter& response) const;

  // Headers every console answer carries (CSP, nosniff, no referrer).
  static void AddSecurityHeaders(HeaderMap& headers);

  // The value of the kiln_session cookie in `request`'s Cookie header(s), or nullopt.
  static std::optional<std::string_view> SessionCookie(const net::HttpRequest& request);
  // Set-Cookie values: a session for `max_age_seconds`, and the one that clears it.
  static std::string SessionSetCookie(std::string_view token, int64_t max_age_seconds);
  static std::string ClearSessionSetCookie();

  static constexpr std::string_view kCookieName = "kiln_session";
  // Requests authenticated by the cookie must carry this header set to "1", except S3 GETs and
  // HEADs (the download links): a cross-site form cannot set it, and SameSite=Strict alone is not
  // enough since every port of the host counts as the same site (front_door.cc, Authenticate).
  static constexpr std::string_view kCsrfHeader = "X-Kiln-Console";

 private:
  ConsoleSessions sessions_;
  ConsoleAssets assets_;
  std::map<std::string_view, const ConsoleAsset*> by_path_;
  const ConsoleAsset* index_ = nullptr;
};

}  // namespace kiln::api
