// An endpoint: variants (weights, instance counts, status), its instances (the remote-access
// targets route), invocation charts per variant (AWS/SageMaker, EndpointName + VariantName; Kiln
// writes them once a second), instance metrics, recent error lines from its log group, the log
// tail and the Connect panel.

import { useMemo, useState } from "preact/hooks";
import { ApiError, Json, logs } from "../api";
import { MetricCharts, MetricSpec } from "../components/Charts";
import { FailureReason, Fields, Section, Status } from "../components/common";
import { ConnectPanel, DetailHeader, useDescribe } from "../components/describe";
import { LogTail } from "../components/LogTail";
import { Link } from "../router";
import { fmtTime, nowSeconds, usePoll } from "../util";

const INVOCATION_METRICS: [string, string, string][] = [
  ["Invocations", "Sum", ""],
  ["ModelLatency", "Average", "µs"],
  ["OverheadLatency", "Average", "µs"],
  ["Invocation4XXErrors", "Sum", ""],
  ["Invocation5XXErrors", "Sum", ""],
];
const ENDPOINT_INSTANCE_NS = "/aws/sagemaker/Endpoints";
const WINDOW_SECONDS = 3600;
const ERROR_PATTERN = "?error ?Error ?ERROR ?Traceback ?Exception";

function liveEndpoint(status?: string): boolean {
  return !!status && !["Failed", "Deleting", "OutOfService"].includes(status);
}

