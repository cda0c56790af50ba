// The console's only way to the server: Kiln's public APIs (SageMaker JSON 1.1, CloudWatch JSON
// 1.0, CloudWatch Logs JSON 1.1, S3 REST-XML GETs, /_kiln/remote/targets), authenticated by the
// session cookie. Every request carries X-Kiln-Console: 1 (the server's CSRF fence for cookie
// requests) and is aborted after 15 s, so a stuck server shows an error, never a spinner forever.

import { signV4 } from "./sigv4";

export const TIMEOUT_MS = 15_000;

export class ApiError extends Error {
  code: string;
  status: number;
  constructor(code: string, message: string, status: number) {
    super(message);
    this.code = code;
    this.status = status;
  }
  // "Requested resource not found." (SageMaker's ValidationException for a missing job),
  // ResourceNotFound, "Could not find endpoint ..." all mean: it is gone.
  get notFound(): boolean {
    return (
      /ResourceNotFound|NoSuchBucket|NoSuchKey/.test(this.code) ||
      /not found|does not exist|could not find/i.test(this.message)
    );
  }
}

// Codes that mean the cookie no longer stands for a key: back to sign-in.
function isAuthLost(code: string): boolean {
  return /^(ExpiredToken|MissingAuthenticationToken|ExpiredTokenException|MissingAuthenticationTokenException)$/.test(
    code,
  );
}

let authLostHandler: ((message: string) => void) | null = null;
// The app registers this: called when a request answers ExpiredToken / MissingAuthenticationToken.
export function onAuthLost(handler: (message: string) => void): void {
  authLostHandler = handler;
}

// fetch with the 15 s timeout; network failures and timeouts become ApiErrors with a sentence.
export async function timedFetch(url: string, init: RequestInit = {}): Promise<Response> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  try {
    return await fetch(url, { ...init, signal: controller.signal, credentials: "same-origin" });
  } catch (e) {
    if (controller.signal.aborted) {
      throw new ApiError("RequestTimeout", `The server did not answer within ${TIMEOUT_MS / 1000} s (${url.split("?")[0]}).`, 0);
    }
    throw new ApiError("NetworkError", `The server could not be reached: ${(e as Error).message || e}.`, 0);
  } finally {
    clearTimeout(timer);
  }
}

