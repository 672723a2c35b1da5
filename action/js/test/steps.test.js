"use strict";

const assert = require("node:assert/strict");
const { test } = require("node:test");
const { main } = require("../src/main");
const { post } = require("../src/post");
const { fakeCache, fakePython, stream } = require("./helpers");

const PLAN = { transfer: "github", key: "cc-test-d-7-1", restore_prefix: "cc-test-d-", path: ".s/*.bundle" };

test("main: install, plan, restore the bundle entry, tell Python what the client found", async () => {
  const out = stream();
  const cache = fakeCache(out, { restored: "cc-test-d-6-1" });
  const python = fakePython({ plan: PLAN });
  assert.equal(await main({ cache, run: python.run, stream: out }), 0);
  assert.deepEqual(python.calls.map(([command]) => command), ["install", "plan", "restore"]);
  assert.deepEqual(cache.calls, [["restore", [".s/*.bundle"], "cc-test-d-7-1", ["cc-test-d-"]]]);
  assert.deepEqual(JSON.parse(python.calls[2][1].COMPILECACHE_FOUND), { matched: "cc-test-d-6-1", problem: null });
});

test("main: the header entry, by its exact key, when the restore names one", async () => {
  const out = stream();
  const cache = fakeCache(out, { restored: undefined, lines: ["::warning::Failed to restore: (403)"] });
  const header = { key: "cc-test-artifact-abc", path: ".h/*.bundle" };
  const python = fakePython({ plan: PLAN, restore: { header } });
  assert.equal(await main({ cache, run: python.run, stream: out }), 0);
  assert.deepEqual(python.calls.map(([command]) => command), ["install", "plan", "restore", "headers"]);
  assert.deepEqual(cache.calls[1], ["restore", [".h/*.bundle"], "cc-test-artifact-abc", []]);
  assert.deepEqual(JSON.parse(python.calls[3][1].COMPILECACHE_FOUND), {
    matched: null,
    problem: "Failed to restore: (403)",
  });
});

test("main: an invalid input stops the step with Python's exit code, before any lookup", async () => {
  const out = stream();
  const cache = fakeCache(out);
  const python = fakePython({}, { plan: 2 });
  assert.equal(await main({ cache, run: python.run, stream: out }), 2);
  assert.deepEqual(python.calls.map(([command]) => command), ["install", "plan"]);
  assert.deepEqual(cache.calls, []);
});

test("main: other stores and modes never call the cache client", async () => {
  for (const transfer of ["direct", "none"]) {
    const out = stream();
    const cache = fakeCache(out);
    const python = fakePython({ plan: { ...PLAN, transfer } });
    assert.equal(await main({ cache, run: python.run, stream: out }), 0);
    assert.deepEqual(cache.calls, []);
    assert.deepEqual(JSON.parse(python.calls[2][1].COMPILECACHE_FOUND), { matched: null, problem: null });
  }
});

test("post: uploads what Python names and hands it the results", async () => {
  const out = stream();
  const cache = fakeCache(out, { saved: 41 });
  const uploads = [
    { what: "bundle", key: "cc-test-d-7-1", path: ".s/*.bundle", bytes: 10 },
    { what: "header", key: "cc-test-artifact-abc", path: ".h/*.bundle", bytes: 20 },
  ];
  const python = fakePython({ save: { report: true, uploads, notes: [] } });
  let clock = 0;
  assert.equal(await post({ cache, run: python.run, stream: out, now: () => (clock += 500) }), 0);
  assert.deepEqual(cache.calls, [
    ["save", [".s/*.bundle"], "cc-test-d-7-1"],
    ["save", [".h/*.bundle"], "cc-test-artifact-abc"],
  ]);
  const told = JSON.parse(python.calls[1][1].COMPILECACHE_SAVES);
  assert.deepEqual(told.uploads[0], { ...uploads[0], id: 41, problems: [], seconds: 0.5 });
  assert.equal(python.calls[1][0], "saved");
});

test("post: nothing to report (read-only run, another store, no plan) calls nothing else", async () => {
  const out = stream();
  const cache = fakeCache(out);
  const python = fakePython({ save: { report: false } });
  assert.equal(await post({ cache, run: python.run, stream: out }), 0);
  assert.deepEqual(python.calls.map(([command]) => command), ["save"]);
  assert.deepEqual(cache.calls, []);
});

test("post: a failed upload is reported to Python, and the step still succeeds", async () => {
  const out = stream();
  const cache = fakeCache(out, { saved: -1, lines: ["::warning::Failed to save: (500) boom"] });
  const uploads = [{ what: "bundle", key: "k", path: ".s/*.bundle", bytes: 1 }];
  const python = fakePython({ save: { report: true, uploads } });
  assert.equal(await post({ cache, run: python.run, stream: out }), 0);
  const told = JSON.parse(python.calls[1][1].COMPILECACHE_SAVES);
  assert.deepEqual([told.uploads[0].id, told.uploads[0].problems], [-1, ["Failed to save: (500) boom"]]);
  assert.ok(!out.text().includes("::warning"), out.text());
});
