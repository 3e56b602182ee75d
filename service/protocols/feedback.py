"""`POST /v1/models/{name}/feedback`: labeled examples of any model, stored for the retrain job.

The instances come as the model's signature takes them, in TF Serving REST's row format
(`instances`: each instance's named inputs, or the value of a signature's one input), checked
against the signature (serving_default, or the model's only signature, or the body's
`signature_name`) with TF Serving's words; a signature taking the 28x28 image contract also
takes /predict's encodings (service/codecs/simple_json.py): pixel arrays (integers 0-255 or
floats in [0, 1]), `{"b64": ...}` image files, or a multipart upload of image files
(`files`). Each instance has its true label (`labels`, one per instance; in a multipart body
one `labels` field per file or one comma-separated field): for a classifier (a signature
with classes or probabilities) a class id or a label name of the serving version, for a
regressor (a `predictions` or `outputs` output) a number; and optionally the
`model_version` that answered it.

    {"instances": [{"x1": 0.5, "color": "red"}], "labels": ["high"], "model_version": "3"}
    {"instances": [<28x28>, {"b64": "..."}], "labels": ["Dress", 7]}

Each instance is stored as a tf.Example of its inputs and label (artifact/feedback/: durable
before the answer, rotated into closed shards the retrain job reads), with its sender (the
token's name the access rules found, `anonymous` without tokens) and the time it came; the
encoding and the file I/O run in a thread. Off (403 saying so) unless FEEDBACK_DIR is set.

Bounds per sender: a token bucket of FEEDBACK_BURST_IMAGES examples refilled at
FEEDBACK_RATE_PER_MINUTE (429 with Retry-After past it; a request of more examples than the
bucket holds is 413), and FEEDBACK_SENDER_SHARE of FEEDBACK_MAX_BYTES (507, as a full store).
The buckets are per process: with WORKERS=n or several replicas, a sender may post up to n
times the rate; the share is counted over every writer's shards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge
from starlette.datastructures import QueryParams

from artifact.contract import INPUT_KEY, PIXEL_MAX, SIGNATURE_NAME, normalize_pixels
from artifact.feedback import (
    LABEL_FEATURE,
    FeedbackStoreFull,
    FeedbackWriteError,
    FeedbackWriter,
    feedback_examples,
    image_examples,
    store_dir,
)
from artifact.images import INVERT_MODES
from artifact.repository import parse_version
from service.budgets import UNBOUNDED_PIXELS, PixelBudget
from service.codecs import json_body, simple_json, tfserving_json
from service.codecs.dtypes import dtype_name
from service.codecs.images import decode_image_files
from service.codecs.signatures import is_image_signature
from service.codecs.v2_metadata import v2_signature_name
from service.dataplane import DataPlane
from service.errors import (
    BadInput,
    Forbidden,
    InsufficientStorage,
    NotFound,
    NotReady,
    PayloadTooLarge,
    RateLimited,
)
from service.protocols.http import (
    FILES_SCHEMA,
    form_request,
    image_form,
    json_response,
    multipart_form,
    request_body,
)
from service.routes import MODEL_WRITE, Answers, Call, Route
from service.security import FEEDBACK
from service.types import SignatureSpec

log = logging.getLogger("service.feedback")
FEEDBACK_OFF = (
    "feedback is off on this service: set FEEDBACK_DIR to store labeled images for the retrain job"
)

CLASSIFICATION, REGRESSION = "classification", "regression"
# The outputs that make a signature a classifier's (the image contract's and TF's canned
# heads': classification signatures, `predict` of a classifier) or a regressor's.
CLASSIFIER_OUTPUTS = frozenset({"classes", "class_ids", "probabilities", "scores"})
REGRESSOR_OUTPUTS = frozenset({"predictions", "outputs"})
FLOAT32_MAX = float(np.finfo(np.float32).max)
# A signature taking only these (serialized tf.Examples, a parsing receiver) does not say
# which features an example has.
EXAMPLES_INPUTS = frozenset({"examples", "inputs"})

FEEDBACK_DOC = request_body(
    {
        "type": "object",
        "required": ["instances", "labels"],
        "properties": {
            "signature_name": {
                "type": "string",
                "description": "the signature the instances are for (default: "
                "serving_default, or the model's only signature)",
            },
            "instances": {
                "type": "array",
                "description": "TF Serving's row format for the signature: each "
                "instance's inputs by name, or the value of its one input; for "
                "28x28 image models also arrays of pixels (integers 0-255) or "
                "{'b64': '<base64 PNG or JPEG>'}",
            },
            "labels": {
                "type": "array",
                "description": "each instance's truth: a classifier's class id or "
                "label name of the serving version, a regressor's value",
            },
            "model_version": {
                "description": "the version that answered (optional)",
            },
        },
    },
    {"instances": [[[0] * 28] * 28], "labels": ["Dress"]},
    {
        "multipart/form-data": multipart_form(
            files=FILES_SCHEMA,
            labels={
                "type": "array",
                "items": {"type": "string"},
                "description": "one per file, or one comma-separated field",
            },
            model_version={"type": "string"},
        )
    },
)

FEEDBACK_ANSWER = {
    "type": "object",
    "properties": {
        "model_name": {"type": "string"},
        "stored": {"type": "integer"},
        "labels": {"type": "array"},
        "model_version": {"type": ["string", "null"]},
    },
}

QUERY = (
    {
        "name": "invert",
        "in": "query",
        "required": False,
        "description": "Uploaded/base64 images: invert to light-on-dark; 'auto' when the border "
        "is light",
        "schema": {"type": "string", "enum": list(INVERT_MODES), "default": "auto"},
    },
)


@dataclasses.dataclass
class _Bucket:
    tokens: float
    updated: float


class SenderRates:
    """A token bucket per sender: `size` images, refilled at `per_minute`; thread-safe.

    Args:
        per_minute: images per minute each sender may post; 0: no rate (every take passes).
        size: the most images a sender may post at once (a full bucket).
        clock: seconds (time.monotonic).
    """

    def __init__(self, per_minute: float, size: int, clock=time.monotonic):
        self.per_second = per_minute / 60.0
        self.size = size
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def _bucket(self, sender: str, now: float) -> _Bucket:
        bucket = self._buckets.get(sender)
        if bucket is None:
            bucket = self._buckets[sender] = _Bucket(float(self.size), now)
        else:
            bucket.tokens = min(self.size, bucket.tokens + (now - bucket.updated) * self.per_second)
            bucket.updated = now
        return bucket

    def wait(self, sender: str, count: int) -> float:
        """Seconds until the sender's bucket holds `count` images (0: now); takes nothing."""
        if not self.per_second:
            return 0.0
        with self._lock:
            bucket = self._bucket(sender, self._clock())
            return max(0.0, (count - bucket.tokens) / self.per_second)

    def take(self, sender: str, count: int) -> float:
        """Take `count` images from the sender's bucket: 0 when taken, else the seconds to
        wait (nothing taken)."""
        if not self.per_second:
            return 0.0
        with self._lock:
            bucket = self._bucket(sender, self._clock())
            if bucket.tokens + 1e-9 < count:
                return (count - bucket.tokens) / self.per_second
            bucket.tokens -= count
            return 0.0

    def give_back(self, sender: str, count: int) -> None:
        """Return what a request took that was not stored (refused by the store)."""
        if not self.per_second:
            return
        with self._lock:
            bucket = self._bucket(sender, self._clock())
            bucket.tokens = min(self.size, bucket.tokens + count)


