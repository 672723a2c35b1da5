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

// A workflow command as @actions/core writes one: `::name key=value,...::data`, at the start of a line.
const COMMAND = /^::([a-z-]+)(?: [^:]*)?::(.*)$/s;
// What the runner would still take for a command: `::` after leading white space, any case (its TryParseV2 trims
// as .NET's String.Trim does, U+0085 included, which JavaScript's \s leaves out, and ignores case), or the older
// form `##[name]` anywhere in a line.
const RUNNER_COMMAND = /^[\s\u0085]*::|##\[/;
// The commands passed on as written: @actions/core's own (one line each: it escapes their data).
const PASSED = new Set(["debug", "add-mask"]);
// How long one call of the client may take (its own retries included: a service that accepts connections and
// never answers holds each request 180 s, five times): the plugin's store timeout, PYTEST_COMPILECACHE_STORE_TIMEOUT.
const TIMEOUT_ENV = "PYTEST_COMPILECACHE_STORE_TIMEOUT";
const DEFAULT_TIMEOUT = 300;
let abandoned = false; // a call given up on still runs: the step ends the process when done (index.js)

/** Seconds a call may take: the job's PYTEST_COMPILECACHE_STORE_TIMEOUT (seconds), else 300. */
function callTimeout(environ = process.env) {
  const seconds = Number(environ[TIMEOUT_ENV]);
  return Number.isFinite(seconds) && seconds > 0 ? seconds : DEFAULT_TIMEOUT;
}

/** True once a call was given up on (it may still hold a socket and write to the log). */
function anyAbandoned() {
  return abandoned;
}

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
  return { kind: PASSED.has(name) ? "passed" : "command", text: line };
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
async function captureClientLog(fn, stream = process.stdout, seconds = 0) {
  const problems = [];
  let timer;
  let timedOut = false;
  const write = stream.write;
  let pending = "";
  const handle = (line) => {
    const read = readLine(line);
    if (read.kind === "annotation") {
      problems.push(read.text);
      return inert(read.text) + "\n";
    }
    if (REASON_PREFIXES.some((prefix) => read.text.startsWith(prefix))) problems.push(read.text);
    if (read.kind === "debug" || read.kind === "passed") return line + "\n";
    // Any other command, and any line the runner would still read as one: the client logs the service's own
    // words (a retried request's error, a matched key) with core.info, which escapes nothing.
    if (read.kind === "command" || RUNNER_COMMAND.test(line)) return inert(line) + "\n";
    return line + "\n";
  };
  stream.write = function (chunk, encoding, callback) {
    pending += typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
    const lines = pending.split(/\r\n|\r|\n/); // the runner ends a line at any of them
    pending = lines.pop();
    const out = lines.map(handle).join("");
    return out ? write.call(stream, out, encoding, callback) : true;
  };
  try {
    if (!seconds) return { value: await fn(), problems, timedOut };
    const deadline = new Promise((resolve) => {
      timer = setTimeout(() => {
        timedOut = abandoned = true;
        resolve(undefined);
      }, seconds * 1000);
    });
    const value = await Promise.race([fn(), deadline]);
    return { value: timedOut ? undefined : value, problems, timedOut };
  } finally {
    clearTimeout(timer);
    if (!timedOut) {
      // given up on, the client still writes: its lines keep going through handle() until the process ends
      stream.write = write;
      if (pending) write.call(stream, handle(pending));
    }
  }
}

/** The problem a call given up on reports. */
function tooSlow(seconds) {
  return `the cache service did not finish within ${seconds} s (see ${TIMEOUT_ENV})`;
}

/**
 * One lookup and, when it finds an entry, its download into `paths` (the client's retries included).
 * Returns {matched: the key restored or null, problem: why nothing was restored, or null (a miss)}.
 */
async function restoreEntry(cache, paths, key, restoreKeys, stream, seconds = callTimeout()) {
  if (!cache.isFeatureAvailable()) {
    return { matched: null, problem: "the cache service is not configured on this runner (no ACTIONS_RESULTS_URL)" };
  }
  try {
    const call = () => cache.restoreCache(paths, key, restoreKeys);
    const { value, problems, timedOut } = await captureClientLog(call, stream, seconds);
    if (timedOut) return { matched: null, problem: [...problems, tooSlow(seconds)].join("; ") };
    return { matched: value || null, problem: value ? null : problems.join("; ") || null };
  } catch (error) {
    return { matched: null, problem: String((error && error.message) || error) };
  }
}

/**
 * Upload `paths` as the entry `key`. Returns {id: the entry id, -1 when nothing was saved, problems}.
 */
async function saveEntry(cache, paths, key, stream, seconds = callTimeout()) {
  if (!cache.isFeatureAvailable()) {
    return { id: -1, problems: ["the cache service is not configured on this runner (no ACTIONS_RESULTS_URL)"] };
  }
  try {
    const { value, problems, timedOut } = await captureClientLog(() => cache.saveCache(paths, key), stream, seconds);
    if (timedOut) return { id: -1, problems: [...problems, tooSlow(seconds)] };
    return { id: typeof value === "number" ? value : -1, problems };
  } catch (error) {
    return { id: -1, problems: [String((error && error.message) || error)] };
  }
}

module.exports = { anyAbandoned, callTimeout, captureClientLog, readLine, restoreEntry, saveEntry, unescapeData };
