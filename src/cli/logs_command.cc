#include "cli/logs_command.h"

#include <curl/curl.h>

#include <chrono>
#include <map>
#include <ostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "aws/sigv4.h"
#include "base/hash.h"

namespace kiln::cli {
namespace {

using nlohmann::json;

size_t CollectBody(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

// One signed AWS JSON 1.1 call. Returns the decoded output, or the error's code and message.
class JsonClient {
 public:
  explicit JsonClient(const LogsCommandOptions& options) : options_(options) {}

  Result<json> Call(const std::string& service, const std::string& target, const json& input) {
    std::string body = input.dump();
    std::string host;
    ASSIGN_OR_RETURN(auto host_port, HostOf(options_.endpoint));
    host = host_port;
    aws::OwnedSignable request;
    request.method = "POST";
    request.raw_path = "/";
    request.headers.emplace("Host", host);
    request.headers.emplace("Content-Type", "application/x-amz-json-1.1");
    request.headers.emplace("X-Amz-Target", target);
    aws::SignOptions sign;
    sign.access_key_id = options_.credential.access_key_id;
    sign.secret_access_key = options_.credential.secret_access_key;
    sign.session_token = options_.credential.session_token;
    sign.region = options_.region;
    sign.service = service;
    sign.payload_hash = Sha256Hex(body);
    aws::SignRequest(request, sign);

    CURL* curl = curl_easy_init();
    if (curl == nullptr) return Status::Internal("curl_easy_init failed");
    struct curl_slist* headers = nullptr;
    for (const auto& [name, value] : request.headers) {
      if (name == "Host") continue;
      headers = curl_slist_append(headers, (name + ": " + value).c_str());
    }
    std::string response;
    std::string url = options_.endpoint;
    if (url.back() != '/') url += "/";
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, CollectBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (rc != CURLE_OK) {
      return Status::Unavailable("cannot reach Kiln at " + options_.endpoint + ": " + curl_easy_strerror(rc) +
                                 " (is `kiln server` running?)");
    }
    json decoded = json::parse(response, nullptr, false);
    if (status != 200) {
      std::string code = decoded.is_object() ? decoded.value("__type", "error") : "HTTP " + std::to_string(status);
      std::string message = decoded.is_object() ? decoded.value("message", decoded.value("Message", "")) : response;
      StatusCode sc = code == "ResourceNotFoundException" ? StatusCode::kNotFound : StatusCode::kFailedPrecondition;
      return Status(sc, code + ": " + message);
    }
    if (decoded.is_discarded()) return Status::Internal("unparsable answer from Kiln: " + response.substr(0, 200));
    return decoded;
  }

 private:
  static Result<std::string> HostOf(const std::string& endpoint) {
    size_t scheme = endpoint.find("://");
    if (scheme == std::string::npos) return Status::InvalidArgument("endpoint must be a URL, got " + endpoint);
    std::string rest = endpoint.substr(scheme + 3);
    size_t slash = rest.find('/');
    return slash == std::string::npos ? rest : rest.substr(0, slash);
  }

  const LogsCommandOptions& options_;
};

constexpr char kGroup[] = "/aws/sagemaker/TrainingJobs";

}  // namespace

Status RunLogsCommand(const LogsCommandOptions& options, std::ostream& out, std::ostream& status_out) {
  JsonClient client(options);
  // The job must exist (as the SDK's logs_for_job checks first).
  ASSIGN_OR_RETURN(json job,
                   client.Call("sagemaker", "SageMaker.DescribeTrainingJob", {{"TrainingJobName", options.job_name}}));
  std::map<std::string, std::string> tokens;  // stream → next forward token
  while (true) {
    const std::string status = job.value("TrainingJobStatus", "");
    const bool terminal = status == "Completed" || status == "Failed" || status == "Stopped";
    // Streams appear when a host writes its first line; the group may not exist before that.
    std::vector<std::string> streams;
    std::string next;
    do {
      json in = {{"logGroupName", kGroup}, {"logStreamNamePrefix", options.job_name + "/"}};
      if (!next.empty()) in["nextToken"] = next;
      auto page = client.Call("logs", "Logs_20140328.DescribeLogStreams", in);
      if (!page.ok()) {
        if (page.status().IsNotFound()) break;
        return page.status();
      }
      for (const json& s : page->value("logStreams", json::array())) streams.push_back(s.value("logStreamName", ""));
      next = page->value("nextToken", "");
    } while (!next.empty());
    bool printed = true;
    while (printed) {
      printed = false;
      for (const auto& stream : streams) {
        json in = {{"logGroupName", kGroup}, {"logStreamName", stream}, {"startFromHead", true}};
        if (tokens.count(stream)) in["nextToken"] = tokens[stream];
        ASSIGN_OR_RETURN(json page, client.Call("logs", "Logs_20140328.GetLogEvents", in));
        for (const json& e : page.value("events", json::array())) {
          if (options.show_stream_names || streams.size() > 1) out << "[" << stream << "] ";
          out << e.value("message", "") << "\n";
          printed = true;
        }
        tokens[stream] = page.value("nextForwardToken", "");
      }
      out.flush();
    }
    if (!options.follow || terminal) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(options.poll_millis));
    ASSIGN_OR_RETURN(
        job, client.Call("sagemaker", "SageMaker.DescribeTrainingJob", {{"TrainingJobName", options.job_name}}));
  }
  if (options.follow) {
    std::string status = job.value("TrainingJobStatus", "");
    status_out << "kiln logs: training job " << options.job_name << " ended " << status;
    if (job.contains("FailureReason")) status_out << ": " << job["FailureReason"].get<std::string>();
    status_out << "\n";
  }
  return Status::Ok();
}

}  // namespace kiln::cli