class FeedbackAPI:
    """The feedback route over a data plane, with one store writer per model.

    Args:
        dataplane: what serves the models (their names and labels; the metrics registry).
        feedback_dir: FEEDBACK_DIR, or None when feedback is off.
        shard_examples: FEEDBACK_SHARD_IMAGES, the examples a shard holds before it closes.
        max_bytes: FEEDBACK_MAX_BYTES.
        max_body_bytes: MAX_BODY_BYTES (the most one uploaded file may be).
        max_request_pixels: MAX_REQUEST_PIXELS, the decoded pixels one request's image files
            may hold (as /predict).
        pixels_in_flight: the process's budget of pixels being decoded (MAX_PIXELS_IN_FLIGHT),
            shared with /predict; None: unbounded.
        sender_share: FEEDBACK_SENDER_SHARE, of max_bytes.
        rates: each sender's bucket (FEEDBACK_RATE_PER_MINUTE, FEEDBACK_BURST_IMAGES); None:
            no rate.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        feedback_dir: str | None,
        shard_examples: int,
        max_bytes: int,
        max_body_bytes: int,
        max_request_pixels: int = 48_000_000,
        pixels_in_flight: PixelBudget | None = None,
        sender_share: float = 1.0,
        rates: SenderRates | None = None,
    ):
        self.dataplane = dataplane
        self.feedback_dir = Path(feedback_dir) if feedback_dir else None
        self.shard_examples = shard_examples
        self.max_bytes = max_bytes
        self.max_body_bytes = max_body_bytes
        self.max_request_pixels = max_request_pixels
        self.pixels_in_flight = pixels_in_flight or UNBOUNDED_PIXELS
        self.max_sender_bytes = max(1, int(max_bytes * sender_share))
        self.rates = rates or SenderRates(0, 1)
        self._writers: dict[str, FeedbackWriter] = {}
        self._opening = asyncio.Lock()
        registry = dataplane.metrics.registry
        self.stored = Counter(
            "feedback_examples_total",
            "Labeled examples stored for the retrain job, by model and true label (a "
            "classifier's class; empty for a regressor's values).",
            ["model", "label"],
            registry=registry,
        )
        self.refused = Counter(
            "feedback_refused_total",
            "Feedback requests refused for want of room (the store's, or the sender's share) "
            "or a writable store (507), by model.",
            ["model"],
            registry=registry,
        )
        self.rate_limited = Counter(
            "feedback_rate_limited_total",
            "Feedback requests refused for their sender's rate (429), by model and sender.",
            ["model", "sender"],
            registry=registry,
        )
        self.store_bytes = Gauge(
            "feedback_store_bytes",
            "Bytes the feedback store takes, as this process last measured it, by model.",
            ["model"],
            registry=registry,
            multiprocess_mode="livemostrecent",
        )

    def routes(self) -> list[Route]:
        """The feedback route: what needs no body (feedback on, the model served, `invert`)
        is checked before the body is read. Its fixed words match in any case, as the /v1
        routes' do."""
        return [
            Route(
                "POST",
                "/v1/models/{name:name}/feedback",
                self.feedback,
                "Store labeled examples (any signature's instances) for the retrain job "
                "(FEEDBACK_DIR)",
                FEEDBACK,
                ("feedback",),
                FEEDBACK_DOC,
                Answers(schema=FEEDBACK_ANSWER, errors=(*MODEL_WRITE, 403, 429, 507)),
                QUERY,
                self.refuse_early,
                any_case=True,
                protocol="feedback",
            )
        ]

    async def start(self) -> None:
        """Open the store of every model served, which recovers the open shards that dead
        writers left (so the retrain job reads them); a store that fails is tried again at its
        first request."""
        if self.feedback_dir is None:
            return
        for name in self.dataplane.model_names():
            try:
                await self._writer(name)
            except InsufficientStorage as err:
                log.warning("%s", err)

    async def close(self) -> None:
        """Close every open shard, so the retrain job can read it."""
        for name, writer in list(self._writers.items()):
            try:
                closed = await asyncio.to_thread(writer.close)
            except OSError as err:
                log.warning("Closing the feedback shard of %s failed: %s", name, err)
                continue
            if closed is not None:
                log.info("Feedback shard closed: %s", closed)

    def refuse_early(self, params: dict, query: QueryParams) -> None:
        """Refuse before the body is read: feedback off, an unknown model, a bad `invert`."""
        if self.feedback_dir is None:
            raise Forbidden(FEEDBACK_OFF)
        name = params["name"]
        if name not in self.dataplane.model_names():
            raise NotFound(f"Could not find any versions of model {name}")
        invert = query.get("invert", "auto")
        if invert not in INVERT_MODES:
            raise BadInput(f"invert: expected one of {', '.join(INVERT_MODES)}, got {invert!r}")

    async def feedback(self, call: Call, name: str):
        """Store the body's labeled examples (refuse_early has passed)."""
        sender = call.sender
        # A sender with an empty bucket is refused before its body is parsed.
        self._check_rate(name, sender, 1, self.rates.wait(sender, 1))
        invert = call.query.get("invert", "auto")
        # Images (an image model's), or any other signature's inputs by name.
        examples: np.ndarray | dict[str, np.ndarray]
        if call.headers.get("content-type", "").startswith("multipart/form-data"):
            signature = await self._signature(name, None)
            if not is_image_signature(signature):
                raise BadInput(
                    f"multipart uploads of image files are for models that take 28x28 "
                    f"images; signature {signature.name!r} of {name} takes "
                    f"{_inputs_text(signature)}: send JSON instances in its row format"
                )
            examples, labels, version = await self._multipart(form_request(call), invert)
        else:
            # In a thread: a large body must not stall the event loop.
            request = await asyncio.to_thread(json_body.loads, call.body)
            if not isinstance(request, dict):
                raise BadInput('Request body must be a JSON object with "instances": [...]')
            signature = await self._signature(name, request.get("signature_name"))
            if is_image_signature(signature):
                examples, labels, version = await asyncio.to_thread(self._json, request, invert)
            else:
                examples, labels, version = await asyncio.to_thread(
                    self._instances, request, signature
                )
        task = feedback_task(signature)
        names = self.dataplane.class_labels(name) if task == CLASSIFICATION else None
        if task == CLASSIFICATION and names is None:
            raise NotReady(f"model {name} has no serving version yet: its labels are not known")
        count = len(examples) if isinstance(examples, np.ndarray) else tensor_rows(examples)
        truth = class_ids_of(labels, names, count) if names else values_of(labels, count)
        if count > self.rates.size and self.rates.per_second:
            raise PayloadTooLarge(
                f"{count} examples in one request; a sender may post at most "
                f"{self.rates.size} at once (FEEDBACK_BURST_IMAGES): send them in smaller "
                "requests"
            )
        encode: Callable[[], list[bytes]]
        if isinstance(examples, np.ndarray):
            pixels = np.rint(examples * PIXEL_MAX).astype(np.uint8)
            encode = functools.partial(image_examples, pixels, truth, INPUT_KEY)
        else:
            encode = functools.partial(feedback_examples, examples, truth)
        self._check_rate(name, sender, count, self.rates.take(sender, count))
        try:
            records = await asyncio.to_thread(encode)
            writer = await self._writer(name)
        except ValueError as err:  # an input of a dtype no tf.Example holds
            self.rates.give_back(sender, count)  # nothing stored: nothing counts
            raise BadInput(f"these instances cannot be stored as tf.Examples: {err}") from err
        except InsufficientStorage:
            self.rates.give_back(sender, count)
            raise
        try:
            appended = await asyncio.to_thread(writer.append, records, [version] * count, sender)
        except (FeedbackStoreFull, FeedbackWriteError) as err:
            self.rates.give_back(sender, count)
            self.refused.labels(name).inc()
            raise InsufficientStorage(str(err)) from err
        finally:
            self.store_bytes.labels(name).set(writer.used_bytes)
        if names:
            for class_id, stored in zip(*np.unique(truth, return_counts=True), strict=True):
                self.stored.labels(name, names[int(class_id)]).inc(int(stored))
        else:
            self.stored.labels(name, "").inc(count)
        if appended.closed is not None:
            log.info("Feedback shard closed: %s", appended.closed)
        return json_response(
            {
                "model_name": name,
                "stored": count,
                "labels": [names[int(k)] for k in truth] if names else truth.tolist(),
                "model_version": None if version is None else str(version),
            }
        )

    async def _signature(self, name: str, signature_name: Any) -> SignatureSpec:
        """The signature feedback is checked against: the body's `signature_name`, else
        serving_default, else the model's only signature.

        Raises:
            BadInput: no such signature, several and none named, or one that takes serialized
                tf.Examples or has an input named as the label's feature.
        """
        if signature_name is not None and not isinstance(signature_name, str):
            raise BadInput(f"signature_name: expected a string, got {signature_name!r}")
        if signature_name is None:
            metadata = await self.dataplane.metadata(name, None)
            signature_name = v2_signature_name(metadata.signatures)
            if signature_name is None:
                raise BadInput(
                    f"model {name} has no {SIGNATURE_NAME!r} signature and several others "
                    f"({', '.join(sorted(metadata.signatures))}): name the one the instances "
                    "are for with signature_name"
                )
        signature = await self.dataplane.signature(name, None, None, signature_name)
        inputs = signature.inputs
        if (
            len(inputs) == 1
            and inputs[0].name in EXAMPLES_INPUTS
            and inputs[0].dtype == np.dtype(object)
        ):
            raise BadInput(
                f"signature {signature.name!r} of {name} takes serialized tf.Examples (a "
                "parsing receiver), which do not say which features a model reads: feedback "
                "needs a signature that takes the features as its inputs (export with the raw "
                "receiver too)"
            )
        if any(spec.name == LABEL_FEATURE for spec in inputs):
            raise BadInput(
                f"signature {signature.name!r} of {name} has an input named {LABEL_FEATURE!r}, "
                "the name feedback stores each label under: feedback cannot store its examples"
            )
        feedback_task(signature)  # a model feedback can label
        return signature

    def _check_rate(self, name: str, sender: str, count: int, wait: float) -> None:
        if wait <= 0:
            return
        self.rate_limited.labels(name, sender).inc()
        per_minute = self.rates.per_second * 60
        raise RateLimited(
            f"the sender {sender} is past its rate of {per_minute:g} images a minute "
            f"(FEEDBACK_RATE_PER_MINUTE): {count} more may come in {wait:.1f} s; nothing "
            "was stored",
            max(1, math.ceil(wait)),
        )

    async def _writer(self, name: str) -> FeedbackWriter:
        writer = self._writers.get(name)
        if writer is not None:
            return writer
        if self.feedback_dir is None:
            raise Forbidden(FEEDBACK_OFF)
        async with self._opening:
            if name not in self._writers:
                writer = FeedbackWriter(
                    store_dir(self.feedback_dir, name),
                    self.shard_examples,
                    self.max_bytes,
                    max_sender_bytes=self.max_sender_bytes,
                )
                try:
                    await asyncio.to_thread(writer.open)
                except OSError as err:
                    self.refused.labels(name).inc()
                    raise InsufficientStorage(
                        f"cannot open the feedback store {writer.directory}: "
                        f"{err.strerror or err}; nothing was stored"
                    ) from err
                for path in writer.recovered:
                    log.info("Recovered the open feedback shard of a dead writer: %s", path)
                self._writers[name] = writer
            return self._writers[name]

    def _json(self, request: dict, invert: str) -> tuple[np.ndarray, list, int | None]:
        """The image contract's instances, in /predict's encodings, as float images."""
        instances = simple_json.pixel_instances(request)
        # Counted before any image is decoded.
        self.dataplane.check_image_count(len(instances))
        labels, version = _labels_and_version(request)
        images = simple_json.decode_pixel_instances(
            instances, invert, self.max_request_pixels, in_flight=self.pixels_in_flight
        )
        return images, labels, version

    def _instances(
        self, request: dict, signature: SignatureSpec
    ) -> tuple[dict[str, np.ndarray], list, int | None]:
        """Any signature's instances, in TF Serving REST's row format, typed by it."""
        if "instances" not in request:
            raise BadInput(
                "Missing 'instances' key; feedback takes the row format: 'instances', each "
                f"instance's inputs {_inputs_text(signature)}, and one of 'labels' per instance"
            )
        labels, version = _labels_and_version(request)
        inputs, _ = tfserving_json.read_inputs(
            {"instances": request["instances"]}, signature, self.dataplane.max_images, True
        )
        return inputs, labels, version

    async def _multipart(self, request, invert: str) -> tuple[np.ndarray, list, int | None]:
        form, uploads = await image_form(request, self.dataplane.max_images, self.max_body_bytes)
        files = [
            (f"files[{i}] ({upload.filename or 'no name'})", await upload.read())
            for i, upload in enumerate(uploads)
        ]
        labels: list = []
        for field in form.getlist("labels"):
            if isinstance(field, str):
                labels += [part.strip() for part in field.split(",")]
        version = model_version_of(form.get("model_version"))

        # In a thread: decoding and resizing photos must not stall the event loop.
        pixels = await asyncio.to_thread(
            decode_image_files,
            files,
            invert,
            self.max_request_pixels,
            in_flight=self.pixels_in_flight,
        )
        return normalize_pixels(pixels), labels, version


