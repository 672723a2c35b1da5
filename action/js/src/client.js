// The cache client (@actions/cache), called so that its failures reach the Action as values.
//
// restoreCache and saveCache never throw for trouble with the service: they log it and return as for a
// miss (restoreCache: undefined) or a failed save (saveCache: -1). The log is the only place the reason
// goes, as a workflow command (`::warning::Failed to restore: ...`, `::error::` for a 5xx) that GitHub shows
// as an annotation, or as a debug line (`Failed to reserve cache: ...`, the service's answer to a refused
// CreateCacheEntry). So each call runs inside captureClientLog: the client's warnings and errors become
// plain log lines (no annotation: the Action reports the trouble once, with the Python side's wording),
// and the lines that say why are handed back as `problems`.
"use strict";

// A workflow command: `::name key=value,...::data` (the runner reads one at the start of a line).
const COMMAND = /^::([a-z-]+)(?: [^:]*)?::(.*)$/s;
// The client's lines that carry a reason: its warnings and errors, its "Failed to save: ..." (logged with
// core.info for a refused reservation) and the debug line that holds the service's own answer to it.
const REASON_PREFIXES = ["Failed to save:", "Failed to reserve cache:"];

/** The data of a workflow command as @actions/core escapes it (%25 %0D %0A), unescaped. */
function unescapeData(text) {
  return text.replace(/%0D/g, "\r").replace(/%0A/g, "\n").replace(/%25/g, "%");
}

/** One line the client wrote, read: {kind: "annotation"|"debug"|"text", text}. */
function readLine(line) {
  const match = COMMAND.exec(line);
  if (!match) return { kind: "text", text: line };
  const [, name, data] = match;
  if (name === "warning" || name === "error" || name === "notice") {
    return { kind: "annotation", text: unescapeData(data) };
  }
  if (name === "debug") return { kind: "debug", text: unescapeData(data) };
  return { kind: "command", text: line };
}

/**
 * Shown in the log instead of an annotation: one line, never starting with `::`, and with the older command
 * form (`##[name]`, which the runner reads anywhere in a line that is not a `::` command) broken, as
 * ghrunner.py breaks it: the text may hold the cache service's or the blob store's words.
 */
function inert(text) {
  return `@actions/cache: ${text.replace(/[\r\n]+/g, " ").replace(/##\[/g, "##\\[")}`;
}

/**
 * Run `fn` (async) while the client's stdout lines are read: annotations are shown as plain lines and
 * collected, the lines that say why a save failed are collected too, everything else passes through.
 * Returns {value, problems}: what fn returned, and the reasons in the order the client gave them.
 */
async function captureClientLog(fn, stream = process.stdout) {
  const problems = [];
  const write = stream.write;
  let pending = "";
  const handle = (line) => {
    const read = readLine(line);
    if (read.kind === "annotation") {
      problems.push(read.text);
      return inert(read.text) + "\n";
    }
    if (REASON_PREFIXES.some((prefix) => read.text.startsWith(prefix))) problems.push(read.text);
    return line + "\n";
  };
  stream.write = function (chunk, encoding, callback) {
    pending += typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
    const lines = pending.split(/\r?\n/);
    pending = lines.pop();
    const out = lines.map(handle).join("");
    return out ? write.call(stream, out, encoding, callback) : true;
  };
  try {
    return { value: await fn(), problems };
  } finally {
    stream.write = write;
    if (pending) write.call(stream, handle(pending));
  }
}

/**
 * One lookup and, when it finds an entry, its download into `paths` (the client's retries included).
 * Returns {matched: the key restored or null, problem: why nothing was restored, or null (a miss)}.
 */
async function restoreEntry(cache, paths, key, restoreKeys, stream) {
  if (!cache.isFeatureAvailable()) {
    return { matched: null, problem: "the cache service is not configured on this runner (no ACTIONS_RESULTS_URL)" };
  }
  try {
    const { value, problems } = await captureClientLog(() => cache.restoreCache(paths, key, restoreKeys), stream);
    return { matched: value || null, problem: value ? null : problems.join("; ") || null };
  } catch (error) {
    return { matched: null, problem: String((error && error.message) || error) };
  }
}

/**
 * Upload `paths` as the entry `key`. Returns {id: the entry id, -1 when nothing was saved, problems}.
 */
async function saveEntry(cache, paths, key, stream) {
  if (!cache.isFeatureAvailable()) {
    return { id: -1, problems: ["the cache service is not configured on this runner (no ACTIONS_RESULTS_URL)"] };
  }
  try {
    const { value, problems } = await captureClientLog(() => cache.saveCache(paths, key), stream);
    return { id: typeof value === "number" ? value : -1, problems };
  } catch (error) {
    return { id: -1, problems: [String((error && error.message) || error)] };
  }
}

module.exports = { captureClientLog, readLine, restoreEntry, saveEntry, unescapeData };
