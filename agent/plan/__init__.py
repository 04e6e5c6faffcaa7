"""The pure three-way, field-manager-aware diff: no I/O, no client."""
