// actions/cache@v5 post step: save under the primary key unless it was restored exactly (src/save.ts).
require("./impl.js").saveRun(true);
