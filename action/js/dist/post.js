// The Action's post step (action.yml). Built by build.mjs.
"use strict";
require("./index.js").runPost();
