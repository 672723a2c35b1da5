// Bundles src/index.js, with the npm packages the lockfile pins, into dist/index.js, and writes dist/main.js and
// dist/post.js, the files action.yml runs, which call its runMain and runPost (a runner installs nothing). `node build.mjs --check` builds
// into a temporary dir and fails when dist/ differs: CI's proof that dist/ is what the lockfile builds.
import { build } from "esbuild";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const STEPS = { main: "runMain", post: "runPost" };
const FILES = ["index.js", ...Object.keys(STEPS).map((step) => `${step}.js`)];
const check = process.argv.includes("--check");
const outdir = check ? mkdtempSync(join(tmpdir(), "compilecache-dist-")) : join(here, "dist");

await build({
  absWorkingDir: here,
  entryPoints: { index: "src/index.js" },
  outdir,
  bundle: true,
  platform: "node",
  target: "node20",
  format: "cjs",
  legalComments: "eof",
  logLevel: "warning",
});

for (const [step, name] of Object.entries(STEPS)) {
  const text = `// The Action's ${step} step (action.yml). Built by build.mjs.\n"use strict";\nrequire("./index.js").${name}();\n`;
  writeFileSync(join(outdir, `${step}.js`), text);
}

if (check) {
  const stale = FILES.filter((file) => {
    const built = readFileSync(join(outdir, file));
    try {
      return !readFileSync(join(here, "dist", file)).equals(built);
    } catch {
      return true; // not committed
    }
  });
  rmSync(outdir, { recursive: true, force: true });
  if (stale.length) {
    console.error(`action/js/dist: ${stale.join(", ")} differ from what src/ and package-lock.json build: run npm run build in action/js and commit dist/`);
    process.exit(1);
  }
  console.log("action/js/dist is what src/ and package-lock.json build");
}
