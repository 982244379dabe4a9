"""The chat page at / (edgeinfer/server/ui/): served files and flags over HTTP, then the page
itself in headless Chromium through selenium against a real server on a tiny model: it loads
with no console errors and nothing from outside the server, streams a reply, stops one, shows
markup in messages as text, keeps conversations across a reload, asks for an API key on 401,
and is served in router mode. The browser tests are skipped when Chromium, chromedriver or
selenium are missing (CI installs them: .ci/run).

The tiny model's special tokens get zero embeddings (so zero logits): at temperature 0 it never
picks an end-of-generation token, and a reply runs until max_tokens or the context is full,
long enough to stop it halfway.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from gguf import GGUFReader
from test_server_harness import ROOT, ServerProcess
from tiny_models import SPECIALS, write_tiny_model

from edgeinfer.server.llama_cli import translate
from edgeinfer.server.options import build_parser, settings_from_args
from edgeinfer.server.routes.ui import ASSETS, UI_DIR

SCRIPT = "<script>window.pwned=1</script>"
IMG = '<img src=x onerror="window.pwned=1">'
N_CTX = 8192


def write_endless_model(path: Path, seed: int = 0) -> Path:
    """A tiny model that never ends a reply by itself (see the module docstring)."""
    write_tiny_model(path, seed=seed, n_embd=512, n_ff=1024, n_layer=4, n_head=8, n_kv=4,
                     n_ctx_train=N_CTX)
    reader = GGUFReader(path, "r+")
    (embd,) = [t for t in reader.tensors if t.name == "token_embd.weight"]
    embd.data[:len(SPECIALS)] = 0  # Q8_0 rows of zero bytes: scale 0, values 0
    reader.data.flush()
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_endless_model(tmp_path_factory.mktemp("web-ui") / "endless.gguf")


@pytest.fixture(scope="module")
def server(model):
    srv = ServerProcess(model, "-c", str(N_CTX), "-np", "2")
    yield srv
    srv.stop()


# -- over HTTP -------------------------------------------------------------------------------

def test_the_page_and_its_files_are_served_with_their_types(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="ui/app.js"></script>' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    types = {"app.js": "text/javascript", "markdown.js": "text/javascript",
             "style.css": "text/css", "icon.svg": "image/svg+xml"}
    for name, media_type in types.items():
        reply = httpx.get(f"{server.url}/ui/{name}")
        assert reply.status_code == 200 and reply.content == (UI_DIR / name).read_bytes()
        assert reply.headers["content-type"].split(";")[0] == media_type
        assert reply.headers["x-content-type-options"] == "nosniff"
    assert httpx.head(server.url + "/").status_code == 200
    missing = httpx.get(server.url + "/ui/index.py")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    assert httpx.get(server.url + "/props").json()["ui"] is True


def test_every_shipped_file_is_served_and_listed_as_package_data():
    assert {p.name for p in UI_DIR.iterdir()} == {"index.html", *ASSETS}
    assert '"edgeinfer.server" = ["ui/*"]' in (ROOT / "pyproject.toml").read_text()


def test_the_page_writes_no_html_from_strings():
    """Model text reaches the page as text nodes only: no API that parses HTML is used."""
    for name in ("app.js", "markdown.js"):
        source = (UI_DIR / name).read_text()
        for api in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                    "eval(", "new Function", "createContextualFragment"):
            assert api not in source, f"{name} uses {api}"
    page = (UI_DIR / "index.html").read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "the page loads nothing remote"


def test_no_ui_answers_404_at_the_root(model):
    srv = ServerProcess(model, "-c", "256", "-np", "1", "--no-ui")
    try:
        for path in ("/", "/ui/app.js"):
            reply = httpx.get(srv.url + path)
            assert reply.status_code == 404
            assert reply.json()["error"] == {"code": 404, "message": "File Not Found",
                                             "type": "not_found_error"}
        assert httpx.get(srv.url + "/props").json()["ui"] is False
    finally:
        srv.stop()


@pytest.mark.parametrize("flag", ["--no-ui", "--no-webui"])
def test_llama_servers_no_webui_turns_the_page_off(flag):
    out = translate(["-m", "m.gguf", flag])
    assert out.serve_args == ["m.gguf", "--no-ui"] and out.unsupported == []
    assert translate(["-m", "m.gguf", "--webui"]).serve_args == ["m.gguf"]  # already on
    parser = build_parser("edgeinfer serve")
    assert settings_from_args(parser.parse_args([flag])).ui is False
    assert settings_from_args(parser.parse_args([])).ui is True


# -- in a browser ----------------------------------------------------------------------------

def _chrome():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium "
                    "chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,860", "--force-prefers-reduced-motion"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver))


@pytest.fixture(scope="module")
def browser():
    driver = _chrome()
    yield driver
    driver.quit()


@pytest.fixture
def page(browser, server):
    """The page on a clean localStorage, the browser's logs emptied."""
    browser.get(server.url + "/")
    browser.execute_script("localStorage.clear()")
    browser.get(server.url + "/")
    wait_for(browser, lambda d: d.find_elements("css selector", "#model option"))
    browser.get_log("browser"), browser.get_log("performance")
    yield browser
    server.wait_idle()


