// The logic of actions/cache v5.0.4 (src/restoreImpl.ts, src/saveImpl.ts, src/stateProvider.ts,
// src/utils/actionUtils.ts), rewritten in plain CommonJS for the tests, on the real @actions/cache
// client. Behaviour the Action relies on, kept as upstream has it:
// * a miss leaves cache-hit unset; an unavailable service sets cache-hit=false and logs a line;
// * every error of the client (lookup, download, upload) is a log line, never a failed step;
//   only invalid inputs fail the main step;
// * the post step reads the primary key from state, the path from its inputs, and skips the save
//   after an exact hit.
"use strict";
const cache = require("@actions/cache");
const core = require("@actions/core");

const State = { CachePrimaryKey: "CACHE_KEY", CacheMatchedKey: "CACHE_RESULT" };
const Outputs = { CacheHit: "cache-hit", CachePrimaryKey: "cache-primary-key", CacheMatchedKey: "cache-matched-key" };

class StateProvider {
  setState(key, value) { core.saveState(key, value); }
  getState(key) { return core.getState(key); }
  getCacheState() { return this.getState(State.CacheMatchedKey) || undefined; }
}

class NullStateProvider extends StateProvider {
  setState(key, value) {
    const output = { [State.CacheMatchedKey]: Outputs.CacheMatchedKey, [State.CachePrimaryKey]: Outputs.CachePrimaryKey }[key];
    core.setOutput(output, value);
  }
  getState() { return ""; }
}

function logWarning(message) { core.info(`[warning]${message}`); }

function isExactKeyMatch(key, cacheKey) {
  return !!(cacheKey && cacheKey.localeCompare(key, undefined, { sensitivity: "accent" }) === 0);
}

function isValidEvent() { return Boolean(process.env.GITHUB_REF); }

function getInputAsArray(name, options) {
  return core.getInput(name, options).split("\n").map(s => s.replace(/^!\s+/, "!").trim()).filter(x => x !== "");
}

function getInputAsBool(name) { return core.getInput(name).toLowerCase() === "true"; }

function getInputAsInt(name) {
  const value = parseInt(core.getInput(name));
  return isNaN(value) || value < 0 ? undefined : value;
}

function isCacheFeatureAvailable() {
  if (cache.isFeatureAvailable()) return true;
  logWarning("An internal error has occurred in cache backend. Please check https://www.githubstatus.com/ for any ongoing issue in actions.");
  return false;
}

async function restoreImpl(stateProvider, earlyExit) {
  try {
    if (!isCacheFeatureAvailable()) {
      core.setOutput(Outputs.CacheHit, "false");
      return;
    }
    if (!isValidEvent()) {
      logWarning(`Event Validation Error: The event type ${process.env.GITHUB_EVENT_NAME} is not supported because it's not tied to a branch or tag ref.`);
      return;
    }
    const primaryKey = core.getInput("key", { required: true });
    stateProvider.setState(State.CachePrimaryKey, primaryKey);
    const restoreKeys = getInputAsArray("restore-keys");
    const cachePaths = getInputAsArray("path", { required: true });
    const enableCrossOsArchive = getInputAsBool("enableCrossOsArchive");
    const failOnCacheMiss = getInputAsBool("fail-on-cache-miss");
    const lookupOnly = getInputAsBool("lookup-only");
    const cacheKey = await cache.restoreCache(cachePaths, primaryKey, restoreKeys, { lookupOnly }, enableCrossOsArchive);
    if (!cacheKey) {
      // cache-hit is intentionally left unset on a miss (actions/cache#1466).
      if (failOnCacheMiss) {
        throw new Error(`Failed to restore cache entry. Exiting as fail-on-cache-miss is set. Input key: ${primaryKey}`);
      }
      core.info(`Cache not found for input keys: ${[primaryKey, ...restoreKeys].join(", ")}`);
      return;
    }
    stateProvider.setState(State.CacheMatchedKey, cacheKey);
    const isExact = isExactKeyMatch(core.getInput("key", { required: true }), cacheKey);
    core.setOutput(Outputs.CacheHit, isExact.toString());
    core.info(lookupOnly ? `Cache found and can be restored from key: ${cacheKey}` : `Cache restored from key: ${cacheKey}`);
    return cacheKey;
  } catch (error) {
    core.setFailed(error.message);
    if (earlyExit) process.exit(1);
  }
}

async function saveImpl(stateProvider) {
  let cacheId = -1;
  try {
    if (!isCacheFeatureAvailable()) return;
    if (!isValidEvent()) {
      logWarning(`Event Validation Error: The event type ${process.env.GITHUB_EVENT_NAME} is not supported because it's not tied to a branch or tag ref.`);
      return;
    }
    const primaryKey = stateProvider.getState(State.CachePrimaryKey) || core.getInput("key");
    if (!primaryKey) {
      logWarning("Key is not specified.");
      return;
    }
    const restoredKey = stateProvider.getCacheState();
    if (isExactKeyMatch(primaryKey, restoredKey)) {
      core.info(`Cache hit occurred on the primary key ${primaryKey}, not saving cache.`);
      return;
    }
    const cachePaths = getInputAsArray("path", { required: true });
    const enableCrossOsArchive = getInputAsBool("enableCrossOsArchive");
    cacheId = await cache.saveCache(cachePaths, primaryKey, { uploadChunkSize: getInputAsInt("upload-chunk-size") }, enableCrossOsArchive);
    if (cacheId != -1) core.info(`Cache saved with key: ${primaryKey}`);
  } catch (error) {
    logWarning(error.message);
  }
  return cacheId;
}

async function exitWhenDone(promise, earlyExit) {
  try {
    await promise;
  } catch (err) {
    console.error(err);
    if (earlyExit) process.exit(1);
  }
  // Dangling HTTP retries would keep node alive; everything that matters has resolved.
  if (earlyExit) process.exit(0);
}

process.on("uncaughtException", e => logWarning(e.message));

module.exports = {
  restoreRun: earlyExit => exitWhenDone(restoreImpl(new StateProvider(), earlyExit), earlyExit),
  restoreOnlyRun: earlyExit => exitWhenDone(restoreImpl(new NullStateProvider(), earlyExit), earlyExit),
  saveRun: earlyExit => exitWhenDone(saveImpl(new StateProvider()), earlyExit),
};
