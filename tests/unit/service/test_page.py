"""The page's routes over a fake backend (no TensorFlow): `/` and its static files under a
strict Content-Security-Policy, the read-only repository views, and what the page asks of
`/predict` (the 28x28 image the model received)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client, write_version
from support.helpers import error_message, ok_json, png_bytes

from artifact.contract import (
    ASSETS_EXTRA,
    BLESSING_FILE,
    CONFUSION_MATRIX_PLOT,
    EXPORT_PLOTS,
    FASHION_MNIST_LABELS,
    LEARNING_CURVES_PLOT,
    PREDICTED_VS_TRUE_PLOT,
    REPORT_FILE,
    RESIDUALS_PLOT,
)
from artifact.images import image_to_pixels
from service.protocols.page import CONTENT_SECURITY_POLICY, STATIC_DIR

PAGE = f"/page/models/{MODEL_NAME}"
# Not real plots: the routes serve bytes, whatever they draw (tests/live/training/test_plots.py
# checks the real ones).
FAKE_PNG = b"\x89PNG\r\n\x1a\n" + b"plot" * 100
RNG = np.random.default_rng(0)


def report(accuracy: float, step: int) -> dict:
    """An evaluation report as training/evaluation_report.py writes it (numbers made up)."""
    confusion = np.diag([30] * 10).tolist()
    return {
        "accuracy": accuracy,
        "examples": 300,
        "per_class": [
            {"class_id": k, "label": label, "precision": 1.0, "recall": 1.0, "support": 30}
            for k, label in enumerate(FASHION_MNIST_LABELS)
        ],
        "confusion_matrix": confusion,
        "date": "2026-01-02T03:04:05+00:00",
        "global_step": step,
        "params": {"model": "cnn"},
    }


BLESSING = {"blessed": True, "candidate": {"accuracy": 0.9}, "baseline": {"accuracy": 0.8}}


@pytest.fixture
def repository(tmp_path) -> Path:
    """models/fashion_mnist: version 1 without any report, 2 with a report and both plots,
    3 with a report, a blessing and one plot; plus files that are not versions."""
    model_dir = tmp_path / "models" / MODEL_NAME
    write_version(model_dir, 1)
    for version, plots in ((2, EXPORT_PLOTS), (3, (CONFUSION_MATRIX_PLOT,))):
        extra = write_version(model_dir, version) / ASSETS_EXTRA
        extra.mkdir()
        (extra / REPORT_FILE).write_text(json.dumps(report(0.5 + version / 10, version * 100)))
        for plot in plots:
            (extra / plot).write_bytes(FAKE_PNG + bytes([version]))
    (model_dir / "3" / ASSETS_EXTRA / BLESSING_FILE).write_text(json.dumps(BLESSING))
    (model_dir / ".export-staging").mkdir()
    (tmp_path / "secret.png").write_bytes(FAKE_PNG + b"secret")
    return model_dir


@pytest.fixture
def client(repository):
    backend = FakeBackend(versions=(1, 2, 3))
    backend.base_path = repository.parent
    backend.labels = {"stable": 2}
    with app_client(backend, model_base_path=str(repository.parent)) as c:
        yield c


class Page(HTMLParser):
    """What a CSP-checking reader of the HTML needs: scripts, styles, handlers, references."""

    def __init__(self):
        super().__init__()
        self.inline_scripts = 0
        self.style_elements = 0
        self.inline_handlers: list[str] = []
        self.style_attributes: list[str] = []
        self.references: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "script" and "src" not in attributes:
            self.inline_scripts += 1
        if tag == "style":
            self.style_elements += 1
        self.inline_handlers += [name for name in attributes if name.startswith("on")]
        if "style" in attributes:
            self.style_attributes.append(tag)
        for name in ("src", "href"):
            if name in attributes:
                self.references.append(attributes[name])


def test_the_page_is_served_with_a_strict_content_security_policy(client):
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    policy = response.headers["content-security-policy"]
    assert policy == CONTENT_SECURITY_POLICY
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert "script-src" not in directives and "style-src" not in directives  # default-src rules
    assert "unsafe" not in policy and "*" not in policy and "data:" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"] == "no-cache"


def test_the_html_needs_nothing_the_policy_forbids(client):
    page = Page()
    page.feed(client.get("/").text)
    assert page.inline_scripts == 0
    assert page.style_elements == 0
    assert page.inline_handlers == []
    assert page.style_attributes == []
    local = [ref for ref in page.references if ref.startswith("/") or ref.startswith("#")]
    assert local == page.references, "every reference stays on this origin"
    assert {"/static/app.js", "/static/style.css", "/static/favicon.svg"} <= set(page.references)


def test_the_script_uses_no_eval_and_sets_no_inline_style():
    script = (STATIC_DIR / "app.js").read_text()
    assert not re.search(r"\beval\(|new Function\(|innerHTML|setAttribute\('style'", script)
    assert not re.search(r"\bstyle['\"]?\s*:", script), "a style attribute: CSP drops it"
    # Every element id the script looks up exists in the page.
    html = (STATIC_DIR / "index.html").read_text()
    wanted = set(re.findall(r"\$\('([\w-]+)'\)", script))
    assert wanted, "the script looks up elements by id"
    missing = sorted(i for i in wanted if f'id="{i}"' not in html)
    assert missing == []


@pytest.mark.parametrize(
    "path, content_type",
    [
        pytest.param("/static/app.js", "text/javascript; charset=utf-8", id="script"),
        pytest.param("/static/style.css", "text/css; charset=utf-8", id="stylesheet"),
        pytest.param("/static/favicon.svg", "image/svg+xml", id="icon"),
    ],
)
def test_static_files_have_their_content_types(client, path, content_type):
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.content == (STATIC_DIR / path.rsplit("/", 1)[1]).read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/static/missing.js", id="unknown-file"),
        pytest.param("/static/index.html", id="the-page-only-at-root"),
        pytest.param("/static/..%5Capp.py", id="backslash"),
        pytest.param("/static/app.js%00.png", id="nul"),
    ],
)
def test_only_the_page_files_are_served(client, path):
    assert "no such file" in error_message(client.get(path), 404)


def test_the_model_the_page_shows(client):
    assert ok_json(client.get("/page/models")) == {"models": [MODEL_NAME]}


def test_versions_on_disk_newest_first_with_accuracy_reports_and_plots(client):
    listing = ok_json(client.get(f"{PAGE}/versions"))
    assert listing["model_name"] == MODEL_NAME
    rows = {row["version"]: row for row in listing["versions"]}
    assert [row["version"] for row in listing["versions"]] == ["3", "2", "1"]
    assert rows["3"] == {
        "version": "3",
        "task": "classification",
        "accuracy": 0.8,
        "rmse": None,
        "mae": None,
        "examples": 300,
        "date": "2026-01-02T03:04:05+00:00",
        "global_step": 300,
        "model": "cnn",
        "evaluation": True,
        "blessing": True,
        "plots": [CONFUSION_MATRIX_PLOT],
        "labels": [],
    }
    assert rows["2"]["plots"] == list(EXPORT_PLOTS) and rows["2"]["blessing"] is False
    assert rows["2"]["labels"] == ["stable"]
    assert rows["1"]["evaluation"] is False and rows["1"]["accuracy"] is None
    assert rows["1"]["plots"] == []


def test_an_unreadable_report_is_named_in_the_listing(client, repository):
    (repository / "2" / ASSETS_EXTRA / REPORT_FILE).write_text("{not json")
    rows = {row["version"]: row for row in ok_json(client.get(f"{PAGE}/versions"))["versions"]}
    assert rows["2"]["evaluation"] is False
    assert "evaluation.json is unreadable" in rows["2"]["error"]
    message = error_message(client.get(f"{PAGE}/versions/2/report"), 500)
    assert "version 2" in message and "unreadable" in message


def test_a_report_with_its_blessing_and_plots(client):
    answer = ok_json(client.get(f"{PAGE}/versions/3/report"))
    assert answer == {
        "model_name": MODEL_NAME,
        "version": "3",
        "evaluation": report(0.8, 300),
        "blessing": BLESSING,
        "plots": [CONFUSION_MATRIX_PLOT],
    }
    answer = ok_json(client.get(f"{PAGE}/versions/2/report"))
    assert answer["blessing"] is None and answer["plots"] == list(EXPORT_PLOTS)
    # Leading zeros name the same version, as in every route that takes one.
    assert ok_json(client.get(f"{PAGE}/versions/002/report"))["version"] == "2"


@pytest.mark.parametrize("plot", EXPORT_PLOTS)
def test_plots_are_served_as_png(client, repository, plot):
    response = client.get(f"{PAGE}/versions/2/plots/{plot}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.content == (repository / "2" / ASSETS_EXTRA / plot).read_bytes()


@pytest.mark.parametrize(
    "path, status, fragment",
    [
        pytest.param(f"{PAGE}/versions/1/report", 404, "version 1 of model fashion_mnist has no evaluation report", id="no-report"),
        pytest.param(f"{PAGE}/versions/7/report", 404, "Could not find version 7", id="missing-version"),
        pytest.param(f"{PAGE}/versions/abc/report", 400, "version must be a non-negative integer", id="not-a-number"),
        pytest.param(f"{PAGE}/versions/-1/report", 400, "non-negative integer", id="negative"),
        pytest.param(f"{PAGE}/versions/²/report", 400, "non-negative integer", id="superscript-digit"),
        pytest.param(f"{PAGE}/versions/99999999999999999999/report", 400, "out of range", id="beyond-int64"),
        pytest.param("/page/models/other/versions", 404, "Could not find any versions of model other", id="other-model-list"),
        pytest.param("/page/models/other/versions/2/report", 404, "model other", id="other-model-report"),
        pytest.param(f"{PAGE}/versions/3/plots/{LEARNING_CURVES_PLOT}", 404, "version 3 of model fashion_mnist has no learning_curves.png", id="plot-not-exported"),
        pytest.param(f"{PAGE}/versions/1/plots/{CONFUSION_MATRIX_PLOT}", 404, "has no confusion_matrix.png", id="no-assets-extra"),
        pytest.param(f"{PAGE}/versions/2/plots/{REPORT_FILE}", 404, "no plot named", id="not-a-plot"),
        pytest.param(f"{PAGE}/versions/2/plots/%2E%2E", 404, "no plot named", id="dot-dot"),
        pytest.param(f"{PAGE}/versions/2/plots/..%5Csecret.png", 404, "no plot named", id="backslash"),
        pytest.param(f"{PAGE}/versions/x/plots/{CONFUSION_MATRIX_PLOT}", 400, "non-negative integer", id="bad-version-plot"),
        pytest.param(f"{PAGE}/versions/9/plots/{CONFUSION_MATRIX_PLOT}", 404, "Could not find version 9", id="missing-version-plot"),
    ],
)  # fmt: skip
def test_refusals(client, path, status, fragment):
    assert fragment in error_message(client.get(path), status)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/static/..%2F..%2Fservice%2Fapp.py", id="static"),
        pytest.param("/static/%2E%2E%2Fprotocols%2Fpage.py", id="static-encoded-dots"),
        pytest.param("/static/%2Fetc%2Fpasswd", id="static-absolute"),
        pytest.param(f"{PAGE}/versions/2/plots/..%2F..%2F..%2Fsecret.png", id="plot"),
        pytest.param(f"{PAGE}/versions/2/plots/%2Fetc%2Fpasswd", id="plot-absolute"),
        pytest.param(f"{PAGE}/versions/2/plots/..%2F{REPORT_FILE}", id="plot-to-report"),
        pytest.param(f"{PAGE}/versions/..%2F2/plots/{CONFUSION_MATRIX_PLOT}", id="version"),
        pytest.param(f"{PAGE}/versions/2%2F..%2F3/report", id="version-report"),
    ],
)
def test_paths_with_slashes_match_no_route(client, path):
    # An encoded slash is a slash to the router: the path has more segments than any page
    # route, so nothing is looked up at all.
    assert error_message(client.get(path), 404) == "Not Found"


def test_a_plot_that_links_outside_its_assets_extra_is_not_served(client, repository, tmp_path):
    link = repository / "3" / ASSETS_EXTRA / LEARNING_CURVES_PLOT
    link.symlink_to(tmp_path / "secret.png")
    message = error_message(client.get(f"{PAGE}/versions/3/plots/{LEARNING_CURVES_PLOT}"), 404)
    assert "has no learning_curves.png" in message
    listing = ok_json(client.get(f"{PAGE}/versions"))["versions"]
    assert listing[0]["plots"] == [CONFUSION_MATRIX_PLOT]


def test_the_page_routes_are_read_only(client):
    for path in ("/", f"{PAGE}/versions", f"{PAGE}/versions/2/report"):
        assert client.post(path).status_code == 405
        assert client.delete(path).status_code == 405


# --- what the page asks of /predict ------------------------------------------------------


def test_predict_answers_the_image_the_model_received_when_asked(client):
    pixels = RNG.integers(0, 256, (2, 28, 28)).astype(np.uint8)
    plain = ok_json(client.post("/predict", json={"instances": pixels.astype(int).tolist()}))
    assert all("pixels" not in row for row in plain["predictions"])
    asked = ok_json(
        client.post("/predict?include_pixels=true", json={"instances": pixels.astype(int).tolist()})
    )
    assert [row["pixels"] for row in asked["predictions"]] == pixels.tolist()
    # Everything else is the answer without the flag.
    assert [{k: v for k, v in row.items() if k != "pixels"} for row in asked["predictions"]] == (
        plain["predictions"]
    )


def test_uploads_answer_the_prepared_image_not_the_file(client):
    # A dark object on a light 40x20 background: inverted, scaled and centred by the service.
    photo = np.full((20, 40), 255, np.uint8)
    photo[5:15, 10:30] = 40
    files = [("files", ("photo.png", png_bytes(photo), "image/png"))]
    rows = ok_json(client.post("/predict?include_pixels=true", files=files))["predictions"]
    assert rows[0]["file"] == "photo.png"
    received = np.array(rows[0]["pixels"])
    assert received.shape == (28, 28)
    np.testing.assert_array_equal(received, image_to_pixels(png_bytes(photo)))
    assert received[0, 0] == 0 and received[14, 14] > 200, "inverted: light object on dark"


def test_a_regressors_versions_headline_is_its_rmse(client, repository):
    """training/evaluation_report.py's regression report: rmse and mae, no accuracy; its plots."""
    extra = write_version(repository, 4) / ASSETS_EXTRA
    extra.mkdir()
    regression = {"rmse": 3.25, "mae": 2.5, "max_error": 7.0, "examples": 40, "slices": {}}
    (extra / REPORT_FILE).write_text(json.dumps(regression))
    for plot in (PREDICTED_VS_TRUE_PLOT, RESIDUALS_PLOT):
        (extra / plot).write_bytes(FAKE_PNG)
    rows = {row["version"]: row for row in ok_json(client.get(f"{PAGE}/versions"))["versions"]}
    assert rows["4"]["task"] == "regression" and rows["3"]["task"] == "classification"
    assert (rows["4"]["rmse"], rows["4"]["mae"], rows["4"]["accuracy"]) == (3.25, 2.5, None)
    assert rows["4"]["plots"] == [PREDICTED_VS_TRUE_PLOT, RESIDUALS_PLOT]
    assert ok_json(client.get(f"{PAGE}/versions/4/report"))["plots"] == rows["4"]["plots"]
    response = client.get(f"{PAGE}/versions/4/plots/{RESIDUALS_PLOT}")
    assert response.status_code == 200 and response.content == FAKE_PNG
