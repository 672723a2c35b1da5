"use strict";

const assert = require("node:assert/strict");
const childProcess = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { test } = require("node:test");
const { ACTION_ROOT, pythonEnv, runPython } = require("../src/python");

test("the Action's root holds action.yml and action/main.py", () => {
  assert.ok(fs.existsSync(path.join(ACTION_ROOT, "action.yml")));
  assert.ok(fs.existsSync(path.join(ACTION_ROOT, "action", "main.py")));
});

test("Python gets the inputs as action/inputs.py reads them, and never the cache service's token", () => {
  const env = pythonEnv(
    { "INPUT_KEY-PREFIX": "p", INPUT_STORE: "github", ACTIONS_RUNTIME_TOKEN: "t", ACTIONS_RESULTS_URL: "u", HOME: "/h" },
    { EXTRA: "1" },
  );
  assert.deepEqual(env, { INPUT_KEY_PREFIX: "p", INPUT_STORE: "github", HOME: "/h", GITHUB_ACTION_PATH: ACTION_ROOT, EXTRA: "1" });
});

function temp() {
  return fs.mkdtempSync(path.join(os.tmpdir(), "compilecache-js-test-"));
}

test("runPython: the exit code and the JSON reply; the reply dir is removed", async () => {
  const runnerTemp = temp();
  const script = "require('fs').writeFileSync(process.env.COMPILECACHE_REPLY, JSON.stringify({ command: process.argv[2], x: process.env.X }))";
  const spawn = (file, argv, options) => childProcess.spawn(process.execPath, ["-e", script, ...argv], options);
  const environ = { RUNNER_TEMP: runnerTemp, INPUT_PYTHON: "ignored", PATH: process.env.PATH };
  const result = await runPython("plan", { environ, extra: { X: "y" }, spawn });
  assert.deepEqual(result, { code: 0, reply: { command: "plan", x: "y" } });
  assert.deepEqual(fs.readdirSync(runnerTemp), []);
});

test("runPython: no reply is {}, and an interpreter that does not exist is exit code 127", async () => {
  const runnerTemp = temp();
  const failing = (file, argv, options) => childProcess.spawn(process.execPath, ["-e", "process.exit(2)"], options);
  assert.deepEqual(await runPython("plan", { environ: { RUNNER_TEMP: runnerTemp }, spawn: failing }), { code: 2, reply: {} });
  const environ = { RUNNER_TEMP: runnerTemp, INPUT_PYTHON: path.join(runnerTemp, "no-such-python") };
  const lines = [];
  const write = process.stdout.write;
  process.stdout.write = (chunk) => lines.push(String(chunk)) > 0;
  let result;
  try {
    result = await runPython("plan", { environ });
  } finally {
    process.stdout.write = write;
  }
  assert.deepEqual(result, { code: 127, reply: {} });
  // One error annotation that names the input, so a typo in `python:` is found from the run's page.
  const annotation = lines.join("");
  assert.match(annotation, /^::error::pytest-compilecache: input python: cannot run .*no-such-python: /m);
});

test("runPython: input python of only spaces is an error naming it, as every other input's, and nothing runs", async () => {
  const runnerTemp = temp();
  const spawned = [];
  const spawn = (file) => spawned.push(file);
  const lines = [];
  const write = process.stdout.write;
  process.stdout.write = (chunk) => lines.push(String(chunk)) > 0;
  let result;
  try {
    result = await runPython("install", { environ: { RUNNER_TEMP: runnerTemp, INPUT_PYTHON: "   " }, spawn });
  } finally {
    process.stdout.write = write;
  }
  assert.deepEqual(result, { code: 2, reply: {} });
  assert.deepEqual(spawned, []);
  assert.match(lines.join(""), /^::error::pytest-compilecache: input python: only spaces/m);
  assert.deepEqual(fs.readdirSync(runnerTemp), []);
});
