"use strict";

const assert = require("node:assert/strict");
const { test } = require("node:test");
const { captureClientLog, readLine, restoreEntry, saveEntry, unescapeData } = require("../src/client");
const { fakeCache, stream } = require("./helpers");

test("workflow commands are read as @actions/core writes them", () => {
  assert.equal(unescapeData("100%25 a%0D%0Ab"), "100% a\r\nb");
  assert.deepEqual(readLine("::warning::Failed to restore: x%0Ay"), { kind: "annotation", text: "Failed to restore: x\ny" });
  assert.deepEqual(readLine("::error title=t::boom"), { kind: "annotation", text: "boom" });
  assert.deepEqual(readLine("::debug::Failed to reserve cache: 429"), { kind: "debug", text: "Failed to reserve cache: 429" });
  assert.deepEqual(readLine("Cache hit for: k"), { kind: "text", text: "Cache hit for: k" });
  assert.equal(readLine("::add-mask::secret").kind, "passed");
  assert.equal(readLine("::stop-commands::T").kind, "command");
});

test("the service's words in the client's plain lines never become a command", async () => {
  const out = stream();
  await captureClientLog(async () => {
    // core.info escapes nothing: a retried request's error and a matched key are the service's text
    out.write("Attempt 1 of 5 failed with error: (500): boom\n::stop-commands::zzz\n");
    out.write("  ::warning::leading\r::ERROR::upper ##[error]old. Retrying request in 3000 ms...\n");
    out.write("Cache hit for restore-key: k-1 ##[error]from-key\n::debug::quiet\n::add-mask::s3cret\n");
    out.write("\u0085::warning::after a next-line character, which the runner trims as white space\n");
  }, out);
  const lines = out.text().split(/\r\n|\r|\n/);
  const commands = lines.filter((line) => /^[\s\u0085]*::/i.test(line) || line.includes("##["));
  assert.deepEqual(commands, ["::debug::quiet", "::add-mask::s3cret"]); // @actions/core's own, as written
  assert.ok(lines.includes("@actions/cache: ::stop-commands::zzz"), out.text());
  assert.ok(lines.includes("Attempt 1 of 5 failed with error: (500): boom"), out.text());
});

test("the client's annotations become plain lines and problems; other lines pass through", async () => {
  const out = stream();
  const { value, problems } = await captureClientLog(async () => {
    out.write("::warning::Failed to restore: Received non-retryable error: Failed request: (403) Forbidden: no\n");
    out.write("Cache not ");
    out.write("found\n::debug::Failed to reserve cache: Error: (429)\n::debug::quiet\nFailed to save: Unable to reserve");
    return 7;
  }, out);
  assert.equal(value, 7);
  assert.deepEqual(problems, [
    "Failed to restore: Received non-retryable error: Failed request: (403) Forbidden: no",
    "Failed to reserve cache: Error: (429)",
    "Failed to save: Unable to reserve",
  ]);
  const text = out.text();
  assert.ok(!/^::(warning|error)/m.test(text), text);
  assert.match(text, /^@actions\/cache: Failed to restore: .*\(403\)/m);
  assert.match(text, /^Cache not found$/m);
  assert.match(text, /^::debug::quiet$/m);
  assert.match(text, /^Failed to save: Unable to reserve\n$/m); // the unterminated last line, flushed
});

test("an annotation's text cannot carry a command in the older ##[ form", async () => {
  const out = stream();
  await captureClientLog(async () => {
    out.write("::warning::Failed to restore: 500 ##[stop-commands]T\n");
  }, out);
  const text = out.text();
  assert.ok(!text.includes("##[stop-commands]"), text);
  assert.match(text, /^@actions\/cache: Failed to restore: 500 ##\\\[stop-commands\]T$/m);
});

test("the stream is given back when the call throws", async () => {
  const out = stream();
  const write = out.write;
  await assert.rejects(captureClientLog(async () => {
    throw new Error("bug");
  }, out), /bug/);
  assert.equal(out.write, write);
});

test("restoreEntry: a miss, a hit, a refusal and an unconfigured service", async () => {
  const out = stream();
  const miss = fakeCache(out);
  assert.deepEqual(await restoreEntry(miss, ["p/*.bundle"], "k-1", ["k-"], out), { matched: null, problem: null });
  assert.deepEqual(miss.calls, [["restore", ["p/*.bundle"], "k-1", ["k-"]]]);
  const hit = fakeCache(out, { restored: "k-0" });
  assert.deepEqual(await restoreEntry(hit, ["p"], "k-1", ["k-"], out), { matched: "k-0", problem: null });
  const refused = fakeCache(out, { lines: ["::warning::Failed to restore: Rate limited: (429)"] });
  assert.deepEqual(await restoreEntry(refused, ["p"], "k-1", [], out), {
    matched: null,
    problem: "Failed to restore: Rate limited: (429)",
  });
  const off = fakeCache(out, { available: false });
  const result = await restoreEntry(off, ["p"], "k-1", [], out);
  assert.equal(result.matched, null);
  assert.match(result.problem, /not configured/);
  assert.deepEqual(off.calls, []);
});

test("restoreEntry: a client that throws (an invalid key) is a problem, not a crash", async () => {
  const out = stream();
  const cache = { isFeatureAvailable: () => true, restoreCache: async () => Promise.reject(new Error("Key Validation Error")) };
  assert.deepEqual(await restoreEntry(cache, ["p"], "k,1", [], out), { matched: null, problem: "Key Validation Error" });
});

test("saveEntry: the entry id, or -1 with the client's reasons", async () => {
  const out = stream();
  assert.deepEqual(await saveEntry(fakeCache(out, { saved: 12 }), ["p"], "k", out), { id: 12, problems: [] });
  const refused = fakeCache(out, {
    saved: -1,
    lines: [
      "::debug::Failed to reserve cache: Error: Failed to CreateCacheEntry: Failed request: (429) Too Many Requests",
      "Failed to save: Unable to reserve cache with key k, another job may be creating this cache.",
    ],
  });
  const result = await saveEntry(refused, ["p"], "k", out);
  assert.equal(result.id, -1);
  assert.equal(result.problems.length, 2);
  assert.match(result.problems[0], /\(429\) Too Many Requests/);
});

test("a call that outlasts the store timeout is given up on: a problem, and its later lines still inert", async () => {
  const { anyAbandoned, callTimeout } = require("../src/client");
  assert.equal(callTimeout({}), 300);
  assert.equal(callTimeout({ PYTEST_COMPILECACHE_STORE_TIMEOUT: "45" }), 45);
  assert.equal(callTimeout({ PYTEST_COMPILECACHE_STORE_TIMEOUT: "soon" }), 300);
  const out = stream();
  let late;
  const silent = {
    isFeatureAvailable: () => true, // a service that accepts the connection and never answers
    restoreCache: () => new Promise((resolve) => (late = resolve)),
    saveCache: () => new Promise(() => {}),
  };
  const found = await restoreEntry(silent, ["p"], "k-1", ["k-"], out, 0.05);
  assert.deepEqual(found, { matched: null, problem: "the cache service did not finish within 0.05 s (see PYTEST_COMPILECACHE_STORE_TIMEOUT)" });
  assert.ok(anyAbandoned());
  out.write("Attempt 2 of 5 failed\n::stop-commands::late\n"); // the abandoned client, still logging
  late("k-0");
  assert.ok(out.text().includes("@actions/cache: ::stop-commands::late"), out.text());
  const saved = await saveEntry(silent, ["p"], "k", stream(), 0.05);
  assert.equal(saved.id, -1);
  assert.match(saved.problems.at(-1), /did not finish within 0.05 s/);
});
