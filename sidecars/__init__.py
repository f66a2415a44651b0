"""Bundled sidecars and the tiny blocking SDK they are written with.

The host never imports anything under this package: sidecars run as separate processes and
are reached only through the registry and their wire protocol.
"""
