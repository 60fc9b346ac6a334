#!/usr/bin/env node
// Copies the generated ES stubs from gen/es (buf generate) into this
// package's gen/, so that the published package needs nothing from the rest
// of the repository. The copy is byte for byte: the stubs only import
// @bufbuild/protobuf and each other by relative path.
//
//   node client/node/tools/sync-gen.mjs          # write the copy
//   node client/node/tools/sync-gen.mjs --check  # exit 1 if it is stale
//
// Run it after `buf generate` changes gen/es; the package's tests run
// --check.

import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const PKG = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const REPO = resolve(PKG, "..", "..");
const SRC = join(REPO, "gen", "es");
const DST = join(PKG, "gen");
const DIRS = ["lockbroker", "buf"];

function walk(root) {
  const out = new Map();
  if (!existsSync(root)) return out;
  const visit = (dir) => {
    for (const name of readdirSync(dir)) {
      const p = join(dir, name);
      if (statSync(p).isDirectory()) visit(p);
      else if (name.endsWith(".js") || name.endsWith(".d.ts")) out.set(relative(root, p), readFileSync(p));
    }
  };
  visit(root);
  return out;
}

export function expected() {
  if (!existsSync(SRC)) throw new Error(`${SRC} not found (run from a lockbroker checkout)`);
  const out = new Map();
  for (const d of DIRS) for (const [rel, data] of walk(join(SRC, d))) out.set(join(d, rel), data);
  return out;
}

export function stale() {
  const want = expected();
  const have = walk(DST);
  const paths = new Set([...want.keys(), ...have.keys()]);
  return [...paths].filter((p) => !want.has(p) || !have.has(p) || !want.get(p).equals(have.get(p))).sort();
}

function write() {
  const want = expected();
  for (const rel of walk(DST).keys()) if (!want.has(rel)) rmSync(join(DST, rel));
  for (const [rel, data] of want) {
    mkdirSync(dirname(join(DST, rel)), { recursive: true });
    writeFileSync(join(DST, rel), data);
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (process.argv.includes("--check")) {
    const s = stale();
    if (s.length > 0) {
      console.error(`client/node/gen is out of sync with gen/es:\n  ${s.join("\n  ")}\nrun: node client/node/tools/sync-gen.mjs`);
      process.exit(1);
    }
  } else {
    write();
  }
}
