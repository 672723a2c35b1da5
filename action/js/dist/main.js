// The Action's main step (action.yml). Built by build.mjs.
"use strict";
require("./index.js").runMain();
