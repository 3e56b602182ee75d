"""`POST /v1/models/{name}/feedback` over the fake backend: for the image contract every
encoding of /predict, labels by id or name, every bad input named, 507 when there is no room,
the metrics, and the feedback and prediction-log folders checked at start; for any other
signature (a tabular classifier, a regressor, 32x32x3 images) the row format checked against
it and stored as tf.Examples. No TensorFlow (the fast tier)."""

from __future__ import annotations

import base64
import errno

import numpy as np
import pytest
from support.entry import run_main_in_process
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.feedback_stores import stored_shards
from support.helpers import assert_one_error_line, error_message, ok_json, png_bytes

from artifact import tfrecord
from artifact.feedback import image_examples, store_dir
from artifact.feedback import write as feedback_write
from artifact.images import image_to_pixels

URL = f"/v1/models/{MODEL_NAME}/feedback"
PIXELS = np.random.default_rng(3).integers(0, 256, (4, 28, 28), dtype=np.uint8)


def stored(feedback_dir) -> list:
    """Every closed shard of the model's store (the app closes its shard when it stops)."""
    return stored_shards(store_dir(feedback_dir, MODEL_NAME))


def post_json(client, images, labels, **extra):
    return client.post(URL, json={"instances": images, "labels": labels, **extra})


def sample(client, name: str, **labels) -> float:
    registry = client.app.dataplane.metrics.registry
    return registry.get_sample_value(name, labels) or 0.0


def test_feedback_is_off_unless_feedback_dir_is_set():
    with app_client(FakeBackend()) as client:
        response = post_json(client, PIXELS[:1].tolist(), [0])
    assert "feedback is off on this service: set FEEDBACK_DIR" in error_message(response, 403)


def test_pixels_with_labels_by_name_and_id_are_stored_as_the_model_got_them(tmp_path):
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:
        body = ok_json(post_json(client, PIXELS[:3].tolist(), ["Dress", 7, "9"], model_version="1"))
        assert body == {
            "model_name": MODEL_NAME,
            "stored": 3,
            "labels": ["Dress", "Sneaker", "Ankle boot"],
            "model_version": "1",
        }
        floats = (PIXELS[3:4] / 255.0).tolist()  # floats in [0, 1], as /predict takes them
        ok_json(post_json(client, floats, ["Bag"]))
        assert sample(client, "feedback_examples_total", model=MODEL_NAME, label="Dress") == 1
        assert sample(client, "feedback_examples_total", model=MODEL_NAME, label="Bag") == 1
        assert sample(client, "feedback_store_bytes", model=MODEL_NAME) > 4 * 784
    (shard,) = stored(tmp_path)  # closed at shutdown
    np.testing.assert_array_equal(shard.images, PIXELS)
    assert shard.labels == [3, 7, 9, 8]
    assert shard.versions == (1, 1, 1, None)


def test_shards_close_every_feedback_shard_images(tmp_path):
    with app_client(FakeBackend(), feedback_dir=str(tmp_path), feedback_shard_images=2) as client:
        for i in range(3):
            ok_json(post_json(client, PIXELS[i : i + 1].tolist(), [i]))
        assert [len(s) for s in stored(tmp_path)] == [2]  # the third waits in the open shard
    assert [len(s) for s in stored(tmp_path)] == [2, 1]


def test_b64_images_and_multipart_uploads_take_the_same_labels(tmp_path):
    png = png_bytes(PIXELS[0])
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:
        ok_json(
            post_json(
                client, [{"b64": base64.b64encode(png).decode()}], ["Trouser"], model_version=3
            )
        )
        files = [("files", (f"item{i}.png", png_bytes(PIXELS[i]), "image/png")) for i in (1, 2)]
        body = ok_json(
            client.post(URL, files=files, data={"labels": "Coat, 5", "model_version": "3"})
        )
        assert body["labels"] == ["Coat", "Sandal"] and body["model_version"] == "3"
        one_field_each = {"labels": ["Shirt", "6"]}
        ok_json(client.post(URL, files=files, data=one_field_each))
    (shard,) = stored(tmp_path)
    np.testing.assert_array_equal(shard.images[0], image_to_pixels(png, "auto"))
    np.testing.assert_array_equal(shard.images[1], image_to_pixels(png_bytes(PIXELS[1]), "auto"))
    assert shard.labels == [1, 4, 5, 6, 6]
    assert shard.versions == (3, 3, 3, None, None)


