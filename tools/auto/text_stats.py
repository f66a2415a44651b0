#!/usr/bin/env python3
"""Count the characters, words and lines of a text, or make a URL slug of it."""

# A simple-json tool (Fractalic's "Simple JSON" convention): toolhost finds it because
# tools/external.tools.jsonc lists "tools/auto" under "autodiscover". It is probed with the
# single argument '{"__test__": true}', asked for its schema with --fractalic-dump-schema, and
# called with the input object as its single JSON argument. stdout carries JSON only.

import json
import re
import sys
import unicodedata

SCHEMA = {
    "description": "Count the characters, words and lines of a text, or make a URL slug of it.",
    "parameters": {
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": ["count", "slug"],
                "description": "count: characters, words and lines; slug: a lowercase URL slug",
            },
            "text": {"type": "string", "description": "The text to work on"},
        },
        "required": ["action", "text"],
    },
}


def process_data(data):
    """Main processing function."""
    action = data.get("action")
    text = data.get("text")
    if not isinstance(text, str):
        return {"error": "text must be a string"}
    if action == "count":
        return {
            "characters": len(text),
            "words": len(text.split()),
            "lines": len(text.splitlines()),
        }
    if action == "slug":
        ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
        return {"slug": re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")}
    return {"error": f"Unknown action: {action}"}


def main():
    # Test mode for autodiscovery
    if len(sys.argv) == 2 and sys.argv[1] == '{"__test__": true}':
        print(json.dumps({"success": True, "_simple": True}))
        return
    # Schema dump for rich LLM integration
    if len(sys.argv) == 2 and sys.argv[1] == "--fractalic-dump-schema":
        print(json.dumps(SCHEMA, ensure_ascii=False))
        return
    try:
        if len(sys.argv) != 2:
            raise ValueError("Expected exactly one JSON argument")
        params = json.loads(sys.argv[1])
        result = process_data(params)
        print(json.dumps(result, ensure_ascii=False))
    except Exception as e:
        print(json.dumps({"error": str(e)}, ensure_ascii=False))
        sys.exit(1)


if __name__ == "__main__":
    main()
