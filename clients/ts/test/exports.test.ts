// The package's entry points load only what they need: the main entry and
// the render entry never import an SDK (ai, openai are optional peer
// dependencies of the middleware subpaths), and every subpath export
// resolves to a built module.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const pkgDir = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8")) as {
  exports: Record<string, { default: string }>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
  dependencies: Record<string, string>;
};

// bareImports returns every bare module specifier reachable by static
// imports from a built file (following relative imports).
function bareImports(file: string, seen = new Set<string>()): Set<string> {
  const out = new Set<string>();
  if (seen.has(file)) return out;
  seen.add(file);
  const src = readFileSync(file, "utf8");
  for (const m of src.matchAll(/^\s*(?:import|export)\s[^;]*?from\s+"([^"]+)"|^\s*import\s+"([^"]+)"/gm)) {
    const spec = m[1] ?? m[2]!;
    if (spec.startsWith(".")) {
      for (const s of bareImports(resolve(dirname(file), spec), seen)) out.add(s);
    } else {
      out.add(spec.split("/").slice(0, spec.startsWith("@") ? 2 : 1).join("/"));
    }
  }
  return out;
}

test("the main and render entries never import an SDK", () => {
  const sdks = ["ai", "openai", "@ai-sdk/provider", "@ai-sdk/openai-compatible"];
  for (const entry of [".", "./render"]) {
    const imports = bareImports(join(pkgDir, pkg.exports[entry]!.default));
    for (const sdk of sdks) assert.ok(!imports.has(sdk), `${entry} imports ${sdk}`);
    for (const i of imports) {
      assert.ok(i.startsWith("node:") || i in pkg.dependencies, `${entry} imports ${i}, which is not a dependency`);
    }
  }
});

test("the middleware subpaths need only their own SDK, an optional peer", () => {
  for (const [entry, sdk] of [["./ai-sdk", "ai"], ["./openai", "openai"]] as const) {
    assert.ok(pkg.exports[entry], `no ${entry} export`);
    assert.ok(pkg.peerDependencies[sdk] && pkg.peerDependenciesMeta[sdk]?.optional, `${sdk} is not an optional peer`);
    const imports = bareImports(join(pkgDir, pkg.exports[entry]!.default));
    for (const i of imports) {
      assert.ok(i.startsWith("node:") || i in pkg.dependencies || i === sdk, `${entry} imports ${i}`);
    }
  }
});
