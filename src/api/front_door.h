#pragma once
// The front door (DESIGN.md §2): every request on Kiln's one port passes here. It answers the
// health route, tells the AWS service apart (X-Amz-Target prefix, SigV4 credential scope, path),
// verifies SigV4 the same way for all of them, maps authentication failures to each protocol's
// error, hands the request to the service, and writes one access-log line.
//
// Dispatch, in order:
//   GET /_kiln/health                            → health (no auth)
//   GET /_kiln/remote/{connect,targets,connections}, POST /_kiln/remote/release, signed for
//   "sagemaker"                                  → remote access
//                                                  (the TunnelService given to SetRemoteAccess;
//                                                  errors in JSON 1.1's shape; connect upgrades
//                                                  the connection to the SSH stream)
//   POST /_kiln/training/interrupt?job=<name>, signed for "sagemaker"
//                                                → the training interrupter given to
//                                                  SetTrainingInterrupter (managed spot: a reclaim
//                                                  of the job's instances; errors in JSON 1.1's
//                                                  shape)
//   GET|POST|DELETE /_kiln/console/session      → the console's sign-in (below; JSON 1.1 errors)
//   unsigned GET|HEAD /console, /console/…
//   without an X-Kiln-Console header, once
//   SetConsole was called                        → the web console's files (Console::ServeStatic)
//   /_kiln/node/…  (no SigV4: the Slurm job's   → the node service given to SetNodeService
//   token is the credential)                       (runtime/slurm/node_service.h); without one,
//                                                  404 JSON
//   X-Amz-Target: <prefix>.<Op>                  → the JsonService registered for <prefix>
//   POST /service/GraniteServiceVersion20100801/operation/<Op> signed for "monitoring" (or
//   unsigned with a smithy-protocol header)      → CloudWatch, Smithy RPC v2 CBOR
//   scope "monitoring" on `/`                    → CloudWatch (Query protocol)
//   scope "sts", or a form/query `Action=`        → STS (Query protocol); unsigned (listener auth
//                                                  "off"): CloudWatch when Action is one of its
//                                                  operations
//   GET /metrics without credentials            → Prometheus text (only once SetMetricsExporter
//                                                  was called; before that it is S3's, as it was)
//   scope "sagemaker" + /endpoints/…             → SageMaker Runtime (REST-JSON): served by the
//                                                  Router given to SetRuntime; without one,
//                                                  UnknownOperationException
//   no SigV4 scope + POST /endpoints/<n>/<op>     → SageMaker Runtime too, once SetRuntime was
//                                                  called (listener auth "off")
//   anything else                                → S3 (REST-XML)
//
// The console (issue 22, console.h). Its files live under /console/, which S3 path-style also
// owns (a bucket named "console"): an unsigned GET or HEAD there without an X-Kiln-Console header
// is the console's; a signed one, any other method, or one with the header (the console's own
// object-store calls send it) stays S3's, so SDKs keep reaching such a bucket, while a browser
// only sees it through the console's /<bucket>/<key> links.
// Sign-in: GET /_kiln/console/session (no auth) answers {"auth": "sigv4"|"off", "region",
// "signed_in", and for a live kiln_session cookie "access_key_id", "principal_arn", "expires_at"
// (epoch seconds)}; POST (body `{}` signed with SigV4 for "sagemaker", verified as any API call)
// starts a session and sets the kiln_session cookie (HttpOnly, SameSite=Strict, Path=/); DELETE
// (with X-Kiln-Console: 1) ends it and clears the cookie.
// Cookie authentication (Authenticate): a request without any signature (no Authorization
// header, no X-Amz-Credential, X-Amz-Signature or AWSAccessKeyId query parameter) that carries
// kiln_session acts as the session's access key: context.auth holds that key's Credential as a
// SigV4 caller's would (payload UNSIGNED-PAYLOAD). Every such request but an S3 GET or HEAD (the
// console's download links) must also carry X-Kiln-Console: 1, else AccessDenied: a cross-site
// form or image cannot set it, and SameSite=Strict does not separate the ports of one host (a
// notebook on :8888 is the same site as Kiln on :5456), while some routes accept GET for actions
// (/_kiln/remote/release). An unknown, expired or revoked session is ExpiredToken(Exception) in
// the route's protocol. With listener auth "off"
// such failures are ignored (the request goes on unsigned, as before). A signed request ignores
// the cookie.
//
// The invoke path also runs without a thread (net::AsyncService): the server offers each request
// header on its event loop, Claims() takes POST /endpoints/<name>/invocations whenever Handle
// would route it to the Router, and Serve() does what Handle does for it (SigV4 over the body,
// the path checks, Router::InvokeAsync over the loop's upstream client, the access-log line),
// answering through the exchange. The server offers only bodies with a Content-Length up to the
// Router's limit and no Expect: 100-continue; chunked, 100-continue and oversized invocations
// still come to Handle (the blocking path, same answers).
//
// Thread-safe after construction and registration (the service table is read-only).

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "access/tunnel_service.h"
#include "api/async_invocations.h"
#include "api/console.h"
#include "api/cloudwatch.h"
#include "api/json_service.h"
#include "aws/credentials.h"
#include "base/mutex.h"
#include "net/http_server.h"
#include "objects/s3api/s3_api.h"
#include "serving/prometheus.h"
#include "serving/router.h"

