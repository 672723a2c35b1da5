// Fakes for the tests: a stream that keeps what is written, a cache client that logs as @actions/cache does.
"use strict";

function stream() {
  const written = [];
  return { written, write: (chunk) => written.push(String(chunk)) && true, text: () => written.join("") };
}

/** A client whose restoreCache/saveCache write `lines` to `out` (as @actions/core does) and return `value`. */
function fakeCache(out, { restored, saved = 1, lines = [], available = true } = {}) {
  const calls = [];
  const log = () => lines.forEach((line) => out.write(line + "\n"));
  return {
    calls,
    isFeatureAvailable: () => available,
    restoreCache: async (paths, key, restoreKeys) => {
      calls.push(["restore", paths, key, restoreKeys]);
      log();
      return restored;
    },
    saveCache: async (paths, key) => {
      calls.push(["save", paths, key]);
      log();
      return saved;
    },
  };
}

/** A stand-in for runPython: records each command and the variables it was given, replies from `replies`. */
function fakePython(replies = {}, codes = {}) {
  const calls = [];
  const run = async (command, { extra = {} } = {}) => {
    calls.push([command, extra]);
    return { code: codes[command] || 0, reply: replies[command] || {} };
  };
  return { calls, run };
}

module.exports = { fakeCache, fakePython, stream };
