"""gitops-agent: a pull-based GitOps reconciliation agent for Kubernetes.

The pipeline is source → render → plan → apply/prune → report, one module per
stage; ``reconcile`` sequences them for one cluster and ``scheduler`` runs one
reconcile job per cluster. See docs/architecture.md.
"""

__version__ = "0.1.0"