namespace kiln::api {

struct FrontDoorOptions {
  // false = accept unsigned requests (listener auth "off"); signed ones are still verified.
  bool auth_enabled = true;
  std::vector<std::string> regions = {"us-east-1"};
  // Accept any region in the credential scope (some tools sign for a fixed region).
  bool accept_any_region = false;
  std::string account_id = "000000000000";
  // JSON and Query bodies are read whole to hash them; larger ones get 413.
  size_t max_rpc_body_bytes = 16 * 1024 * 1024;
  // Bodies larger than large_rpc_body_bytes (Content-Length, or max_rpc_body_bytes when chunked)
  // count against max_large_rpc_bytes_in_flight from before they are read until they are
  // answered: a 16 MiB JSON body costs ~3x its size while handled (text, DOM, answer), so 16 of
  // them at once took the server past 1 GB. Past the budget a request waits up to
  // large_rpc_wait_millis for room, then gets ThrottlingException (400, which AWS SDKs retry with
  // backoff; its body is read and dropped, so the client sees the answer). Raising the budget lets
  // more large requests run at once at that memory cost.
  size_t large_rpc_body_bytes = 1024 * 1024;
  size_t max_large_rpc_bytes_in_flight = 64 * 1024 * 1024;
  int large_rpc_wait_millis = 10000;
  std::string version;  // reported by the health route
};

class FrontDoor final : public net::AsyncService {
 public:
  // `credentials` and `s3` must outlive the FrontDoor.
  FrontDoor(FrontDoorOptions options, const aws::CredentialProvider* credentials, objects::S3Api* s3);

  // Registers a JSON service by its target prefix. Call before serving.
  void AddJsonService(std::unique_ptr<JsonService> service);

