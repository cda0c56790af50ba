#pragma once
// PrometheusExporter: the text exposition (format 0.0.4) that `GET /metrics` answers with.
//
// Families (labels endpoint="<EndpointName>", variant="<VariantName>"):
//   kiln_invocations_total                  counter  requests that reached a container
//   kiln_invocation_4xx_errors_total        counter  container answered 4xx
//   kiln_invocation_5xx_errors_total        counter  container answered 5xx
//   kiln_invocation_model_errors_total      counter  any ModelError (non-2xx, timeout, socket, ...)
//   kiln_invocation_unavailable_total       counter  no routable instance (503), Kiln extra
//   kiln_model_latency_seconds              histogram request sent to container → response read
//   kiln_overhead_latency_seconds           histogram Kiln's own time (total − model)
//   kiln_routable_instances                 gauge    instances in the current routing snapshot
//   kiln_instance_outstanding_requests      gauge    per instance (extra label instance)
//   kiln_http_client_idle_connections       gauge    pooled keep-alive connections (no labels)
//
// Thread-safety: Render may be called from any thread (it reads snapshots and totals).

#include <functional>
#include <string>

#include "net/http_client.h"
#include "serving/invocation_metrics.h"
#include "serving/routing.h"

namespace kiln::serving {

class PrometheusExporter {
 public:
  // Each pointer may be null (its families are left out); the objects must outlive the exporter.
  PrometheusExporter(const InvocationMetrics* metrics, const RoutingTable* routes, const net::HttpClient* client)
      : metrics_(metrics), routes_(routes), client_(client) {}

  // Idle pooled connections held elsewhere (the event loops' upstream clients), added to the
  // client's in kiln_http_client_idle_connections. Call before rendering.
  void SetExtraIdleConnections(std::function<size_t()> count) { extra_idle_ = std::move(count); }

  // Appends the exposition to `out`.
  void Render(std::string* out) const;

  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  const InvocationMetrics* metrics_;
  const RoutingTable* routes_;
  const net::HttpClient* client_;
  std::function<size_t()> extra_idle_;
};

// A label value escaped for the text format (\\, \", \n).
std::string EscapeLabelValue(std::string_view value);

}  // namespace kiln::serving