export function EndpointPage(props: { name: string }) {
  const { name } = props;
  // Endpoints keep serving: the describe poll goes on while the page is open.
  const { data: d, error, gone } = useDescribe("DescribeEndpoint", { EndpointName: name }, "endpoint", () => true);
  // The charts show the last hour (fixed when the page opened; CloudWatch's 1-s periods need a
  // start less than 3 hours old).
  const [openedAt] = useState(() => Math.floor(nowSeconds()));
  if (!d) return <DetailHeader kind="Endpoint" name={name} status={gone ? "Not found" : "Loading"} error={error} />;
  const live = !gone && liveEndpoint(d.EndpointStatus);
  const start = Math.max(Math.floor(d.CreationTime || 0), openedAt - WINDOW_SECONDS);
  const variants: Json[] = d.ProductionVariants || [];
  return (
    <>
      <DetailHeader kind="Endpoint" name={name} status={d.EndpointStatus} error={error} />
      <FailureReason reason={d.FailureReason} />
      <Section title="Summary">
        <Fields
          rows={[
            ["ARN", <code class="wrap">{d.EndpointArn}</code>],
            ["Endpoint config", <Link to={`/endpoint-configs/${encodeURIComponent(d.EndpointConfigName)}`}>{d.EndpointConfigName}</Link>],
            ["Created", fmtTime(d.CreationTime)],
            ["Last modified", fmtTime(d.LastModifiedTime)],
            [
              "Pending deployment",
              d.PendingDeploymentSummary ? (
                <Link to={`/endpoint-configs/${encodeURIComponent(d.PendingDeploymentSummary.EndpointConfigName)}`}>
                  {d.PendingDeploymentSummary.EndpointConfigName}
                </Link>
              ) : undefined,
            ],
            ["Invoke URL", <code class="wrap">{`${location.origin}/endpoints/${name}/invocations`}</code>],
          ]}
        />
      </Section>
      <Section title="Variants">
        <table class="kv">
          <caption class="sr-only">Production variants</caption>
          <thead>
            <tr>
              <th scope="col">Variant</th>
              <th scope="col">Status</th>
              <th scope="col">Weight (current / desired)</th>
              <th scope="col">Instances (current / desired)</th>
              <th scope="col">Image</th>
            </tr>
          </thead>
          <tbody>
            {variants.map((v) => (
              <tr key={v.VariantName}>
                <th scope="row">{v.VariantName}</th>
                <td>
                  {(v.VariantStatus || []).length === 0
                    ? "—"
                    : v.VariantStatus.map((s: Json, i: number) => (
                        <div key={i}>
                          <Status status={s.Status} /> {s.StatusMessage}
                        </div>
                      ))}
                </td>
                <td class="num">
                  {v.CurrentWeight ?? "—"} / {v.DesiredWeight ?? "—"}
                </td>
                <td class="num">
                  {v.CurrentServerlessConfig
                    ? `serverless, max concurrency ${v.CurrentServerlessConfig.MaxConcurrency}`
                    : `${v.CurrentInstanceCount ?? "—"} / ${v.DesiredInstanceCount ?? "—"}`}
                </td>
                <td>
                  {(v.DeployedImages || []).map((im: Json, i: number) => (
                    <code key={i} class="wrap">
                      {im.SpecifiedImage}
                    </code>
                  ))}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
      {variants.map((v) => (
        <VariantCharts key={v.VariantName} endpoint={name} variant={v.VariantName} start={start} live={live} />
      ))}
      <Section title="Recent errors">
        <RecentErrors endpoint={name} since={start} live={live} />
      </Section>
      <Section title="Logs">
        <LogTail group={`/aws/sagemaker/Endpoints/${name}`} prefix="" live={live} emptyText="No log stream yet: no instance has started." />
      </Section>
      <ConnectPanel
        title="Instances and remote access"
        resource={`endpoint/${name}`}
        live={live}
        enableHint="Enable it with EnableSSMAccess: true on the variant in a new endpoint config, then update the endpoint to it."
      />
    </>
  );
}

function VariantCharts(props: { endpoint: string; variant: string; start: number; live: boolean }) {
  const { endpoint, variant } = props;
  const dims = { EndpointName: endpoint, VariantName: variant };
  const specs = useMemo<MetricSpec[]>(
    () => [
      ...INVOCATION_METRICS.map(([metric, stat, unit]) => ({
        id: `${variant}:${metric}`,
        namespace: "AWS/SageMaker",
        metric,
        dimensions: dims,
        stat,
        unit,
        extra: { "data-variant": variant },
      })),
      ...["CPUUtilization", "MemoryUtilization", "GPUUtilization", "GPUMemoryUtilization"].map((metric) => ({
        id: `${variant}:inst:${metric}`,
        namespace: ENDPOINT_INSTANCE_NS,
        metric,
        dimensions: dims,
        stat: "Average",
        unit: "%",
        hideEmpty: metric.startsWith("GPU"),
        extra: { "data-variant": variant },
      })),
    ],
    [endpoint, variant],
  );
  return (
    <Section title={`Metrics · ${variant}`} id={`metrics-${variant}`}>
      <p class="muted">Last hour, per second: invocations and errors are sums, latencies averages.</p>
      <MetricCharts specs={specs} start={props.start} live={props.live} />
    </Section>
  );
}

// Lines of the endpoint's log group that look like errors, since the window start (newest last).
function RecentErrors(props: { endpoint: string; since: number; live: boolean }) {
  const [events, setEvents] = useState<Json[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  usePoll(
    async () => {
      try {
        const found: Json[] = [];
        let token: string | undefined;
        for (let i = 0; i < 5; i++) {
          const input: Record<string, unknown> = {
            logGroupName: `/aws/sagemaker/Endpoints/${props.endpoint}`,
            filterPattern: ERROR_PATTERN,
            startTime: props.since * 1000,
            limit: 1000,
          };
          if (token) input.nextToken = token;
          const out = await logs("FilterLogEvents", input);
          found.push(...(out.events || []));
          token = out.nextToken;
          if (!token) break;
        }
        setEvents(found.slice(-50));
        setError(null);
      } catch (e) {
        if (e instanceof ApiError && e.code.includes("ResourceNotFound")) setEvents([]);
        else setError(e instanceof ApiError ? `${e.code}: ${e.message}` : String(e));
      }
      return props.live;
    },
    10000,
    [props.endpoint, props.since, props.live],
  );
  if (error) return <p class="error">{error}</p>;
  if (events === null) return <p class="muted">Loading…</p>;
  if (events.length === 0) return <p class="muted">No error lines in the last hour.</p>;
  return (
    <div class="log errors" role="log" aria-label="Recent error lines" tabIndex={0}>
      {events.map((e) => (
        <div class="error-line" key={e.eventId}>
          <span class="muted">
            {fmtTime(e.timestamp / 1000)} {e.logStreamName}
          </span>{" "}
          {e.message}
        </div>
      ))}
    </div>
  );
}
