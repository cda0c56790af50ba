// The Describe* poll behind every detail page, the page heading, and the Connect panel.

import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import { ApiError, getJson, Json, sagemaker } from "../api";
import { usePoll } from "../util";
import { Copyable, PageError, Section, Status } from "./common";

export interface Described {
  data: Json | null;
  error: string | null;
  gone: boolean;
}

// Polls `operation` every 2 s while `isLive(answer)` holds, then every 5 s (only to notice a
// deletion). A missing resource stops the polling with "This <noun> no longer exists" (or "There
// is no <noun> ..." when it never loaded).
export function useDescribe(operation: string, input: Record<string, unknown>, noun: string, isLive: (d: Json) => boolean): Described {
  const [state, setState] = useState<Described>({ data: null, error: null, gone: false });
  const key = JSON.stringify(input);
  usePoll(
    async () => {
      try {
        const data = await sagemaker(operation, input);
        setState({ data, error: null, gone: false });
        return isLive(data) ? true : 5000;
      } catch (e) {
        if (e instanceof ApiError && e.notFound) {
          setState((s) => ({
            data: s.data,
            error: s.data ? `This ${noun} no longer exists.` : `There is no ${noun} with this name. ${e.message}`,
            gone: true,
          }));
          return false;
        }
        setState((s) => ({ ...s, error: e instanceof ApiError ? `${e.code}: ${e.message}` : String(e) }));
        return true;
      }
    },
    2000,
    [operation, key],
  );
  return state;
}

export function DetailHeader(props: { kind: string; name: string; status?: string; error: string | null; children?: ComponentChildren }) {
  return (
    <header class="detail-header">
      <p class="kind">{props.kind}</p>
      <h1 id="resource-title">{props.name}</h1>
      {props.status !== undefined && (
        <p class="status-line">
          Status: <Status id="resource-status" status={props.status} />
          {props.children}
        </p>
      )}
      <PageError message={props.error} />
    </header>
  );
}

const LIVE = new Set(["Pending", "Ready", "Held"]);

// Remote access (kiln connect / kiln ssh-config) to a training job's hosts or an endpoint's
// instances: the targets route says which exist, their state and whether access is enabled.
export function ConnectPanel(props: { resource: string; enableHint: string; live: boolean; title?: string }) {
  const [answer, setAnswer] = useState<Json | null>(null);
  const [error, setError] = useState<string | null>(null);
  usePoll(
    async () => {
      try {
        const a = await getJson(`/_kiln/remote/targets?resource=${encodeURIComponent(props.resource)}`);
        setAnswer(a);
        setError(null);
        return props.live && (a.Targets || []).some((t: Json) => LIVE.has(t.State) || t.State === "Pending");
      } catch (e) {
        if (e instanceof ApiError && /UnknownOperation/.test(e.code)) {
          setError("Remote access is not served by this Kiln server (remote_access in its config).");
          return false;
        }
        setError(e instanceof ApiError ? `${e.code}: ${e.message}` : String(e));
        return props.live;
      }
    },
    5000,
    [props.resource, props.live],
  );
  const targets: Json[] = answer?.Targets || [];
  return (
    <Section title={props.title || "Connect"} id="connect">
      {error && <p class="muted">{error}</p>}
      {answer && !answer.AccessEnabled && (
        <p class="muted">
          Remote access is not enabled for this resource. {props.enableHint}
        </p>
      )}
      {answer && targets.length === 0 && <p class="muted">No instances yet.</p>}
      {targets.length > 0 && (
        <table class="targets">
          <caption class="sr-only">Remote access targets</caption>
          <thead>
            <tr>
              <th scope="col">Target</th>
              <th scope="col">Host</th>
              {targets.some((t) => t.Variant) && <th scope="col">Variant</th>}
              <th scope="col">State</th>
              {answer?.AccessEnabled && <th scope="col">Commands</th>}
            </tr>
          </thead>
          <tbody>
            {targets.map((t) => (
              <tr key={t.Target}>
                <th scope="row">
                  <code>{t.Target}</code>
                </th>
                <td>{t.Hostname}</td>
                {targets.some((x) => x.Variant) && <td>{t.Variant}</td>}
                <td>
                  <Status status={t.State} />
                </td>
                {answer?.AccessEnabled && (
                  <td>
                    <Copyable label={`connect command for ${t.Target}`} text={`kiln connect ${t.Target}`} />
                    <Copyable label={`ssh-config command for ${t.Target}`} text={`kiln ssh-config ${t.Target}`} />
                  </td>
                )}
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </Section>
  );
}
