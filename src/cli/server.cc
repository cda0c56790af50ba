#include "cli/server.h"

#include "api/logs.h"
#include "base/fs.h"
#include "base/log.h"
#include "cli/version.h"
#include "objects/fs_object_store.h"
#include "objects/s3_object_store.h"

namespace kiln::cli {

Result<std::unique_ptr<objects::ObjectStore>> OpenObjectStore(const Config& config, store::Database* database) {
  if (config.object_store.backend == "s3") {
    objects::S3ObjectStore::Options options;
    options.endpoint = config.object_store.endpoint;
    options.region = config.object_store.region;
    options.access_key_id = config.object_store.access_key_id;
    options.secret_access_key = config.object_store.secret_access_key;
    options.session_token = config.object_store.session_token;
    ASSIGN_OR_RETURN(auto store, objects::S3ObjectStore::Open(std::move(options)));
    return std::unique_ptr<objects::ObjectStore>(std::move(store));
  }
  objects::FsObjectStore::Options options;
  options.root = config.data_dir + "/objects";
  options.database = database;
  ASSIGN_OR_RETURN(auto store, objects::FsObjectStore::Open(std::move(options)));
  return std::unique_ptr<objects::ObjectStore>(std::move(store));
}

Result<std::unique_ptr<Server>> Server::Create(Config config) {
  std::unique_ptr<Server> server(new Server(std::move(config)));
  const Config& c = server->config_;
  RETURN_IF_ERROR(MakeDirs(c.data_dir, 0700).WithPrefix("data dir"));

  ASSIGN_OR_RETURN(server->database_, store::Database::Open(c.data_dir + "/kiln.db", {}));
  ASSIGN_OR_RETURN(server->object_store_, OpenObjectStore(c, server->database_.get()));

  api::CredentialStore::Options cred_options;
  cred_options.path = c.data_dir + "/credentials.json";
  cred_options.account_id = c.account_id;
  cred_options.configured = c.credentials;
  ASSIGN_OR_RETURN(server->credentials_, api::CredentialStore::Open(std::move(cred_options), true));

  objects::S3ApiOptions s3_options;
  s3_options.virtual_host_suffixes = c.virtual_host_suffixes;
  s3_options.default_region = c.regions.front();
  s3_options.account_id = c.account_id;
  server->s3_ = std::make_unique<objects::S3Api>(std::move(s3_options), server->object_store_.get());

  api::FrontDoorOptions door;
  door.auth_enabled = c.auth_enabled;
  door.regions = c.regions;
  door.accept_any_region = c.accept_any_region;
  door.account_id = c.account_id;
  door.version = KilnVersion();
  server->front_door_ = std::make_unique<api::FrontDoor>(door, server->credentials_.get(), server->s3_.get());
  // The JSON services exist from the start so that every operation Kiln does not implement yet
  // answers UnknownOperationException naming it; later issues register operations here.
  server->front_door_->AddJsonService(
      std::make_unique<api::JsonService>("SageMaker", "sagemaker", aws::Protocol::kJson11));
  auto logs = std::make_unique<api::JsonService>("Logs_20140328", "logs", aws::Protocol::kJson11);
  ASSIGN_OR_RETURN(server->log_store_,
                   observe::LogStore::Open({c.data_dir + "/logs", server->database_.get(), nullptr}));
  api::RegisterLogsOperations(logs.get(), server->log_store_.get(), c.account_id, c.regions.front());
  server->front_door_->AddJsonService(std::move(logs));
  server->front_door_->AddJsonService(std::make_unique<api::JsonService>(
      "AnyScaleFrontendService", "application-autoscaling", aws::Protocol::kJson11));
  server->front_door_->AddJsonService(std::make_unique<api::JsonService>(
      "GraniteServiceVersion20100801", "monitoring", aws::Protocol::kJson10));

  net::HttpServerOptions http;
  http.listen = c.listen;
  api::FrontDoor* door_ptr = server->front_door_.get();
  ASSIGN_OR_RETURN(server->http_, net::HttpServer::Create(
                                      http, [door_ptr](net::HttpRequest& request, net::ResponseWriter& response) {
                                        door_ptr->Handle(request, response);
                                      }));
  return server;
}

Server::~Server() { Stop(); }

Status Server::Start() { return http_->Start(); }

void Server::Stop(int grace_seconds) {
  if (http_) http_->Stop(grace_seconds);
}

}  // namespace kiln::cli
