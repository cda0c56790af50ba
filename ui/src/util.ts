// Formatting and the polling hook shared by the pages.

import { useEffect, useRef } from "preact/hooks";

// SageMaker timestamps are epoch seconds (JSON protocols); Logs uses epoch milliseconds.
export function fmtTime(seconds: number | undefined | null): string {
  if (seconds == null) return "—";
  const d = new Date(seconds * 1000);
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// "2h 05m", "3m 12s", "45s".
export function fmtDuration(seconds: number | undefined | null): string {
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d ${String(Math.floor((s % 86400) / 3600)).padStart(2, "0")}h`;
}

// From start to end (or now while it runs).
export function duration(start: number | undefined, end: number | undefined): string {
  if (start == null) return "—";
  return fmtDuration((end ?? Date.now() / 1000) - start);
}

export function nowSeconds(): number {
  return Date.now() / 1000;
}

// Calls `tick` at once and then every `intervalMs` while the page is visible (a hidden tab costs
// the server nothing); again at once when it becomes visible. `tick` returns false to stop
// polling (a finished or deleted resource). Ticks never overlap: the next is scheduled after the
// previous one settles. A number returned is the delay before the next tick instead of
// `intervalMs` (a finished resource is still watched, slowly, for its deletion). Stops on unmount;
// `deps` restart it.
export function usePoll(tick: () => Promise<boolean | number | void>, intervalMs: number, deps: unknown[]): void {
  const tickRef = useRef(tick);
  tickRef.current = tick;
  useEffect(() => {
    let stopped = false;
    let running = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async () => {
      if (stopped || running) return;
      if (document.visibilityState !== "visible") return; // resumed by visibilitychange
      running = true;
      let again: boolean | number | void = true;
      try {
        again = await tickRef.current();
      } catch {
        // the tick shows its own errors; keep polling (the server may come back)
      }
      running = false;
      if (stopped) return;
      if (again === false) {
        stopped = true;
        return;
      }
      timer = setTimeout(run, typeof again === "number" ? again : intervalMs);
    };
    const onVisible = () => {
      if (document.visibilityState === "visible" && !running && !stopped) {
        clearTimeout(timer);
        run();
      }
    };
    document.addEventListener("visibilitychange", onVisible);
    run();
    return () => {
      stopped = true;
      clearTimeout(timer);
      document.removeEventListener("visibilitychange", onVisible);
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, deps);
}

// CSS class of a status badge.
export function statusClass(status: string | undefined): string {
  if (!status) return "status";
  if (/^(Completed|InService|Ready|Held)$/.test(status)) return "status ok";
  if (/Failed/.test(status)) return "status bad";
  if (/^(Stopped|Stopping|OutOfService|Deleting|Gone)$/.test(status)) return "status off";
  return "status busy";
}
