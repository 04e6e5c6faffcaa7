"""Report rendering without clusters: size cap, colour, progress, field diffs, exit codes, CI examples."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from agent.cli.diff import TerminalProgress, diff
from agent.model import ObjectKey
from agent.report import format as render
from agent.report.diff import new_object, sort_objects
from agent.report.diff_fields import diff_objects, scrub, secret_strings
from agent.report.model import ClusterReport, Mode, ObjectAction, Report, RevisionInfo
from tests.test_report_golden import build_report

ROOT = Path(__file__).resolve().parent.parent


def big_report(n: int = 200) -> Report:
    objs = []
    for i in range(n):
        before = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm{i}"},
            "data": {"k": "a" * 300},
        }
        after = {**before, "data": {"k": "b" * 300}}
        text, fields = diff_objects(before, after, from_label="live", to_label="server dry-run")
        objs.append(
            new_object(
                ObjectKey("", "ConfigMap", "ns", f"cm{i}"),
                "v1",
                ObjectAction.UPDATE,
                diff=text,
                fields=fields,
            )
        )
    clusters = (
        ClusterReport.single("one", objects=sort_objects(objs)),
        ClusterReport("two", error="cluster 'two': connection refused"),
    )
    return Report(Mode.LIVE, RevisionInfo("main", "f" * 40), clusters)


@pytest.mark.parametrize("limit", [4096, 20000, 65536])
def test_markdown_is_kept_under_the_size_limit_by_truncating_details_never_the_summary(limit: int) -> None:
    report = big_report()
    text = render.render_markdown(report, max_size=limit)
    assert len(text) <= limit
    assert text.startswith(render.COMMENT_MARKER)
    assert render.markdown_summary(report) in text
    assert "| two | 0 | 0 | 0 | 0 | 1 | error: cluster 'two': connection refused |" in text
    assert "Report truncated" in text and f"under {limit} characters" in text
    assert text.count("<details>") == text.count("</details>")


def test_markdown_is_not_truncated_when_it_fits() -> None:
    text = render.render_markdown(big_report(3))
    assert "truncated" not in text and text.count("<details>") == 3


def test_a_single_huge_diff_is_clipped_with_a_note() -> None:
    before = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}
    after = {**before, "data": {f"k{i}": "v" * 50 for i in range(2000)}}
    text, fields = diff_objects(before, after, from_label="a", to_label="b")
    obj = new_object(ObjectKey("", "ConfigMap", "", "x"), "v1", ObjectAction.UPDATE, diff=text, fields=fields)
    report = Report(Mode.LIVE, RevisionInfo("main"), (ClusterReport.single("one", objects=(obj,)),))
    out = render.render_markdown(report, max_size=10000)
    assert len(out) <= 10000 and "diff truncated" in out and "Report truncated" in out


def test_text_is_coloured_only_when_asked() -> None:
    report = build_report()
    assert "\x1b[" not in render.render_text(report, color=False)
    coloured = render.render_text(report, color=True)
    assert "\x1b[32m+" in coloured and "\x1b[31m-" in coloured


def test_progress_shows_each_cluster_as_it_finishes() -> None:
    out = io.StringIO()
    p = TerminalProgress(out, ["a", "b"])
    p.started("a")
    p.finished(ClusterReport("a"))
    p.finished(ClusterReport("b", error="down"))
    text = out.getvalue()
    assert "planning 1/2: a ✓ b …" in text
    assert text.endswith("planning 2/2: a ✓ b ✗\n")


def test_exit_codes_are_those_of_kubectl_diff() -> None:
    same = Report(Mode.LIVE, RevisionInfo("x"), (ClusterReport.single("a", unchanged=3),))
    assert same.exit_code == 0
    assert big_report(1).exit_code == 2
    changed = Report(Mode.LIVE, RevisionInfo("x"), (big_report(1).clusters[0],))
    assert changed.exit_code == 1


def test_field_diff_shows_only_what_changes_with_list_items_named() -> None:
    live = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "w",
            "labels": {"team": "x", "app": "w"},
            "managedFields": [{}],
            "generation": 4,
        },
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                        {"name": "b", "image": "b:1"},
                    ]
                }
            }
        },
        "status": {"ready": 1},
    }
    after = yaml.safe_load(yaml.safe_dump(live))
    after["spec"]["template"]["spec"]["containers"][1]["image"] = "b:2"
    after["metadata"]["generation"] = 5
    text, fields = diff_objects(live, after, from_label="live", to_label="after")
    assert [(f.path, f.op, f.before, f.after) for f in fields] == [
        ("spec.template.spec.containers[name=b].image", "replace", "b:1", "b:2")
    ]
    assert "team" not in text and "a:1" not in text and "generation" not in text and "status" not in text
    assert "- name: b" in text


def test_secret_strings_are_scrubbed_from_free_text() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"p": "hunter22"},
    }
    found = secret_strings([secret])
    assert scrub("rejected value hunter22 (aHVudGVyMjI=)", found) == "rejected value *** (***)"


def test_ci_examples_run_the_real_command_with_valid_options() -> None:
    options = {o for p in diff.params for o in getattr(p, "opts", [])}
    for name in ("github-actions.yml", "gitlab-ci.yml"):
        text = (ROOT / "docs" / "examples" / name).read_text()
        yaml.safe_load(text)
        assert render.COMMENT_MARKER in text
        calls = re.findall(r"gitops-agent diff((?:\\\n|[^\n])*)", text)
        assert calls, name
        for call in calls:
            words = shlex.split(call.replace("\\\n", " "), comments=True)
            used = {w for w in words if w.startswith("--")}
            assert used <= options, (name, used - options)