def wait_for(driver, condition, timeout: float = 20.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.02).until(condition)


def css(driver, selector: str):
    return driver.find_elements("css selector", selector)


def artifact(driver, name: str) -> Path:
    folder = Path(os.environ.get("EDGEINFER_ARTIFACTS") or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(folder / name))
    return folder / name


def set_settings(driver, **values) -> None:
    css(driver, "#settings-toggle")[0].click()
    for name, value in values.items():
        field = css(driver, f"#{name}")[0]
        field.clear()
        field.send_keys(str(value))
    css(driver, "#settings-toggle")[0].click()  # closing it blurs the field: change fires


def send(driver, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    prompt = css(driver, "#prompt")[0]
    prompt.send_keys(text)
    prompt.send_keys(Keys.ENTER)


def last_reply(driver):
    return css(driver, ".message.assistant")[-1]


def idle(driver) -> bool:
    return css(driver, "#send")[0].is_displayed() and not css(driver, "#stop")[0].is_displayed()


def wait_reply_done(driver, timeout: float = 30.0) -> str:
    wait_for(driver, lambda d: idle(d) and last_reply(d).find_element(
        "css selector", ".stats").text, timeout)
    return last_reply(driver).find_element("css selector", ".stats").text


def test_the_page_loads_offline_with_the_model_listed(browser, server):
    browser.get(server.url + "/")
    wait_for(browser, lambda d: css(d, "#model option"))
    assert [o.text for o in css(browser, "#model option")] == ["endless.gguf"]
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    urls = [json.loads(e["message"])["message"]["params"]["request"]["url"]
            for e in browser.get_log("performance")
            if '"Network.requestWillBeSent"' in e["message"]]
    assert server.url + "/ui/app.js" in urls and server.url + "/v1/models" in urls
    assert [u for u in urls if not u.startswith(server.url + "/")] == []
    assert browser.execute_script("return document.title") == "edgeinfer"


def test_a_reply_streams_then_shows_its_speed(page):
    set_settings(page, temperature=0, max_tokens=400)
    page.execute_script("""
        window.lengths = [];
        new MutationObserver(() => {
          const replies = document.querySelectorAll('.message.assistant .content');
          if (replies.length) window.lengths.push(replies[replies.length - 1].textContent.length);
        }).observe(document.getElementById('messages'),
                   {childList: true, subtree: true, characterData: true});""")
    from selenium.webdriver.common.keys import Keys

    css(page, "#prompt")[0].send_keys("hello", Keys.SHIFT + Keys.ENTER)  # a new line
    assert css(page, ".message") == [], "Shift+Enter does not send"
    send(page, "there")
    stats = wait_reply_done(page)
    assert re.search(r"^400 tokens, [\d.]+ tokens/s · prompt \d+ tokens at [\d.]+ tokens/s, "
                     r"\d+ cached$", stats), stats
    lengths = [n for n in page.execute_script("return window.lengths") if n]
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), lengths  # grew, in steps
    assert css(page, ".message.user .content")[0].text == "hello\nthere"
    assert len(css(page, ".message.user .content br")) == 1
    assert page.execute_script("return document.activeElement.id") == "prompt"


def test_stop_aborts_the_request_and_the_server_cancels_it(page, server):
    set_settings(page, temperature=0, max_tokens=100000)
    log_start = len(server.log_text())
    send(page, "tell me everything")
    wait_for(page, lambda d: len(last_reply(d).find_element("css selector", ".content").text)
             > 20)
    assert server.wait_busy(), "the reply is being generated"
    css(page, "#stop")[0].click()
    wait_for(page, idle, 5)
    stats = last_reply(page).find_element("css selector", ".stats").text
    assert stats == "stopped"
    server.wait_idle(timeout=5)
    server.poll("the disconnect line", lambda: "client disconnected" in
                server.log_text(log_start), 5)
    text = last_reply(page).find_element("css selector", ".content").text
    time.sleep(0.3)
    assert last_reply(page).find_element("css selector", ".content").text == text
    stored = page.execute_script("return JSON.parse(localStorage['edgeinfer.conversations'])")
    assert stored[0]["messages"][-1]["stopped"] is True


def assert_shown_as_text(driver, message) -> None:
    text = message.find_element("css selector", ".content").text
    assert SCRIPT in text and IMG in text
    assert message.find_elements("css selector", "img, script, [onerror]") == []
    assert css(driver, "#messages img, #messages script") == []
    assert driver.execute_script("return typeof window.pwned") == "undefined"


def test_markup_sent_as_a_message_is_shown_as_text(page):
    set_settings(page, temperature=0, max_tokens=8)
    send(page, f"look: {SCRIPT} and {IMG}")
    wait_reply_done(page)
    assert_shown_as_text(page, css(page, ".message.user")[0])


