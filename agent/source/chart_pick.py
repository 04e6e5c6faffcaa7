"""Which version of a chart a constraint picks, from the versions a repository lists.

Called by ``source.charts`` (the versions of ``index.yaml``) and ``source.oci`` (the tags of an
OCI repository), so both pick alike: an exact version listed is taken as it is; otherwise the
newest the constraint allows (``agent.config.chart_versions``: no prerelease unless the
constraint names one); a listed version that is not semver is never picked, as in Helm.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from agent.config.chart_versions import Constraint, Version, newest, parse_constraint, parse_version
from agent.config.types import HelmSettings
from agent.errors import ChartError, ChartProblem

__all__ = ["constraint_of", "pick"]


def constraint_of(helm: HelmSettings) -> Constraint:
    """``helm.version`` parsed; ``ChartError`` (no match) for one the loader would refuse."""
    try:
        return parse_constraint(helm.version)
    except ValueError as e:  # the loader refuses these; a constraint built in code may not
        raise ChartError(
            ChartProblem.NO_MATCH, str(e), url=helm.repository, constraint=helm.version
        ) from None


def pick(helm: HelmSettings, listed: Iterable[str]) -> str:
    """The version of ``listed`` that ``helm.version`` picks, as listed; ``ChartError`` naming
    the newest versions there are when none matches."""
    constraint = constraint_of(helm)
    by_text: dict[str, Version] = {}
    for text in listed:
        try:
            by_text.setdefault(text, parse_version(text))
        except ValueError:
            continue
    if helm.version and helm.version in by_text:
        return helm.version
    best = newest(constraint, by_text.values())
    if best is not None and best.text in by_text:
        return best.text
    have = sorted(by_text.values(), key=functools.cmp_to_key(Version.compare), reverse=True)[:5]
    shown = ", ".join(str(v) for v in have) or "none"
    raise ChartError(
        ChartProblem.NO_MATCH,
        f"no version of chart {helm.chart!r} matches (newest: {shown})",
        url=helm.repository,
        constraint=str(constraint),
    )
