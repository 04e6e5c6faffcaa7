"""Render a ``Report`` as markdown (PR comments), JSON (bots, policy checks) or text (terminals).

Pure: takes the typed model of ``agent.report.model`` and returns a string;
it never recomputes a plan and never sees an unmasked value (masking happened
where the diffs were made). Called by ``gitops-agent diff`` (``agent.cli.diff``).

Markdown starts with ``COMMENT_MARKER`` (CI scripts find and update their one
comment by it), a summary table (cluster by created/updated/pruned/conflicts/
errors) and then, per cluster, one collapsible ``<details>`` section per
object, under a heading per app unless the cluster's only app is the one named
after it (then it reads as before apps existed). ``max_size`` (GitHub's 65,536
characters by default) is kept by dropping or clipping detail sections, never
the summary, with a note saying how much was left out.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable

import click

from agent.model import IgnoredFields
from agent.report.model import (
    AppReport,
    ClusterReport,
    ConflictLine,
    Mode,
    ObjectAction,
    ObjectReport,
    Report,
    Severity,
    to_json,
)

COMMENT_MARKER = "<!-- gitops-agent-diff -->"
GITHUB_MAX = 65536
_COLUMNS = ("created", "updated", "pruned", "conflicts", "errors")
_OFFLINE_WORDS = {ObjectAction.CREATE: "added", ObjectAction.UPDATE: "changed", ObjectAction.PRUNE: "removed"}
#: Room kept for the truncation note (its text is well below this).
_NOTE_ROOM = 400


def action_word(report: Report, obj: ObjectReport) -> str:
    word = (
        _OFFLINE_WORDS.get(obj.action, obj.action.value) if report.mode is Mode.OFFLINE else obj.action.value
    )
    return f"error ({word})" if obj.error else word


def _value(v: object) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=False)


def conflict_text(c: ConflictLine) -> str:
    """One line per conflict, naming the other manager and what the agent does."""
    where = f"{c.operation}" + (f", subresource {c.subresource}" if c.subresource else "")
    if c.resolution == "yield":
        what = f"yield: the cluster keeps {_value(c.live)} (Git says {_value(c.desired)})"
    else:
        what = f"force: Git's {_value(c.desired)} replaces {_value(c.live)}"
    return f"{c.path} is owned by {c.manager} ({where}): {what}"


def ignored_text(i: IgnoredFields) -> str:
    """``3 field(s) left alone by rule `apps[0].ignore[1]```."""
    return f"{i.fields} field(s) left alone by rule `{i.rule}`"


def status_text(c: ClusterReport) -> str:
    if c.error:
        return "error: " + c.error.strip().splitlines()[0]
    failed = [a for a in c.apps if a.error]
    if failed:
        a = failed[0]
        where = "" if c.implicit_only else f"app {a.name}: "
        more = f" (+{len(failed) - 1} app(s))" if len(failed) > 1 else ""
        return f"error: {where}" + (a.error or "").strip().splitlines()[0] + more
    flagged = [f for a in c.apps for f in a.findings if f.severity is Severity.ERROR]
    if flagged:
        more = f" (+{len(flagged) - 1} more)" if len(flagged) > 1 else ""
        return f"error: {flagged[0].text()}{more}"
    if c.errors:
        return f"{c.errors} object(s) rejected"
    if c.blocked:
        return f"{c.blocked} object(s) use an API version that is not served"
    refused = [
        (a.prune_refused.splitlines() or [""])[0] if c.implicit_only else f"{a.name}: " + a.prune_refused
        for a in c.apps
        if a.prune_refused
    ]
    if refused:
        return (
            "prune refused: "
            + refused[0].splitlines()[0]
            + (f" (+{len(refused) - 1} app(s))" if len(refused) > 1 else "")
        )
    return "changes" if c.has_differences else "no changes"


def title(report: Report) -> str:
    if report.mode is Mode.OFFLINE:
        base = report.base.label if report.base else "?"
        return f"gitops-agent diff (offline): {base} → {report.revision.label}"
    return f"gitops-agent diff (live): {report.revision.label}"


# -- JSON ---------------------------------------------------------------------------------


def render_json(report: Report) -> str:
    return json.dumps(to_json(report), indent=2, ensure_ascii=False) + "\n"


# -- markdown -----------------------------------------------------------------------------


def _md(text: str) -> str:
    """Free text for markdown: HTML-escaped outside `code spans` (inside them GitHub shows entities as is)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # unbalanced backticks: no code spans at all
        return html.escape(text, quote=False)
    return "`".join(p if i % 2 else html.escape(p, quote=False) for i, p in enumerate(parts))


