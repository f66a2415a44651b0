"""Pure policy: decisions as functions of facts. No trio, psutil, process calls or clock here;
time comes in as ``now`` (milliseconds) and randomness as a seeded generator."""
