// AWS Signature Version 4 in the browser, for the one signed request the console makes: the
// sign-in POST to /_kiln/console/session (every later request rides on the session cookie).
//
// Pure JavaScript SHA-256/HMAC from @noble/hashes: crypto.subtle exists only in secure contexts
// (https or localhost), and people reach a GPU box over plain http by its address.
//
// Contract: the secret is only read here, never stored or sent; the caller drops it afterwards.

import { hmac } from "@noble/hashes/hmac";
import { sha256 } from "@noble/hashes/sha2";

const encoder = new TextEncoder();

function hex(bytes: Uint8Array): string {
  let out = "";
  for (let i = 0; i < bytes.length; i++) out += bytes[i].toString(16).padStart(2, "0");
  return out;
}

function hmacSha256(key: Uint8Array, text: string): Uint8Array {
  return hmac(sha256, key, encoder.encode(text));
}

export function sha256Hex(text: string): string {
  return hex(sha256(encoder.encode(text)));
}

// "20261204T031500Z" and "20261204" of a time in milliseconds.
export function amzDate(millis: number): { stamp: string; day: string } {
  const iso = new Date(millis).toISOString(); // 2026-12-04T03:15:00.123Z
  const stamp = iso.slice(0, 19).replace(/[-:]/g, "") + "Z";
  return { stamp, day: stamp.slice(0, 8) };
}

// RFC 3986 encoding of one path segment or query component, as SigV4 wants it.
function uriEncode(text: string): string {
  return encodeURIComponent(text).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}

export interface SignInput {
  method: string;
  path: string; // absolute, unencoded segments ("/_kiln/console/session")
  host: string; // what the browser sends as Host (location.host)
  headers: Record<string, string>; // headers to sign besides host and x-amz-date
  body: string;
  accessKeyId: string;
  secretAccessKey: string;
  region: string;
  service: string;
  nowMillis: number;
}

// The headers to add to the request: X-Amz-Date and Authorization.
export function signV4(input: SignInput): Record<string, string> {
  const { stamp, day } = amzDate(input.nowMillis);
  const all: Record<string, string> = { host: input.host, "x-amz-date": stamp };
  for (const [name, value] of Object.entries(input.headers)) all[name.toLowerCase()] = value;
  const names = Object.keys(all).sort();
  const canonicalHeaders = names.map((n) => n + ":" + all[n].trim().replace(/\s+/g, " ") + "\n").join("");
  const signedHeaders = names.join(";");
  const canonicalPath = input.path.split("/").map(uriEncode).join("/");
  const canonicalRequest = [
    input.method,
    canonicalPath,
    "", // no query string
    canonicalHeaders,
    signedHeaders,
    sha256Hex(input.body),
  ].join("\n");
  const scope = `${day}/${input.region}/${input.service}/aws4_request`;
  const stringToSign = ["AWS4-HMAC-SHA256", stamp, scope, sha256Hex(canonicalRequest)].join("\n");
  let key = hmacSha256(encoder.encode("AWS4" + input.secretAccessKey), day);
  key = hmacSha256(key, input.region);
  key = hmacSha256(key, input.service);
  key = hmacSha256(key, "aws4_request");
  const signature = hex(hmacSha256(key, stringToSign));
  return {
    "X-Amz-Date": stamp,
    Authorization: `AWS4-HMAC-SHA256 Credential=${input.accessKeyId}/${scope}, SignedHeaders=${signedHeaders}, Signature=${signature}`,
  };
}
