// Metric charts: CloudWatch GetMetricData, fetched incrementally while the resource is live, drawn
// by uPlot (lazy chunk). DOM contract: <figure class="metric-chart" data-metric data-points data-sum>
// with <figcaption> = the metric name and "No data points yet" while it has none.

import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, cloudwatch, Json } from "../api";
import type { DrawnChart, XRange } from "../chart-impl";
import { nowSeconds, usePoll } from "../util";

let implPromise: Promise<typeof import("../chart-impl")> | null = null;
function loadImpl() {
  if (!implPromise) implPromise = import("../chart-impl");
  return implPromise;
}

export function ChartFigure(props: {
  metric: string;
  caption?: string;
  unit?: string;
  xs: number[];
  ys: number[];
  range?: XRange;
  extra?: Record<string, string>;
}) {
  const { xs, ys } = props;
  const holder = useRef<HTMLDivElement>(null);
  const chart = useRef<DrawnChart | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  let n = 0;
  let sum = 0;
  let min = Infinity;
  let max = -Infinity;
  for (const v of ys) {
    if (v == null || !Number.isFinite(v)) continue;
    n++;
    sum += v;
    min = Math.min(min, v);
    max = Math.max(max, v);
  }

  useEffect(() => {
    if (n === 0) {
      chart.current?.destroy();
      chart.current = null;
      return;
    }
    const el = holder.current;
    if (!el) return;
    if (chart.current) {
      chart.current.setData(xs, ys, props.range || null);
      return;
    }
    let cancelled = false;
    loadImpl()
      .then((impl) => {
        if (cancelled || !holder.current) return;
        chart.current?.destroy();
        chart.current = impl.drawChart(holder.current, props.metric, props.unit || "", xs, ys, holder.current.clientWidth, props.range || null);
      })
      .catch((e) => setLoadError(`The chart code could not be loaded: ${e}`));
    return () => {
      cancelled = true;
    };
  }, [xs, ys, n]);

  // Follow the width of the page.
  useEffect(() => {
    const el = holder.current;
    if (!el || typeof ResizeObserver === "undefined") return;
    const ro = new ResizeObserver(() => chart.current?.setWidth(el.clientWidth));
    ro.observe(el);
    return () => ro.disconnect();
  }, [n === 0]);

  useEffect(() => () => chart.current?.destroy(), []);

  const fmt = (v: number) => (Math.abs(v) >= 1000 || Number.isInteger(v) ? String(Math.round(v * 100) / 100) : v.toPrecision(4));
  return (
    <figure class="metric-chart" data-metric={props.metric} data-points={String(n)} data-sum={String(sum)} {...props.extra}>
      <figcaption>{props.caption || props.metric}</figcaption>
      {n === 0 ? (
        <p class="no-data">No data points yet</p>
      ) : (
        <>
          <div class="chart-holder" ref={holder} aria-hidden="true" />
          <p class="sr-only">
            {n} points; latest {fmt(ys[ys.length - 1])}, lowest {fmt(min)}, highest {fmt(max)}
            {props.unit ? ` ${props.unit}` : ""}.
          </p>
        </>
      )}
      {loadError && <p class="error">{loadError}</p>}
    </figure>
  );
}

export interface MetricSpec {
  id: string; // unique in the group: the GetMetricData query id is derived from its position
  namespace: string;
  metric: string;
  dimensions: Record<string, string>;
  stat: string; // Average, Sum, Maximum
  unit?: string;
  caption?: string;
  hideEmpty?: boolean; // GPU metrics: not shown at all on instances without GPUs
  extra?: Record<string, string>;
}

interface Series {
  xs: number[];
  ys: number[];
}

// CloudWatch's rule: periods under a minute only while StartTime is less than 3 hours old, then a
// multiple of 60; of 300 past 15 days; of 3600 past 63 days (a margin keeps a page opened just
// before a boundary valid for a while).
export function periodFor(startSeconds: number): number {
  const age = nowSeconds() - startSeconds + 600;
  if (age < 3 * 3600) return 1;
  if (age < 15 * 86400) return 60;
  if (age < 63 * 86400) return 300;
  return 3600;
}

