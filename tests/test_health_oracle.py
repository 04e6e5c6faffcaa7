"""Our health rules against kstatus itself: every fixture agrees, except the gaps we close on purpose.

The oracle is sigs.k8s.io/cli-utils v0.37.2's ``status.Compute`` in a small Go program
(tools/go/kstatus/, built into the cache by ``scripts/install-go-tools``, which
``scripts/bootstrap --test`` runs). Each gap is listed here with why, and in docs/health.md; a gap
that no longer differs, or a difference that is not listed, fails the test.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from agent.plan.health import assess
from agent.render.binaries import go_tool

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "health"
HEALTH_DOC = ROOT / "docs" / "health.md"

#: fixture → (ours, kstatus's, why ours differs). kstatus's "Error" (it refused the object) is
#: compared as our Unknown.
GAPS: dict[str, tuple[str, str, str]] = {
    "deployment-paused": ("Suspended", "InProgress", "a paused Deployment waits for its operator, not stuck"),
    "job-running": ("InProgress", "Current", "a Job the app waits for must complete, not only start"),
    "job-suspended": ("Suspended", "InProgress", "a suspended Job waits for its operator"),
    "cronjob-suspended": ("Suspended", "Current", "a suspended CronJob runs nothing until resumed"),
    "service-lb-pending": ("InProgress", "Current", "a LoadBalancer Service needs its address"),
    "ingress-no-address": ("InProgress", "Current", "an Ingress needs its load balancer's address"),
    "pod-image-pull-backoff": ("Failed", "InProgress", "an image that cannot be pulled does not fix itself"),
    "pod-err-image-pull": ("Failed", "InProgress", "the first failed pull; debounce absorbs a blip"),
    "pod-create-config-error": ("Failed", "InProgress", "a missing Secret does not appear by itself"),
    "pod-init-crashloop": ("Failed", "InProgress", "an init container crash-looping fails the Pod too"),
    "pod-evicted": ("Failed", "Current", "a Pod that ended in phase Failed has failed"),
    "pod-migrate-failed": ("Failed", "Current", "a Pod that ended in phase Failed has failed"),
    "pod-unschedulable": ("InProgress", "Failed", "no clock inside: the timeout decides"),
    "pvc-lost": ("Failed", "InProgress", "a claim whose volume is gone will not bind again"),
    "statefulset-ondelete-not-ready": ("InProgress", "Current", "OnDelete skips the revision, not readiness"),
    "daemonset-ondelete": ("Current", "InProgress", "OnDelete Pods update only when deleted: not waited for"),
    "apiservice-missing-endpoints": ("InProgress", "Current", "an APIService is served once Available"),
    "hpa-no-metrics": ("InProgress", "Current", "it cannot compute a replica count yet"),
    "hpa-scaling-disabled": ("Suspended", "Current", "its target is scaled to zero on purpose"),
    "pdb-not-observed": ("InProgress", "Current", "an uncomputed budget protects nothing"),
    "deployment-malformed": ("Unknown", "InProgress", "a status field of the wrong type is not read as zero"),
}


def oracle() -> Path:
    found = go_tool("kstatus")
    if found is None:
        pytest.fail(
            "the kstatus oracle is not built: run scripts/bootstrap --test"
            " (or scripts/install-go-tools kstatus)"
        )
    return found


def verdicts(paths: list[Path]) -> list[dict[str, str]]:
    objects = [json.loads(p.read_text()) for p in paths]
    out = subprocess.run(
        [str(oracle())], input=json.dumps(objects), capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_our_health_agrees_with_kstatus_on_every_fixture_but_the_listed_gaps() -> None:
    paths = sorted(FIXTURES.glob("*.json"))
    assert len(paths) >= 40
    found: dict[str, tuple[str, str]] = {}
    for path, theirs in zip(paths, verdicts(paths), strict=True):
        ours = assess(json.loads(path.read_text())).state.value
        kstatus = "Unknown" if theirs["status"] == "Error" else theirs["status"]
        if ours != kstatus:
            found[path.stem] = (ours, kstatus)
    assert found == {name: (ours, theirs) for name, (ours, theirs, _) in GAPS.items()}


def test_every_gap_is_listed_in_the_health_docs_with_both_verdicts() -> None:
    text = HEALTH_DOC.read_text()
    for name, (ours, theirs, _) in GAPS.items():
        row = re.search(rf"^\|[^\n]*`{re.escape(name)}`[^\n]*$", text, re.M)
        assert row is not None, f"docs/health.md does not list the gap {name}"
        assert ours in row.group(0) and theirs in row.group(0), row.group(0)


def test_the_oracle_is_kstatus_at_the_pinned_version() -> None:
    go_mod = (ROOT / "tools" / "go" / "kstatus" / "go.mod").read_text()
    assert re.search(r"^\s*sigs\.k8s\.io/cli-utils v0\.37\.2$", go_mod, re.M), go_mod
