// Sign-in with an access key. The secret is read from the input into a local, used to sign one
// request, and the input is cleared: it is never stored and never sent.

import { useRef, useState } from "preact/hooks";
import { ApiError, SessionInfo, signIn } from "../api";

export function SignIn(props: { region: string; message?: string | null; onSignedIn: (s: SessionInfo) => void }) {
  const [error, setError] = useState<string | null>(props.message || null);
  const [busy, setBusy] = useState(false);
  const keyRef = useRef<HTMLInputElement>(null);
  const secretRef = useRef<HTMLInputElement>(null);

  const submit = async (e: Event) => {
    e.preventDefault();
    const keyInput = keyRef.current!;
    const secretInput = secretRef.current!;
    const accessKeyId = keyInput.value.trim();
    let secret = secretInput.value;
    secretInput.value = "";
    if (!accessKeyId || !secret) {
      setError(!accessKeyId ? "Enter the access key ID." : "Enter the secret access key.");
      (!accessKeyId ? keyInput : secretInput).focus();
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const session = await signIn(accessKeyId, secret, props.region);
      secret = "";
      props.onSignedIn(session);
    } catch (err) {
      secret = "";
      setError(err instanceof ApiError ? err.message : String(err));
      secretInput.focus();
    } finally {
      setBusy(false);
    }
  };

  return (
    <main id="main" class="signin">
      <h1>Sign in to Kiln</h1>
      <p class="muted">
        Use an access key of this server (the same key the SDK and the <code>aws</code> CLI use). The secret signs one request in
        this browser and is not sent or kept.
      </p>
      <form id="signin-form" onSubmit={submit} noValidate>
        <label for="access-key-id">Access key ID</label>
        <input id="access-key-id" name="access-key-id" ref={keyRef} autocomplete="username" spellcheck={false} required />
        <label for="secret-access-key">Secret access key</label>
        <input
          id="secret-access-key"
          name="secret-access-key"
          ref={secretRef}
          type="password"
          autocomplete="current-password"
          spellcheck={false}
          required
        />
        <div id="signin-error" role="alert" class={error ? "error" : "error empty"}>
          {error || ""}
        </div>
        <button type="submit" class="primary" disabled={busy}>
          Sign in
        </button>
      </form>
    </main>
  );
}