WRONG_SIZE = np.zeros((27, 28), int).tolist()
BAD_INPUTS = [
    pytest.param({"instances": PIXELS[:1].tolist(), "labels": ["Dres"]}, "labels[0]: unknown label 'Dres'; the model's labels are T-shirt/top, Trouser", id="unknown-label"),
    pytest.param({"instances": PIXELS[:2].tolist(), "labels": [1, 10]}, "labels[1]: class id 10 is out of range 0-9", id="id-out-of-range"),
    pytest.param({"instances": PIXELS[:1].tolist(), "labels": [-1]}, "labels[0]: class id -1 is out of range 0-9", id="negative-id"),
    pytest.param({"instances": PIXELS[:1].tolist(), "labels": ["12"]}, "labels[0]: class id 12 is out of range 0-9", id="id-as-text-out-of-range"),
    pytest.param({"instances": PIXELS[:1].tolist(), "labels": [True]}, "labels[0]: expected a class id or a label name, got bool", id="bool-label"),
    pytest.param({"instances": [PIXELS[0].tolist(), WRONG_SIZE], "labels": [1, 2]}, "instances[1]: expected a 28x28 array of numbers, got shape (27, 28)", id="wrong-image-size"),
    pytest.param({"instances": [[[300] * 28] * 28], "labels": [1]}, "instances[0]: integer pixels must be 0-255", id="pixel-out-of-range"),
    pytest.param({"instances": PIXELS[:2].tolist(), "labels": [1]}, "labels: 1 label(s) for 2 instance(s); send one true label per instance", id="count-mismatch"),
    pytest.param({"instances": PIXELS[:1].tolist()}, 'Request body must have "labels"', id="no-labels"),
    pytest.param({"instances": PIXELS[:1].tolist(), "labels": "Dress"}, "labels: expected a list", id="labels-not-a-list"),
    pytest.param({"instances": PIXELS[:1].tolist(), "labels": [1], "model_version": "v2"}, "model_version: expected a version number (int64), got 'v2'", id="bad-version"),
    pytest.param({"instances": PIXELS[:1].tolist(), "labels": [1], "model_version": -1}, "model_version: expected a version number", id="negative-version"),
    pytest.param({"labels": [1]}, 'Request body must be a JSON object with "instances"', id="no-instances"),
]  # fmt: skip


@pytest.mark.parametrize("body, message", BAD_INPUTS)
def test_every_bad_input_is_a_400_naming_the_item_and_nothing_is_stored(tmp_path, body, message):
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:
        response = client.post(URL, json=body)
        assert message in error_message(response, 400)
        assert sample(client, "feedback_examples_total", model=MODEL_NAME, label="Trouser") == 0
    assert stored(tmp_path) == []


def test_a_bad_upload_and_an_unknown_model(tmp_path):
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:
        files = [("files", ("notes.txt", b"not an image", "text/plain"))]
        response = client.post(URL, files=files, data={"labels": "1"})
        assert "files[0] (notes.txt)" in error_message(response, 400)
        response = client.post("/v1/models/other/feedback", json={"instances": [], "labels": []})
        assert "Could not find any versions of model other" in error_message(response, 404)
        response = client.post(URL, content=b"{not json")
        assert "JSON Parse error" in error_message(response, 400)
    assert stored(tmp_path) == []


@pytest.mark.parametrize(
    "count", [pytest.param(17, id="max-images-plus-one"), pytest.param(30, id="many-more")]
)
def test_more_uploads_than_max_images_is_413(tmp_path, count):
    files = [("files", (f"{i}.png", png_bytes(PIXELS[0]), "image/png")) for i in range(count)]
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:  # MAX_IMAGES 16
        response = client.post(URL, files=files, data={"labels": ",".join(["1"] * count)})
        assert "the limit is 16 per request (MAX_IMAGES)" in error_message(response, 413)
    assert stored(tmp_path) == []


