"""toolhost: a resident tool host supervising sidecar worker pools for an agent kernel.

The import name is ``supervisor`` (fixed by the project card); the distribution and the
console command are ``toolhost``. Importing this package must stay cheap: sidecars import
:mod:`supervisor.contracts` for the wire messages.
"""

__version__ = "0.1.0"
