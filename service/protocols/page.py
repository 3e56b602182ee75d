"""The page for people at `/`: try the model and inspect its versions in a browser.

It serves the static page (service/static/: HTML, JavaScript and CSS, no build step, nothing
fetched from the network) under a strict Content-Security-Policy, and the read-only views of
the model repository the page needs that the other protocols do not give:

    GET /page/models                                          the models, the default first
    GET /page/models/{name}                                   what /predict takes and answers
    GET /page/models/{name}/versions                          versions on disk, newest first
    GET /page/models/{name}/versions/{version}/report         evaluation and blessing reports
    GET /page/models/{name}/versions/{version}/plots/{plot}   a PNG the export drew

Everything else the page asks the service's own endpoints: `POST /predict/{name}` (with
`include_pixels=true` for image models: the answer and the image the model received),
`GET /v1/models/{name}` (each version's state) and `/readyz` (the serving version and its
device).

Nothing the client sends becomes a path: versions are int64s looked up among the versions
listed on disk, plots and static files are names looked up in fixed tables, and a plot that
resolves outside its version's assets.extra/ (a symlink out) is not served.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.responses import FileResponse

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, EXPORT_PLOTS, REPORT_FILE
from artifact.repository import list_versions, read_blessing, read_report
from service.dataplane import DataPlane
from service.errors import BadInput, NotFound, NotReady, ServiceError, redact_paths
from service.protocols.http import json_response, version_in_url
from service.protocols.model_form import model_form
from service.routes import Answers, Call, Route
from service.security import STATUS

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
INDEX_FILE = "index.html"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# Scripts, styles and everything else from this origin only: no inline script or style, no
# eval. Images also from blob: URLs, the page's previews of the files a person picked.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' blob:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated every time (FileResponse sends an ETag): a new release shows at once.
    "Cache-Control": "no-cache",
}


class ReportError(ServiceError):
    """A file in a version's assets.extra/ that cannot be read: the repository's fault."""

    status = 500


def static_files(directory: Path = STATIC_DIR) -> dict[str, tuple[Path, str]]:
    """name -> (path, media type) of the page's files, read once: the only files served."""
    return {
        path.name: (path, MEDIA_TYPES[path.suffix])
        for path in sorted(directory.iterdir())
        if path.is_file() and path.suffix in MEDIA_TYPES
    }


def plot_file(version_path: Path, plot: str) -> Path | None:
    """A plot in a version's assets.extra/, or None when it is missing or resolves outside."""
    if plot not in EXPORT_PLOTS:
        return None
    extra = (version_path / ASSETS_EXTRA).resolve()
    path = (extra / plot).resolve()
    if not path.is_relative_to(extra) or not path.is_file():
        return None
    return path


def redacted(value):
    """A report (JSON values) with the folders of every absolute path in its strings left
    out (service/errors.py: redact_paths)."""
    if isinstance(value, str):
        return redact_paths(value)
    if isinstance(value, dict):
        return {key: redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redacted(item) for item in value]
    return value


def version_summary(version: int, path: Path) -> dict:
    """One row of the versions list: the report's headline numbers (accuracy for a
    classifier, RMSE and MAE for a regressor) and which files exist."""
    summary = {
        "version": str(version),
        "task": None,
        "accuracy": None,
        "rmse": None,
        "mae": None,
        "examples": None,
        "date": None,
        "global_step": None,
        "model": None,
        "evaluation": False,
        "blessing": (path / ASSETS_EXTRA / BLESSING_FILE).is_file(),
        "plots": [plot for plot in EXPORT_PLOTS if plot_file(path, plot) is not None],
    }
    try:
        report = read_report(path)
    except (OSError, ValueError) as err:
        summary["error"] = f"{ASSETS_EXTRA}/{REPORT_FILE} is unreadable: {err}"
        return summary
    if isinstance(report, dict):
        params = report.get("params")
        summary.update(
            evaluation=True,
            # training/evaluation_report.py: a regressor's report has rmse and mae, a classifier's
            # accuracy.
            task="regression" if "rmse" in report else "classification",
            accuracy=report.get("accuracy"),
            rmse=report.get("rmse"),
            mae=report.get("mae"),
            examples=report.get("examples"),
            date=report.get("date"),
            global_step=report.get("global_step"),
            model=params.get("model") if isinstance(params, dict) else None,
        )
    return summary


