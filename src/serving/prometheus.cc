#include "serving/prometheus.h"

#include <cstdio>

namespace kiln::serving {

namespace {

void AppendDouble(std::string* out, double value) {
  char buf[64];
  int n = std::snprintf(buf, sizeof(buf), "%g", value);
  out->append(buf, static_cast<size_t>(n));
}

void AppendSeconds(std::string* out, int64_t micros) {
  char buf[64];
  int n = std::snprintf(buf, sizeof(buf), "%.6f", static_cast<double>(micros) / 1e6);
  out->append(buf, static_cast<size_t>(n));
}

void Labels(std::string* out, std::string_view endpoint, std::string_view variant) {
  out->append("endpoint=\"").append(EscapeLabelValue(endpoint)).append("\",variant=\"");
  out->append(EscapeLabelValue(variant)).append("\"");
}

using Totals = std::map<std::pair<std::string, std::string>, InvocationCounts>;

template <typename Get>
void Counter(std::string* out, const Totals& totals, const char* name, const char* help, Get get) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" counter\n");
  for (const auto& [key, counts] : totals) {
    out->append(name).append("{");
    Labels(out, key.first, key.second);
    out->append("} ").append(std::to_string(get(counts))).append("\n");
  }
}

template <typename Get>
void Histogram(std::string* out, const Totals& totals, const char* name, const char* help, Get get) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" histogram\n");
  for (const auto& [key, counts] : totals) {
    const LatencyHistogram& h = get(counts);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.buckets.size(); ++i) {
      cumulative += h.buckets[i];
      out->append(name).append("_bucket{");
      Labels(out, key.first, key.second);
      out->append(",le=\"");
      if (i < kLatencyBucketsMicros.size()) {
        AppendDouble(out, static_cast<double>(kLatencyBucketsMicros[i]) / 1e6);
      } else {
        out->append("+Inf");
      }
      out->append("\"} ").append(std::to_string(cumulative)).append("\n");
    }
    out->append(name).append("_sum{");
    Labels(out, key.first, key.second);
    out->append("} ");
    AppendSeconds(out, h.sum_micros);
    out->append("\n");
    out->append(name).append("_count{");
    Labels(out, key.first, key.second);
    out->append("} ").append(std::to_string(h.count)).append("\n");
  }
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PrometheusExporter::Render(std::string* out) const {
  if (metrics_ != nullptr) {
    Totals totals = metrics_->Totals();
    Counter(out, totals, "kiln_invocations_total", "InvokeEndpoint requests that reached a model container.",
            [](const InvocationCounts& c) { return c.invocations; });
    Counter(out, totals, "kiln_invocation_4xx_errors_total", "Invocations the model answered with a 4xx status.",
            [](const InvocationCounts& c) { return c.errors_4xx; });
    Counter(out, totals, "kiln_invocation_5xx_errors_total", "Invocations the model answered with a 5xx status.",
            [](const InvocationCounts& c) { return c.errors_5xx; });
    Counter(out, totals, "kiln_invocation_model_errors_total",
            "Invocations answered with ModelError (non-2xx, timeout, socket error, malformed response).",
            [](const InvocationCounts& c) { return c.model_errors; });
    Counter(out, totals, "kiln_invocation_unavailable_total",
            "Invocations refused with ServiceUnavailable: the variant had no routable instance.",
            [](const InvocationCounts& c) { return c.unavailable; });
    Histogram(out, totals, "kiln_model_latency_seconds",
              "Time from sending the request to the container until its whole response was read.",
              [](const InvocationCounts& c) -> const LatencyHistogram& { return c.model_latency; });
    Histogram(out, totals, "kiln_overhead_latency_seconds",
              "Kiln's time on an invocation: from receiving the request to sending the answer, minus model latency.",
              [](const InvocationCounts& c) -> const LatencyHistogram& { return c.overhead_latency; });
  }
  if (routes_ != nullptr) {
    std::shared_ptr<const RoutingTable::Map> all = routes_->All();
    out->append("# HELP kiln_routable_instances Instances in the routing snapshot of each variant.\n");
    out->append("# TYPE kiln_routable_instances gauge\n");
    for (const auto& [name, route] : *all) {
      for (const VariantRoute& variant : route->variants) {
        out->append("kiln_routable_instances{");
        Labels(out, route->name, variant.name);
        out->append("} ").append(std::to_string(variant.instances.size())).append("\n");
      }
    }
    out->append("# HELP kiln_instance_outstanding_requests Requests sent to an instance and not yet answered.\n");
    out->append("# TYPE kiln_instance_outstanding_requests gauge\n");
    for (const auto& [name, route] : *all) {
      for (const VariantRoute& variant : route->variants) {
        for (const auto& instance : variant.instances) {
          out->append("kiln_instance_outstanding_requests{");
          Labels(out, route->name, variant.name);
          out->append(",instance=\"").append(EscapeLabelValue(instance->instance_id)).append("\"} ");
          out->append(std::to_string(instance->outstanding.load(std::memory_order_relaxed))).append("\n");
        }
      }
    }
  }
  if (client_ != nullptr) {
    out->append("# HELP kiln_http_client_idle_connections Idle keep-alive connections to serving containers.\n");
    out->append("# TYPE kiln_http_client_idle_connections gauge\n");
    const size_t idle = client_->idle_connections() + (extra_idle_ ? extra_idle_() : 0);
    out->append("kiln_http_client_idle_connections ").append(std::to_string(idle)).append("\n");
  }
}

}  // namespace kiln::serving
