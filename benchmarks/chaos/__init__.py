"""The chaos and soak runner: ``python -m benchmarks chaos --duration SECONDS --seed N``.

It runs the real agent daemon (``python -m agent.cli run``) against three real local clusters and
a Git server on loopback, injects faults chosen with the seed, and checks the safety invariants
from the outside (with admin credentials, never through the agent) after every step.

``content`` is the Git side (what each commit declares, pure), ``world`` what runs (clusters,
Git server, proxy, agent process), ``faults`` one class per fault kind (inject, observe, heal),
``invariants`` pure checks over snapshots, ``runner`` the seeded schedule, loop and table.
docs/reliability.md says what is injected and how each fault is observed.
"""
