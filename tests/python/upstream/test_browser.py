"""llama-server's web UI with a Spark model, in a real browser: the page llama.cpp's UI build
(tools/upstream.sh: npm, from the pinned sdist's tools/ui) embeds in llama-server, opened in
Debian's headless Chromium driven through WebDriver (selenium + chromium-driver, installed by
tools/setup.sh). A user's steps: open the server's address, type a message, press Enter, read
the model's reply. The reply shown is the greedy reply of the OpenAI endpoint, and the plugin's
table at shutdown shows it came from the Spark kernels. The page's screenshot is saved as
tests/out/browser-chat.png (README's picture, docs/browser-chat.png, is one of them)."""

from __future__ import annotations

import gzip
import http.client
import re
import shutil
import tempfile
import time

import pytest

from upstream_helpers import CFG, TARGET_KEEP, Server, assert_stats_table

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MESSAGE = "Who is there?"
N_PREDICT = 32
REPLY_TIMEOUT = 120  # s; a reply takes ~2 s on 2 idle cores
# Chromium as root in a closed network: no sandbox (root), no GPU, none of its background
# connections (which the network would refuse), a new empty profile per run.
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1280,800"]


def get(srv: Server, path: str, gzip_ok: bool = True) -> tuple[int, dict, bytes]:
    """GET path as a browser asks for it (Accept-Encoding: gzip); the body decompressed."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
        resp = conn.getresponse()
        body, headers = resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    if headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    return resp.status, headers, body


@pytest.fixture(scope="module")
def ui_server(shipped_f32_chat, tmp_path_factory):
    """The shipped model (with Gemma-2's chat template in the file, named spark-shakespeare) in
    llama-server with its web UI, the plugin and SPARK_STATS=1. Greedy unless a request says
    otherwise (--temp 0) and N_PREDICT tokens (-n): the UI sends the server's own defaults,
    which it reads from /props."""
    srv = Server(shipped_f32_chat, tmp_path_factory.mktemp("ui-server"), "--alias",
                 "spark-shakespeare", "--temp", "0", "-n", N_PREDICT, "--seed", "1",
                 with_plugin=True, stats=True, webui=True)
    yield srv
    srv.kill()


def test_server_serves_the_web_ui(ui_server):
    """GET / is the UI's page (not llama-server's "File Not Found" of a build without it), and the
    script bundle it loads is served too. The assets are embedded gzip-compressed, as upstream
    builds them: a client that does not accept gzip gets 415."""
    status, headers, body = get(ui_server, "/")
    assert status == 200, ui_server.explain(
        f"GET / gave {status} {body[:200]!r}: llama-server was built without its web UI "
        f"(bash tools/upstream.sh builds it; see its output)")
    page = body.decode()
    assert headers.get("content-type", "").startswith("text/html"), headers
    assert "__sveltekit_" in page, page[-800:]  # SvelteKit's boot script
    bundle = re.search(r'import\("\./(_app/immutable/bundle\.[\w-]+\.js)"\)', page)
    assert bundle, f"no bundle import in the page: {page[-800:]}"
    status, headers, js = get(ui_server, "/" + bundle.group(1))
    assert status == 200 and headers.get("content-type") == "application/javascript", (
        status, headers)
    assert len(js) > 10_000, f"{bundle.group(1)}: {len(js)} bytes"
    status, _, body = get(ui_server, "/", gzip_ok=False)
    assert status == 415, (status, body[:200])


def browser():
    """Headless Chromium through chromium-driver (WebDriver); fails when they are missing."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            pytest.fail(f"{path} is missing: install chromium and chromium-driver with "
                        f"`bash tools/setup.sh`", pytrace=False)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: `bash tools/setup.sh` installs tests/requirements.txt",
                    pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for arg in CHROMIUM_ARGS + [f"--user-data-dir={profile}"]:
        options.add_argument(arg)
    # both paths given: selenium's driver manager (which would go to the network) is not used
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    return driver, profile


def chat_in_page(srv: Server, message: str, shot) -> tuple[str, list[str]]:
    """A user's chat in Chromium: opens srv's page, types `message`, presses Enter, waits for
    the reply to finish streaming (the Stop button comes and goes), reads it and saves the
    page's screenshot to `shot`. Returns the reply shown and the steps taken (for the log)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver, profile = browser()
    steps = []
    try:
        t0 = time.monotonic()
        driver.get(srv.url + "/")
        box = WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.CSS_SELECTOR, "textarea[placeholder='Type a message...']"))
        steps.append(f"open {srv.url}/: the chat page with its message box "
                     f"({time.monotonic() - t0:.1f} s)")
        box.send_keys(message)
        box.send_keys(Keys.ENTER)
        steps.append(f"type {message!r}, Enter")

        # The page re-renders while the reply streams: an element found a moment ago may be
        # gone (stale); the waits then look again.
        def streaming(d):
            return any(b.get_attribute("textContent").strip() == "Stop"
                       for b in d.find_elements(By.TAG_NAME, "button"))

        def reply(d):
            found = d.find_elements(By.CSS_SELECTOR, ".chat-message-assistant .markdown-content")
            return found[-1].text if found else ""

        def wait(until):
            return WebDriverWait(driver, REPLY_TIMEOUT, poll_frequency=0.2,
                                 ignored_exceptions=(StaleElementReferenceException,)).until(until)

        t1 = time.monotonic()
        try:  # streaming starts (the Stop button) or is already over (a reply, no Stop button)
            wait(lambda d: streaming(d) or reply(d).strip())
            shown = wait(lambda d: not streaming(d) and reply(d).strip() and reply(d))
        except TimeoutException:
            driver.save_screenshot(str(shot))
            pytest.fail(srv.explain(f"no finished reply within {REPLY_TIMEOUT} s; screenshot "
                                    f"{shot}"), pytrace=False)
        steps.append(f"the reply appears and finishes streaming ({time.monotonic() - t1:.1f} s)")
        user = driver.find_elements(By.CSS_SELECTOR, "[aria-label='User message with actions']")
        assert user and message in user[-1].text, [u.text for u in user]
        time.sleep(0.5)  # the message statistics settle
        driver.save_screenshot(str(shot))
        steps.append(f"screenshot {shot}")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return shown, steps


def test_chat_in_chromium(ui_server, out_dir):
    """Opens the page, types MESSAGE, presses Enter, waits for the reply to finish streaming, and
    reads it (chat_in_page): it is the greedy reply llama-server's /v1/chat/completions gives
    for the same message, rendered. Saves the screenshot."""
    srv = ui_server
    shot = out_dir / "browser-chat.png"
    shown, steps = chat_in_page(srv, MESSAGE, shot)

    want = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": MESSAGE}], "max_tokens": N_PREDICT,
        "temperature": 0, "seed": 1, "cache_prompt": False})["choices"][0]["message"]["content"]
    # the page renders the Markdown: line breaks and spacing may change, the words may not
    assert shown.split() == want.split(), (f"the page shows {shown!r}\n/v1/chat/completions "
                                           f"gives {want!r}")
    rc, log = srv.stop()
    assert rc == 0, srv.explain(f"exit status {rc} after SIGINT")
    assert_stats_table(log, CFG["n_layers"], TARGET_KEEP, explain=srv.explain)
    print("\n" + "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
          + f"\nreply shown: {shown!r}")