def _labels_and_version(request: dict) -> tuple[list, int | None]:
    if "labels" not in request:
        raise BadInput('Request body must have "labels": one true label per instance')
    labels = request["labels"]
    if not isinstance(labels, list):
        raise BadInput(
            f"labels: expected a list of class ids, label names or values, got {labels!r}"
        )
    return labels, model_version_of(request.get("model_version"))


def _inputs_text(signature: SignatureSpec) -> str:
    return ", ".join(
        f"{spec.name} {dtype_name(spec.dtype)}"
        + ("" if spec.shape is None else f" [{','.join(map(str, spec.shape))}]")
        for spec in signature.inputs
    )


def tensor_rows(inputs: dict[str, np.ndarray]) -> int:
    """The instances of row-format inputs (their batch dimension)."""
    return len(next(iter(inputs.values())))


def feedback_task(signature: SignatureSpec) -> str:
    """CLASSIFICATION or REGRESSION, from the signature's outputs.

    Raises:
        BadInput: a signature with neither a classifier's outputs nor a regressor's.
    """
    outputs = {spec.name for spec in signature.outputs}
    if outputs & CLASSIFIER_OUTPUTS:
        return CLASSIFICATION
    if outputs & REGRESSOR_OUTPUTS:
        return REGRESSION
    raise BadInput(
        f"signature {signature.name!r} gives {', '.join(sorted(outputs))}: feedback labels a "
        f"classifier ({', '.join(sorted(CLASSIFIER_OUTPUTS))}) or a regressor "
        f"({', '.join(sorted(REGRESSOR_OUTPUTS))}), and this is neither"
    )