// The error of a non-2xx answer: JSON {__type, message} / {code, Message}, or S3's XML <Error>.
async function errorOf(response: Response, notifyAuthLost = true): Promise<ApiError> {
  const text = await response.text().catch(() => "");
  let code = response.headers.get("x-amzn-ErrorType") || "";
  let message = "";
  const queryError = response.headers.get("x-amzn-query-error");
  if (text.trim().startsWith("{")) {
    try {
      const body = JSON.parse(text) as Record<string, unknown>;
      code = String(body.__type || body.code || body.Code || code);
      message = String(body.message || body.Message || "");
    } catch {
      /* fall through: the text is shown as is */
    }
  } else if (text.trim().startsWith("<")) {
    const doc = new DOMParser().parseFromString(text, "application/xml");
    code = doc.querySelector("Code")?.textContent || code;
    message = doc.querySelector("Message")?.textContent || "";
  }
  // "com.amazonaws...#ValidationException" and "Code:http://..." both mean the bare code.
  code = code.replace(/^.*#/, "").replace(/:.*$/, "");
  if (queryError && !code) code = queryError.split(";")[0];
  if (!code) code = `HTTP${response.status}`;
  if (!message) message = text && !text.trim().startsWith("<") ? text.slice(0, 300) : `${response.status} ${response.statusText}`;
  const error = new ApiError(code, message, response.status);
  if (notifyAuthLost && isAuthLost(code) && authLostHandler) authLostHandler(message);
  return error;
}

const JSON_PROTOCOLS = {
  sagemaker: { prefix: "SageMaker", contentType: "application/x-amz-json-1.1" },
  logs: { prefix: "Logs_20140328", contentType: "application/x-amz-json-1.1" },
  cloudwatch: { prefix: "GraniteServiceVersion20100801", contentType: "application/x-amz-json-1.0" },
} as const;

export type JsonService = keyof typeof JSON_PROTOCOLS;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Json = any;

// One JSON-protocol operation: POST / with X-Amz-Target.
export async function call(service: JsonService, operation: string, input: Record<string, unknown> = {}): Promise<Json> {
  const protocol = JSON_PROTOCOLS[service];
  const response = await timedFetch("/", {
    method: "POST",
    headers: {
      "X-Amz-Target": `${protocol.prefix}.${operation}`,
      "Content-Type": protocol.contentType,
      "X-Kiln-Console": "1",
    },
    body: JSON.stringify(input),
  });
  if (!response.ok) throw await errorOf(response);
  const text = await response.text();
  return text ? JSON.parse(text) : {};
}

export const sagemaker = (operation: string, input: Record<string, unknown> = {}) => call("sagemaker", operation, input);
export const logs = (operation: string, input: Record<string, unknown> = {}) => call("logs", operation, input);
export const cloudwatch = (operation: string, input: Record<string, unknown> = {}) => call("cloudwatch", operation, input);

// A GET of a Kiln JSON route (/_kiln/remote/targets?resource=...).
export async function getJson(path: string): Promise<Json> {
  const response = await timedFetch(path, { headers: { "X-Kiln-Console": "1" } });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// S3 REST-XML GET (ListBuckets, ListObjectsV2), parsed.
export async function s3Get(path: string): Promise<Document> {
  const response = await timedFetch(path, { headers: { "X-Kiln-Console": "1" } });
  if (!response.ok) throw await errorOf(response);
  const text = await response.text();
  return new DOMParser().parseFromString(text, "application/xml");
}

// The S3 path of a bucket/key, each key segment percent-encoded ("/b/a%20b/c.txt").
export function objectPath(bucket: string, key: string): string {
  return "/" + encodeURIComponent(bucket) + "/" + key.split("/").map(encodeURIComponent).join("/");
}

// "s3://bucket/key" → {bucket, key}; null for anything else.
export function parseS3Uri(uri: string | undefined | null): { bucket: string; key: string } | null {
  if (!uri) return null;
  const m = /^s3:\/\/([^/]+)\/?(.*)$/.exec(uri);
  return m ? { bucket: m[1], key: m[2] } : null;
}

// ---- the console session (/_kiln/console/session) ----

export interface SessionInfo {
  auth: "sigv4" | "off";
  region: string;
  signed_in: boolean;
  access_key_id?: string;
  principal_arn?: string;
  expires_at?: number;
}

export const SESSION_PATH = "/_kiln/console/session";

// The server's clock minus ours (ms), from the Date header of the last session answer: a laptop
// whose clock is off by minutes still signs a request the server accepts.
export let clockOffsetMs = 0;

export async function getSession(): Promise<SessionInfo> {
  const response = await timedFetch(SESSION_PATH, { headers: { Accept: "application/json" } });
  const date = response.headers.get("Date");
  if (date) {
    const server = Date.parse(date);
    // Date has 1 s resolution: only correct offsets that matter.
    if (!Number.isNaN(server) && Math.abs(server - Date.now()) > 60_000) clockOffsetMs = server - Date.now();
  }
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// Signs in with an access key: a SigV4-signed POST for service sagemaker in the server's region.
// The secret is only used to sign (the caller clears its input). Errors: the API's, with a
// sentence a person can act on.
export async function signIn(accessKeyId: string, secretAccessKey: string, region: string): Promise<SessionInfo> {
  const body = "{}";
  const contentType = "application/x-amz-json-1.1";
  const signed = signV4({
    method: "POST",
    path: SESSION_PATH,
    host: location.host,
    headers: { "content-type": contentType },
    body,
    accessKeyId,
    secretAccessKey,
    region,
    service: "sagemaker",
    nowMillis: Date.now() + clockOffsetMs,
  });
  const response = await timedFetch(SESSION_PATH, {
    method: "POST",
    headers: { "Content-Type": contentType, "X-Kiln-Console": "1", ...signed },
    body,
  });
  if (!response.ok) {
    const error = await errorOf(response, false);
    error.message = signInMessage(error);
    throw error;
  }
  return response.json();
}

function signInMessage(error: ApiError): string {
  const code = error.code;
  if (/InvalidClientTokenId|UnrecognizedClient|InvalidAccessKeyId/.test(code)) {
    return "The access key ID is not known to this server. Check it, or ask the operator for a key (kiln env prints the server's).";
  }
  if (/SignatureDoesNotMatch|InvalidSignature/.test(code)) {
    if (/expired|skew|time/i.test(error.message)) {
      return `This computer's clock differs too much from the server's: set the clock right and sign in again (${error.message}).`;
    }
    return "The secret access key does not match this access key ID. Check it and sign in again.";
  }
  if (/AccessDenied/.test(code)) return `This key may not use the console: ${error.message}`;
  return error.message || `Sign-in failed (${code}).`;
}

// Ends the session on the server (the cookie is cleared by its answer).
export async function signOut(): Promise<void> {
  const response = await timedFetch(SESSION_PATH, { method: "DELETE", headers: { "X-Kiln-Console": "1" } });
  if (!response.ok) throw await errorOf(response, false);
}
