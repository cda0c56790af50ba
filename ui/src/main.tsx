// The console's shell: the session check, sign-in, navigation and the route table.

import { render } from "preact";
import type { FunctionComponent } from "preact";
import { useEffect, useState } from "preact/hooks";
import { getSession, onAuthLost, SessionInfo, signOut } from "./api";
import { ListPage } from "./components/ListPage";
import type { ListConfig } from "./components/ListPage";
import { EndpointPage } from "./pages/Endpoint";
import { EndpointConfigPage, ModelPage, ProcessingJobPage, TransformJobPage } from "./pages/details";
import * as lists from "./pages/lists";
import { BucketPage, BucketsPage } from "./pages/Objects";
import { SignIn } from "./pages/SignIn";
import { TrainingJobPage } from "./pages/TrainingJob";
import { TuningJobPage } from "./pages/TuningJob";
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

// Route segment → its list and detail page.
const KINDS: Record<string, { list: ListConfig; detail: FunctionComponent<{ name: string }> }> = {
  "training-jobs": { list: lists.trainingJobs, detail: TrainingJobPage },
  endpoints: { list: lists.endpoints, detail: EndpointPage },
  models: { list: lists.models, detail: ModelPage },
  "endpoint-configs": { list: lists.endpointConfigs, detail: EndpointConfigPage },
  "tuning-jobs": { list: lists.tuningJobs, detail: TuningJobPage },
  "processing-jobs": { list: lists.processingJobs, detail: ProcessingJobPage },
  "transform-jobs": { list: lists.transformJobs, detail: TransformJobPage },
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
    } finally {
      document.body.dataset.ready = "1";
    }
  };
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
