"""The page's report endpoint (service/protocols/page.py) shows what training wrote, without
the server's folders: the trainer writes its data, model and export paths into its reports."""

from __future__ import annotations

import json

from support.fakes import MODEL_NAME, FakeBackend, app_client, write_version
from support.helpers import ok_json

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, REPORT_FILE

REPORT = {
    "accuracy": 0.9,
    "examples": 300,
    "params": {"model": "cnn", "data_dir": "/srv/secret/datasets/fashion-mnist"},
    "model_dir": "/srv/secret/runs/fashion_mnist",
    "notes": ["exported to /srv/secret/models/fashion_mnist/2 at step 40"],
}
BLESSING = {"blessed": True, "candidate": {"path": "/srv/secret/models/fashion_mnist/2"}}


def test_a_version_report_names_no_folder_of_the_server(tmp_path):
    model_dir = tmp_path / "models" / MODEL_NAME
    extra = write_version(model_dir, 2) / ASSETS_EXTRA
    extra.mkdir()
    (extra / REPORT_FILE).write_text(json.dumps(REPORT))
    (extra / BLESSING_FILE).write_text(json.dumps(BLESSING))
    backend = FakeBackend(versions=(2,))
    backend.base_path = model_dir.parent
    with app_client(backend, model_base_path=str(model_dir.parent)) as client:
        response = client.get(f"/page/models/{MODEL_NAME}/versions/2/report")
        answer = ok_json(response)
    assert "/srv" not in response.text
    assert answer["evaluation"] == {
        "accuracy": 0.9,
        "examples": 300,
        "params": {"model": "cnn", "data_dir": "fashion-mnist"},
        "model_dir": "fashion_mnist",
        "notes": ["exported to 2 at step 40"],
    }
    assert answer["blessing"] == {"blessed": True, "candidate": {"path": "2"}}
