// The bundle's entry (dist/index.js, build.mjs): the Action's main and post steps, with the real
// @actions/cache. dist/main.js and dist/post.js, which action.yml runs, each call one of these.
"use strict";

const cache = require("@actions/cache");
const core = require("@actions/core");
const { main } = require("./main");
const { post } = require("./post");

function runMain() {
  return main({ cache }).then(
    (code) => {
      process.exitCode = code;
    },
    // A bug of this file, not cache trouble (the client's errors are values): fail the step visibly.
    (error) => core.setFailed(`pytest-compilecache: ${(error && error.stack) || error}`),
  );
}

function runPost() {
  // Whatever happens here, the job's outcome stays what its steps made it: a bug is one warning.
  return post({ cache }).catch((error) =>
    core.warning(`pytest-compilecache: the save failed: ${(error && error.stack) || error}`),
  );
}

module.exports = { runMain, runPost };
