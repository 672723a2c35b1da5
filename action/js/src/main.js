// The Action's main step: install and plan (Python), restore the bundle entry (@actions/cache), unpack it
// and tell the plugin (Python), then the precompiled header's entry the same way. See action/README.md.
"use strict";

const { restoreEntry } = require("./client");
const { runPython } = require("./python");

/**
 * Returns the step's exit code: 0, or the Python side's (2: an invalid input, which it has reported as one
 * `::error::` naming the input). Trouble with the cache service is never a failed step: the restore
 * reports it (outcome `error`, one warning) and the tests compile cold.
 */
async function main({ cache, run = runPython, environ = process.env, stream = process.stdout }) {
  const install = await run("install", { environ });
  if (install.code !== 0) return install.code;
  const planned = await run("plan", { environ });
  if (planned.code !== 0) return planned.code;
  const plan = planned.reply;
  let found = { matched: null, problem: null };
  if (plan.transfer === "github") {
    found = await restoreEntry(cache, [plan.path], plan.key, [plan.restore_prefix], stream);
  }
  const restored = await run("restore", { environ, extra: { COMPILECACHE_FOUND: JSON.stringify(found) } });
  const header = restored.reply.header;
  if (restored.code !== 0 || !header) return restored.code;
  // The header entry's key is its content (known only from the verified manifest): exact, no prefix.
  const entry = await restoreEntry(cache, [header.path], header.key, [], stream);
  const headers = await run("headers", { environ, extra: { COMPILECACHE_FOUND: JSON.stringify(entry) } });
  return headers.code;
}

module.exports = { main };
