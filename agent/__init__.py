"""gitops-agent: a pull-based GitOps reconciliation agent for Kubernetes.

The pipeline is source → render → plan → apply/prune → report, one module per
stage; ``reconcile`` sequences them for one cluster and ``scheduler`` runs one
reconcile job per cluster. See docs/architecture.md.
"""

import os

__version__ = "0.1.0"

# Before any module logs: structlog's out-of-the-box logger writes to stdout, which holds
# only a command's product (`render | kubectl apply -f -`). The Git child process of every poll
# (``agent.source.remote``, marked by ``GIT_CHILD``) answers over a pipe and never logs: it skips
# importing structlog, which cost each poll a third of a second where ``rich`` is installed.
GIT_CHILD = "GITOPS_AGENT_GIT_CHILD"
if os.environ.get(GIT_CHILD) != "1":
    from agent import logs as _logs

    _logs.default_to_stderr()
