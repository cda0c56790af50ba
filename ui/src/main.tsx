// The console's shell: the session check, sign-in, navigation and the route table.

import { render } from "preact";
import type { FunctionComponent } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { getSession, onAuthLost, SessionInfo, signOut } from "./api";
import { ListPage } from "./components/ListPage";
import type { ListConfig } from "./components/ListPage";
import * as lists from "./pages/lists";
import { SignIn } from "./pages/SignIn";
import { Link, navigate, useRoute } from "./router";
import "./styles.css";

const NAV: [string, string][] = [
  ["/training-jobs", "Training jobs"],
  ["/endpoints", "Endpoints"],
  ["/models", "Models"],
  ["/endpoint-configs", "Endpoint configs"],
  ["/tuning-jobs", "Tuning jobs"],
  ["/processing-jobs", "Processing jobs"],
  ["/transform-jobs", "Transform jobs"],
  ["/objects", "Object store"],
];

type LazyModule = typeof import("./pages/lazy");
let lazyModule: LazyModule | null = null;
let lazyPromise: Promise<LazyModule> | null = null;

// A page of the lazily loaded chunk: "Loading…" until it has arrived (at most once per page load).
// A chunk that cannot be loaded (the server was upgraded under an open page: the old hashed file is
// gone) says to reload.
function lazy<P extends object>(name: keyof LazyModule): FunctionComponent<P> {
  return function Lazy(props: P) {
    const [, setLoaded] = useState(0);
    const [error, setError] = useState<string | null>(null);
    useEffect(() => {
      if (lazyModule) return;
      let live = true;
      lazyPromise ||= import("./pages/lazy");
      lazyPromise
        .then((m) => {
          lazyModule = m;
          if (live) setLoaded((n) => n + 1);
        })
        .catch((e) => {
          lazyPromise = null;
          if (live) setError(`This page could not be loaded (${e}). The console may have been updated: reload the page.`);
        });
      return () => {
        live = false;
      };
    }, []);
    if (error) {
      return (
        <p id="page-error" role="alert" class="error">
          {error}
        </p>
      );
    }
    if (!lazyModule) return <p class="loading">Loading…</p>;
    const C = lazyModule[name] as unknown as FunctionComponent<P>;
    return <C {...props} />;
  };
}

const BucketsPage = lazy<Record<string, never>>("BucketsPage");
const BucketPage = lazy<{ bucket: string; prefix: string }>("BucketPage");

// Route segment → its list and detail page.
const KINDS: Record<string, { list: ListConfig; detail: FunctionComponent<{ name: string }> }> = {
  "training-jobs": { list: lists.trainingJobs, detail: lazy("TrainingJobPage") },
  endpoints: { list: lists.endpoints, detail: lazy("EndpointPage") },
  models: { list: lists.models, detail: lazy("ModelPage") },
  "endpoint-configs": { list: lists.endpointConfigs, detail: lazy("EndpointConfigPage") },
  "tuning-jobs": { list: lists.tuningJobs, detail: lazy("TuningJobPage") },
  "processing-jobs": { list: lists.processingJobs, detail: lazy("ProcessingJobPage") },
  "transform-jobs": { list: lists.transformJobs, detail: lazy("TransformJobPage") },
};

function decode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

function Page(props: { path: string }) {
  const parts = props.path.split("/").filter(Boolean);
  if (parts.length === 0) return null; // "/" is redirected to /training-jobs
  const [kind, ...rest] = parts;
  if (kind === "objects") {
    if (rest.length === 0) return <BucketsPage />;
    const bucket = decode(rest[0]);
    const raw = props.path.split("/").slice(3).map(decode).join("/");
    return <BucketPage bucket={bucket} prefix={raw} />;
  }
  const k = KINDS[kind];
  if (!k) {
    return (
      <div>
        <h1 id="resource-title">Not found</h1>
        <p id="page-error" role="alert" class="error">
          The console has no page at {props.path}. Choose a page from the menu.
        </p>
      </div>
    );
  }
  if (rest.length === 0) return <ListPage key={kind} config={k.list} />;
  const name = decode(rest[0]);
  const Detail = k.detail;
  return <Detail key={kind + "/" + name} name={name} />;
}

function Shell(props: { session: SessionInfo; onSignOut: () => void }) {
  const path = useRoute();
  useEffect(() => {
    if (path === "/" || path === "") navigate("/training-jobs", true);
  }, [path]);
  // After an in-app navigation, focus moves to the page (screen readers start there; Tab continues
  // from it), as a full page load would do.
  const firstPath = useRef(true);
  useEffect(() => {
    if (firstPath.current) {
      firstPath.current = false;
      return;
    }
    document.getElementById("main")?.focus({ preventScroll: true });
  }, [path]);
  const top = "/" + (path.split("/")[1] || "");
  useEffect(() => {
    const title = NAV.find(([p]) => p === top)?.[1] || "Console";
    const parts = path.split("/").filter(Boolean);
    document.title = (parts.length > 1 && top !== "/objects" ? decode(parts[1]) + " · " : "") + title + " · Kiln";
  }, [path]);
  const s = props.session;
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="topbar">
        <span class="brand">Kiln</span>
        <nav aria-label="Main">
          <ul>
            {NAV.map(([p, label]) => (
              <li key={p}>
                <Link to={p} aria-current={top === p ? "page" : undefined}>
                  {label}
                </Link>
              </li>
            ))}
          </ul>
        </nav>
        <div class="who">
          <span id="whoami" title={s.access_key_id ? `Access key ${s.access_key_id}` : undefined}>
            {s.auth === "off" ? "Authentication off" : s.principal_arn || s.access_key_id || ""}
          </span>
          {s.auth !== "off" && (
            <button type="button" id="sign-out" class="small" onClick={props.onSignOut}>
              Sign out
            </button>
          )}
        </div>
      </header>
      <main id="main" tabIndex={-1}>
        <Page path={path} />
      </main>
    </>
  );
}

function App() {
  const [session, setSession] = useState<SessionInfo | null>(null);
  const [bootError, setBootError] = useState<string | null>(null);
  const [message, setMessage] = useState<string | null>(null);

  const check = async () => {
    try {
      const s = await getSession();
      setSession(s);
      setBootError(null);
    } catch (e) {
      setBootError(`The Kiln server did not answer the session check: ${(e as Error).message}`);
    }
  };
  // Ready (the tests' hook) once the answer to the session check is on the screen.
  useEffect(() => {
    if (session || bootError) document.body.dataset.ready = "1";
  }, [session, bootError]);
  useEffect(() => {
    check();
    onAuthLost((m) => {
      setMessage(m || "The console session expired or was signed out: sign in again");
      setSession((s) => (s ? { ...s, signed_in: false } : s));
    });
  }, []);

  if (bootError) {
    return (
      <main id="main" class="signin">
        <h1>Kiln console</h1>
        <p id="page-error" role="alert" class="error">
          {bootError}
        </p>
        <button type="button" onClick={check}>
          Try again
        </button>
      </main>
    );
  }
  if (!session) return <p class="loading">Loading…</p>;
  if (session.auth !== "off" && !session.signed_in) {
    return (
      <SignIn
        region={session.region}
        message={message}
        onSignedIn={(s) => {
          setMessage(null);
          setSession(s);
        }}
      />
    );
  }
  return (
    <Shell
      session={session}
      onSignOut={async () => {
        try {
          await signOut();
        } catch {
          /* signed out locally either way */
        }
        setMessage(null);
        setSession({ ...session, signed_in: false, principal_arn: undefined, access_key_id: undefined });
      }}
    />
  );
}

render(<App />, document.getElementById("app")!);
