// A resource list: server-paged (MaxResults 50, NextToken; Previous walks back a stack of the
// tokens that led to each page), filtered (NameContains, StatusEquals) and sorted (SortBy,
// SortOrder) by the List* API itself, refreshed every 5 s while visible.

import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, Json, sagemaker } from "../api";
import { Link } from "../router";
import { usePoll } from "../util";
import { PageError } from "./common";

export const PAGE_SIZE = 50;

export interface Column {
  label: string;
  sortBy?: string; // the API's SortBy value when the column sorts
  render: (row: Json) => ComponentChildren;
  class?: string;
}

export interface ListConfig {
  title: string;
  operation: string; // ListTrainingJobs
  resultKey: string; // TrainingJobSummaries
  nameKey: string; // TrainingJobName
  route: string; // "/training-jobs": rows link to <route>/<name>
  statuses?: string[]; // StatusEquals values; none: no status filter
  columns: Column[];
  extraInput?: Record<string, unknown>;
  pageSize?: number;
}

let listMarked = false;

// Where each list was left (filter, sort, page), so Back from a detail page returns to it.
interface ListState {
  nameInput: string;
  status: string;
  sortBy: string;
  sortOrder: "Ascending" | "Descending";
  tokens: (string | undefined)[];
  page: number;
}
const remembered = new Map<string, ListState>();

export function ListPage(props: { config: ListConfig }) {
  const c = props.config;
  const saved = remembered.get(c.route);
  const [nameInput, setNameInput] = useState(saved?.nameInput || "");
  const [name, setName] = useState(saved?.nameInput.trim() || "");
  const [status, setStatus] = useState(saved?.status || "");
  const [sortBy, setSortBy] = useState(saved?.sortBy || "CreationTime");
  const [sortOrder, setSortOrder] = useState<"Ascending" | "Descending">(saved?.sortOrder || "Descending");
  const [tokens, setTokens] = useState<(string | undefined)[]>(saved?.tokens || [undefined]);
  const [page, setPage] = useState(saved?.page || 0);
  remembered.set(c.route, { nameInput, status, sortBy, sortOrder, tokens, page });
  const [rows, setRows] = useState<Json[] | null>(null);
  const [nextToken, setNextToken] = useState<string | undefined>(undefined);
  const [error, setError] = useState<string | null>(null);
  const [loadedAt, setLoadedAt] = useState(0);
  const pageSize = c.pageSize || PAGE_SIZE;

  // A new filter or sort starts again at page 1.
  const resetPaging = () => {
    setTokens([undefined]);
    setPage(0);
    setRows(null);
  };

  // The name filter applies 300 ms after typing stops.
  useEffect(() => {
    const t = setTimeout(() => {
      if (nameInput.trim() !== name) {
        setName(nameInput.trim());
        resetPaging();
      }
    }, 300);
    return () => clearTimeout(t);
  }, [nameInput]);

  // Answers to an earlier query (another page, filter or sort) that arrive late are dropped.
  const queryKey = JSON.stringify([c.operation, name, status, sortBy, sortOrder, page, tokens[page]]);
  const currentKey = useRef(queryKey);
  currentKey.current = queryKey;

  usePoll(
    async () => {
      const input: Record<string, unknown> = { MaxResults: pageSize, SortBy: sortBy, SortOrder: sortOrder, ...c.extraInput };
      if (name) input.NameContains = name;
      if (status) input.StatusEquals = status;
      if (tokens[page]) input.NextToken = tokens[page];
      const key = queryKey;
      try {
        const out = await sagemaker(c.operation, input);
        if (currentKey.current !== key) return;
        setRows(out[c.resultKey] || []);
        setNextToken(out.NextToken || undefined);
        setError(null);
        setLoadedAt(Date.now());
      } catch (e) {
        if (currentKey.current !== key) return;
        setError(e instanceof ApiError ? `${e.code}: ${e.message}` : String(e));
      }
    },
    5000,
    [c.operation, name, status, sortBy, sortOrder, page, tokens],
  );

  useEffect(() => {
    if (rows !== null && !listMarked) {
      listMarked = true;
      performance.mark("kiln:list-rendered");
    }
  }, [rows]);

  const sort = (key: string) => {
    if (key === sortBy) setSortOrder(sortOrder === "Ascending" ? "Descending" : "Ascending");
    else {
      setSortBy(key);
      setSortOrder(key === "CreationTime" ? "Descending" : "Ascending");
    }
    resetPaging();
  };

  const count = rows?.length || 0;
  const from = page * pageSize + 1;
  const pageStatus =
    rows === null ? `Page ${page + 1} · loading` : count === 0 ? `Page ${page + 1} · none` : `Page ${page + 1} · ${from}–${from + count - 1}`;

  return (
    <div class="list-page">
      <h1>{c.title}</h1>
      <form class="filters" role="search" onSubmit={(e) => e.preventDefault()}>
        <label for="name-filter">Name contains</label>
        <input
          id="name-filter"
          type="search"
          value={nameInput}
          autocomplete="off"
          spellcheck={false}
          onInput={(e) => setNameInput((e.target as HTMLInputElement).value)}
        />
        {c.statuses && (
          <>
            <label for="status-filter">Status</label>
            <select id="status-filter" value={status} onChange={(e) => {
                setStatus((e.target as HTMLSelectElement).value);
                resetPaging();
              }}>
              <option value="">Any</option>
              {c.statuses.map((s) => (
                <option value={s} key={s}>
                  {s}
                </option>
              ))}
            </select>
          </>
        )}
      </form>
      <PageError message={error} />
      <table id="resource-table" class="resources" data-loaded-at={loadedAt || undefined}>
        <caption class="sr-only">
          {c.title}, {pageStatus}
        </caption>
        <thead>
          <tr>
            {c.columns.map((col) => {
              const sorted = col.sortBy && col.sortBy === sortBy;
              return (
                <th
                  scope="col"
                  key={col.label}
                  class={col.class}
                  aria-sort={col.sortBy ? (sorted ? (sortOrder === "Ascending" ? "ascending" : "descending") : "none") : undefined}
                >
                  {col.sortBy ? (
                    <button type="button" class="sort" onClick={() => sort(col.sortBy!)}>
                      {col.label}
                    </button>
                  ) : (
                    col.label
                  )}
                </th>
              );
            })}
          </tr>
        </thead>
        <tbody>
          {rows?.map((row) => {
            const n = String(row[c.nameKey]);
            return (
              <tr data-name={n} key={n}>
                {c.columns.map((col, i) => (
                  <td key={col.label} class={col.class}>
                    {i === 0 ? <Link to={`${c.route}/${encodeURIComponent(n)}`}>{n}</Link> : col.render(row)}
                  </td>
                ))}
              </tr>
            );
          })}
          {rows !== null && rows.length === 0 && (
            <tr class="empty-row">
              <td colSpan={c.columns.length}>{name || status ? "Nothing matches the filter." : "Nothing here yet."}</td>
            </tr>
          )}
        </tbody>
      </table>
      <div class="pager">
        <button
          type="button"
          id="prev-page"
          disabled={page === 0}
          onClick={() => {
            setRows(null);
            setPage(page - 1);
          }}
        >
          Previous
        </button>
        <span id="page-status" aria-live="polite">
          {pageStatus}
        </span>
        <button
          type="button"
          id="next-page"
          disabled={!nextToken || rows === null}
          onClick={() => {
            const t = tokens.slice(0, page + 1);
            t.push(nextToken);
            setTokens(t);
            setRows(null);
            setPage(page + 1);
          }}
        >
          Next
        </button>
      </div>
    </div>
  );
}
