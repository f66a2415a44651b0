"""A plain process-json worker (no SDK) that times host-service round trips from the inside.

Tool ``bench.services``: input ``{"op": "invoke" | "get" | "set" | "fill", "n", "tool"?,
"input"?, "window"?}``; the answer's data is ``{"us": [round trip µs, ...]}`` (``fill`` and a
windowed ``set`` return ``{"seconds": elapsed}`` instead).
"""

import json
import sys
import time
from typing import Any

out = sys.stdout.buffer
lines = iter(sys.stdin.buffer)
seq = 0


def write(obj: Any) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def send(cid: int, method: str, params: dict[str, Any]) -> int:
    global seq
    seq += 1
    write({"type": "request", "id": seq, "callId": cid, "method": method, "params": params})
    return seq


def receive() -> dict[str, Any]:
    while True:
        msg = json.loads(next(lines))
        if msg.get("type") == "response":
            if "error" in msg:
                raise RuntimeError(msg["error"])
            return dict(msg)
        if msg.get("type") == "ping":
            write({"type": "pong", "id": msg["id"], "status": "healthy"})


def run(call: dict[str, Any]) -> dict[str, Any]:
    cid, a = call["id"], call["input"]
    op, n = a["op"], a["n"]
    clock = time.perf_counter
    if op in ("fill", "set") and a.get("window"):
        window = a["window"]
        t0 = clock()
        sent = done = 0
        while done < n:
            while sent < n and sent - done < window:
                send(cid, "state.set", {"name": "bench", "key": f"k{sent}", "value": sent})
                sent += 1
            receive()
            done += 1
        return {"seconds": clock() - t0}
    us: list[float] = []
    for i in range(n):
        if op == "invoke":
            params = {"tool": a["tool"], "input": a["input"]}
            method = "tools.invoke"
        elif op == "get":
            params, method = {"name": "bench", "key": f"k{i % a.get('keys', 1)}"}, "state.get"
        else:
            params, method = {"name": "bench", "key": f"s{i}", "value": i}, "state.set"
        t = clock()
        send(cid, method, params)
        receive()
        us.append((clock() - t) * 1e6)
    return {"us": us}


def main() -> None:
    for line in lines:
        msg = json.loads(line)
        kind = msg.get("type")
        if kind == "init":
            write(
                {
                    "type": "ready",
                    "protocol": 1,
                    "concurrency": 1,
                    "tools": [{"name": "bench.services", "inputSchema": {"type": "object"}}],
                }
            )
        elif kind == "ping":
            write({"type": "pong", "id": msg["id"], "status": "healthy"})
        elif kind == "call":
            try:
                data = run(msg)
                write({"type": "result", "id": msg["id"], "ok": True, "data": data})
            except Exception as exc:
                write({"type": "result", "id": msg["id"], "ok": False, "error": str(exc)})
        elif kind == "shutdown":
            return


if __name__ == "__main__":
    main()
