"""A real headless Chromium for the status page's tests (Debian's ``chromium`` and
``chromium-driver``, installed by ``scripts/bootstrap``), driven by Selenium.

The driver's path is given explicitly, so Selenium Manager never runs and nothing is
downloaded. Missing binaries fail the requesting test with the install hint; they never skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
LAPTOP = (1366, 900)
PHONE = (390, 844)


def require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.fail(
            f"headless Chromium unavailable: {', '.join(missing)} missing; run scripts/bootstrap "
            "(it installs the Debian packages chromium and chromium-driver)",
            pytrace=False,
        )


def start(size: tuple[int, int] = LAPTOP) -> webdriver.Chrome:
    """A headless Chromium of this machine at ``size`` (CSS pixels)."""
    require_browser()
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # tests run as root, where Chromium's sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--hide-scrollbars",
        f"--window-size={size[0]},{size[1]}",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
