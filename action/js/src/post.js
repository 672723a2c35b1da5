// The Action's post step (saving runs of store: github): Python says what to upload (the plugin's new
// bundle, a precompiled header whose entry is missing), @actions/cache uploads each, and Python reports
// the real result (saved, not needed and why, or failed with the service's reason) in the log and the
// job summary. It runs when the job succeeded, or failed with input save-on-failure (action.yml post-if).
"use strict";

const { saveEntry } = require("./client");
const { runPython } = require("./python");

/** Returns 0: a failed upload is one warning, never a changed job outcome. */
async function post({ cache, run = runPython, environ = process.env, stream = process.stdout, now = Date.now }) {
  const planned = await run("save", { environ });
  if (planned.code !== 0 || !planned.reply.report) return 0; // nothing to save here (see action/main.py)
  const uploads = [];
  for (const upload of planned.reply.uploads || []) {
    const started = now();
    const { id, problems } = await saveEntry(cache, [upload.path], upload.key, stream);
    uploads.push({ ...upload, id, problems, seconds: (now() - started) / 1000 });
  }
  await run("saved", { environ, extra: { COMPILECACHE_SAVES: JSON.stringify({ ...planned.reply, uploads }) } });
  return 0;
}

module.exports = { post };
