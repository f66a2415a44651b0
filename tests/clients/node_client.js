// A kernel client in a second language: Node.js talking NDJSON over the Unix socket.
// Usage: node node_client.js SOCKET TOOL INPUT_JSON
// Prints one JSON object: {hello, tools, envelope}.
"use strict";
const net = require("net");

const [socketPath, tool, inputJson] = process.argv.slice(2);
const sock = net.createConnection(socketPath);
const pending = new Map();
let buffer = "";
let nextId = 1;

sock.on("data", (chunk) => {
  buffer += chunk.toString("utf8");
  let nl;
  while ((nl = buffer.indexOf("\n")) >= 0) {
    const line = buffer.slice(0, nl);
    buffer = buffer.slice(nl + 1);
    if (!line.trim()) continue;
    const msg = JSON.parse(line);
    if (msg.event !== undefined) continue; // events are not needed here
    const resolve = pending.get(msg.id);
    if (resolve) {
      pending.delete(msg.id);
      resolve(msg);
    }
  }
});

function request(method, params) {
  const id = nextId++;
  return new Promise((resolve) => {
    pending.set(id, resolve);
    sock.write(JSON.stringify({ id, method, params }) + "\n");
  });
}

sock.on("connect", async () => {
  const hello = await request("server.hello", { client: { name: "node-test", version: "1" } });
  const catalog = await request("capability.catalog.get", {});
  const invoke = await request("tools.invoke", { tool, input: JSON.parse(inputJson) });
  process.stdout.write(
    JSON.stringify({
      hello: hello.result.protocol,
      tools: catalog.result.tools.map((t) => t.name),
      envelope: invoke.result,
    }) + "\n"
  );
  sock.end();
});
sock.on("error", (err) => {
  process.stderr.write(String(err) + "\n");
  process.exit(2);
});
