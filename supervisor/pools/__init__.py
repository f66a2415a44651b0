"""Pools: one per sidecar; dispatch to its workers, keep them alive, probe and scale them."""