  // The invoke path (POST /endpoints/{name}/invocations) goes to `router` (not owned; must
  // outlive the FrontDoor). Null (the default) answers UnknownOperationException. Call before
  // serving.
  void SetRuntime(serving::Router* router) { runtime_ = router; }
  // InvokeEndpointAsync (POST /endpoints/{name}/async-invocations) goes to `invoker` (not owned;
  // must outlive the FrontDoor) once SigV4 and the path checks passed; it runs on the worker
  // thread (HeadObject and the queue's fsync block). Null (the default): ValidationError, "not
  // supported". Call before serving.
  void SetAsyncInvoker(const AsyncInvoker* invoker) { async_invoker_ = invoker; }
  // CloudWatch's Query and RPC v2 CBOR requests go to `cloudwatch` (not owned; must outlive the
  // FrontDoor); its JSON 1.0 requests reach it through the JsonService registered with
  // AddJsonService(cloudwatch->MakeJsonService()). Null (the default): Query requests are all STS's
  // and CBOR requests answer UnknownOperationException. Call before serving.
  void SetCloudWatch(const CloudWatch* cloudwatch) { cloudwatch_ = cloudwatch; }
  // GET /metrics (no auth) renders `exporter` (not owned). Null (the default): no /metrics route.
  // Call before serving.
  void SetMetricsExporter(const serving::PrometheusExporter* exporter) { metrics_exporter_ = exporter; }
  // The /_kiln/remote/* routes go to `tunnels` (not owned; must outlive the FrontDoor). Null (the
  // default): they answer UnknownOperationException. Call before serving.
  void SetRemoteAccess(access::TunnelService* tunnels) { remote_access_ = tunnels; }
  // POST /_kiln/training/interrupt?job=<name> (`kiln interrupt`) calls `interrupter` with the job
  // name: OK answers {"TrainingJobName", "Interrupted": true}; NotFound is ResourceNotFound (404),
  // FailedPrecondition and InvalidArgument are ValidationException (400) with the status message.
  // Unset (the default): the route answers UnknownOperationException. Call before serving.
  void SetTrainingInterrupter(std::function<Status(const std::string& job)> interrupter) {
    training_interrupter_ = std::move(interrupter);
  }

  // Every request under /_kiln/node/ (the Slurm runtime's node protocol, issue 21) goes to
  // `service`, unauthenticated here: the service checks its own token (node_service.h). Unset (the
  // default): such requests answer 404 with a JSON error. Call before serving.
  void SetNodeService(net::Handler service) { node_service_ = std::move(service); }

  // The web console's files and sign-in sessions (issue 22; not owned; must outlive the
  // FrontDoor). Null (the default): /console/ is S3's as before, /_kiln/console/session answers
  // 404 and kiln_session cookies are ignored. Call before serving.
  void SetConsole(Console* console) { console_ = console; }

  // The net::Handler.
  void Handle(net::HttpRequest& request, net::ResponseWriter& response);

  // net::AsyncService: the invoke path on the event loops. Claims() is true for exactly the
  // requests Handle would give to ServeRuntime's invocations (a Router set, POST
  // /endpoints/<name>/invocations, classified as SageMaker Runtime) except those to serverless
  // endpoints (Router::IsServerless: they may wait for a cold start, which only a worker thread
  // may do); max_body_bytes() is the
  // Router's max_request_body_bytes (0 without a Router). Serve() never blocks: SigV4 is CPU only
  // (the credential store may stat and re-read its small file on a lookup miss, at most once a
  // second) and the container call is Router::InvokeAsync on the exchange's loop.
  bool Claims(const net::HttpRequest& head) const override;
  size_t max_body_bytes() const override;
  void Serve(net::AsyncExchange& exchange) override;

