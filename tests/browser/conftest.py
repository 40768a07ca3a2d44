"""Fixtures for the browser tests: one live server, one headless Chromium, a watched page per test.

Server and browser are package-scoped, so they close when tests/browser is done: Playwright's sync
API keeps an event loop marked running on the main thread while it is open, and later tests that
call asyncio.run() must not see it.

Each page records console errors, uncaught exceptions and every request; at teardown a test fails
on any console error it did not expect and on any request that left the loopback interface.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from tests.browser.chromium import browser_required, chromium_path, missing
from tests.reliability.live_server import REPO_ROOT, LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Locator, Page, Playwright, Request, ViewportSize

ARTIFACTS = REPO_ROOT / "tests" / "artifacts" / "browser"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
LOCAL_SCHEMES = {"data", "blob", "about"}
WIDTH, HEIGHT = 1280, 900
ADMIN_TOKEN = "browser-tests"


@dataclass
class Watch:
    """What one page did: console errors, page errors, and the URLs it requested."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    def allow(self, pattern: str) -> None:
        """A console error this test expects (e.g. Chromium's line about an API answer it provoked)."""
        self.allowed.append(re.compile(pattern))

    def unexpected_errors(self) -> list[str]:
        errors = [m for m in self.console_errors if not any(p.search(m) for p in self.allowed)]
        return errors + self.page_errors

    def external_requests(self) -> list[str]:
        return [url for url in self.requests if not is_local(url)]

    def screenshot(self, name: str, *, full_page: bool = True, element: Locator | None = None) -> Path:
        """Save the page (or one element of it) under tests/artifacts/browser/ for a person to look at."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if element is not None:
            element.screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path), full_page=full_page)
        return path


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    return (parts.hostname or "") in LOOPBACK or (parts.hostname or "").startswith("127.")


SKIPPED_KEY = pytest.StashKey[int]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without Chromium (or playwright), leave the browser tests out; the summary says why in one line.

    Under HOOKSERVE_REQUIRE_BROWSER=1 (CI) they stay in, and `chromium_executable` fails them.
    """
    if browser_required() or missing() is None:
        return
    browser_items = [item for item in items if "chromium_executable" in getattr(item, "fixturenames", ())]
    if browser_items:
        config.hook.pytest_deselected(items=browser_items)
        items[:] = [item for item in items if item not in browser_items]
        config.stash[SKIPPED_KEY] = len(browser_items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    skipped = config.stash.get(SKIPPED_KEY, 0)
    if skipped:
        terminalreporter.write_line(f"{skipped} browser tests skipped. {missing()}")


@pytest.fixture(scope="package")
def chromium_executable() -> str:
    """The Chromium binary; a hard failure where it is required (CI) and missing."""
    reason = missing()
    path = chromium_path()
    if reason is not None or path is None:
        pytest.fail(f"HOOKSERVE_REQUIRE_BROWSER is set: {reason}")
    return path


@pytest.fixture(scope="package")
def playwright_instance(chromium_executable: str) -> Iterator[Playwright]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as instance:
        yield instance


@pytest.fixture(scope="package")
def browser(playwright_instance: Playwright, chromium_executable: str) -> Iterator[Browser]:
    """One headless Chromium for all the browser tests (the distribution's binary)."""
    launched = playwright_instance.chromium.launch(executable_path=chromium_executable, headless=True)
    yield launched
    launched.close()


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory, chromium_executable: str) -> Iterator[LiveServer]:
    """`python -m service` over the built-in registry (lenet, resnet18, efficientvit_b0) on loopback."""
    env = {"HOOKSERVE_ADMIN_TOKEN": ADMIN_TOKEN}
    with LiveServer(tmp_path_factory.mktemp("browser-models"), None, env=env) as live:
        yield live


@pytest.fixture
def watch(browser: Browser, server: LiveServer) -> Iterator[Watch]:
    """A fresh page (own context: no shared storage) whose errors and requests are checked at teardown."""
    viewport: ViewportSize = {"width": WIDTH, "height": HEIGHT}
    context = browser.new_context(viewport=viewport, base_url=server.base_url)
    context.set_default_timeout(60_000)
    page = context.new_page()
    watched = Watch(page)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            watched.console_errors.append(f"{message.text} ({message.location.get('url', '')})")

    def on_request(request: Request) -> None:
        watched.requests.append(request.url)

    page.on("console", on_console)
    page.on("pageerror", lambda error: watched.page_errors.append(f"uncaught: {error}"))
    page.on("request", on_request)
    yield watched
    context.close()
    assert not watched.external_requests(), f"requests left the machine: {watched.external_requests()}"
    assert not watched.unexpected_errors(), f"console errors: {watched.unexpected_errors()}\n{server.log()}"
