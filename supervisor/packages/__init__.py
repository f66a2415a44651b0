"""The external tool package manager: package format, journal, stage/apply/rollback/recovery.

Below the runtime: plain file-system work, no trio. The host drives it through
``supervisor/host/upgrades.py``; the CLI drives it directly when no host is running.
"""
