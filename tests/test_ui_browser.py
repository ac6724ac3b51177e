"""`calor ui` in a real browser: headless Chromium (Debian's package, driven by selenium
through Debian's chromedriver) against a real `calor serve` with an auth file and a real
`calor ui` holding a key that may read some channels and not others.

With CALOR_UI_SCREENSHOTS set to a folder (`make screenshots`), each page's test saves
its screenshot there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.client import CalorClient
from calor.server.cluster.local import free_port
from calor.v1 import memory_pb2
from tests.test_access import add_key

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import TimeoutException, WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no headless Chromium here: install Debian's chromium and chromium-driver "
    "(make test does, where apt-get may run)",
)

READABLE = "ui-garden"
ALSO_READABLE = "ui-kitchen"
WORKSHOP = "ui-shed"  # the inspector's key may write here (and nowhere else)
SECRET = "ui-vault"
GARDEN = [
    "Ada waters the tomatoes every morning before work.",
    "The greenhouse door sticks when it rains; lift it slightly to open.",
    "Ada prefers green tea with honey after weeding.",
    "The compost bin by the shed is for kitchen scraps only.",
    "Basil seedlings go out once the nights stay above ten degrees.",
]

KITCHEN = [  # alike enough to be linked
    "Ada roasted the garlic for Saturday's dinner party.",
    "Ada roasted garlic for the Saturday dinner party with friends.",
    "The roasted garlic from Saturday's dinner party keeps a week in the fridge.",
]
MIGRATION_COLOUR = (0x70, 0x48, 0xE8)  # calor.js's colour for the cold-storage moment


@dataclass
class Running:
    """A `calor serve`, a read-only `calor ui` on it and one started with
    ``--allow-writes`` (both with the same key), and an admin client of the server."""

    target: str
    ui: str
    writer: str
    admin: CalorClient
    ids: dict[str, str]


def _calor(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("calor")), *args]


def _wait_serving(target: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"calor serve exited: {log.read_text()[-2000:]}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise RuntimeError("calor serve did not become SERVING in 60 s")


def _wait_http(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"calor ui exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"calor ui did not answer at {url}")


def _start_ui(target: str, key: str, *options: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        _calor("--target", target, "--api-key", key, "ui", "--port", str(port), *options),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(base + "/static/calor.css", process)
    except RuntimeError:
        _stop(process)
        raise
    return process, base


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("ui")
    auth = folder / "keys.toml"
    _, root = add_key(auth, "*=admin", label="root")
    # The inspector's key reads the garden, administers the kitchen (whose triggers an
    # admin may list), writes in the shed, and may not see the vault at all.
    _, viewer = add_key(
        auth, f"{READABLE}=read", f"{ALSO_READABLE}=admin", f"{WORKSHOP}=read,write", label="viewer"
    )
    port = free_port()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    log = (folder / "serve.log").open("wb")
    serve = subprocess.Popen(
        _calor("serve", "--data-dir", str(folder / "data"), "--port", str(port))
        + ["--auth-file", str(auth)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    target = f"127.0.0.1:{port}"
    uis: list[subprocess.Popen[bytes]] = []
    try:
        _wait_serving(target, serve, folder / "serve.log")
        admin = CalorClient(target, channel=READABLE, api_key=root)
        ids = {text: admin.store(text).id for text in GARDEN}
        admin.create_trigger(
            event="on_store",
            action="notify",
            trigger_id="kitchen-notes",
            config={"message": "noted {memory_id}"},
            channel=ALSO_READABLE,
        )
        admin.store("Pasta water wants a handful of salt.", channel=ALSO_READABLE)
        for text in KITCHEN:
            ids[text] = admin.store(text, channel=ALSO_READABLE, memory_type="episodic").id
        admin.recall(KITCHEN[0], channel=ALSO_READABLE, limit=1)  # a jump on its curve
        admin.dream(channel=READABLE)
        admin.store("The vault code is 4-8-15-16.", channel=SECRET)
        admin.store("The spare twine hangs on the shed door.", channel=WORKSHOP)
        reader, base = _start_ui(target, viewer)
        uis.append(reader)
        writer, writing = _start_ui(target, viewer, "--allow-writes")
        uis.append(writer)
        yield Running(target, base, writing, admin, ids)
        admin.close()
    finally:
        for process in (*uis, serve):
            _stop(process)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(flag)
    options.add_argument("--disable-dev-shm-usage")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(browser: WebDriver, name: str) -> None:
    folder = os.environ.get("CALOR_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))


def _texts(browser: WebDriver, selector: str) -> list[str]:
    return [element.text for element in browser.find_elements(By.CSS_SELECTOR, selector)]


def _click_and_wait(browser: WebDriver, selector: str, *, confirm: bool = False) -> None:
    """Click what ``selector`` finds (accepting the question it asks, with ``confirm``)
    and wait for the page the click opens to have loaded."""
    browser.execute_script("window.calorPageBefore = true;")
    browser.find_element(By.CSS_SELECTOR, selector).click()
    if confirm:
        WebDriverWait(browser, 10).until(expected_conditions.alert_is_present()).accept()
    # While Chromium swaps the page, a script may be refused: that is not the answer yet.
    WebDriverWait(browser, 10, ignored_exceptions=(WebDriverException,)).until(
        lambda _: browser.execute_script(
            "return !window.calorPageBefore && document.readyState === 'complete';"
        )
    )


def test_the_fleet_page_lists_the_channels_the_key_may_read_and_no_other(
    running: Running, browser: WebDriver
) -> None:
    browser.get(running.ui + "/")
    names = _texts(browser, "#channels a.channel")
    assert sorted(names) == sorted([READABLE, ALSO_READABLE, WORKSHOP])
    assert SECRET not in browser.page_source
    row = browser.find_element(By.XPATH, f"//tr[td/a[text()='{READABLE}']]")
    assert row.find_elements(By.TAG_NAME, "td")[1].text == str(len(GARDEN))
    _shot(browser, "fleet")


def test_a_channel_the_key_may_not_read_is_refused_by_name(
    running: Running, browser: WebDriver
) -> None:
    browser.get(running.ui + f"/channels/{SECRET}")
    assert "permission" in browser.find_element(By.ID, "error").text.lower()
    assert "4-8-15-16" not in browser.page_source


def test_the_channel_page_lists_its_memories_and_links_each_to_its_page(
    running: Running, browser: WebDriver
) -> None:
    browser.get(running.ui + f"/channels/{READABLE}")
    shown = _texts(browser, "#memories tbody td:first-child a")
    assert sorted(shown) == sorted(GARDEN)
    # Hottest first, each row with its sparkline drawn; a chart per type whose bars
    # count every memory; the dream the fixture ran.
    heats = [float(h) for h in _texts(browser, "#memories tbody .heat")]
    assert heats == sorted(heats, reverse=True)
    table = browser.find_element(By.ID, "memories")
    assert table.get_attribute("data-sparklines") == str(len(GARDEN))
    assert len(browser.find_elements(By.CSS_SELECTOR, "td.spark canvas")) == len(GARDEN)
    charts = browser.find_elements(By.CSS_SELECTOR, "#histograms figure[data-drawn] canvas")
    assert charts and len(charts) == len(
        browser.find_elements(By.CSS_SELECTOR, "#histograms figure")
    )
    counted = sum(int(x.strip("()")) for x in _texts(browser, "#histograms figcaption small"))
    assert counted == len(GARDEN)
    assert _texts(browser, "#dreams tbody td:nth-child(2)") == ["dream"]
    assert "need its admin permission" in browser.page_source  # the garden is read-only
    _shot(browser, "channel")
    browser.find_element(By.LINK_TEXT, GARDEN[2]).click()
    text = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.ID, "text"))
    )
    assert text.text == GARDEN[2]
    facts = browser.find_element(By.ID, "facts").text
    assert "type" in facts and "heat" in facts


def test_the_recall_playground_puts_the_answer_first_with_its_score_parts(
    running: Running, browser: WebDriver
) -> None:
    browser.get(running.ui + "/recall")
    form = browser.find_element(By.ID, "recall-form")
    form.find_element(By.NAME, "query").send_keys("What does Ada drink after weeding?")
    _click_and_wait(browser, "#recall-form button[type=submit]")  # the answer's page
    hits = browser.find_elements(By.CSS_SELECTOR, "#hits li.hit")
    assert hits, "the playground showed no hit"
    assert hits[0].find_element(By.CLASS_NAME, "hit-text").text == GARDEN[2]
    parts = [row.get_attribute("data-part") for row in hits[0].find_elements(By.CLASS_NAME, "part")]
    assert parts == ["similarity", "lexical", "heat", "keyword", "temporal", "own channel"]
    similarity = hits[0].find_element(By.CSS_SELECTOR, ".part[data-part=similarity] .bar")
    assert similarity.size["width"] > 0
    assert "a peek" in browser.page_source  # read-only: nothing was warmed
    _shot(browser, "recall")


def test_a_memory_stored_through_the_api_appears_on_the_events_page_within_two_seconds(
    running: Running, browser: WebDriver
) -> None:
    browser.get(running.ui + "/events")
    WebDriverWait(browser, 10).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "stream-state"), "live")
    )
    stored = running.admin.store("Mulch the strawberries before the frost.").id
    secret = running.admin.store("A second vault code.", channel=SECRET).id
    started = time.monotonic()
    try:
        WebDriverWait(browser, 2, poll_frequency=0.05).until(
            expected_conditions.presence_of_element_located(
                (By.CSS_SELECTOR, f"#events tr[data-memory='{stored}']")
            )
        )
    except TimeoutException:
        waited = time.monotonic() - started
        pytest.fail(f"the stored memory was not on the events page after {waited:.1f} s")
    row = browser.find_element(By.CSS_SELECTOR, f"#events tr[data-memory='{stored}']")
    assert row.get_attribute("data-kind") == "on_store"
    assert not browser.find_elements(By.CSS_SELECTOR, f"#events tr[data-memory='{secret}']")
    _shot(browser, "events")


def test_a_read_only_inspector_warms_nothing_even_when_asked_to(
    running: Running, browser: WebDriver
) -> None:
    answer = GARDEN[3]
    before = running.admin.inspect(running.ids[answer]).memory
    query = urllib.parse.urlencode(
        {"channel": READABLE, "query": "where do kitchen scraps go?", "warm": "1"}
    )
    browser.get(running.ui + "/recall?" + query)
    first = browser.find_element(By.CSS_SELECTOR, "#hits li.hit .hit-text")
    assert first.text == answer
    assert "a peek" in browser.page_source
    after = running.admin.inspect(running.ids[answer]).memory
    assert (after.recall_count, after.heat0) == (before.recall_count, before.heat0)
    assert not browser.find_elements(By.NAME, "warm")  # no such choice offered


def test_a_memory_page_draws_its_heat_curve_with_the_floor_and_the_migration_moment(
    running: Running, browser: WebDriver
) -> None:
    memory_id = running.ids[KITCHEN[0]]
    curve = running.admin.inspect(memory_id, channel=ALSO_READABLE, heat_curve=True).heat_curve
    migration_at = curve.migration_at.ToNanoseconds() / 1e9
    browser.get(running.ui + f"/channels/{ALSO_READABLE}/memories/{memory_id}")
    figure = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located(
            (By.CSS_SELECTOR, "#heat-curve[data-drawn]")
        )
    )
    drawn = (figure.get_attribute("data-drawn") or "").split()
    assert {"past", "projected", "floor", "cold-threshold", "migration_at"} <= set(drawn)
    key = browser.find_element(By.ID, "curve-key").text
    assert f"floor {curve.floor:.2f}" in key and "1 jump" in key
    shown = browser.find_element(By.CSS_SELECTOR, "#moments dd[data-moment=migration_at]")
    assert float(shown.get_attribute("data-at") or "nan") == pytest.approx(migration_at, abs=1e-3)
    assert shown.find_element(By.TAG_NAME, "time").text  # written out in the reader's locale
    # The chart holds the recall's jump and the floor line, and the migration moment's
    # vertical is painted on the canvas where the time axis puts it.
    series = browser.execute_script(
        "const u = window.calorCurveChart;"
        "return {jumps: u.data[5].filter(v => v !== null).length,"
        " floor: u.data[3][0], x: u.valToPos(arguments[0], 'x', true),"
        " y: u.bbox.top + u.bbox.height / 2};",
        migration_at,
    )
    assert series["jumps"] == 1
    assert series["floor"] == pytest.approx(curve.floor)
    pixels = browser.execute_script(
        "const c = document.querySelector('#heat-curve canvas');"
        "const x = Math.round(arguments[0]) - 3, y = Math.round(arguments[1]);"
        "return Array.from(c.getContext('2d').getImageData(x, y, 7, 1).data);",
        series["x"],
        series["y"],
    )
    painted = [tuple(pixels[i : i + 3]) for i in range(0, len(pixels), 4)]
    assert any(
        all(abs(a - b) <= 40 for a, b in zip(rgb, MIGRATION_COLOUR, strict=True)) for rgb in painted
    ), f"no cold-storage line at x={series['x']:.0f}: {painted}"
    _shot(browser, "memory")


def test_the_memory_page_draws_its_neighbourhood_and_a_click_opens_a_neighbour(
    running: Running, browser: WebDriver
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    memory_id = running.ids[KITCHEN[1]]
    edges = running.admin.inspect(memory_id, channel=ALSO_READABLE).edges
    neighbours = {e.to_id if e.from_id == memory_id else e.from_id for e in edges}
    assert neighbours, "the kitchen memories were stored alike enough to be linked"
    browser.get(running.ui + f"/channels/{ALSO_READABLE}/memories/{memory_id}")
    # It is drawn once it is scrolled to (its library is fetched then).
    browser.execute_script("document.getElementById('graph').scrollIntoView();")
    graph = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#graph[data-nodes]"))
    )
    drawn = browser.execute_script(
        "return window.calorGraphView.nodes().map(n => ({id: n.id(), hop: n.data('hop'),"
        " x: n.renderedPosition('x'), y: n.renderedPosition('y')}));"
    )
    assert {node["id"] for node in drawn if node["hop"] == 1} == neighbours
    assert [node["hop"] for node in drawn if node["id"] == memory_id] == [0]
    target = next(node for node in drawn if node["hop"] == 1)
    size = graph.size
    ActionChains(browser).move_to_element_with_offset(
        graph, int(target["x"] - size["width"] / 2), int(target["y"] - size["height"] / 2)
    ).click().perform()
    WebDriverWait(browser, 5).until(expected_conditions.url_contains(target["id"]))
    assert browser.current_url.endswith(f"/memories/{target['id']}")


def test_the_channel_page_lists_triggers_with_their_latest_firings_for_an_admin(
    running: Running, browser: WebDriver
) -> None:
    browser.get(running.ui + f"/channels/{ALSO_READABLE}")
    trigger = browser.find_element(By.CSS_SELECTOR, "#triggers li[data-trigger='kitchen-notes']")
    firings = trigger.find_elements(By.CSS_SELECTOR, ".firings li")
    # Four stores fired it (the pasta note and the three kitchen memories): newest first.
    assert "fired 4 times" in trigger.text
    assert [f.find_element(By.TAG_NAME, "a").text for f in firings[:3]] == [
        running.ids[text] for text in reversed(KITCHEN)
    ]
    assert all(f.find_element(By.TAG_NAME, "time").text for f in firings)
    assert _texts(browser, "#dreams") == [] and "has not dreamt yet" in browser.page_source


def _post(url: str, fields: dict[str, str], **headers: str) -> int:
    """The HTTP status a form POST gets (without following a redirect)."""

    class _Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    request = urllib.request.Request(
        url, data=urllib.parse.urlencode(fields).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.build_opener(_Stay()).open(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


def test_a_writing_inspector_boosts_pins_and_forgets_from_the_memory_page(
    running: Running, browser: WebDriver
) -> None:
    memory_id = running.admin.store(
        "Ada oils the shears after pruning the roses.", channel=WORKSHOP
    ).id
    before = running.admin.boost(memory_id, -0.5, channel=WORKSHOP)  # room to warm
    page = running.writer + f"/channels/{WORKSHOP}/memories/{memory_id}"
    browser.get(page)
    assert "read-only" not in browser.find_element(By.TAG_NAME, "header").text

    _click_and_wait(browser, "#actions button[value=boost]")
    assert browser.find_element(By.ID, "done").text.startswith("Boosted")
    boosted = running.admin.inspect(memory_id, channel=WORKSHOP).memory
    assert boosted.heat0 > before.heat0

    _click_and_wait(browser, "#actions button[value=keystone]")
    assert running.admin.inspect(memory_id, channel=WORKSHOP).memory.keystone
    assert "keystone" in browser.find_element(By.ID, "facts").text
    _click_and_wait(browser, "#actions button[value=unkeystone]")  # the pin's button turned
    assert not running.admin.inspect(memory_id, channel=WORKSHOP).memory.keystone

    _click_and_wait(browser, "#actions button[value=forget]", confirm=True)  # it asks first
    assert browser.current_url.startswith(running.writer + f"/channels/{WORKSHOP}")
    assert browser.find_element(By.ID, "done").text == "Forgotten."
    assert memory_id not in browser.find_element(By.ID, "memories").get_attribute("innerHTML")
    gone = running.admin.inspect(memory_id, channel=WORKSHOP).memory
    assert memory_pb2.MemoryState.Name(gone.state) == "MEMORY_STATE_DELETED"


def test_a_writing_inspector_still_changes_nothing_its_key_may_only_read(
    running: Running, browser: WebDriver
) -> None:
    memory_id = running.ids[GARDEN[4]]
    before = running.admin.inspect(memory_id).memory
    browser.get(running.writer + f"/channels/{READABLE}/memories/{memory_id}")
    _click_and_wait(browser, "#actions button[value=boost]")
    assert "permission" in browser.find_element(By.ID, "error").text.lower()
    assert running.admin.inspect(memory_id).memory.heat0 == before.heat0


def test_a_write_without_its_pages_token_is_refused_and_changes_nothing(
    running: Running,
) -> None:
    memory_id = running.admin.store("The rake's handle is cracked.", channel=WORKSHOP).id
    before = running.admin.inspect(memory_id, channel=WORKSHOP).memory
    boost = {"action": "boost", "channel": WORKSHOP, "memory": memory_id}
    # A cross-site form carries no cookie; a forged one does not bear the inspector's
    # signature; a read-only inspector takes no write at all, token or none.
    assert _post(running.writer + "/act", boost) == 403
    forged = "forged-token"
    assert (
        _post(running.writer + "/act", {**boost, "csrftoken": forged}, Cookie=f"csrftoken={forged}")
        == 403
    )
    assert _post(running.writer + "/recall", {"channel": WORKSHOP, "query": "rake"}) == 403
    assert _post(running.ui + "/act", boost) == 404
    assert _post(running.ui + "/recall", {"channel": WORKSHOP, "query": "rake"}) == 405
    after = running.admin.inspect(memory_id, channel=WORKSHOP).memory
    assert (after.heat0, after.recall_count) == (before.heat0, before.recall_count)


def test_a_write_with_its_pages_token_is_checked_before_it_changes_anything(
    running: Running,
) -> None:
    memory_id = running.admin.store("The hose reel leaks at the tap.", channel=WORKSHOP).id
    before = running.admin.boost(memory_id, -0.5, channel=WORKSHOP)
    with urllib.request.urlopen(
        running.writer + f"/channels/{WORKSHOP}/memories/{memory_id}", timeout=10
    ) as page:
        cookie = page.headers["set-cookie"].split(";")[0]
        token = re.search(r'name="csrftoken" value="([^"]+)"', page.read().decode())
    assert token is not None and cookie.startswith("csrftoken=")
    signed = {"channel": WORKSHOP, "memory": memory_id, "csrftoken": token.group(1)}
    assert _post(running.writer + "/act", {**signed, "action": "melt"}, Cookie=cookie) == 400
    assert (
        _post(running.writer + "/act", {**signed, "action": "boost", "memory": ""}, Cookie=cookie)
        == 400
    )
    unchanged = running.admin.inspect(memory_id, channel=WORKSHOP).memory
    assert unchanged.heat0 == before.heat0
    assert _post(running.writer + "/act", {**signed, "action": "boost"}, Cookie=cookie) == 303
    assert running.admin.inspect(memory_id, channel=WORKSHOP).memory.heat0 > before.heat0


def test_the_inspector_answers_only_to_its_loopback_names(running: Running) -> None:
    # A page elsewhere that rebinds its own name to 127.0.0.1 still sends that name.
    rebound = urllib.request.Request(running.writer + "/", headers={"Host": "calor.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rebound, timeout=10)
    refused.value.close()
    assert refused.value.code == 400
    with urllib.request.urlopen(running.writer.replace("127.0.0.1", "localhost") + "/") as page:
        assert page.status == 200


def test_a_writing_inspector_warms_what_a_recall_finds_only_when_asked_to(
    running: Running, browser: WebDriver
) -> None:
    answer = "The bread starter lives in the blue jar on the top shelf."
    memory_id = running.admin.store(answer, channel=WORKSHOP).id
    query = urllib.parse.urlencode(
        {"channel": WORKSHOP, "query": "where is the bread starter kept?", "limit": "1"}
    )
    browser.get(running.writer + "/recall?" + query)  # a link: a peek
    assert _texts(browser, "#hits li.hit .hit-text") == [answer]
    assert "a peek" in browser.find_element(By.ID, "asked").text
    assert running.admin.inspect(memory_id, channel=WORKSHOP).memory.recall_count == 0

    _click_and_wait(browser, "#warm button[type=submit]")
    assert _texts(browser, "#hits li.hit .hit-text") == [answer]
    assert "warmed" in browser.find_element(By.ID, "asked").text
    assert running.admin.inspect(memory_id, channel=WORKSHOP).memory.recall_count == 1


def test_a_long_channel_page_draws_each_rows_sparkline_by_the_time_it_is_scrolled_to(
    running: Running, browser: WebDriver
) -> None:
    running.admin.store_many(
        [f"Seed packet {n}: sow row {n} of the shed's bench with cress." for n in range(60)],
        channel=WORKSHOP,
    )
    browser.get(running.ui + f"/channels/{WORKSHOP}")
    rows = browser.find_elements(By.CSS_SELECTOR, "#memories tbody tr")
    assert len(rows) > 60
    table = browser.find_element(By.ID, "memories")
    assert int(table.get_attribute("data-sparklines") or 0) > 0  # the rows in view
    for row in rows:  # read down the page as a person would
        browser.execute_script("arguments[0].scrollIntoView({block: 'end'});", row)
        WebDriverWait(browser, 10).until(
            lambda _, row=row: row.find_elements(By.CSS_SELECTOR, "td.spark canvas")
        )
    assert table.get_attribute("data-sparklines") == str(len(rows))
