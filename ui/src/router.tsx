// History-API routing under /console/ (the server answers index.html for every /console/... path
// that is not a file, so deep links and reloads work).

import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";

export const BASE = "/console";

// The path below /console, "/" at least ("/training-jobs/foo").
export function currentPath(): string {
  const p = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length) : location.pathname;
  return p || "/";
}

const listeners = new Set<() => void>();

export function navigate(to: string, replace = false): void {
  const url = BASE + to;
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  listeners.forEach((l) => l());
  if (!replace) window.scrollTo(0, 0);
}

export function useRoute(): string {
  const [path, setPath] = useState(currentPath());
  useEffect(() => {
    const update = () => setPath(currentPath());
    listeners.add(update);
    window.addEventListener("popstate", update);
    return () => {
      listeners.delete(update);
      window.removeEventListener("popstate", update);
    };
  }, []);
  return path;
}

// A real <a href> (open in new tab, copy link work), routed in-page on a plain click.
export function Link(props: { to: string; children: ComponentChildren; class?: string; "aria-current"?: "page" }) {
  const { to, children, ...rest } = props;
  return (
    <a
      href={BASE + to}
      {...rest}
      onClick={(e: MouseEvent) => {
        if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
        e.preventDefault();
        navigate(to);
      }}
    >
      {children}
    </a>
  );
}

// Path segments are percent-encoded in links and decoded when matched.
export function seg(name: string): string {
  return encodeURIComponent(name);
}
