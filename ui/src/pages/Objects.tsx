// The object store: buckets (S3 ListBuckets, GET /), then a bucket's folders and objects one level
// at a time (ListObjectsV2 with delimiter "/", 200 a page, continuation tokens), with download
// links (plain GETs of /<bucket>/<key>: the session cookie authenticates them).

import { useState } from "preact/hooks";
import { ApiError, objectPath, s3Get } from "../api";
import { browsePath, PageError } from "../components/common";
import { Link } from "../router";
import { usePoll } from "../util";

const PAGE = 200;

function text(el: Element, tag: string): string {
  return el.getElementsByTagName(tag)[0]?.textContent || "";
}

function fmtSize(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = bytes / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

function fmtIso(iso: string): string {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function BucketsPage() {
  const [buckets, setBuckets] = useState<{ name: string; created: string }[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  usePoll(
    async () => {
      try {
        const doc = await s3Get("/");
        setBuckets(Array.from(doc.getElementsByTagName("Bucket")).map((b) => ({ name: text(b, "Name"), created: text(b, "CreationDate") })));
        setError(null);
      } catch (e) {
        setError(e instanceof ApiError ? `${e.code}: ${e.message}` : String(e));
      }
    },
    5000,
    [],
  );
  return (
    <div class="list-page">
      <h1>Object store</h1>
      <PageError message={error} />
      <table id="resource-table" class="resources">
        <caption class="sr-only">Buckets</caption>
        <thead>
          <tr>
            <th scope="col">Bucket</th>
            <th scope="col">Created</th>
          </tr>
        </thead>
        <tbody>
          {buckets?.map((b) => (
            <tr key={b.name} data-name={b.name}>
              <td>
                <Link to={browsePath(b.name, "")}>{b.name}</Link>
              </td>
              <td>{fmtIso(b.created)}</td>
            </tr>
          ))}
          {buckets?.length === 0 && (
            <tr class="empty-row">
              <td colSpan={2}>No buckets yet.</td>
            </tr>
          )}
        </tbody>
      </table>
      <p id="page-status" class="muted">
        {buckets === null ? "Loading" : `${buckets.length} buckets`}
      </p>
    </div>
  );
}

interface Listing {
  folders: string[];
  objects: { key: string; size: number; modified: string }[];
  next?: string;
}

export function BucketPage(props: { bucket: string; prefix: string }) {
  const { bucket, prefix } = props;
  const [tokens, setTokens] = useState<(string | undefined)[]>([undefined]);
  const [page, setPage] = useState(0);
  const [listing, setListing] = useState<Listing | null>(null);
  const [error, setError] = useState<string | null>(null);
  const key = `${bucket}\n${prefix}`;
  const [shownKey, setShownKey] = useState(key);
  if (shownKey !== key) {
    // Another folder: start at its first page.
    setShownKey(key);
    setTokens([undefined]);
    setPage(0);
    setListing(null);
  }
  usePoll(
    async () => {
      let q = `list-type=2&delimiter=%2F&max-keys=${PAGE}&prefix=${encodeURIComponent(prefix)}`;
      if (tokens[page]) q += `&continuation-token=${encodeURIComponent(tokens[page]!)}`;
      try {
        const doc = await s3Get(`/${encodeURIComponent(bucket)}?${q}`);
        const root = doc.documentElement;
        const folders = Array.from(root.getElementsByTagName("CommonPrefixes")).map((p) => text(p, "Prefix"));
        const objects = Array.from(root.getElementsByTagName("Contents")).map((c) => ({
          key: text(c, "Key"),
          size: Number(text(c, "Size")),
          modified: text(c, "LastModified"),
        }));
        const truncated = text(root, "IsTruncated") === "true";
        setListing({ folders, objects, next: truncated ? text(root, "NextContinuationToken") : undefined });
        setError(null);
      } catch (e) {
        setError(e instanceof ApiError ? `${e.code}: ${e.message}` : String(e));
        if (e instanceof ApiError && e.notFound) return false;
      }
      return true;
    },
    5000,
    [bucket, prefix, page, tokens],
  );

  // Breadcrumbs: bucket / a / b /
  const parts = prefix.split("/").filter(Boolean);
  const count = listing ? listing.folders.length + listing.objects.length : 0;
  return (
    <div class="list-page">
      <nav aria-label="Breadcrumb" class="crumbs">
        <Link to="/objects">Object store</Link> / <Link to={browsePath(bucket, "")}>{bucket}</Link>
        {parts.map((p, i) => (
          <span key={i}>
            {" / "}
            <Link to={browsePath(bucket, parts.slice(0, i + 1).join("/") + "/")}>{p}</Link>
          </span>
        ))}
      </nav>
      <h1 id="resource-title">{prefix ? `${bucket}/${prefix}` : bucket}</h1>
      <PageError message={error} />
      <table id="resource-table" class="resources">
        <caption class="sr-only">Contents of {prefix || bucket}</caption>
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col" class="num">
              Size
            </th>
            <th scope="col">Last modified</th>
            <th scope="col">Download</th>
          </tr>
        </thead>
        <tbody>
          {listing?.folders.map((f) => (
            <tr key={"d:" + f} data-name={f}>
              <td>
                <Link to={browsePath(bucket, f)}>{f.slice(prefix.length)}</Link>
              </td>
              <td class="num">folder</td>
              <td>—</td>
              <td>—</td>
            </tr>
          ))}
          {listing?.objects.map((o) => (
            <tr key={"o:" + o.key} data-name={o.key}>
              <td>{o.key.slice(prefix.length) || o.key}</td>
              <td class="num">{fmtSize(o.size)}</td>
              <td>{fmtIso(o.modified)}</td>
              <td>
                <a href={objectPath(bucket, o.key)} download aria-label={`Download ${o.key}`}>
                  Download
                </a>
              </td>
            </tr>
          ))}
          {listing && count === 0 && (
            <tr class="empty-row">
              <td colSpan={4}>Empty.</td>
            </tr>
          )}
        </tbody>
      </table>
      <div class="pager">
        <button type="button" id="prev-page" disabled={page === 0} onClick={() => (setListing(null), setPage(page - 1))}>
          Previous
        </button>
        <span id="page-status" aria-live="polite">
          {listing === null ? `Page ${page + 1} · loading` : count === 0 ? `Page ${page + 1} · none` : `Page ${page + 1} · ${page * PAGE + 1}–${page * PAGE + count}`}
        </span>
        <button
          type="button"
          id="next-page"
          disabled={!listing?.next}
          onClick={() => {
            const t = tokens.slice(0, page + 1);
            t.push(listing!.next);
            setTokens(t);
            setListing(null);
            setPage(page + 1);
          }}
        >
          Next
        </button>
      </div>
    </div>
  );
}
