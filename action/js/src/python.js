// The Action's Python side (action/main.py), run as a subprocess: it plans, verifies, installs and packs,
// and writes everything the runner reads (outputs, env, summary, annotations) through ghrunner.py. Its
// stdout and stderr go to the step's log as they come; what it tells this side comes back as one JSON
// object in the file named by COMPILECACHE_REPLY.
"use strict";

const core = require("@actions/core");
const childProcess = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

// The Action's checkout: dist/ is action/js/dist, so three levels up (action.yml's directory).
const ACTION_ROOT = path.resolve(__dirname, "..", "..", "..");

/**
 * The environment of a Python step: the job's, less the cache service's URL and token (Python never
 * talks to the service; pip runs build backends), plus each input as INPUT_<NAME> with `-` as `_` (the
 * runner spells `key-prefix` INPUT_KEY-PREFIX; action/inputs.py reads INPUT_KEY_PREFIX).
 */
function pythonEnv(environ, extra = {}) {
  const env = {};
  for (const [name, value] of Object.entries(environ)) {
    if (name.startsWith("ACTIONS_")) continue;
    env[name.startsWith("INPUT_") ? name.replace(/-/g, "_") : name] = value;
  }
  return { ...env, GITHUB_ACTION_PATH: ACTION_ROOT, ...extra };
}

/** The interpreter input `python` names (default `python`); null when it is only spaces (a mistake, as for every
 * other input: action/inputs.py refuses those). */
function interpreter(environ) {
  const given = environ["INPUT_PYTHON"] || "";
  if (given && !given.trim()) return null;
  return given.trim() || "python";
}

/** The JSON object the Python side wrote to `file`, or {} (none written: it failed before replying). */
function readReply(file) {
  try {
    const reply = JSON.parse(fs.readFileSync(file, "utf8"));
    return reply && typeof reply === "object" ? reply : {};
  } catch {
    return {};
  }
}

/**
 * Run `python action/main.py <command>`; resolves {code, reply} (reply: the parsed JSON object, or {}).
 * A Python that cannot start resolves code 127, input `python` of only spaces code 2, each with one error
 * annotation naming input `python` (written by `@actions/core`, which escapes it).
 */
function runPython(command, { environ = process.env, extra = {}, spawn = childProcess.spawn } = {}) {
  const dir = fs.mkdtempSync(path.join(environ.RUNNER_TEMP || os.tmpdir(), "compilecache-js-"));
  const replyFile = path.join(dir, "reply.json");
  const argv = [path.join(ACTION_ROOT, "action", "main.py"), command];
  const env = pythonEnv(environ, { ...extra, COMPILECACHE_REPLY: replyFile });
  const python = interpreter(environ);
  if (python === null) {
    core.error("pytest-compilecache: input python: only spaces; leave it empty (or out) for its default");
    fs.rmSync(dir, { recursive: true, force: true });
    return Promise.resolve({ code: 2, reply: {} });
  }
  return new Promise((resolve) => {
    const child = spawn(python, argv, { env, stdio: "inherit" });
    let settled = false;
    const done = (code) => {
      if (settled) return; // a child that cannot start emits "error", and may emit "close" after it
      settled = true;
      const reply = readReply(replyFile);
      fs.rmSync(dir, { recursive: true, force: true });
      resolve({ code, reply });
    };
    child.on("error", (error) => {
      core.error(`pytest-compilecache: input python: cannot run ${python}: ${error.message}`);
      done(127);
    });
    child.on("close", (code) => done(code === null ? 1 : code));
  });
}

module.exports = { ACTION_ROOT, interpreter, pythonEnv, runPython };
