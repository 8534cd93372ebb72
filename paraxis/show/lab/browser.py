"""Open the lab page in headless Chromium through Selenium: for the browser test and for
the screenshots in docs/img/.

Uses Debian's packages (`apt-get install -y chromium chromium-driver`): the chromedriver
that ships with the browser, so the two always match and nothing is downloaded. Selenium is
a dev dependency; it is imported only here.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.spec.errors import ParaxisError

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
WIDGETS = ("scaling", "dp", "ring", "tp", "pipe", "zero", "grid", "cp", "moe")
# Steps to take before a widget's screenshot, so the shot shows its animation under way.
SHOT_STEPS = {"dp": 4, "ring": 3, "tp": 5}


def browser_missing() -> str | None:
    """What of the browser is not installed, as one line saying how to install it (None:
    everything is there)."""
    try:
        import selenium  # noqa: F401  # lazy: selenium is optional (dev extra)
    except ImportError:
        return "the lab's browser needs selenium; pip install -e '.[dev]'"
    for path, package in ((CHROMEDRIVER, "chromium-driver"), (CHROMIUM, "chromium")):
        if shutil.which(path) is None:
            return f"{path} is missing; apt-get install -y {package}"
    return None


def open_browser(width: int = 1100, height: int = 1000) -> WebDriver:
    """A headless Chromium driven by Debian's chromedriver; ParaxisError when missing."""
    if missing := browser_missing():
        raise ParaxisError(missing)
    from selenium import webdriver  # lazy: selenium is optional (dev extra)
    from selenium.webdriver.chrome.service import Service  # lazy: selenium, as above

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def screenshots(page: Path, folder: Path) -> list[Path]:
    """One PNG per widget, lab-<widget>.png in `folder`, each after pressing its check
    button (so the shot shows a worked answer) and stepping its animation."""
    folder.mkdir(parents=True, exist_ok=True)
    driver = open_browser(height=1600)
    try:
        driver.get(page.resolve().as_uri())
        shots = []
        for widget in WIDGETS:
            driver.find_element("id", f"{widget}-check").click()
            for _ in range(SHOT_STEPS.get(widget, 0)):
                driver.find_element("id", f"{widget}-step").click()
            path = folder / f"lab-{widget}.png"
            section = driver.find_element("id", f"w-{widget}")
            driver.execute_script("arguments[0].scrollIntoView(true)", section)  # all of it
            section.screenshot(str(path))
            shots.append(path)
        return shots
    finally:
        driver.quit()
