"""The bench's echo tool as a Fractalic-style simple-json script (PROTOCOL 3.3).

The input object is the single argument; the answer is JSON on stdout. ``{"__test__": true}``
is the discovery probe, ``--fractalic-dump-schema`` describes the tool.
"""

import json
import sys

SCHEMA = {
    "description": "Return the payload unchanged.",
    "parameters": {"type": "object", "properties": {"payload": {"type": "string"}}},
}


def main() -> None:
    arg = sys.argv[1] if len(sys.argv) > 1 else "{}"
    if arg == "--fractalic-dump-schema":
        print(json.dumps(SCHEMA))
        return
    request = json.loads(arg)
    if request.get("__test__"):
        print(json.dumps({"ok": True}))
        return
    print(json.dumps({"payload": request.get("payload", "")}))


if __name__ == "__main__":
    main()