// Fetches every spec from `start` (epoch s) to `end` (or now, while `live`), then, while live,
// every 2 s the points since the last fetch (with an overlap: a second's statistics may still
// grow after it was first read).
export function MetricCharts(props: { specs: MetricSpec[]; start: number; end?: number; live: boolean; emptyText?: string }) {
  const { specs, start, end, live } = props;
  const [series, setSeries] = useState<Record<string, Series>>({});
  const [error, setError] = useState<string | null>(null);
  const fetchedTo = useRef<number | null>(null);
  const period = useRef(periodFor(start));
  const specKey = specs.map((s) => s.id).join("|");

  useEffect(() => {
    setSeries({});
    fetchedTo.current = null;
    period.current = periodFor(start);
  }, [specKey, start]);

  usePoll(
    async () => {
      if (specs.length === 0) return false;
      const p = period.current;
      const overlap = p === 1 ? 30 : 3 * p;
      const from = fetchedTo.current === null ? start : Math.max(start, fetchedTo.current - overlap);
      const to = end != null && !live ? end + p : nowSeconds() + p;
      const fromAligned = Math.floor(from / p) * p;
      const queries = specs.map((s, i) => ({
        Id: `m${i}`,
        MetricStat: {
          Metric: {
            Namespace: s.namespace,
            MetricName: s.metric,
            Dimensions: Object.entries(s.dimensions).map(([Name, Value]) => ({ Name, Value })),
          },
          Period: p,
          Stat: s.stat,
        },
        ReturnData: true,
      }));
      const got: Record<string, Series> = {};
      let token: string | undefined;
      try {
        for (let pageNo = 0; pageNo < 50; pageNo++) {
          const input: Record<string, unknown> = {
            MetricDataQueries: queries,
            StartTime: fromAligned,
            EndTime: Math.ceil(to),
            ScanBy: "TimestampAscending",
          };
          if (token) input.NextToken = token;
          const out: Json = await cloudwatch("GetMetricData", input);
          for (const r of out.MetricDataResults || []) {
            const spec = specs[Number(String(r.Id).slice(1))];
            if (!spec) continue;
            const s = (got[spec.id] ||= { xs: [], ys: [] });
            const ts: number[] = r.Timestamps || [];
            const vs: number[] = r.Values || [];
            for (let i = 0; i < ts.length; i++) {
              s.xs.push(ts[i]);
              s.ys.push(vs[i]);
            }
          }
          token = out.NextToken;
          if (!token) break;
        }
        setError(null);
      } catch (e) {
        setError(e instanceof ApiError ? `Metrics could not be read: ${e.code}: ${e.message}` : String(e));
        return live;
      }
      fetchedTo.current = to - p;
      setSeries((old) => {
        const next: Record<string, Series> = {};
        for (const spec of specs) {
          const prev = old[spec.id] || { xs: [], ys: [] };
          const add = got[spec.id] || { xs: [], ys: [] };
          // Keep what is older than this fetch; take the fetch's points (sorted) for the rest.
          const keep = prev.xs.findIndex((x) => x >= fromAligned);
          const cut = keep < 0 ? prev.xs.length : keep;
          const pairs = add.xs.map((x, i) => [x, add.ys[i]] as [number, number]).sort((a, b) => a[0] - b[0]);
          next[spec.id] = {
            xs: prev.xs.slice(0, cut).concat(pairs.map((q) => q[0])),
            ys: prev.ys.slice(0, cut).concat(pairs.map((q) => q[1])),
          };
        }
        return next;
      });
      return live;
    },
    2000,
    [specKey, start, end, live],
  );

  const shown = specs.filter((s) => !s.hideEmpty || (series[s.id]?.xs.length || 0) > 0);
  return (
    <div class="charts">
      {error && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
      {shown.length === 0 && <p class="muted">{props.emptyText || "No metrics."}</p>}
      <div class="chart-grid">
        {shown.map((s) => (
          <ChartFigure
            key={s.id}
            metric={s.metric}
            caption={s.caption}
            unit={s.unit}
            xs={series[s.id]?.xs || []}
            ys={series[s.id]?.ys || []}
            extra={s.extra}
            range={[start, end != null && !live ? end : nowSeconds()]}
          />
        ))}
      </div>
    </div>
  );
}