 private:
  struct Route;
  Route Classify(const net::HttpRequest& request) const;
  // The one authentication of every route. Verifies `request` when it carries credentials (an
  // Authorization header or a presigned signature) or auth is enabled: SigV4 signed for
  // `signing_name` over `body` (JSON, Query, CBOR and runtime bodies, read whole before), or, with
  // no body (nullopt: S3, which streams its payload), S3's rules, SigV2, and presigned URLs that
  // merely name a credential. A request with no signature and a console session cookie is
  // authenticated by the session instead (see the top of this file). On success fills `verified`
  // (owned by Handle), points context.auth at it and takes its region; on failure logs the
  // canonical request at debug level and returns the error to answer, in `protocol`'s shape
  // (AuthErrorFor, or the console's AccessDenied / ExpiredToken).
  std::optional<aws::AwsError> Authenticate(const net::HttpRequest& request, std::string_view signing_name,
                                            std::optional<std::string_view> body, aws::Protocol protocol,
                                            aws::RequestContext& context,
                                            std::optional<aws::VerifiedRequest>& verified) const;
  // /_kiln/console/session: the console's sign-in, sign-out and session check.
  void ServeConsoleSession(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                           std::optional<aws::VerifiedRequest>& verified);
  // The Serve* functions authenticate (above), then hand the request to the service.
  void ServeRpc(const Route& route, net::HttpRequest& request, net::ResponseWriter& response,
                aws::RequestContext& context, std::optional<aws::VerifiedRequest>& verified);
  // ServeRpc's steps: hold a large body's bytes against max_large_rpc_bytes_in_flight (false when
  // no room came within large_rpc_wait_millis); hand the authenticated, decoded body to the
  // service `route` names and return its answer.
  struct LargeRpcReservation;
  bool ReserveLargeRpc(size_t bytes, LargeRpcReservation& reservation);
  aws::WireResponse DispatchRpc(const Route& route, const net::HttpRequest& request, aws::RequestContext& context,
                                const std::string& body);
  // An RPC route's error in its protocol: CBOR bodies for RPC v2 CBOR, CloudWatch's namespace
  // for its Query errors.
  static aws::WireResponse RpcError(const Route& route, const aws::AwsError& error, const std::string& request_id);
  void ServeS3(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
               std::optional<aws::VerifiedRequest>& verified);
  // GET /_kiln/remote/{connect,targets,connections}: SigV4 for "sagemaker" over an empty body,
  // then the TunnelService; connect ends with the connection upgraded and handed to it.
  void ServeRemote(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                   std::optional<aws::VerifiedRequest>& verified);
  // POST /_kiln/training/interrupt: SigV4 for "sagemaker" over an empty body, then the
  // training interrupter.
  void ServeTraining(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                     std::optional<aws::VerifiedRequest>& verified);
  // InvokeEndpoint and friends: 413 from Content-Length, body read into a per-thread buffer,
  // SigV4 over its hash, path validation, then the Router.
  void ServeRuntime(net::HttpRequest& request, net::ResponseWriter& response, aws::RequestContext& context,
                    std::optional<aws::VerifiedRequest>& verified, int64_t start_steady_ns);
  // ServeRuntime's and Serve's steps once the body is read: SigV4 over `body`, then the path,
  // endpoint name, method and operation checks. Returns the error to answer (REST-JSON), or
  // nullopt with `invoke` filled (its views point into `request`, `body` and `context`).
  std::optional<aws::AwsError> CheckRuntime(const net::HttpRequest& request, std::string_view body,
                                            aws::RequestContext& context, std::optional<aws::VerifiedRequest>& verified,
                                            serving::InvokeRequest& invoke) const;
  // The one access-log line of a request (Handle and Serve).
  static void LogRequest(const net::HttpRequest& request, const aws::RequestContext& context, aws::Protocol protocol,
                         std::string_view route_operation, int status, uint64_t bytes);

  FrontDoorOptions options_;
  const aws::CredentialProvider* credentials_;
  objects::S3Api* s3_;
  std::map<std::string, std::unique_ptr<JsonService>> json_services_;  // by target prefix
  serving::Router* runtime_ = nullptr;
  const AsyncInvoker* async_invoker_ = nullptr;
  const CloudWatch* cloudwatch_ = nullptr;
  const serving::PrometheusExporter* metrics_exporter_ = nullptr;
  access::TunnelService* remote_access_ = nullptr;
  std::function<Status(const std::string& job)> training_interrupter_;
  net::Handler node_service_;
  Console* console_ = nullptr;
  // Bytes of large RPC bodies being read or handled now (see FrontDoorOptions); waiters queue on
  // the condition variable. Only large bodies touch these.
  Mutex large_rpc_mutex_;
  CondVar large_rpc_freed_;
  size_t large_rpc_bytes_in_flight_ GUARDED_BY(large_rpc_mutex_) = 0;
};

// The AWS error a protocol answers for an authentication failure (spec/control-plane-api.md §3.6).
aws::AwsError AuthErrorFor(aws::Protocol protocol, const aws::AuthError& error);

// True when `request` carries any AWS signature or presigned credential (an Authorization header,
// or an X-Amz-Credential, X-Amz-Signature or AWSAccessKeyId query parameter): such a request is
// verified by its signature and never by a console cookie.
bool CarriesSignature(const net::HttpRequest& request);

}  // namespace kiln::api
