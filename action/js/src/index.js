// The bundle's entry (dist/index.js, build.mjs): the Action's main and post steps, with the real
// @actions/cache. dist/main.js and dist/post.js, which action.yml runs, each call one of these.
"use strict";

const cache = require("@actions/cache");
const core = require("@actions/core");
const { anyAbandoned } = require("./client");
const { main } = require("./main");
const { post } = require("./post");

// A client call given up on (client.js) still holds its socket and its retries: the step ends the process once
// its own work is done, instead of waiting for them.
function endIfAbandoned() {
  if (anyAbandoned()) process.exit();
}

function runMain() {
  return main({ cache })
    .then(
      (code) => {
        process.exitCode = code;
      },
      // A bug of this file, not cache trouble (the client's errors are values): fail the step visibly.
      (error) => core.setFailed(`pytest-compilecache: ${(error && error.stack) || error}`),
    )
    .then(endIfAbandoned);
}

function runPost() {
  // Whatever happens here, the job's outcome stays what its steps made it: a bug is one warning.
  return post({ cache })
    .catch((error) => core.warning(`pytest-compilecache: the save failed: ${(error && error.stack) || error}`))
    .then(endIfAbandoned);
}

module.exports = { runMain, runPost };
