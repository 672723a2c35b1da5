// actions/cache/restore@v5: restore, with the keys as outputs instead of state (src/restoreOnly.ts).
require("./impl.js").restoreOnlyRun(true);
