// graphile-worker (pinned in package.json) beside taskmill: bulk enqueue, then drain
// no-op jobs with one runner in this process. Prints one JSON line.
//   node bench.mjs <connectionString> <schema> <jobs> <concurrency> <defaults|best|enqueue> [batch]
// "best": localQueue of 1000 jobs and batched completions (completeJobBatchDelay 0,
// failJobBatchDelay 0), graphile-worker's own high-throughput settings. "enqueue": the
// bulk enqueue only (addJobs of `batch` jobs per call, default 1000), no runner.
import { makeWorkerUtils, run } from "graphile-worker";

const [connectionString, schema, jobsArg, concurrencyArg, mode, batchArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
const batch = Number(batchArg ?? 1000);
const concurrency = Number(concurrencyArg);
const { Logger } = await import("graphile-worker");
const silent = new Logger(() => () => {});

const utils = await makeWorkerUtils({ connectionString, schema, logger: silent });
await utils.migrate();
let started = performance.now();
for (let first = 0; first < jobs; first += batch) {
  const specs = [];
  for (let i = first; i < Math.min(jobs, first + batch); i++) {
    specs.push({ identifier: "noop", payload: { i } });
  }
  await utils.addJobs(specs);
}
const enqueueSeconds = (performance.now() - started) / 1000;
await utils.release();
if (mode === "enqueue") {
  console.log(JSON.stringify({ enqueueSeconds, enqueued: jobs }));
  process.exit(0);
}

let done = 0;
let finish;
const allDone = new Promise((resolve) => (finish = resolve));
const preset =
  mode === "best"
    ? { worker: { localQueue: { size: 1000 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } }
    : {};
started = performance.now();
const runner = await run({
  connectionString,
  schema,
  concurrency,
  noHandleSignals: true,
  pollInterval: 1000,
  logger: silent,
  preset,
  taskList: {
    noop: async () => {
      done += 1;
      if (done === jobs) finish();
    },
  },
});
await allDone;
await runner.stop(); // writes the last batch of completions
const seconds = (performance.now() - started) / 1000;
console.log(JSON.stringify({ seconds, enqueueSeconds, processed: done }));
process.exit(0);
