"""Headless Chromium (Debian's `chromium` package) driven from its command line: the DOM after
the page's scripts ran (`--dump-dom`) and PNG screenshots at a given window size. No driver, no
download: `make browser` installs the package when it is missing."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome")
CHECK_ID = "rig-browser-check"
INSTALL_HINT = "no headless Chromium on PATH: `make browser` installs Debian's chromium package"


def binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


def _run(page: Path, profile: Path, extra: list[str], timeout_s: float = 60) -> str:
    chromium = binary()
    if chromium is None:
        raise FileNotFoundError(INSTALL_HINT)
    argv = [
        chromium,
        "--headless",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",  # let the page's scripts finish before the dump
        *extra,
        page.resolve().as_uri(),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def dump_dom(page: Path, profile: Path, width: int = 1280, height: int = 900) -> str:
    """The page's DOM after its scripts ran, in a window `width` px wide."""
    return _run(page, profile, [f"--window-size={width},{height}", "--dump-dom"])


def screenshot(page: Path, out: Path, profile: Path, width: int = 1280, height: int = 2000) -> Path:
    """A PNG of the first `height` px of the page in a window `width` px wide."""
    _run(page, profile, [f"--window-size={width},{height}", f"--screenshot={out.resolve()}"])
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {out}")
    return out


def with_check_script(page: Path, script: str, out: Path) -> Path:
    """A copy of `page` with a test-only script at the end of the body that writes its JSON
    result into <pre id=rig-browser-check> (read back with `check_result`); the page's
    Content-Security-Policy is widened by exactly that script's hash."""
    text = page.read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    if "script-src " not in text:
        raise AssertionError("the page has no script-src policy to extend")
    text = text.replace("script-src ", f"script-src 'sha256-{digest}' ", 1)
    body_end = text.rindex("</body>")
    out.write_text(text[:body_end] + f"<script>{script}</script>" + text[body_end:], "utf-8")
    return out


def without_scripts(page: Path, out: Path) -> Path:
    """A copy of `page` as a browser with JavaScript off shows it: a second policy that
    allows no script at all (headless Chromium's own switch for it takes no screenshots)."""
    text = page.read_text(encoding="utf-8")
    policy = '<meta http-equiv="Content-Security-Policy" content="script-src \'none\'">'
    head_end = text.index("</head>")
    out.write_text(text[:head_end] + policy + text[head_end:], "utf-8")
    return out


def check_result(dom: str) -> dict:
    found = re.search(rf'<pre id="{CHECK_ID}">(.*?)</pre>', dom, re.S)
    if found is None:
        raise AssertionError("the check script left no result in the DOM (did it throw?)")
    return json.loads(html.unescape(found.group(1)))
