// The HTTP service's load from an app in another language: Node's `fetch` (undici,
// keep-alive) as the client, and optionally a Node HTTP server as the task handler.
//
//   node bench/http_node_client.mjs --base http://127.0.0.1:8080 --token T \
//       --clients 32 --requests 5000 --task-type bench-node [--handler] [--fetch]
//
// - The creates go through `node:http` with a keep-alive agent of `--clients` sockets
//   (about half the CPU of `fetch` per request, which matters when the load generator
//   shares the service's cores), or through `fetch` with `--fetch`.
// - `--clients` loops each POST /v1/tasks one task at a time, `--requests` in all;
//   every answer must be 201. Latency is from just before the `fetch` to the body read.
// - `--handler` first starts an HTTP server on a free loopback port that answers every
//   POST with 200 `null` (the HTTP handler protocol: the task COMPLETED), and registers
//   it with PUT /v1/handlers/{task-type}, so a worker in the service runs each task by
//   calling it; the script then waits (at most 120 s) until the handler has been called
//   once per task and reports when the last call came.
// - `--sequential N` before the load: N creates from one client, one after the other
//   (the lone request's latency), reported apart.
//
// Prints one JSON object on stdout (bench/http_service.py --client node reads it).

import http from "node:http";
import { parseArgs } from "node:util";

const { values: args } = parseArgs({
  options: {
    base: { type: "string" },
    token: { type: "string" },
    clients: { type: "string", default: "32" },
    requests: { type: "string", default: "5000" },
    "task-type": { type: "string", default: "bench-node" },
    handler: { type: "boolean", default: false },
    sequential: { type: "string", default: "0" },
    fetch: { type: "boolean", default: false },
  },
});
const base = args.base;
const clients = Number(args.clients);
const requests = Number(args.requests);
const sequential = Number(args.sequential);
const taskType = args["task-type"];
const headers = {
  authorization: `Bearer ${args.token}`,
  "content-type": "application/json",
};

function percentile(values, pct) {
  const ordered = [...values].sort((a, b) => a - b);
  return ordered[Math.min(ordered.length - 1, Math.floor((ordered.length * pct) / 100))];
}

const round = (x) => Math.round(x * 100) / 100;

let handled = 0;
let lastHandled = 0;
let receiver = null;
if (args.handler) {
  receiver = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      handled += 1;
      lastHandled = performance.now();
      res.writeHead(200, { "content-type": "application/json" });
      res.end("null");
    });
  });
  receiver.keepAliveTimeout = 60_000;
  await new Promise((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  const port = receiver.address().port;
  const put = await fetch(`${base}/v1/handlers/${taskType}`, {
    method: "PUT",
    headers,
    body: JSON.stringify({ url: `http://127.0.0.1:${port}/run`, concurrency: 100 }),
  });
  if (!put.ok) throw new Error(`PUT /v1/handlers: ${put.status} ${await put.text()}`);
  // Every worker re-reads the registrations every second: wait until one runs a probe.
  const probe = await fetch(`${base}/v1/tasks`, {
    method: "POST",
    headers,
    body: JSON.stringify({ task_type: taskType, params: { probe: true } }),
  });
  if (probe.status !== 201) throw new Error(`probe: ${probe.status} ${await probe.text()}`);
  const deadline = performance.now() + 30_000;
  while (handled < 1) {
    if (performance.now() > deadline) throw new Error("no worker ran the probe task in 30 s");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  handled = 0;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: clients });
const target = new URL(`${base}/v1/tasks`);

function postHttp(body) {
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        agent,
        method: "POST",
        hostname: target.hostname,
        port: target.port,
        path: target.pathname,
        headers: { ...headers, "content-length": Buffer.byteLength(body) },
      },
      (response) => {
        const chunks = [];
        response.on("data", (chunk) => chunks.push(chunk));
        response.on("end", () =>
          resolve({ status: response.statusCode, text: Buffer.concat(chunks).toString() }),
        );
        response.on("error", reject);
      },
    );
    request.on("error", reject);
    request.end(body);
  });
}

async function postFetch(body) {
  const response = await fetch(target, { method: "POST", headers, body });
  return { status: response.status, text: await response.text() };
}

const post = args.fetch ? postFetch : postHttp;

async function create(n) {
  const began = performance.now();
  const { status, text } = await post(JSON.stringify({ task_type: taskType, params: { n } }));
  if (status !== 201) throw new Error(`POST /v1/tasks: ${status} ${text}`);
  return performance.now() - began;
}

const result = {
  clients,
  requests,
  handler: args.handler,
  node: process.version,
  client: args.fetch ? "fetch" : "node:http",
};

if (sequential > 0) {
  const lone = [];
  for (let i = 0; i < sequential; i++) lone.push(await create(i));
  result.sequential = {
    requests: sequential,
    p50_ms: round(percentile(lone, 50)),
    p99_ms: round(percentile(lone, 99)),
  };
}

const latencies = [];
let remaining = requests;
const began = performance.now();
await Promise.all(
  Array.from({ length: clients }, async (_, n) => {
    while (remaining > 0) {
      remaining -= 1;
      latencies.push(await create(n));
    }
  }),
);
const elapsed = (performance.now() - began) / 1000;
Object.assign(result, {
  seconds: round(elapsed),
  requests_per_s: round(requests / elapsed),
  p50_ms: round(percentile(latencies, 50)),
  p99_ms: round(percentile(latencies, 99)),
});

if (receiver) {
  const expected = requests + sequential;
  const deadline = performance.now() + 120_000;
  while (handled < expected && performance.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  result.handled = handled;
  result.expected_handled = expected;
  result.all_handled_after_s = round((lastHandled - began) / 1000);
  result.tasks_per_s = round(requests / ((lastHandled - began) / 1000));
  await fetch(`${base}/v1/handlers/${taskType}`, { method: "DELETE", headers });
  receiver.closeAllConnections();
  receiver.close();
}
agent.destroy();

const cpu = process.cpuUsage();
result.node_cpu_s = round((cpu.user + cpu.system) / 1e6);
process.stdout.write(JSON.stringify(result) + "\n");
