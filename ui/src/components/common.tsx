// Small building blocks of the detail pages.

import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import { objectPath, parseS3Uri } from "../api";
import { Link, seg } from "../router";
import { statusClass } from "../util";

export function Status(props: { status?: string; id?: string }) {
  return (
    <span id={props.id} class={statusClass(props.status)} role={props.id === "resource-status" ? "status" : undefined}>
      {props.status || "—"}
    </span>
  );
}

// A definition list of label → value; empty values are left out.
// A resource's FailureReason, when it has one.
export function FailureReason(props: { reason?: string | null }) {
  if (!props.reason) return null;
  return (
    <p class="failure" role="note">
      <strong>Failure reason:</strong> {props.reason}
    </p>
  );
}

export function Fields(props: { rows: [string, ComponentChildren][] }) {
  const rows = props.rows.filter(([, v]) => v !== undefined && v !== null && v !== "");
  if (rows.length === 0) return null;
  return (
    <dl class="fields">
      {rows.map(([k, v]) => (
        <div class="field" key={k}>
          <dt>{k}</dt>
          <dd>{v}</dd>
        </div>
      ))}
    </dl>
  );
}

export function Section(props: { title: string; children: ComponentChildren; id?: string }) {
  const headingId = (props.id || props.title.toLowerCase().replace(/[^a-z0-9]+/g, "-")) + "-heading";
  return (
    <section class="panel" aria-labelledby={headingId} id={props.id}>
      <h2 id={headingId}>{props.title}</h2>
      {props.children}
    </section>
  );
}

// A key → value table (hyperparameters, environment).
export function KeyValueTable(props: { data?: Record<string, string> | null; caption: string; empty?: string }) {
  const entries = Object.entries(props.data || {});
  if (entries.length === 0) return <p class="muted">{props.empty || "None."}</p>;
  return (
    <table class="kv">
      <caption class="sr-only">{props.caption}</caption>
      <thead>
        <tr>
          <th scope="col">Name</th>
          <th scope="col">Value</th>
        </tr>
      </thead>
      <tbody>
        {entries.map(([k, v]) => (
          <tr key={k}>
            <th scope="row">
              <code>{k}</code>
            </th>
            <td>
              <code class="wrap">{String(v)}</code>
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

// An s3:// URI as a link into the object store page (a prefix) or a download (an object).
export function S3Link(props: { uri?: string | null; download?: boolean }) {
  const parsed = parseS3Uri(props.uri);
  if (!props.uri) return <span class="muted">—</span>;
  if (!parsed) return <code class="wrap">{props.uri}</code>;
  if (props.download && parsed.key && !parsed.key.endsWith("/")) {
    return (
      <span class="s3">
        <code class="wrap">{props.uri}</code>{" "}
        <a href={objectPath(parsed.bucket, parsed.key)} download>
          Download
        </a>{" "}
        <Link to={browsePath(parsed.bucket, parentPrefix(parsed.key))}>Browse folder</Link>
      </span>
    );
  }
  return <Link to={browsePath(parsed.bucket, parsed.key)}>{props.uri}</Link>;
}

function parentPrefix(key: string): string {
  const i = key.lastIndexOf("/");
  return i < 0 ? "" : key.slice(0, i + 1);
}

// /objects/<bucket>/<prefix...> (the prefix keeps its slashes; a trailing one is added).
export function browsePath(bucket: string, prefix: string): string {
  let p = prefix;
  if (p && !p.endsWith("/")) p += "/";
  return "/objects/" + seg(bucket) + (p ? "/" + p.split("/").map(encodeURIComponent).join("/") : "");
}

export function PageError(props: { message?: string | null }) {
  return (
    <div id="page-error" role="alert" class={props.message ? "error" : "error empty"}>
      {props.message || ""}
    </div>
  );
}

// Copies `text`: the Clipboard API where the page is a secure context, else the older
// execCommand("copy") on a temporary textarea (plain-http pages have no navigator.clipboard).
async function copyText(text: string): Promise<boolean> {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch {
    /* fall back below */
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch {
    ok = false;
  }
  area.remove();
  return ok;
}

export function Copyable(props: { text: string; label: string }) {
  const [done, setDone] = useState<string | null>(null);
  return (
    <div class="copyable">
      <pre>
        <code>{props.text}</code>
      </pre>
      <button
        type="button"
        class="small"
        aria-label={`Copy ${props.label}`}
        onClick={async () => {
          setDone((await copyText(props.text)) ? "Copied" : "Select and copy the text");
          setTimeout(() => setDone(null), 2000);
        }}
      >
        Copy
      </button>
      <span class="muted" aria-live="polite">
        {done || ""}
      </span>
    </div>
  );
}
