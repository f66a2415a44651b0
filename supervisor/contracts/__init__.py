"""Contracts: every message and config shape of PROTOCOL.md as msgspec Structs.

This layer imports msgspec only. Config structs are strict (unknown fields are errors);
wire structs are tolerant (unknown fields are ignored, new fields get defaults).
"""
