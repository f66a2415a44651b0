"""CLI commands that talk to a running host over its socket."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import msgspec
import trio

from supervisor.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    die,
    socket_path,
)
from supervisor.cli.render import catalog_text, reload_text, stats_text, status_text
from supervisor.client import Client, ConnectionLost, RpcError, open_client


def _run(args: argparse.Namespace, body: Any) -> int:
    path = socket_path(args)

    async def main() -> int:
        async with open_client(path, name="toolhost-cli") as client:
            return int(await body(client))

    try:
        return trio.run(main)
    except (FileNotFoundError, ConnectionRefusedError):
        return die(f"no host is serving on {path} (start one with `toolhost serve`)")
    except ConnectionLost:
        return die("the host closed the connection")
    except RpcError as exc:
        return die(f"host answered {exc.code}: {exc.message}", EXIT_FAILED)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(msgspec.to_builtins(obj), indent=2, ensure_ascii=False) + "\n")


def status(args: argparse.Namespace) -> int:
    if getattr(args, "watch", False):
        return watch(args)

    async def body(client: Client) -> int:
        cat = await client.catalog()
        pending = await _pending_approvals(client)
        if args.json:
            _print_json({**msgspec.to_builtins(cat), "pendingApprovals": pending})
        else:
            print(status_text(cat))
            if pending:
                print(approvals_text(pending))
        return EXIT_OK

    return _run(args, body)


async def _pending_approvals(client: Client) -> list[dict[str, Any]]:
    try:
        result = await client.request("approvals.list")
    except RpcError:  # an older host without the method
        return []
    return list(result.get("pending", []))


def approvals_text(pending: list[dict[str, Any]]) -> str:
    """The calls waiting for an operator, one block each."""
    lines = [f"waiting for approval ({len(pending)}):"]
    for p in pending:
        lines.append(
            f"  {p['callId']}  {p['tool']} (sidecar {p['sidecar']}), waiting "
            f"{p['waitingMs'] / 1000:.1f} s, deadline in {p['deadlineInMs'] / 1000:.1f} s"
        )
        lines.append(f"      input: {p['input']}")
    lines.append("  grant with `toolhost approve CALL_ID`, refuse with `toolhost approve --deny`")
    return "\n".join(lines)


def approve(args: argparse.Namespace) -> int:
    """``toolhost approve CALL_ID``: grant (or ``--deny``) a call waiting for an operator."""
    from supervisor.calls.approvals import token_path
    from supervisor.private_files import read_token

    path = socket_path(args)
    try:
        token = read_token(token_path(path), create=False)
    except FileNotFoundError:
        return die(
            f"no operator token next to {path}: is the host running with "
            '"approvalSource": "operator"?',
            EXIT_FAILED,
        )
    except (OSError, ValueError) as exc:
        return die(f"cannot read the operator token next to {path}: {exc}", EXIT_FAILED)
    by = args.by or os.environ.get("USER") or "operator"

    async def body(client: Client) -> int:
        await client.request(
            "approvals.decide",
            {"callId": args.call_id, "granted": not args.deny, "by": by, "token": token},
        )
        print(f"{'denied' if args.deny else 'approved'} {args.call_id} (by {by})")
        return EXIT_OK

    return _run(args, body)


def invoke(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.input == "-" else args.input
    try:
        tool_input = json.loads(text)
    except json.JSONDecodeError as exc:
        return die(f"input is not JSON: {exc}", EXIT_USAGE)

    def on_event(name: str, data: Any) -> None:
        print(json.dumps({"event": name, "data": data}), file=sys.stderr, flush=True)

    async def body(client: Client) -> int:
        env = await client.invoke(
            args.tool,
            tool_input,
            timeout_ms=args.timeout,
            approval={"granted": True, "by": args.approve} if args.approve else None,
            stream=args.stream,
            on_event=on_event if args.stream else None,
        )
        if args.content:
            print(env.content)
        else:
            _print_json(env)
        return {"success": EXIT_OK, "failed": EXIT_FAILED}.get(env.status, EXIT_UNAVAILABLE)

    return _run(args, body)


def catalog(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        cat = await client.catalog()
        if args.json:
            _print_json(cat.tools)
            return EXIT_OK
        print(catalog_text(cat))
        return EXIT_OK

    return _run(args, body)


def restart(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        params: dict[str, Any] = {"sidecar": args.sidecar}
        if args.force:
            params["force"] = True
        result = await client.request("sidecar.restart", params)
        old = result.get("replaced", [])
        was = ", ".join(f"pid {pid}" for pid in old) or "no running worker"
        print(f"restarted {args.sidecar}: replaced {was}")
        return EXIT_OK

    return _run(args, body)


def logs(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        result = await client.request(
            "sidecar.logs", {"sidecar": args.sidecar, "bytes": args.bytes}
        )
        sys.stdout.write(result["stderr"])
        if not result["stderr"]:  # say so: an empty screen reads like a hang or a failure
            sys.stderr.write(f"toolhost: {args.sidecar} has written nothing to its stderr yet\n")
        for hint in (result.get("confinement") or {}).get("hints", []):
            sys.stderr.write(f"toolhost: its walls refused it: {hint}\n")
        return EXIT_OK

    return _run(args, body)


def stats(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        data = await client.stats()
        if args.json:
            _print_json(data)
        elif args.prometheus:
            from supervisor.cli.prometheus import exposition

            sys.stdout.write(exposition(data))
        else:
            print(stats_text(data))
        return EXIT_OK

    return _run(args, body)


def reload(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        result = await client.request("registry.reload")
        if args.json:
            _print_json(result)
        else:
            print(reload_text(result))
        return EXIT_OK if result.get("applied") and not result.get("errors") else EXIT_FAILED

    return _run(args, body)


def watch(args: argparse.Namespace) -> int:
    """``toolhost status --watch``: redraw on every catalog change (and every 2 s for workers)."""

    async def body(client: Client) -> int:
        await client.subscribe()
        while True:
            cat = await client.catalog()
            sys.stdout.write("\x1b[H\x1b[2J" + status_text(cat) + "\n")
            sys.stdout.flush()
            with trio.move_on_after(2.0):
                await client.events.receive()

    try:
        return _run(args, body)
    except KeyboardInterrupt:
        return EXIT_OK


def resources(args: argparse.Namespace) -> int:
    """``toolhost resources``: the hosted MCP resources and templates, or one read."""

    async def body(client: Client) -> int:
        if args.uri:
            read = await client.request("resources.read", {"uri": args.uri})
            if args.json:
                _print_json(read)
                return EXIT_OK
            for item in read.get("contents", []):
                text = item.get("text")
                print(text if text is not None else f"[{item.get('mimeType') or 'blob'}]")
            return EXIT_OK
        listed = await client.request("resources.list", {})
        templates = await client.request("resources.templates", {})
        if args.json:
            _print_json({**listed, "resourceTemplates": templates["resourceTemplates"]})
            return EXIT_OK
        if not listed["resources"] and not templates["resourceTemplates"]:
            _none_offered("resources")
        for r in listed["resources"]:
            print(f"{r['uri']}  [{r['sidecar']}]  {r.get('description') or r.get('name', '')}")
        for t in templates["resourceTemplates"]:
            print(f"{t['uriTemplate']}  [{t['sidecar']}]  {t.get('description') or ''}")
        for s in [*listed["shadowed"], *templates["shadowed"]]:
            what = s.get("uri") or s.get("uriTemplate")
            print(f"shadowed: {what} of {s['sidecar']} (owned by {s['shadowedBy']})")
        return EXIT_OK

    return _run(args, body)


def _none_offered(what: str) -> None:
    """Say why a list is empty (on stderr: stdout stays the list, empty)."""
    print(
        f"no {what}: no available MCP server offers any (a sidecar with protocol mcp or "
        "mcp-http; docs/mcp-server.md)",
        file=sys.stderr,
    )


def prompts(args: argparse.Namespace) -> int:
    """``toolhost prompts``: the hosted MCP prompts, or one got with ``--arg k=v``."""

    async def body(client: Client) -> int:
        if args.name:
            arguments = dict(args.arg or [])
            got = await client.request("prompts.get", {"name": args.name, "arguments": arguments})
            if args.json:
                _print_json(got)
                return EXIT_OK
            for m in got.get("messages", []):
                content = m.get("content") or {}
                print(
                    f"{m.get('role')}: {content.get('text', '[' + str(content.get('type')) + ']')}"
                )
            return EXIT_OK
        listed = await client.request("prompts.list", {})
        if args.json:
            _print_json(listed)
            return EXIT_OK
        if not listed["prompts"]:
            _none_offered("prompts")
        for p in listed["prompts"]:
            names = ", ".join(a.get("name", "") for a in p.get("arguments") or [])
            print(f"{p['name']}({names})  [{p['sidecar']}]  {p.get('description') or ''}")
        for s in listed["shadowed"]:
            print(f"shadowed: {s['name']} of {s['sidecar']} (owned by {s['shadowedBy']})")
        return EXIT_OK

    return _run(args, body)
