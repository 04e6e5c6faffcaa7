"""Writes: server-side apply, the ApplySet inventory, and pruning on positive evidence only."""
