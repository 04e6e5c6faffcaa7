"""One pass for one cluster: render -> read live -> plan -> apply -> prune (and takeover)."""
