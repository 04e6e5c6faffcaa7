"""gitops-agent: a pull-based GitOps reconciliation agent for Kubernetes.

The pipeline is source → render → plan → apply/prune → report, one module per
stage; ``reconcile`` sequences them for one cluster and ``scheduler`` runs one
reconcile job per cluster. See docs/architecture.md.
"""

from agent import logs as _logs

__version__ = "0.1.0"

# Before any module logs: structlog's out-of-the-box logger writes to stdout, which holds
# only a command's product (`render | kubectl apply -f -`).
_logs.default_to_stderr()
