"""The page in a real browser: Debian's headless Chromium, driven by Selenium through
chromedriver, against a real `python -m service` serving the session's trained model, and
one serving models of other contracts side by side (a tabular classifier and regressor, a
32x32 colour image model: conftest's `any_server`), where the page adapts to each.

Every test saves a screenshot of the whole page under build/screenshots/ (git-ignored).
`make setup` installs Chromium where it can (as root, with apt-get): there a missing Chromium
fails the tests; elsewhere they are skipped with the command to run.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait
from support.helpers import ok_json, png_bytes
from support.servers import REPO_ROOT, Server, add_version, copy_repository, start_server

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, FASHION_MNIST_LABELS, NUM_CLASSES
from artifact.repository import read_report

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Without the background-networking flags Chromium tries to reach Google's services, and a
# closed network refuses its connections; a new profile keeps every run the same.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
DESKTOP = (1280, 900)
PHONE = (390, 844)  # a common phone's CSS pixels
WAIT_SECONDS = 30.0
SCREENSHOTS = REPO_ROOT / "build" / "screenshots"
BLESSING = {
    "blessed": True,
    "candidate": {"accuracy": 0.8123},
    "baseline": {"accuracy": 0.8011},
    "thresholds": {"max_accuracy_drop": 0.0},
}


def chromium_or_skip() -> None:
    """Fail when Chromium is missing where `make setup` installs it (as root); skip, saying
    what to run, where this user cannot install it."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if not missing:
        return
    if os.geteuid() == 0:
        pytest.fail(
            f"{', '.join(missing)} not found: run `make setup` (it installs Debian's chromium "
            "and chromium-driver)"
        )
    pytest.skip(
        f"{', '.join(missing)} not found and this user cannot install it: run "
        "`sudo apt-get install chromium chromium-driver`"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium_or_skip()
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--window-size={},{}".format(*DESKTOP),
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=DriverService(CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT_SECONDS)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def repository(trained_model, tmp_path_factory) -> Path:
    """The trained model as version 1, and a copy of it as version 2 that retraining blessed."""
    base = copy_repository(trained_model, tmp_path_factory.mktemp("page"))
    model_dir = base / "fashion_mnist"
    (add_version(model_dir, "1", "2") / ASSETS_EXTRA / BLESSING_FILE).write_text(
        json.dumps(BLESSING)
    )
    return model_dir


@pytest.fixture(scope="module")
def server(repository) -> Iterator[Server]:
    srv = start_server(
        repository.parent.parent / "server.log", MODEL_BASE_PATH=str(repository.parent)
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def test_images(small_test_data, server, tmp_path_factory) -> list[tuple[Path, dict]]:
    """Two real Fashion-MNIST test images of different classes that the tiny model gets
    right, as PNG files, each with what /predict itself answers for it."""
    images, labels = small_test_data
    folder = tmp_path_factory.mktemp("uploads")
    chosen: list[tuple[Path, dict]] = []
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        for i in range(60):
            data = png_bytes(images[i])
            answer = ok_json(client.post("/predict", files=[("files", (f"test-{i}.png", data))]))
            row = answer["predictions"][0]
            seen = {r["class_id"] for _, r in chosen}
            if row["class_id"] == labels[i] and row["class_id"] not in seen:
                path = folder / f"fashion-mnist-test-{i}.png"
                path.write_bytes(data)
                chosen.append((path, {**row, "pixels": images[i].tolist()}))
                if len(chosen) == 2:
                    return chosen
    pytest.fail("the tiny model got fewer than two classes right among 60 test images")


# --- helpers -------------------------------------------------------------------------------


def wait(driver: WebDriver, condition, what: str):
    """Wait (bounded) until condition(driver) is truthy; fail naming what never happened. An
    element the page re-rendered between its finding and its reading is looked for again."""
    try:
        return WebDriverWait(
            driver, WAIT_SECONDS, poll_frequency=0.05,
            ignored_exceptions=(StaleElementReferenceException,),
        ).until(condition)  # fmt: skip
    except TimeoutException:
        screenshot(driver, "timeout")
        pytest.fail(f"gave up after {WAIT_SECONDS:.0f} s waiting for {what}")


def open_page(driver: WebDriver, server: Server) -> None:
    driver.get(server.url + "/")
    wait(
        driver,
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"),
        "the page to start",
    )


def screenshot(driver: WebDriver, name: str) -> Path:
    """The whole page (not only the window) as build/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        },
    )
    path = SCREENSHOTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def page_errors(driver: WebDriver) -> list[dict]:
    """Console entries since the last call that are the page's fault: script errors, CSP
    violations, failed loads. The answers a test provoked on purpose (4xx/503 from the API,
    which Chromium logs as failed loads) are not."""
    entries = driver.get_log("browser")
    return [
        entry
        for entry in entries
        if entry["level"] == "SEVERE"
        and not (
            entry["source"] == "network"
            and any(f"status of {code}" in entry["message"] for code in (400, 413, 503))
            and ("/predict" in entry["message"] or "/readyz" in entry["message"])
        )
    ]


def cards(driver: WebDriver):
    return driver.find_elements(By.CSS_SELECTOR, "#results .card")


def model_input(driver: WebDriver, card) -> np.ndarray:
    """The 28x28 gray levels drawn on a result's 'what the model received' canvas."""
    canvas = card.find_element(By.CSS_SELECTOR, "canvas.model-input")
    red = driver.execute_script(
        "const data = arguments[0].getContext('2d').getImageData(0, 0, 28, 28).data;"
        "return Array.from(data.filter((_, i) => i % 4 === 0));",
        canvas,
    )
    return np.array(red, np.uint8).reshape(28, 28)


def bars(card) -> list[tuple[str, str]]:
    rows = card.find_elements(By.CSS_SELECTOR, ".bars .bar-row")
    return [
        (
            row.find_element(By.CLASS_NAME, "bar-label").text,
            row.find_element(By.CLASS_NAME, "bar-value").text,
        )
        for row in rows
    ]


def shown_controls(driver: WebDriver) -> list:
    """The controls a person can reach (a hidden one is out of the accessibility tree)."""
    controls = driver.find_elements(
        By.CSS_SELECTOR, "button, input, select, textarea, canvas, a, [tabindex='0']"
    )
    return [control for control in controls if control.is_displayed()]


def unnamed_controls(driver: WebDriver) -> list[str]:
    return [
        control.get_attribute("outerHTML")[:80]
        for control in shown_controls(driver)
        if not control.accessible_name.strip()
    ]


def visible_error(driver: WebDriver, element_id: str) -> str:
    element = driver.find_element(By.ID, element_id)
    return element.text if element.is_displayed() else ""


# --- the tests ------------------------------------------------------------------------------


def test_uploaded_test_images_show_their_label_probabilities_and_model_input(
    browser, server, test_images
):
    open_page(browser, server)
    ready = ok_json(httpx.get(server.url + "/readyz"))
    assert browser.find_element(By.ID, "service-status").text == (
        f"Ready: fashion_mnist version {ready['version']} answers, on {ready['device']}."
    )
    browser.find_element(By.ID, "file-input").send_keys("\n".join(str(p) for p, _ in test_images))
    wait(browser, lambda d: len(cards(d)) == 2, "two result cards")
    screenshot(browser, "upload-desktop")
    for card, (path, expected) in zip(cards(browser), test_images, strict=True):
        assert card.find_element(By.CLASS_NAME, "card-title").text == path.name
        assert card.find_element(By.CLASS_NAME, "predicted-label").text == expected["label"]
        assert expected["label"] == FASHION_MNIST_LABELS[expected["class_id"]]
        shown = bars(card)
        assert [label for label, _ in shown] == list(FASHION_MNIST_LABELS)
        assert [value for _, value in shown] == [
            f"{100 * p:.1f}%" for p in expected["probabilities"].values()
        ]
        top = card.find_element(By.CSS_SELECTOR, ".bar-row.top .bar-label").text
        assert top == expected["label"]
        # A test image is already 28x28, light on dark: the model receives it unchanged.
        np.testing.assert_array_equal(model_input(browser, card), expected["pixels"])
        assert card.find_element(By.CLASS_NAME, "answered-by").text == (
            f"Answered by fashion_mnist version {ready['version']} on {ready['device']}"
        )
        assert card.find_element(By.CSS_SELECTOR, "img.original").get_property("naturalWidth") == 28
    assert visible_error(browser, "try-error") == ""
    assert page_errors(browser) == []


def test_a_drawn_stroke_is_classified(browser, server):
    open_page(browser, server)
    pad = browser.find_element(By.ID, "pad")
    (
        ActionChains(browser)
        .move_to_element_with_offset(pad, -50, -90)
        .click_and_hold()
        .move_by_offset(30, 60)
        .move_by_offset(30, 60)
        .move_by_offset(20, 50)
        .release()
        .perform()
    )
    wait(browser, lambda d: len(cards(d)) == 1, "the drawing's result card")
    screenshot(browser, "drawing-desktop")
    (card,) = cards(browser)
    assert card.find_element(By.CLASS_NAME, "card-title").text == "drawing.png"
    assert card.find_element(By.CLASS_NAME, "predicted-label").text in FASHION_MNIST_LABELS
    shown = bars(card)
    assert len(shown) == NUM_CLASSES
    assert sum(float(value.rstrip("%")) for _, value in shown) == pytest.approx(100, abs=0.5)
    received = model_input(browser, card)
    # Black ink on white paper arrives inverted, light on dark, trimmed to the middle.
    assert received.max() > 200
    assert np.concatenate([received[0], received[-1], received[:, 0], received[:, -1]]).max() < 40
    assert page_errors(browser) == []


DISPATCH_FILES = """
const [kind, name, b64] = arguments;
const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
const files = new DataTransfer();
files.items.add(new File([bytes], name, {type: 'image/png'}));
if (kind === 'drop') {
  document.getElementById('dropzone').dispatchEvent(
    new DragEvent('drop', {dataTransfer: files, bubbles: true, cancelable: true}));
} else {
  document.body.dispatchEvent(
    new ClipboardEvent('paste', {clipboardData: files, bubbles: true, cancelable: true}));
}
"""


@pytest.mark.parametrize("kind", ["drop", "paste"])
def test_a_dropped_or_pasted_image_is_classified(browser, server, test_images, kind):
    """The drop zone's and the clipboard's handlers, fed a real DataTransfer of a PNG file."""
    path, expected = test_images[0]
    open_page(browser, server)
    payload = base64.b64encode(path.read_bytes()).decode()
    browser.execute_script(DISPATCH_FILES, kind, path.name, payload)
    wait(browser, lambda d: len(cards(d)) == 1, f"the {kind}ped image's result card")
    (card,) = cards(browser)
    assert card.find_element(By.CLASS_NAME, "card-title").text == path.name
    assert card.find_element(By.CLASS_NAME, "predicted-label").text == expected["label"]
    np.testing.assert_array_equal(model_input(browser, card), expected["pixels"])
    assert page_errors(browser) == []


def test_a_text_file_is_refused_in_words(browser, server, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("This is not an image.\n")
    open_page(browser, server)
    browser.find_element(By.ID, "file-input").send_keys(str(notes))
    wait(browser, lambda d: visible_error(d, "try-error"), "the error message")
    screenshot(browser, "text-file-desktop")
    message = visible_error(browser, "try-error")
    assert message.startswith("The service could not use this input: files[0] (notes.txt): ")
    assert "not an image file in an accepted format" in message
    assert cards(browser) == []
    assert visible_error(browser, "page-error") == ""
    assert page_errors(browser) == []


def test_a_versions_report_shows_its_confusion_matrix_curves_and_blessing(
    browser, server, repository
):
    open_page(browser, server)
    rows = browser.find_elements(By.CSS_SELECTOR, "#versions tbody tr")
    assert [row.get_attribute("data-version") for row in rows] == ["2", "1"]
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#versions thead th")]
    assert "Labels" not in headers, "no version has labels"
    report = read_report(repository / "1")
    states = {
        row.get_attribute("data-version"): row.find_elements(By.TAG_NAME, "td") for row in rows
    }
    column = {name: i - 1 for i, name in enumerate(headers)}  # the version is a row header
    assert states["2"][column["State"]].text == "AVAILABLE (serving)"
    assert states["1"][column["State"]].text == "not loaded"
    assert states["1"][column["Test accuracy"]].text == f"{100 * report['accuracy']:.2f}%"

    # With the keyboard: Enter on version 1's button, and the focus moves to the report.
    button = browser.find_element(By.CSS_SELECTOR, "button.show-report[data-version='1']")
    button.send_keys(Keys.ENTER)
    wait(
        browser,
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#confusion td.cell")) == 100,
        "the heatmap",
    )
    assert browser.switch_to.active_element.get_attribute("id") == "report-title"
    assert browser.find_element(By.ID, "report-title").text == "Version 1 of fashion_mnist"
    cells = browser.find_elements(By.CSS_SELECTOR, "#confusion tbody tr")
    counts = [[int(td.text) for td in row.find_elements(By.TAG_NAME, "td")] for row in cells]
    assert counts == report["confusion_matrix"]
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#confusion thead th")]
    assert heads == list(FASHION_MNIST_LABELS)
    per_class = browser.find_elements(By.CSS_SELECTOR, "#per-class tbody tr")
    assert [row.find_element(By.TAG_NAME, "th").text for row in per_class] == list(
        FASHION_MNIST_LABELS
    )
    curves = browser.find_element(By.CSS_SELECTOR, "#learning-curves img")
    wait(
        browser,
        lambda d: curves.get_property("complete") and curves.get_property("naturalWidth") > 0,
        "the learning curves",
    )
    assert not browser.find_element(By.ID, "blessing").is_displayed()
    screenshot(browser, "report-desktop")

    browser.find_element(By.CSS_SELECTOR, "button.show-report[data-version='2']").click()
    wait(browser, lambda d: d.find_element(By.ID, "blessing").is_displayed(), "the blessing report")
    assert browser.find_element(By.ID, "report-title").text == "Version 2 of fashion_mnist"
    assert browser.find_element(By.CSS_SELECTOR, "#blessing .verdict").text.startswith("Blessed")
    row = browser.find_element(By.CSS_SELECTOR, "#blessing-metrics tbody tr")
    assert [c.text for c in row.find_elements(By.CSS_SELECTOR, "th, td")] == [
        "accuracy",
        "0.8123",
        "0.8011",
        "0.0112",
    ]
    screenshot(browser, "blessing-desktop")
    assert page_errors(browser) == []


def test_every_control_has_a_name_for_screen_readers(browser, server):
    open_page(browser, server)
    browser.find_element(By.CSS_SELECTOR, "button.show-report").click()
    wait(browser, lambda d: d.find_element(By.ID, "report").is_displayed(), "the report")
    assert len(shown_controls(browser)) > 10
    assert unnamed_controls(browser) == []


def test_the_page_fits_a_phone(browser, server, test_images):
    width, height = PHONE
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 2, "mobile": True},
    )
    try:
        open_page(browser, server)
        browser.find_element(By.ID, "file-input").send_keys(
            "\n".join(str(p) for p, _ in test_images)
        )
        wait(browser, lambda d: len(cards(d)) == 2, "two result cards")
        browser.find_element(By.CSS_SELECTOR, "button.show-report").click()
        wait(
            browser,
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#confusion td.cell")) == 100,
            "the heatmap",
        )
        # Nothing wider than the screen: wide tables scroll inside their own boxes.
        page_width = browser.execute_script("return document.documentElement.scrollWidth")
        assert page_width <= width
        for card in cards(browser):
            box = card.rect
            assert box["x"] >= 0 and box["x"] + box["width"] <= width
        screenshot(browser, "phone")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert page_errors(browser) == []


@pytest.fixture
def unready_server(tmp_path) -> Iterator[Server]:
    """A service with no version to serve: alive, not ready."""
    (tmp_path / "models" / "fashion_mnist").mkdir(parents=True)
    srv = start_server(
        tmp_path / "server.log", wait_for="/healthz", MODEL_BASE_PATH=str(tmp_path / "models")
    )
    yield srv
    srv.stop()


def test_a_service_that_is_not_ready_says_so(browser, unready_server, test_images):
    open_page(browser, unready_server)
    status = browser.find_element(By.ID, "service-status").text
    assert status.startswith("The service is not ready: ") and "no version" in status
    assert browser.find_element(By.ID, "versions-status").text.startswith(
        "No version has been exported"
    )
    browser.find_element(By.ID, "file-input").send_keys(str(test_images[0][0]))
    wait(browser, lambda d: visible_error(d, "try-error"), "the error message")
    message = visible_error(browser, "try-error")
    assert (
        message.startswith("The service is not ready: no version") and message.count("ready") == 1
    )
    assert cards(browser) == []
    screenshot(browser, "not-ready-desktop")
    assert page_errors(browser) == []


@pytest.fixture
def labeled_server(repository, tmp_path) -> Iterator[Server]:
    """The same repository served through TF Serving's model config, with labels."""
    config = tmp_path / "models.config"
    config.write_text(
        "model_config_list {\n  config {\n"
        f'    name: "fashion_mnist"\n    base_path: "{repository}"\n'
        '    model_platform: "tensorflow"\n'
        "    model_version_policy { specific { versions: 1 versions: 2 } }\n"
        '    version_labels { key: "stable" value: 1 }\n'
        '    version_labels { key: "canary" value: 2 }\n'
        "  }\n}\n"
    )
    srv = start_server(tmp_path / "server.log", MODEL_CONFIG_FILE=str(config))
    yield srv
    srv.stop()


def test_the_versions_table_shows_labels_when_the_config_has_them(browser, labeled_server):
    open_page(browser, labeled_server)
    wait(
        browser,
        lambda d: (
            "Labels" in [th.text for th in d.find_elements(By.CSS_SELECTOR, "#versions thead th")]
        ),
        "the Labels column",
    )
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#versions thead th")]
    column = {name: i - 1 for i, name in enumerate(headers)}  # the version is a row header
    rows = {
        row.get_attribute("data-version"): row.find_elements(By.TAG_NAME, "td")
        for row in browser.find_elements(By.CSS_SELECTOR, "#versions tbody tr")
    }
    assert rows["1"][column["Labels"]].text == "stable"
    assert rows["2"][column["Labels"]].text == "canary"
    # `stable` answers requests that name no version.
    assert rows["1"][column["State"]].text == "AVAILABLE (serving)"
    assert rows["2"][column["State"]].text == "AVAILABLE"
    assert page_errors(browser) == []


# --- models of other contracts: the page adapts to each ------------------------------------

CLASSIFIER_FEATURES = {"color": "red", "rooms": "3", "x1": "1.5", "x2": "-0.25"}
REGRESSOR_FEATURES = {"city": "b", "rooms": "2", "x1": "0.75", "x2": "1.5"}


def open_model(driver: WebDriver, server: Server, model: str) -> None:
    driver.get(f"{server.url}/?model={model}")
    wait(
        driver,
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"),
        "the page to start",
    )
    assert driver.find_element(By.ID, "model-name").text == model


def fill_features(driver: WebDriver, values: dict[str, str]) -> dict[str, str]:
    """Type each value into its generated field; the fields' types, by feature."""
    fields = driver.find_elements(By.CSS_SELECTOR, "#feature-fields input[data-feature]")
    assert sorted(f.get_attribute("data-feature") for f in fields) == sorted(values)
    types = {}
    for field in fields:
        name = field.get_attribute("data-feature")
        types[name] = (field.get_attribute("type"), field.get_attribute("step"))
        field.clear()
        field.send_keys(values[name])
    return types


def submit_features(driver: WebDriver, server: Server, model: str, values: dict[str, str]):
    """Fill the generated form, send it, and wait for its card; (card, the fields' types,
    what /predict itself answers for the same instance, typed as the fields are)."""
    types = fill_features(driver, values)
    driver.find_element(By.ID, "predict-features").click()
    wait(driver, lambda d: len(cards(d)) == 1, "the answer's card")
    instance = {
        name: (text if types[name][0] != "number" else int(text) if types[name][1] == "1"
               else float(text))
        for name, text in values.items()
    }  # fmt: skip
    (expected,) = ok_json(
        httpx.post(f"{server.url}/predict/{model}", json={"instances": [instance]})
    )["predictions"]
    (card,) = cards(driver)
    return card, types, expected


def test_the_model_selector_lists_every_model(browser, any_server):
    open_model(browser, any_server, "classifier")
    select = browser.find_element(By.ID, "model-select")
    assert select.is_displayed()
    options = [o.get_attribute("value") for o in select.find_elements(By.TAG_NAME, "option")]
    assert sorted(options) == sorted(ok_json(httpx.get(f"{any_server.url}/page/models"))["models"])
    Select(select).select_by_value("regressor")
    wait(browser, lambda d: d.find_element(By.ID, "model-name").text == "regressor", "the switch")
    wait(
        browser,
        lambda d: "city" in [f.get_attribute("data-feature") for f in
                             d.find_elements(By.CSS_SELECTOR, "#feature-fields input")],
        "the regressor's fields",
    )  # fmt: skip
    assert page_errors(browser) == []


def test_a_tabular_classifiers_form_is_generated_from_its_signature(browser, any_server):
    open_model(browser, any_server, "classifier")
    assert not browser.find_element(By.ID, "image-inputs").is_displayed()
    assert browser.find_element(By.ID, "features-form").is_displayed()
    card, types, expected = submit_features(browser, any_server, "classifier", CLASSIFIER_FEATURES)
    screenshot(browser, "tabular-classifier")
    # Numbers in number fields (integers step by one), strings in text fields.
    assert types == {
        "color": ("text", ""),
        "rooms": ("number", "1"),
        "x1": ("number", "any"),
        "x2": ("number", "any"),
    }
    assert card.find_element(By.CLASS_NAME, "predicted-label").text == expected["label"]
    assert expected["label"] in ("high", "low", "mid")
    assert bars(card) == [
        (label, f"{100 * p:.1f}%") for label, p in expected["probabilities"].items()
    ]
    assert page_errors(browser) == []


def test_a_regressors_form_answers_its_value_and_its_report_its_errors(browser, any_server):
    open_model(browser, any_server, "regressor")
    card, _, expected = submit_features(browser, any_server, "regressor", REGRESSOR_FEATURES)
    assert float(card.find_element(By.CLASS_NAME, "predicted-value").text) == expected["value"]
    # The versions list's headline is the RMSE, and the report a regressor's.
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#versions thead th")]
    assert "Test RMSE" in headers and "Test accuracy" not in headers
    browser.find_element(By.CSS_SELECTOR, "button.show-report").click()
    wait(browser, lambda d: d.find_element(By.ID, "regression-report").is_displayed(), "the report")
    assert not browser.find_element(By.ID, "classification-report").is_displayed()
    summary = browser.find_element(By.ID, "report-summary").text
    assert "Test RMSE" in summary and "Test MAE" in summary
    assert browser.find_elements(By.CSS_SELECTOR, "#slices tbody tr")
    # The export's plots of a regressor, loaded from its version's assets.extra/.
    plots = browser.find_elements(By.CSS_SELECTOR, "#regression-plots img")
    assert [p.get_attribute("src").rsplit("/", 1)[1] for p in plots] == [
        "predicted_vs_true.png",
        "residuals.png",
    ]
    for plot in plots:
        wait(
            browser,
            lambda d, plot=plot: (
                plot.get_property("complete") and plot.get_property("naturalWidth") > 0
            ),
            "a regressor's plot",
        )
    screenshot(browser, "tabular-regressor")
    assert unnamed_controls(browser) == []
    assert page_errors(browser) == []


def test_a_32x32_colour_image_is_resized_and_shown_as_the_model_received_it(
    browser, any_server, tmp_path
):
    open_model(browser, any_server, "shapes")
    assert browser.find_element(By.ID, "image-inputs").is_displayed()
    assert not browser.find_element(By.ID, "invert-choice").is_displayed()
    photo = np.zeros((48, 40, 3), np.uint8)
    photo[8:40, 10:30] = (220, 40, 30)  # a red box on black
    path = tmp_path / "box.png"
    path.write_bytes(png_bytes(photo))
    browser.find_element(By.ID, "file-input").send_keys(str(path))
    wait(browser, lambda d: len(cards(d)) == 1, "the image's card")
    screenshot(browser, "image-32x32x3")
    (expected,) = ok_json(
        httpx.post(
            f"{any_server.url}/predict/shapes?include_pixels=true",
            files=[("files", ("box.png", path.read_bytes()))],
        )
    )["predictions"]
    (card,) = cards(browser)
    assert card.find_element(By.CLASS_NAME, "predicted-label").text == expected["label"]
    canvas = card.find_element(By.CSS_SELECTOR, "canvas.model-input")
    rgb = browser.execute_script(
        "const c = arguments[0]; const data = c.getContext('2d').getImageData(0, 0, c.width, "
        "c.height).data; return [c.width, c.height, Array.from(data.filter((_, i) => i % 4 !== 3))];",
        canvas,
    )
    assert rgb[:2] == [32, 32]
    np.testing.assert_array_equal(np.array(rgb[2]).reshape(32, 32, 3), expected["pixels"])
    assert page_errors(browser) == []


# --- models as users export them (conftest's exports_server) ---------------------------------

PAD_PNG = "return arguments[0].toDataURL('image/png').split(',')[1];"


def test_an_image_bytes_model_gets_each_file_and_the_drawing_as_they_are(
    browser, exports_server, tmp_path
):
    open_model(browser, exports_server, "resnet_bytes")
    assert browser.find_element(By.ID, "image-inputs").is_displayed()
    assert not browser.find_element(By.ID, "invert-choice").is_displayed()
    assert "a classifier of image files it decodes itself from its input image_bytes (" in (
        browser.find_element(By.ID, "model-status").text
    )
    photo = np.zeros((30, 50, 3), np.uint8)
    photo[..., 2] = 230  # blue
    path = tmp_path / "blue.png"
    path.write_bytes(png_bytes(photo))
    browser.find_element(By.ID, "file-input").send_keys(str(path))
    wait(browser, lambda d: len(cards(d)) == 1, "the image's card")
    screenshot(browser, "image-bytes")
    (expected,) = ok_json(
        httpx.post(
            f"{exports_server.url}/predict/resnet_bytes",
            files=[("files", ("blue.png", path.read_bytes()))],
        )
    )["predictions"]
    (card,) = cards(browser)
    assert card.find_element(By.CLASS_NAME, "predicted-label").text == expected["label"] == "blue"
    assert bars(card) == [
        (label, f"{100 * p:.1f}%") for label, p in expected["probabilities"].items()
    ]
    # The service never sees the pixels: no "what the model received".
    assert card.find_elements(By.CSS_SELECTOR, "canvas.model-input") == []
    pad = browser.find_element(By.ID, "pad")
    (
        ActionChains(browser)
        .move_to_element_with_offset(pad, -60, -60)
        .click_and_hold()
        .move_by_offset(120, 120)
        .release()
        .perform()
    )
    wait(
        browser,
        lambda d: (
            [c.find_element(By.CLASS_NAME, "card-title").text for c in cards(d)] == ["drawing.png"]
        ),
        "the drawing's card",
    )
    # The drawing's PNG, as the pad holds it, answered the same when sent by hand (the card
    # is read once the page has drawn its answer: it may render the card more than once).
    drawn = base64.b64decode(browser.execute_script(PAD_PNG, pad))
    (expected,) = ok_json(
        httpx.post(
            f"{exports_server.url}/predict/resnet_bytes",
            files=[("files", ("drawing.png", drawn))],
        )
    )["predictions"]
    shown = [(label, f"{100 * p:.1f}%") for label, p in expected["probabilities"].items()]
    wait(browser, lambda d: [bars(c) for c in cards(d)] == [shown], "the drawing's answer")
    assert visible_error(browser, "try-error") == ""
    assert page_errors(browser) == []


def test_a_regressor_of_two_values_shows_both(browser, exports_server):
    open_model(browser, exports_server, "two_targets")
    assert browser.find_element(By.ID, "model-status").text == (
        "two_targets version 1 is a classifier or a regressor of 2 features (signature predict)."
    )
    card, _, expected = submit_features(
        browser, exports_server, "two_targets", {"x1": "0.5", "x2": "-1.25"}
    )
    screenshot(browser, "two-targets")
    prediction = card.find_element(By.CLASS_NAME, "prediction").text
    assert prediction.startswith("Predicted values: ")
    shown = card.find_element(By.CLASS_NAME, "predicted-value").text
    assert [float(value) for value in shown.split(", ")] == expected["value"]
    assert len(expected["value"]) == 2
    assert page_errors(browser) == []
