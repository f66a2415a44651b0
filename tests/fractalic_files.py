"""Files of a Fractalic-style ``tools/`` folder shared by the folder tests (unit, integration and
end to end): manifests of every kind the host must list, hostile YAML, a plain script."""

SJ_YAML = """
name: sj
description: From the manifest
command: simple-json
entry: sj.py
parameters: {type: object, properties: {q: {type: string}}}
"""

MCP_YAML = """
name: files
description: An MCP server
command: mcp
entry: npx -y @modelcontextprotocol/server-filesystem /data
"""

BOMB = """
name: bomb
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
"""
"""A billion-laughs alias bomb (9**6 leaves once expanded)."""

DEEP_YAML = "[" * 10_000 + "]" * 10_000
"""A flow sequence nested 10,000 deep."""

SANE = """
import json, sys
if sys.argv[1] == '{"__test__": true}':
    print(json.dumps({"ok": True})); sys.exit(0)
if sys.argv[1].startswith("--"):
    sys.exit(1)
print(json.dumps({"sane": True}))
"""
"""A well-behaved simple-json script (the bystander beside hostile ones)."""
