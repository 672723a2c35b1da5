// actions/github-script@v9's main step (src/main.ts) for the tests: `script` runs as the body of an async
// function, with @actions/core (from NODE_PATH, as the stand-in for actions/cache finds it); no octokit,
// which the Action's script does not use.
"use strict";
const core = require("@actions/core");

const AsyncFunction = Object.getPrototypeOf(async () => null).constructor;

async function main() {
  const script = core.getInput("script", { required: true });
  const result = await new AsyncFunction("require", "core", script)(require, core);
  const encoding = core.getInput("result-encoding") || "json";
  core.setOutput("result", encoding === "string" ? String(result) : JSON.stringify(result));
}

main().catch(error => core.setFailed(`Unhandled error: ${error}`));
