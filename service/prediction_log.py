"""Prediction logging, as TF Serving's `logging_config` does it: a sampled share of the
successful predictions written as `PredictionLog` records (TF Serving's
tensorflow_serving/apis/prediction_log.proto: log_metadata and a predict_log with the
request and the response; the request's id in log_metadata.request_origin) in TFRecord
files, so TensorFlow's own tools read them (`tf.data.TFRecordDataset`, then
`PredictionLog.FromString`).

    <PREDICTION_LOG_DIR>/<model name>/
        predictions-<closed at, UTC>-<writer>-<n>.tfrecord   closed: complete, never written again
        .open-<writer>.tfrecord                              the file being written

Each process writes its own file and closes it (renamed, atomically) every
PREDICTION_LOG_FILE_RECORDS records and at shutdown. The logs rotate within
PREDICTION_LOG_MAX_BYTES for the folder: a record that would not fit removes the oldest
closed files (of any model and writer) until it does; only when no closed file is left to
remove is it dropped (and counted). A file left open by a dead process is cut back to its
last whole record and closed by the next process to start. Predictions are the clients'
data: files are made readable by the service's user only (0600, folders 0700).

The request path pays for a random draw and a queue put: the records are serialized and
written by one thread of their own; when it falls behind, predictions are dropped (counted),
never waited for. TF Serving's protos import TensorFlow, which the service's fast tier must
not load: the app imports this module only when PREDICTION_LOG_SAMPLING_RATE > 0, and the
module imports the protos only when a logger is made.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import queue
import random
import struct
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from artifact.contract import INPUT_KEY
from artifact.feedback import store_bytes, writer_id
from artifact.logs import current_request
from service.types import Inputs, PredictResult

log = logging.getLogger("service.prediction_log")

OPEN_PREFIX = ".open-"
CLOSED_PREFIX = "predictions-"
SUFFIX = ".tfrecord"
QUEUE_SIZE = 1024
# A TFRecord: uint64 length, uint32 masked crc32c of the length, data, uint32 masked crc32c.
RECORD_OVERHEAD = 16
# The clients' images and the model's answers: for the service's user only.
FILE_MODE = 0o600
DIR_MODE = 0o700


def whole_records_length(path: Path) -> int:
    """Bytes of a TFRecord file up to the end of its last whole record (the framing's
    lengths only: the checksums are TensorFlow's business when the file is read)."""
    size = path.stat().st_size
    end = 0
    with open(path, "rb") as f:
        while end + 12 <= size:
            f.seek(end)
            (length,) = struct.unpack("<Q", f.read(8))
            if end + RECORD_OVERHEAD + length > size:
                break
            end += RECORD_OVERHEAD + length
    return end


def closed_logs(directory: str | Path) -> list[Path]:
    """A model's closed prediction log files, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f"{CLOSED_PREFIX}*{SUFFIX}"))


class _ModelLog:
    """One model's open log file, written by TensorFlow's TFRecordWriter and locked (flock)
    through a descriptor of our own, so other processes can tell it is alive."""

    def __init__(self, tf, directory: Path, writer: str):
        self.tf = tf
        self.directory = directory
        self.writer = writer
        self.path = directory / f"{OPEN_PREFIX}{writer}{SUFFIX}"
        self.records = 0
        self.sequence = 0
        # A tf.io.TFRecordWriter while a file is open.
        self._file: Any = None
        self._lock_fd: int | None = None

    def write(self, record: bytes) -> None:
        if self._file is None:
            self._lock_fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._file = self.tf.io.TFRecordWriter(str(self.path))
        self._file.write(record)
        self._file.flush()
        self.records += 1

    def close(self) -> Path | None:
        """Close the open file as a closed one (fsynced, renamed); None when none is open."""
        fd = self._lock_fd
        if self._file is None or fd is None:
            return None
        self._file.close()
        self._file = None
        os.fsync(fd)
        self.sequence += 1
        target = self.directory / _closed_name(self.writer, self.sequence)
        os.rename(self.path, target)
        os.close(fd)
        self._lock_fd = None
        self.records = 0
        return target


def _closed_name(writer: str, sequence: int) -> str:
    closed_at = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{CLOSED_PREFIX}{closed_at}-{writer}-{sequence}{SUFFIX}"


def recover_dead_files(directory: Path) -> list[Path]:
    """Close the open files of dead writers (no flock on them), cut to their whole records."""
    recovered = []
    for path in sorted(directory.glob(f"{OPEN_PREFIX}*{SUFFIX}")):
        fd = os.open(path, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its writer is alive
            os.ftruncate(fd, whole_records_length(path))
            os.fsync(fd)
            if os.fstat(fd).st_size == 0:
                path.unlink()
                continue
            dead = path.name[len(OPEN_PREFIX) : -len(SUFFIX)]
            target = directory / _closed_name(dead, 0)
            os.rename(path, target)
            recovered.append(target)
        finally:
            os.close(fd)
    return recovered


class PredictionLogger:
    """The data plane's `on_prediction` callback: samples, queues, and writes in a thread.

    Args:
        directory: PREDICTION_LOG_DIR (a folder per model is made under it).
        sampling_rate: the share of predictions logged, in (0, 1].
        file_records: records per file before it is closed.
        max_bytes: most bytes the folder may take.
        registry: the app's Prometheus registry, for the logged and dropped counters.
        seed: the sampler's seed (tests); None = random.
    """

    def __init__(
        self,
        directory: str | Path,
        sampling_rate: float,
        file_records: int,
        max_bytes: int,
        registry: CollectorRegistry,
        seed: int | None = None,
    ):
        # TensorFlow (and TF Serving's protos, which import it) only now: logging is on.
        import tensorflow as tf
        from tensorflow_serving.apis import prediction_log_pb2

        self._tf = tf
        self._pb = prediction_log_pb2
        self.directory = Path(directory)
        self.sampling_rate = sampling_rate
        self.file_records = file_records
        self.max_bytes = max_bytes
        self.writer = writer_id()
        self._random = random.Random(seed)
        self._queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self._logs: dict[str, _ModelLog] = {}
        self._used = 0
        self._full_warned = False
        self._thread: threading.Thread | None = None
        self.logged = Counter(
            "prediction_log_records_total",
            "Predictions written to the prediction log, by model.",
            ["model"],
            registry=registry,
        )
        self.dropped = Counter(
            "prediction_log_dropped_total",
            "Sampled predictions not logged, by model and why (queue_full, max_bytes, error).",
            ["model", "reason"],
            registry=registry,
        )

    def start(self) -> None:
        """Create the folder, close dead writers' files, measure it, start the writer thread.

        Raises:
            OSError: the folder cannot be created or written.
        """
        self.directory.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        for model_dir in [p for p in self.directory.iterdir() if p.is_dir()]:
            for path in recover_dead_files(model_dir):
                log.info("Recovered the prediction log of a dead writer: %s", path)
        self._used = store_bytes(self.directory)
        self._thread = threading.Thread(target=self._run, name="prediction-log", daemon=True)
        self._thread.start()

    def __call__(
        self, name: str, signature_name: str, images: Inputs, result: PredictResult
    ) -> None:
        """Sample one prediction (on the event loop: a draw and a queue put, no I/O), with the
        id of the request it answers."""
        if self._random.random() >= self.sampling_rate:
            return
        request = current_request.get()
        request_id = request.request_id if request is not None else ""
        try:
            self._queue.put_nowait((name, signature_name, images, result, request_id))
        except queue.Full:
            self.dropped.labels(name, "queue_full").inc()

    def close(self) -> None:
        """Write what is queued, close every open file, stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        for model_log in self._logs.values():
            try:
                closed = model_log.close()
            except OSError as err:
                log.warning("Closing the prediction log %s failed: %s", model_log.path, err)
                continue
            if closed is not None:
                log.info("Prediction log closed: %s", closed)

    def record(
        self,
        name: str,
        signature_name: str,
        images: Inputs,
        result: PredictResult,
        request_id: str = "",
    ) -> bytes:
        """One PredictionLog, serialized: TF Serving's request and response for a prediction.

        The request's id (its X-Request-ID, or the one the service gave it) is written in
        `log_metadata.request_origin`: TF Serving's LogMetadata has no field for a request id,
        and leaves this one (a string saying where the request came from) empty.
        """
        tf, entry = self._tf, self._pb.PredictionLog()
        spec = entry.log_metadata.model_spec
        spec.name, spec.signature_name = name, signature_name
        spec.version.value = result.version
        if request_id:
            entry.log_metadata.request_origin = request_id
        entry.log_metadata.sampling_config.sampling_rate = self.sampling_rate
        entry.log_metadata.saved_model_tags.append("serve")
        request, response = entry.predict_log.request, entry.predict_log.response
        request.model_spec.CopyFrom(spec)
        if isinstance(images, dict):
            for key, value in images.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        else:
            request.inputs[INPUT_KEY].CopyFrom(tf.make_tensor_proto(images, tf.float32))
        response.model_spec.CopyFrom(spec)
        for key, value in result.outputs.items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
        return entry.SerializeToString()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name = item[0]
            try:
                self._write(name, self.record(*item))
            except Exception:  # noqa: BLE001 - the thread must outlive any one failure
                self.dropped.labels(name, "error").inc()
                log.exception("Writing the prediction log of %s failed", name)

    def _make_room(self, size: int) -> None:
        """Remove the oldest closed files (every model's, every writer's: their names start
        with the time they were closed) until `size` more bytes fit, or none is left."""
        closed = sorted(
            (path for folder in self.directory.iterdir() if folder.is_dir()
             for path in closed_logs(folder)),
            key=lambda path: path.name,
        )  # fmt: skip
        # Measured afresh: other processes write here too.
        self._used = store_bytes(self.directory)
        for path in closed:
            if self._used + size <= self.max_bytes:
                return
            try:
                freed = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue  # another process removed it first
            self._used -= freed
            log.info("Prediction log over PREDICTION_LOG_MAX_BYTES: removed the oldest %s", path)

    def _write(self, name: str, record: bytes) -> None:
        size = len(record) + RECORD_OVERHEAD
        if self._used + size > self.max_bytes:
            self._make_room(size)
        if self._used + size > self.max_bytes:
            self.dropped.labels(name, "max_bytes").inc()
            if not self._full_warned:
                log.warning(
                    "The prediction log %s reached PREDICTION_LOG_MAX_BYTES=%s with no closed "
                    "file left to remove: sampled predictions are dropped until it has room",
                    self.directory,
                    f"{self.max_bytes:,}",
                )
                self._full_warned = True
            return
        model_log = self._logs.get(name)
        if model_log is None:
            folder = self.directory / name
            folder.mkdir(exist_ok=True, mode=DIR_MODE)
            model_log = self._logs[name] = _ModelLog(self._tf, folder, self.writer)
        model_log.write(record)
        self._used += size
        self.logged.labels(name).inc()
        if model_log.records >= self.file_records:
            closed = model_log.close()
            log.info("Prediction log closed: %s", closed)
            # Other processes write here too: measured afresh once a file.
            self._used = store_bytes(self.directory)
            self._full_warned = self._full_warned and self._used + size > self.max_bytes