STORED_REPLY = f"""## A heading with **bold** and *italic*

Markup: {SCRIPT} and {IMG}

```python
print("{SCRIPT}")
```

- a [safe link](https://example.com/docs) and `inline {IMG}`
- a [bad link](javascript:window.pwned=1) stays text
1. first
2. second"""


def test_markup_in_a_stored_reply_is_shown_as_text_and_markdown_renders(page, server):
    conversation = {"id": "x1", "title": "markup", "messages": [
        {"role": "user", "content": "show me markup"},
        {"role": "assistant", "content": STORED_REPLY}]}
    page.execute_script("localStorage['edgeinfer.conversations'] = arguments[0]",
                        json.dumps([conversation]))
    page.refresh()
    reply = wait_for(page, lambda d: css(d, ".message.assistant"))[0]
    assert_shown_as_text(page, reply)
    assert reply.find_element("css selector", "h4").text == "A heading with bold and italic"
    assert reply.find_element("css selector", "h4 strong").text == "bold"
    code = reply.find_element("css selector", "pre code.language-python")
    assert code.get_attribute("textContent") == f'print("{SCRIPT}")'
    (link,) = reply.find_elements("css selector", "a")
    assert link.get_attribute("href") == "https://example.com/docs"
    assert link.get_attribute("rel") == "noopener noreferrer"
    assert "[bad link](javascript:window.pwned=1)" in reply.text
    assert reply.find_element("css selector", "li code").text == f"inline {IMG}"
    assert [li.text for li in reply.find_elements("css selector", "ol li")] == ["first",
                                                                                "second"]
    artifact(page, "web-ui.png")


def test_conversations_persist_across_a_reload(page):
    set_settings(page, temperature=0, max_tokens=5)
    send(page, "remember me")
    wait_reply_done(page)
    page.refresh()
    wait_for(page, lambda d: css(d, "#conversations .open"))
    assert [b.text for b in css(page, "#conversations .open")] == ["remember me"]
    assert css(page, ".message.user")[0].text.endswith("remember me")
    assert "5 tokens" in last_reply(page).text
    assert css(page, "#temperature")[0].get_attribute("value") == "0"  # settings too
    css(page, "#new-chat")[0].click()
    assert css(page, ".message") == []
    send(page, "a second one")
    wait_reply_done(page)
    titles = [b.text for b in css(page, "#conversations .open")]
    assert titles == ["a second one", "remember me"]
    css(page, "#conversations .open")[1].click()
    assert css(page, ".message.user")[0].text.endswith("remember me")
    css(page, "#conversations .delete")[1].click()
    page.refresh()
    wait_for(page, lambda d: css(d, "#conversations .open"))
    assert [b.text for b in css(page, "#conversations .open")] == ["a second one"]


def test_the_page_asks_for_the_api_key_on_401(browser, model):
    # its origin (http://127.0.0.1:PORT) is not in --cors-origins: same-origin is enough
    srv = ServerProcess(model, "-c", "256", "-np", "1", "--api-key", "sesame",
                        "--cors-origins", "https://app.example")
    try:
        browser.get(srv.url + "/")
        browser.execute_script("localStorage.clear()")
        browser.refresh()
        wait_for(browser, lambda d: css(d, "#model option"))
        set_settings(browser, temperature=0, max_tokens=6)
        send(browser, "hi")
        dialog = wait_for(browser, lambda d: [e for e in css(d, "#key-dialog")
                                              if e.is_displayed()])[0]
        dialog.find_element("css selector", "#api-key").send_keys("sesame")
        dialog.find_element("css selector", "#key-save").click()
        assert wait_reply_done(browser).startswith("6 tokens")
        assert browser.execute_script("return localStorage['edgeinfer.apiKey']") == "sesame"
        send(browser, "again")  # the stored key is sent: no dialog this time
        assert wait_reply_done(browser).startswith("6 tokens")
        assert not css(browser, "#key-dialog")[0].is_displayed()
    finally:
        srv.stop()


def test_router_mode_serves_the_page_with_every_model(browser, tmp_path, monkeypatch):
    for name, seed in (("alpha", 0), ("beta", 1)):
        write_tiny_model(tmp_path / f"{name}.gguf", seed=seed)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no pulled models
    srv = ServerProcess(Path(f"--models-dir={tmp_path}"), "-c", "256", "-np", "1")
    try:
        reply = httpx.get(srv.url + "/")
        assert reply.status_code == 200 and "ui/app.js" in reply.text
        browser.get(srv.url + "/")
        browser.execute_script("localStorage.clear()")
        wait_for(browser, lambda d: len(css(d, "#model option")) == 2)
        assert [o.text for o in css(browser, "#model option")] == ["alpha", "beta"]
        from selenium.webdriver.support.ui import Select

        Select(css(browser, "#model")[0]).select_by_visible_text("beta")
        set_settings(browser, temperature=0, max_tokens=4)
        send(browser, "hi")
        assert wait_reply_done(browser, 60).startswith("4 tokens")
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        assert {m["id"]: m["status"]["value"] for m in models} == {"alpha": "unloaded",
                                                                    "beta": "loaded"}
    finally:
        srv.stop()
