// Builds the console into dist/ (node 18+; run through `npm run build`):
//
//   dist/index.html                  the shell, naming the hashed assets by absolute /console/ paths
//   dist/assets/app-<hash>.js|.css   the entry bundle (preact, the pages, @noble/hashes) and its CSS
//   dist/assets/chart-impl-<hash>.js uPlot, loaded on the first page that draws a chart
//   dist/assets/chunk-<hash>.js      code shared by the two, if any
//   dist/favicon.svg
//   dist/licenses.txt                the bundled packages' licenses
//   dist/<file>.gz, dist/<file>.br   precompressed variants of every text file (when smaller)
//   dist/manifest.json               what the server embeds (format: /work/notes/issue22-manifest.md,
//                                    restated in README.md): written last
//
// Everything is rebuilt from scratch each time (dist/ is removed first), so the manifest lists
// exactly what this build wrote. Prints the first-load size (index.html + entry JS + CSS).

import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import zlib from "node:zlib";
import * as esbuild from "esbuild";

const root = path.dirname(fileURLToPath(import.meta.url));
const src = path.join(root, "src");
const dist = path.join(root, "dist");
const BASE = "/console/";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".json": "application/json",
  ".map": "application/json",
  ".txt": "text/plain; charset=utf-8",
};
const COMPRESSIBLE = new Set([".html", ".js", ".css", ".svg", ".json", ".map", ".txt"]);
const SAFE_PATH = /^[A-Za-z0-9._\-/]+$/;

fs.rmSync(dist, { recursive: true, force: true });
fs.mkdirSync(path.join(dist, "assets"), { recursive: true });

const result = await esbuild.build({
  absWorkingDir: root,
  entryPoints: { app: path.join(src, "main.tsx") },
  bundle: true,
  splitting: true,
  format: "esm",
  minify: true,
  target: ["es2020"],
  outdir: path.join(dist, "assets"),
  entryNames: "[name]-[hash]",
  chunkNames: "[name]-[hash]",
  assetNames: "[name]-[hash]",
  jsx: "automatic",
  jsxImportSource: "preact",
  define: { "process.env.NODE_ENV": '"production"' },
  legalComments: "eof",
  metafile: true,
  logLevel: "warning",
});

// The entry's JS and CSS, and the chunks it imports statically (those load with it).
const outputs = result.metafile.outputs;
const rel = (p) => path.relative(dist, path.resolve(root, p)).split(path.sep).join("/");
const entry = Object.entries(outputs).find(([, o]) => o.entryPoint && o.entryPoint.endsWith("main.tsx"));
if (!entry) throw new Error("esbuild produced no entry bundle for src/main.tsx");
const [entryFile, entryMeta] = entry;
const entryJs = rel(entryFile);
const entryCss = entryMeta.cssBundle ? rel(entryMeta.cssBundle) : null;
const staticChunks = entryMeta.imports.filter((i) => i.kind === "import-statement").map((i) => rel(i.path));

// index.html from the template.
let html = fs.readFileSync(path.join(src, "index.html"), "utf8");
html = html.replace("<!--styles-->", entryCss ? `<link rel="stylesheet" href="${BASE}${entryCss}" />` : "");
html = html.replace(
  "<!--scripts-->",
  staticChunks.map((c) => `<link rel="modulepreload" href="${BASE}${c}" />`).join("") +
    `<script type="module" src="${BASE}${entryJs}"></script>`,
);
fs.writeFileSync(path.join(dist, "index.html"), html);
fs.copyFileSync(path.join(src, "favicon.svg"), path.join(dist, "favicon.svg"));

// The licenses of the bundled packages (minifying drops their header comments), served at
// /console/licenses.txt.
const bundled = ["preact", "uplot", "@noble/hashes"];
const notices = bundled.map((name) => {
  const dir = path.join(root, "node_modules", name);
  const version = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
  return `${name} ${version}\n\n${fs.readFileSync(path.join(dir, "LICENSE"), "utf8").trim()}\n`;
});
fs.writeFileSync(
  path.join(dist, "licenses.txt"),
  "The Kiln console bundles these packages:\n\n" + notices.join("\n" + "-".repeat(72) + "\n\n"),
);

// Every file written, relative to dist/.
function walk(dir) {
  const out = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...walk(p));
    else out.push(path.relative(dist, p).split(path.sep).join("/"));
  }
  return out.sort();
}

const files = [];
const sizes = {};
for (const file of walk(dist)) {
  if (!SAFE_PATH.test(file) || file.includes("..")) throw new Error(`unservable file name in dist: ${file}`);
  const ext = path.extname(file);
  const bytes = fs.readFileSync(path.join(dist, file));
  const entry = {
    path: file,
    type: TYPES[ext] || "application/octet-stream",
    hash: createHash("sha256").update(bytes).digest("hex"),
    gzip: false,
    br: false,
    immutable: file.startsWith("assets/"),
  };
  sizes[file] = { identity: bytes.length, gzip: bytes.length, br: bytes.length };
  if (COMPRESSIBLE.has(ext)) {
    const gz = zlib.gzipSync(bytes, { level: 9 });
    const br = zlib.brotliCompressSync(bytes, {
      params: {
        [zlib.constants.BROTLI_PARAM_QUALITY]: 11,
        [zlib.constants.BROTLI_PARAM_SIZE_HINT]: bytes.length,
        [zlib.constants.BROTLI_PARAM_MODE]: zlib.constants.BROTLI_MODE_TEXT,
      },
    });
    if (gz.length < bytes.length) {
      fs.writeFileSync(path.join(dist, file + ".gz"), gz);
      entry.gzip = true;
      sizes[file].gzip = gz.length;
    }
    if (br.length < bytes.length) {
      fs.writeFileSync(path.join(dist, file + ".br"), br);
      entry.br = true;
      sizes[file].br = br.length;
    }
  }
  files.push(entry);
}
if (!files.some((f) => f.path === "index.html")) throw new Error("index.html was not written");
fs.writeFileSync(path.join(dist, "manifest.json"), JSON.stringify({ version: 1, files }, null, 2) + "\n");

// The report: every file, and what a first visit downloads.
const firstLoad = ["index.html", entryJs, ...(entryCss ? [entryCss] : []), ...staticChunks];
const total = { identity: 0, gzip: 0, br: 0 };
for (const f of firstLoad) for (const k of Object.keys(total)) total[k] += sizes[f][k];
const pad = (s, n) => String(s).padStart(n);
console.log("file".padEnd(40) + pad("bytes", 9) + pad("gzip", 9) + pad("br", 9));
for (const f of files) console.log(f.path.padEnd(40) + pad(sizes[f.path].identity, 9) + pad(sizes[f.path].gzip, 9) + pad(sizes[f.path].br, 9));
console.log(
  `first load (${firstLoad.join(", ")}): ${total.identity} bytes, ${total.gzip} gzip, ${total.br} br`,
);
