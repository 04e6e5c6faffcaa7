"""A real headless Chromium for the status page's tests (Debian's ``chromium`` and
``chromium-driver``, installed by ``scripts/bootstrap``), driven by Selenium: the same one
``python -m agent.dev.screenshots`` uses (``agent.dev.screenshots.chromium``).

The driver's path is given explicitly, so Selenium Manager never runs and nothing is
downloaded. Missing binaries fail the requesting test with the install hint; they never skip.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.dev.screenshots import CHROMEDRIVER, CHROMIUM, LAPTOP, PHONE, chromium

__all__ = ["LAPTOP", "PHONE", "require_browser", "start"]


def require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.fail(
            f"headless Chromium unavailable: {', '.join(missing)} missing; run scripts/bootstrap --test "
            "(it installs the Debian packages chromium and chromium-driver)",
            pytrace=False,
        )


def start(size: tuple[int, int] = LAPTOP) -> Any:
    """A headless Chromium of this machine at ``size`` (CSS pixels)."""
    require_browser()
    return chromium(size)