def _cell(text: str, limit: int = 160) -> str:
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return _md(text).replace("|", "\\|").replace("\n", " ")


def _line(text: str, limit: int = 1000) -> str:
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return _md(text).replace("\n", " ")


def _fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return ticks


def markdown_summary(report: Report) -> str:
    lines = [COMMENT_MARKER, f"### {_line(title(report), 400)}", ""]
    if report.kubernetes_version:
        lines += [f"API versions checked against Kubernetes {report.kubernetes_version}.", ""]
    if report.field_manager and report.mode is Mode.LIVE:
        lines += [
            f"Field manager `{report.field_manager}`; creates and updates checked by a server dry-run.",
            "",
        ]
    lines += [
        "| Cluster | Created | Updated | Pruned | Conflicts | Errors | Status |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for c in report.clusters:
        t = c.totals()
        lines.append(
            f"| {_cell(c.name)} | "
            + " | ".join(str(t[k]) for k in _COLUMNS)
            + f" | {_cell(status_text(c))} |"
        )
    for note in report.notes:
        lines += ["", f"> {_line(note, 1000)}"]
    return "\n".join(lines) + "\n"


def _markdown_body(report: Report, a: AppReport, what: str) -> list[str]:
    lines: list[str] = []
    if a.error:
        lines += [
            f"**Error** — nothing could be planned for this {what}:",
            "",
            "```",
            a.error.strip(),
            "```",
            "",
        ]
    if a.prune_refused:
        lines += [f"> **Prune refused:** {_line(a.prune_refused, 2000)}", ""]
    lines += [f"> {_line(n, 1000)}" for n in a.notes]
    if a.sync:
        lines += ["", "**Sync order** (each step once the one before is healthy):", ""]
        lines += [f"{i}. {_line(step, 1000)}" for i, step in enumerate(a.sync, 1)] + [""]
    lines += [f"> **{f.severity.value.capitalize()}:** {_line(f.text(), 1000)}" for f in a.findings]
    if not a.error and not a.objects:
        lines.append(
            "No changes." if report.mode is Mode.OFFLINE else f"No changes ({a.unchanged} unchanged)."
        )
    elif not a.error and a.unchanged:
        lines.append(f"{a.unchanged} object(s) unchanged.")
    if a.ignored:
        lines += ["", *(f"- Ignored: {_md(ignored_text(i))}" for i in a.ignored)]
    return lines


def markdown_cluster_head(report: Report, c: ClusterReport) -> str:
    """The cluster's heading; a cluster whose only app is named after it shows that app's
    errors and notes right here, as before apps existed."""
    lines = ["", f"#### {_line(c.name)}", ""]
    if c.error:
        lines += [
            "**Error** — nothing could be planned for this cluster:",
            "",
            "```",
            c.error.strip(),
            "```",
            "",
        ]
    if c.implicit_only and c.apps:
        lines += _markdown_body(report, c.apps[0], "cluster")
    elif lines[-1] == "":
        lines.pop()  # each app's heading opens with its own blank line
    return "\n".join(lines) + "\n"


def markdown_app_head(report: Report, a: AppReport) -> str:
    """One app's heading under its cluster's (clusters with apps other than their own)."""
    return "\n".join(["", f"##### App `{a.name}`", "", *_markdown_body(report, a, "app")]) + "\n"


def markdown_object(report: Report, o: ObjectReport, *, diff_limit: int | None = None) -> str:
    """One ``<details>`` section; ``diff_limit`` clips the diff to that many characters."""
    bits = []
    if o.fields and o.action is not ObjectAction.CREATE and o.action is not ObjectAction.PRUNE:
        bits.append(f"{len(o.fields)} field(s) changed")
    if o.conflicts:
        bits.append(f"{len(o.conflicts)} conflict(s)")
    if o.released:
        bits.append(f"{len(o.released)} released")
    extra = f" — {', '.join(bits)}" if bits else ""
    icon = "❌ " if o.error or o.blocked else ""
    lines = [
        "<details>",
        f"<summary>{icon}<b>{action_word(report, o)}</b> <code>{html.escape(o.key)}</code>{extra}</summary>",
        "",
    ]
    if o.error:
        lines += [f"**Rejected:** {_line(o.error, 4000)}", ""]
    if o.source:
        lines.append(f"Source: `{o.source}`  ")
    if o.reason:
        lines.append(f"{_line(o.reason, 1000)}  ")
    if o.note:
        lines.append(f"_{_line(o.note, 1000)}_  ")
    if o.diff:
        diff = o.diff
        clipped = diff_limit is not None and len(diff) > diff_limit
        if clipped:
            diff = diff[: max(0, diff_limit or 0)].rsplit("\n", 1)[0]
        fence = _fence(diff)
        lines += ["", f"{fence}diff", diff, fence]
        if clipped:
            lines.append("_(diff truncated to respect the size limit)_")
    if o.conflicts or o.released or o.app_conflicts or o.api:
        lines.append("")
    lines += [f"- {'❌' if a.blocking else '⚠️'} {a.problem}: {_line(a.message, 1000)}" for a in o.api]
    lines += [f"- ⚠️ conflict: {_line(conflict_text(c), 1000)}" for c in o.conflicts]
    lines += [f"- ⚠️ app conflict: {_line(c.text(), 1000)}" for c in o.app_conflicts]
    for r in o.released:
        fate = "removed by the server" if r.removed else "kept: another manager co-owns it"
        lines.append(f"- released: `{r.path}` ({fate})")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def render_markdown(report: Report, *, max_size: int = GITHUB_MAX) -> str:
    """The PR comment; never longer than ``max_size`` unless the summary alone is."""
    out = markdown_summary(report)
    budget = max_size - len(out) - _NOTE_ROOM
    parts: list[str] = []
    total = sum(len(c.objects) for c in report.clusters)
    shown = 0
    clipped = False
    stopped = False
    # One block per app: the first of a cluster carries the cluster's heading.
    blocks: list[tuple[str, tuple[ObjectReport, ...]]] = []
    for c in report.clusters:
        blocks.append((markdown_cluster_head(report, c), ()))
        if not c.implicit_only:
            blocks += [(markdown_app_head(report, a), a.objects) for a in c.apps]
        else:
            blocks += [("", a.objects) for a in c.apps]
    for head, objects in blocks:
        if stopped:
            break
        if len(head) > budget:
            stopped = True
            break
        parts.append(head)
        budget -= len(head)
        for o in objects:
            section = markdown_object(report, o)
            if len(section) <= budget:
                parts.append(section)
                budget -= len(section)
                shown += 1
                continue
            # Too big: clip this one's diff to what is left, if its frame fits, and stop there.
            frame = len(markdown_object(report, o, diff_limit=0))
            if o.diff and frame + 200 < budget:
                section = markdown_object(report, o, diff_limit=budget - frame - 100)
                parts.append(section)
                budget -= len(section)
                shown += 1
                clipped = True
            stopped = True
            break
    out += "".join(parts)
    omitted = total - shown
    if omitted or clipped or stopped:
        what = f"{omitted} of {total} object section(s) omitted" if omitted else "a diff was clipped"
        out += (
            f"\n> ⚠️ **Report truncated** to stay under {max_size} characters: {what}. "
            "The summary table above is complete; run `gitops-agent diff --format text` "
            "(or `--format json`) for the whole report.\n"
        )
    return out


# -- text ---------------------------------------------------------------------------------


def render_text(report: Report, *, color: bool = False) -> str:
    """For terminals; ANSI colours only when ``color`` (the CLI passes ``isatty``)."""

    def style(text: str, **kw: object) -> str:
        return click.style(text, **kw) if color else text  # type: ignore[arg-type]

    lines = [style(title(report), bold=True), ""]
    if report.kubernetes_version:
        lines[1:1] = [f"API versions checked against Kubernetes {report.kubernetes_version}"]
    rows: list[tuple[str, ...]] = [
        ("CLUSTER", "CREATED", "UPDATED", "PRUNED", "CONFLICTS", "ERRORS", "STATUS")
    ]
    for c in report.clusters:
        t = c.totals()
        rows.append((c.name, *(str(t[k]) for k in _COLUMNS), status_text(c)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
    lines.extend(f"note: {n}" for n in report.notes)
    for c in report.clusters:
        lines += ["", style(f"== {c.name} ==", bold=True)]
        if c.error:
            lines.append(style(f"error: {c.error}", fg="red"))
        for a in c.apps:
            if not c.implicit_only:
                lines += ["", style(f"-- app {a.name} --", bold=True)]
            if a.error:
                lines.append(style(f"error: {a.error}", fg="red"))
            if a.prune_refused:
                lines.append(style(f"prune refused: {a.prune_refused}", fg="yellow"))
            lines.extend(f"note: {n}" for n in a.notes)
            lines.extend(f"sync {i}: {step}" for i, step in enumerate(a.sync, 1))
            for f in a.findings:
                colour = "red" if f.severity is Severity.ERROR else "yellow"
                lines.append(style(f"{f.severity.value}: {f.text()}", fg=colour))
            if not a.error and not a.objects:
                lines.append("no changes")
            lines.extend(f"ignored: {ignored_text(i)}" for i in a.ignored)
            for o in a.objects:
                lines.extend(_text_object(report, o, style))
    return "\n".join(lines) + "\n"


def _text_object(report: Report, o: ObjectReport, style: Callable[..., str]) -> list[str]:
    colour = {"create": "green", "update": "yellow", "prune": "red", "conflict": "magenta"}.get(
        o.action.value
    )
    head = f"{action_word(report, o)} {o.key}" + (f"  ({o.source})" if o.source else "")
    lines = ["", style(head, fg="red" if o.error else colour, bold=True)]
    if o.error:
        lines.append(style(f"  rejected: {o.error}", fg="red"))
    for a in o.api:
        lines.append(style(f"  {a.problem}: {a.message}", fg="red" if a.blocking else "yellow"))
    if o.reason:
        lines.append(f"  {o.reason}")
    if o.note:
        lines.append(f"  note: {o.note}")
    for line in o.diff.splitlines():
        if line.startswith(("+++", "---")):
            lines.append("  " + style(line, bold=True))
        elif line.startswith("+"):
            lines.append("  " + style(line, fg="green"))
        elif line.startswith("-"):
            lines.append("  " + style(line, fg="red"))
        elif line.startswith("@@"):
            lines.append("  " + style(line, fg="cyan"))
        else:
            lines.append("  " + line)
    lines.extend("  " + style("conflict: " + conflict_text(c), fg="magenta") for c in o.conflicts)
    lines.extend("  " + style("app conflict: " + c.text(), fg="magenta") for c in o.app_conflicts)
    for r in o.released:
        lines.append(f"  released: {r.path} ({'removed by the server' if r.removed else 'kept: co-owned'})")
    return lines
