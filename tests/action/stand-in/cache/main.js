// actions/cache@v5 main step: restore, remembering the keys for the post step (src/restore.ts).
require("./impl.js").restoreRun(true);