def model_version_of(value) -> int | None:
    """The optional `model_version`: a version number (int64) as a number or a string."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        version = parse_version(str(value))
    elif isinstance(value, str):
        version = parse_version(value.strip())
    else:
        version = None
    if version is None:
        raise BadInput(f"model_version: expected a version number (int64), got {value!r}")
    return version


def _count_check(labels: list, count: int, what: str) -> None:
    if len(labels) != count:
        raise BadInput(
            f"labels: {len(labels)} label(s) for {count} instance(s); send one {what} per instance"
        )


def class_ids_of(labels: list, names: tuple[str, ...], count: int) -> np.ndarray:
    """Each instance's class id from a class id or a label name; BadInput naming the item."""
    _count_check(labels, count, "true label")
    classes = len(names)
    ids = []
    for i, label in enumerate(labels):
        where = f"labels[{i}]"
        if isinstance(label, int) and not isinstance(label, bool):
            if not 0 <= label < classes:
                raise BadInput(f"{where}: class id {label} is out of range 0-{classes - 1}")
            ids.append(label)
        elif isinstance(label, str):
            if label in names:
                ids.append(names.index(label))
            elif label.isascii() and label.isdigit():
                # A class id sent as text (a form field is always text).
                if int(label) >= classes:
                    raise BadInput(f"{where}: class id {label} is out of range 0-{classes - 1}")
                ids.append(int(label))
            else:
                shown = ", ".join(names) if classes <= 20 else ", ".join(names[:20]) + ", ..."
                raise BadInput(
                    f"{where}: unknown label {label[:40]!r}; the model's labels are "
                    f"{shown} (or class ids 0-{classes - 1})"
                )
        else:
            raise BadInput(
                f"{where}: expected a class id or a label name, got {type(label).__name__}"
            )
    return np.asarray(ids, np.int64)


def values_of(labels: list, count: int) -> np.ndarray:
    """A regressor's true values, finite numbers; BadInput naming the item."""
    _count_check(labels, count, "true value")
    values = []
    for i, label in enumerate(labels):
        if isinstance(label, bool) or not isinstance(label, (int, float)):
            raise BadInput(
                f"labels[{i}]: expected a number (the true value of a regressor's output), "
                f"got {type(label).__name__}"
            )
        # Compared as Python floats: a float32 bound would cast the label, and overflow.
        if not math.isfinite(label) or abs(label) > FLOAT32_MAX:
            raise BadInput(f"labels[{i}]: expected a finite number, got {label!r}")
        values.append(float(label))
    return np.asarray(values, np.float32)