def test_over_feedback_max_bytes_is_507_and_what_was_stored_stays(tmp_path):
    # The committed count and three examples: its record, empty version line, provenance line.
    record = len(tfrecord.frame(image_examples(PIXELS[:1], [1], "image")[0]))
    limit = 21 + 3 * (record + 1 + len("2026-01-01T00:00:00Z anonymous\n"))
    with app_client(
        FakeBackend(),
        feedback_dir=str(tmp_path),
        feedback_max_bytes=limit,
        feedback_sender_share=1,
    ) as client:
        ok_json(post_json(client, PIXELS[:2].tolist(), [1, 2]))
        response = post_json(client, PIXELS[2:4].tolist(), [3, 4])
        message = error_message(response, 507)
        assert f"FEEDBACK_MAX_BYTES={limit:,}: nothing was stored" in message
        assert sample(client, "feedback_refused_total", model=MODEL_NAME) == 1
        ok_json(post_json(client, PIXELS[2:3].tolist(), [3]))  # what fits still does
    (shard,) = stored(tmp_path)
    assert shard.labels == [1, 2, 3]


def test_a_full_disk_is_507_and_what_was_stored_stays(tmp_path, monkeypatch):
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:
        ok_json(post_json(client, PIXELS[:2].tolist(), [1, 2]))
        real = feedback_write._pwrite_all
        written = []

        def fill_up(fd, data, offset):
            if written:  # the request's version lines: the disk is full by now
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(len(data))
            real(fd, data, offset)  # the request's records went through

        monkeypatch.setattr(feedback_write, "_pwrite_all", fill_up)
        message = error_message(post_json(client, PIXELS[2:4].tolist(), [3, 4]), 507)
        assert "no room to store feedback" in message and "No space left on device" in message
        assert "nothing of this request was stored" in message
        monkeypatch.setattr(feedback_write, "_pwrite_all", real)
        ok_json(post_json(client, PIXELS[3:4].tolist(), [4]))
    (shard,) = stored(tmp_path)
    assert shard.labels == [1, 2, 4]
    np.testing.assert_array_equal(shard.images, PIXELS[[0, 1, 3]])


def test_a_store_that_cannot_be_opened_is_507(tmp_path):
    blocker = tmp_path / "feedback"
    blocker.write_text("a file where the store's folder goes")
    with app_client(FakeBackend(), feedback_dir=str(blocker)) as client:
        message = error_message(post_json(client, PIXELS[:1].tolist(), [1]), 507)
    # (the folders of a path may be left out of a 5xx answer)
    assert "cannot open the feedback store" in message and MODEL_NAME in message
    assert "Not a directory; nothing was stored" in message


@pytest.mark.parametrize(
    "make_path",
    [
        pytest.param(lambda tmp: "/sys/feedback-test", id="read-only-sysfs"),
        pytest.param(lambda tmp: "/proc/feedback-test", id="proc"),
        pytest.param(lambda tmp: (tmp / "f").write_text("") or str(tmp / "f"), id="a-file"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("variable", ["FEEDBACK_DIR", "PREDICTION_LOG_DIR"])
def test_a_folder_that_cannot_be_written_stops_the_service_at_start(tmp_path, make_path, variable):
    path = make_path(tmp_path)
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), **{variable: path})
    assert result.returncode == 2, result.stderr
    assert_one_error_line(result.stderr, f"{variable}: cannot write to {path}")


def test_prediction_logging_needs_a_folder(tmp_path):
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), PREDICTION_LOG_SAMPLING_RATE="0.5")
    assert result.returncode == 2, result.stderr
    assert_one_error_line(
        result.stderr, "PREDICTION_LOG_SAMPLING_RATE=0.5 needs PREDICTION_LOG_DIR"
    )