class PageAPI:
    """`/`, its static files and the repository views it needs.

    Args:
        dataplane: the models served (their names, folders and labels).
        static_dir: the page's files.
    """

    def __init__(self, dataplane: DataPlane, static_dir: Path = STATIC_DIR):
        self.dataplane = dataplane
        self.files = static_files(static_dir)
        if INDEX_FILE not in self.files:
            raise FileNotFoundError(f"{static_dir} has no {INDEX_FILE}")

    def routes(self) -> list[Route]:
        """The page and its files (open to all: no data in them), and the repository's views
        it reads (the `status` scope)."""
        tags = ("page",)
        html, png = Answers(("text/html",)), Answers(("image/png",), errors=(400, 404, 500))
        files = Answers(
            ("text/html", "text/javascript", "text/css", "image/svg+xml", "image/png"),
            errors=(404,),
        )
        views = Answers(errors=(400, 404, 500))
        return [
            Route("GET", "/", self.index, "The page: try the model, inspect its versions", None,
                  tags, answers=html),
            Route("GET", "/static/{file}", self.static, "The page's scripts and styles", None,
                  tags, answers=files),
            Route("GET", "/page/models", self.models,
                  "The models served, the default one first", STATUS, tags, answers=views),
            Route("GET", "/page/models/{name}", self.model,
                  "What /predict/{name} takes (image, features, ...) and answers "
                  "(classification, regression, ...), or why the model is not ready",
                  STATUS, tags, answers=views),
            Route("GET", "/page/models/{name}/versions", self.versions,
                  "Versions on disk, newest first: accuracy, reports and plots", STATUS, tags,
                  answers=views),
            Route("GET", "/page/models/{name}/versions/{version}/report", self.report,
                  "A version's evaluation report, and its blessing report when it has one",
                  STATUS, tags, answers=views),
            Route("GET", "/page/models/{name}/versions/{version}/plots/{plot}", self.plot,
                  f"A plot the export drew: {', '.join(EXPORT_PLOTS)}", STATUS, tags,
                  answers=png),
        ]  # fmt: skip

    # --- the page itself ----------------------------------------------------------------

    def _file(self, name: str) -> FileResponse:
        path, media_type = self.files[name]
        return FileResponse(path, media_type=media_type, headers=SECURITY_HEADERS)

    async def index(self, call: Call):
        return self._file(INDEX_FILE)

    async def static(self, call: Call, file: str):
        if file not in self.files or file == INDEX_FILE:
            raise NotFound(f"no such file: /static/{file[:60]}")
        return self._file(file)

    # --- the repository, read-only --------------------------------------------------------

    async def models(self, call: Call):
        names = self.dataplane.model_names()
        default = self.dataplane.model_name
        # The model /predict serves first: the page tries that one.
        return json_response({"models": sorted(names, key=lambda n: n != default)})

    async def model(self, call: Call, name: str):
        """The page's form for a model: from its serving version's signature; while none
        serves, `ready` false and why (the page shows the upload, and /predict says why)."""
        readiness = self.dataplane.model_readiness(name)  # NotFound: no such model
        answer = {
            "model_name": name,
            "ready": readiness.ready,
            # /readyz's words: why, without the server's folders (a failed version's error
            # names its files).
            "reason": redact_paths(readiness.reason),
            "model_version": None if readiness.version is None else str(readiness.version),
            "form": None,
            "problem": None,
        }
        if readiness.ready:
            try:
                answer["form"] = (await model_form(self.dataplane, name)).to_json()
            except NotReady as err:  # unloaded since readiness answered
                answer.update(ready=False, reason=redact_paths(err.message))
            except BadInput as err:  # no signature /predict can choose
                answer["problem"] = err.message
        return json_response(answer)

    def _version_path(self, name: str, version: str) -> tuple[int, Path]:
        model_dir = self.dataplane.model_dir(name)  # NotFound: no such model
        number = version_in_url(version)
        path = dict(list_versions(model_dir)).get(number)
        if path is None:
            raise NotFound(f"Could not find version {number} of model {name} in the repository")
        return number, path

    async def versions(self, call: Call, name: str):
        model_dir = self.dataplane.model_dir(name)  # NotFound: no such model
        labels = self.dataplane.version_labels(name)

        def summaries() -> list[dict]:
            rows = [version_summary(v, p) for v, p in reversed(list_versions(model_dir))]
            for row in rows:
                row["labels"] = sorted(k for k, v in labels.items() if str(v) == row["version"])
            return rows

        return json_response({"model_name": name, "versions": await asyncio.to_thread(summaries)})

    async def report(self, call: Call, name: str, version: str):
        number, path = self._version_path(name, version)

        def read() -> dict:
            try:
                evaluation, blessing = read_report(path), read_blessing(path)
            except (OSError, ValueError) as err:
                raise ReportError(
                    f"version {number} of model {name}: a report in {ASSETS_EXTRA}/ is "
                    f"unreadable: {err}"
                ) from err
            if evaluation is None:
                raise NotFound(
                    f"version {number} of model {name} has no evaluation report "
                    f"({ASSETS_EXTRA}/{REPORT_FILE})"
                )
            plots = [plot for plot in EXPORT_PLOTS if plot_file(path, plot) is not None]
            return {
                "model_name": name,
                "version": str(number),
                # The trainer writes its own paths (data, model and export folders) into the
                # reports: the server's filesystem is not the page's business.
                "evaluation": redacted(evaluation),
                "blessing": redacted(blessing),
                "plots": plots,
            }

        return json_response(await asyncio.to_thread(read))

    async def plot(self, call: Call, name: str, version: str, plot: str):
        number, path = self._version_path(name, version)
        if plot not in EXPORT_PLOTS:
            raise NotFound(f"no plot named {plot[:60]!r}; the plots are {', '.join(EXPORT_PLOTS)}")
        file = await asyncio.to_thread(plot_file, path, plot)
        if file is None:
            raise NotFound(f"version {number} of model {name} has no {plot}")
        return FileResponse(file, media_type=MEDIA_TYPES[".png"], headers=SECURITY_HEADERS)
