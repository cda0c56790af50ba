// Live log tail over CloudWatch Logs: the streams of a group under a prefix (DescribeLogStreams),
// the last 500 events of the chosen one (GetLogEvents startFromHead=false), then every 2 s the
// events after nextForwardToken. The DOM keeps at most MAX_LINES lines ("N earlier lines not
// shown"), so a chatty job cannot grow the page without bound.
//
// DOM contract: <div id="log-tail" role="log" aria-live="polite" data-line-count=<lines received>>
// with one <div class="log-line"> per shown line.

import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, Json, logs } from "../api";
import { usePoll } from "../util";

export const MAX_LINES = 2000;
const TAIL = 500;

interface Line {
  n: number;
  t: number;
  text: string;
}

export function LogTail(props: { group: string; prefix: string; live: boolean; emptyText?: string }) {
  const { group, prefix, live } = props;
  const [streams, setStreams] = useState<string[]>([]);
  const [stream, setStream] = useState<string>("");
  const [lines, setLines] = useState<Line[]>([]);
  const [received, setReceived] = useState(0);
  const [error, setError] = useState<string | null>(null);
  const [follow, setFollow] = useState(true);
  const token = useRef<string | null>(null);
  const ticks = useRef(0);
  const box = useRef<HTMLDivElement>(null);
  const receivedRef = useRef(0);
  // One more round after the resource stops being live, so the last lines arrive.
  const finalRound = useRef(false);
  const streamRef = useRef(stream);
  streamRef.current = stream;

  useEffect(() => {
    token.current = null;
    receivedRef.current = 0;
    setLines([]);
    setReceived(0);
  }, [group, stream]);

  usePoll(
    async () => {
      ticks.current++;
      try {
        // The streams: until one exists, then every 5th round (a restarted host adds a stream).
        if (streams.length === 0 || ticks.current % 5 === 0) {
          const found: string[] = [];
          // The default stream: the newest (a retried or resumed job starts a new epoch's
          // stream); among equals, the first by name (algo-1 before algo-2).
          let newest = "";
          let newestTime = -Infinity;
          let next: string | undefined;
          for (let i = 0; i < 10; i++) {
            const input: Record<string, unknown> = { logGroupName: group, limit: 50 };
            if (prefix) input.logStreamNamePrefix = prefix;
            if (next) input.nextToken = next;
            const out: Json = await logs("DescribeLogStreams", input);
            for (const s of out.logStreams || []) {
              found.push(s.logStreamName);
              const t = Number(s.creationTime || 0);
              if (t > newestTime) {
                newestTime = t;
                newest = s.logStreamName;
              }
            }
            next = out.nextToken;
            if (!next) break;
          }
          if (found.join("\n") !== streams.join("\n")) setStreams(found);
          if (!stream && found.length > 0) {
            setStream(newest || found[0]);
            return true; // the stream effect resets; the next round reads it
          }
        }
        if (!stream) {
          setError(null);
          if (!live) {
            if (finalRound.current) return false;
            finalRound.current = true;
          }
          return true;
        }
        const input: Record<string, unknown> = { logGroupName: group, logStreamName: stream };
        if (token.current === null) {
          input.startFromHead = false;
          input.limit = TAIL;
        } else {
          input.nextToken = token.current;
          input.startFromHead = true;
          input.limit = 10000;
        }
        const out: Json = await logs("GetLogEvents", input);
        if (streamRef.current !== stream) return true; // another stream was chosen meanwhile
        const events: Json[] = out.events || [];
        if (out.nextForwardToken) token.current = out.nextForwardToken;
        if (events.length > 0) {
          const base = receivedRef.current;
          receivedRef.current += events.length;
          setReceived(receivedRef.current);
          setLines((old) => {
            const add = events.map((e, i) => ({ n: base + i, t: e.timestamp, text: String(e.message) }));
            const all = old.concat(add);
            return all.length > MAX_LINES ? all.slice(all.length - MAX_LINES) : all;
          });
        }
        setError(null);
      } catch (e) {
        if (e instanceof ApiError && e.code.includes("ResourceNotFound")) {
          // The group or stream does not exist yet (nothing logged yet).
          setError(null);
        } else {
          setError(e instanceof ApiError ? `Logs could not be read: ${e.code}: ${e.message}` : String(e));
        }
      }
      if (!live) {
        if (finalRound.current) return false;
        finalRound.current = true;
      }
      return true;
    },
    2000,
    [group, prefix, stream, live, streams.length],
  );

  // Keep the newest line in view while following.
  useEffect(() => {
    const el = box.current;
    if (el && follow) el.scrollTop = el.scrollHeight;
  }, [lines, follow]);

  const hidden = received - lines.length;
  return (
    <div class="log-panel">
      <div class="log-controls">
        {streams.length > 1 && (
          <>
            <label for="log-stream">Stream</label>
            <select id="log-stream" value={stream} onChange={(e) => setStream((e.target as HTMLSelectElement).value)}>
              {streams.map((s) => (
                <option key={s} value={s}>
                  {s}
                </option>
              ))}
            </select>
          </>
        )}
        {streams.length === 1 && (
          <span class="muted">
            Stream <code>{stream}</code>
          </span>
        )}
        <label class="check">
          <input type="checkbox" checked={follow} onChange={(e) => setFollow((e.target as HTMLInputElement).checked)} /> Follow
          the newest line
        </label>
      </div>
      {error && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
      {hidden > 0 && <p class="muted log-hidden">{hidden} earlier lines not shown</p>}
      <div
        id="log-tail"
        role="log"
        aria-live="polite"
        aria-label={`Log of ${stream || prefix}`}
        tabIndex={0}
        data-line-count={String(received)}
        ref={box}
        class={lines.length === 0 ? "log empty" : "log"}
      >
        {lines.length === 0 && <p class="muted">{stream ? "No log lines yet." : props.emptyText || "No log stream yet."}</p>}
        {lines.map((l) => (
          <div class="log-line" key={l.n}>
            {l.text}
          </div>
        ))}
      </div>
    </div>
  );
}
