"""The IDX reader's validation and the tf.data input functions, on small generated files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from artifact.contract import INPUT_KEY
from training import data
from training.data import IMAGES_MAGIC, LABELS_MAGIC, DataError

# ---------------------------------------------------------------------------------------------
# Helpers: raw IDX bytes with any header, written gzipped or not under either spelling.


def make_examples(n: int = 7, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n uint8 images [n, 28, 28] and labels [n]; pixel 0 and 255 both occur."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255
    labels = (np.arange(n) % 10).astype(np.uint8)
    return images, labels


def images_bytes(images: np.ndarray, magic: int = IMAGES_MAGIC, count: int | None = None) -> bytes:
    n, rows, cols = images.shape
    header = struct.pack(">IIII", magic, n if count is None else count, rows, cols)
    return header + np.ascontiguousarray(images, np.uint8).tobytes()


def labels_bytes(labels: np.ndarray, magic: int = LABELS_MAGIC, count: int | None = None) -> bytes:
    header = struct.pack(">II", magic, len(labels) if count is None else count)
    return header + np.ascontiguousarray(labels, np.uint8).tobytes()


def file_name(kind: str, split: str = "train", dotted: bool = False, gz: bool = True) -> str:
    prefix = data.SPLITS[split]
    ndim = 3 if kind == "images" else 1
    sep = "." if dotted else "-"
    return f"{prefix}-{kind}{sep}idx{ndim}-ubyte" + (".gz" if gz else "")


def put(directory: Path, name: str, raw: bytes, compress: bool | None = None) -> Path:
    """Write raw bytes to directory/name, gzipping them when compress (default: name ends .gz)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if compress is None:
        compress = name.endswith(".gz")
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def write_split(
    directory: Path,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    split="train",
    dotted=False,
    gz=True,
    images_raw=None,
    labels_raw=None,
) -> tuple[Path, Path]:
    """Write a split from arrays (or from given raw bytes); returns (images_path, labels_path)."""
    images_path = put(
        directory,
        file_name("images", split, dotted, gz),
        images_bytes(images) if images_raw is None else images_raw,
    )
    labels_path = put(
        directory,
        file_name("labels", split, dotted, gz),
        labels_bytes(labels) if labels_raw is None else labels_raw,
    )
    return images_path, labels_path  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Reading valid files.


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("dotted", [False, True], ids=["idx3-ubyte", "dot-idx3-ubyte"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_load_split_reads_both_spellings_gzipped_or_not(tmp_path, split, dotted, gz):
    images, labels = make_examples()
    images_path, labels_path = write_split(
        tmp_path, images, labels, split=split, dotted=dotted, gz=gz
    )
    assert ("." if dotted else "-") + "idx3-ubyte" in images_path.name

    described, got_images, got_labels = data.load_split(tmp_path, split)

    assert described == data.IdxSplit(str(images_path), str(labels_path), len(images))
    assert got_images.dtype == np.uint8 and got_images.shape == (7, 28, 28)
    assert got_labels.dtype == np.uint8 and got_labels.shape == (7,)
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)
    assert data.load_split(tmp_path, split)[0] == described


@pytest.mark.parametrize("compress", [True, False], ids=["gzip", "plain"])
def test_write_idx_round_trips(tmp_path, compress):
    images, labels = make_examples(12)
    written = data.write_idx(tmp_path, "test", images, labels, compress=compress)
    assert Path(written.images_path).name == file_name("images", "test", gz=compress)
    assert Path(written.labels_path).name == file_name("labels", "test", gz=compress)
    np.testing.assert_array_equal(data.read_images(written.images_path), images)
    np.testing.assert_array_equal(data.read_labels(written.labels_path), labels)
    assert data.load_split(tmp_path, "test")[0] == written


def test_gzipped_file_is_preferred_over_plain_one(tmp_path):
    images, labels = make_examples()
    write_split(tmp_path, images, labels, gz=False)
    gz_images, gz_labels = write_split(tmp_path, images[::-1], labels[::-1], gz=True)
    described, got_images, _ = data.load_split(tmp_path, "train")
    assert (described.images_path, described.labels_path) == (str(gz_images), str(gz_labels))
    np.testing.assert_array_equal(got_images, images[::-1])


# ---------------------------------------------------------------------------------------------
# Every bad input raises DataError naming the file and the problem.


# Each case_* builds a bad data dir under tmp and returns (data_dir, split, path, fragments):
# load_split(data_dir, split) must raise DataError starting with "path: " and containing them.


def case_missing_data_dir(tmp):
    missing = tmp / "no-such-dir"
    return missing, "train", missing, ["data directory not found"]


def case_data_dir_is_a_file(tmp):
    path = put(tmp, "not-a-dir", b"x")
    return path, "train", path, ["data directory not found"]


def case_missing_images_file(tmp):
    images, labels = make_examples()
    put(tmp, file_name("labels"), labels_bytes(labels))
    return tmp, "train", tmp / file_name("images"), ["file not found", "nor without .gz"]


def case_missing_labels_file(tmp):
    images, labels = make_examples()
    put(tmp, file_name("images"), images_bytes(images))
    return tmp, "train", tmp / file_name("labels"), ["file not found"]


def case_missing_test_split(tmp):
    images, labels = make_examples()
    write_split(tmp, images, labels, split="train")
    return tmp, "test", tmp / "t10k-images-idx3-ubyte.gz", ["file not found"]


def case_images_wrong_magic(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images, labels, images_raw=images_bytes(images, magic=2049))
    return tmp, "train", path, ["wrong magic number 0x00000801", "expected 0x00000803"]


def case_labels_wrong_magic(tmp):
    images, labels = make_examples()
    _, path = write_split(tmp, images, labels, labels_raw=labels_bytes(labels, magic=2051))
    return tmp, "train", path, ["wrong magic number 0x00000803", "expected 0x00000801"]


def case_images_file_holds_labels(tmp):
    images, labels = make_examples()
    many_labels = np.zeros(100, np.uint8)  # long enough for an images header
    path, _ = write_split(tmp, images, labels, images_raw=labels_bytes(many_labels))
    return tmp, "train", path, ["wrong magic number 0x00000801"]


def case_images_truncated_plain(tmp):
    images, labels = make_examples()
    raw = images_bytes(images)[:-100]
    path, _ = write_split(tmp, images, labels, gz=False, images_raw=raw)
    return tmp, "train", path, ["truncated", "header says 7 images", f"file has {len(raw)}"]


def case_labels_truncated_plain(tmp):
    images, labels = make_examples()
    _, path = write_split(tmp, images, labels, gz=False, labels_raw=labels_bytes(labels)[:-1])
    return tmp, "train", path, ["truncated", "header says 7 labels"]


def case_images_header_too_short(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images, labels, gz=False, images_raw=images_bytes(images)[:10])
    return tmp, "train", path, ["too short for an IDX images header (10 bytes)"]


def case_labels_empty_file(tmp):
    images, labels = make_examples()
    _, path = write_split(tmp, images, labels, gz=False, labels_raw=b"")
    return tmp, "train", path, ["too short for an IDX labels header (0 bytes)"]


def case_images_truncated_gzip(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images, labels)
    path.write_bytes(path.read_bytes()[:-200])
    return tmp, "train", path, ["truncated gzip stream"]


def case_labels_truncated_gzip(tmp):
    images, labels = make_examples()
    _, path = write_split(tmp, images, labels)
    path.write_bytes(path.read_bytes()[:12])
    return tmp, "train", path, ["truncated gzip stream"]


def case_images_corrupt_gzip(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images, labels)
    raw = bytearray(path.read_bytes())
    raw[-6] ^= 0xFF  # inside the CRC32 trailer
    path.write_bytes(bytes(raw))
    return tmp, "train", path, ["corrupt gzip data"]


def case_images_trailing_bytes(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images, labels, images_raw=images_bytes(images) + b"\0" * 5)
    return tmp, "train", path, ["has trailing bytes", "header says 7 images"]


def case_labels_trailing_bytes(tmp):
    images, labels = make_examples()
    _, path = write_split(tmp, images, labels, gz=False, labels_raw=labels_bytes(labels) + b"\1")
    return tmp, "train", path, ["has trailing bytes", "header says 7 labels"]


def case_count_mismatch(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images[:5], labels[:4])
    return tmp, "train", path, ["5 images but", file_name("labels"), "has 4 labels"]


def case_image_size_27x28(tmp):
    images, labels = make_examples()
    small = images[:, :27, :]
    path, _ = write_split(tmp, images, labels, images_raw=images_bytes(small))
    return tmp, "train", path, ["images are 27x28, expected 28x28"]


def case_image_size_28x27(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images, labels, gz=False, images_raw=images_bytes(images[:, :, 1:]))
    return tmp, "train", path, ["images are 28x27, expected 28x28"]


def case_label_10(tmp):
    images, labels = make_examples()
    labels = labels.copy()
    labels[3] = 10
    _, path = write_split(tmp, images, labels)
    return tmp, "train", path, ["label 10 at index 3 is outside 0-9"]


def case_label_255(tmp):
    images, labels = make_examples()
    labels = labels.copy()
    labels[-1] = 255
    _, path = write_split(tmp, images, labels, gz=False)
    return tmp, "train", path, ["label 255 at index 6 is outside 0-9"]


def case_images_named_gz_not_gzip(tmp):
    images, labels = make_examples()
    path = put(tmp, file_name("images"), images_bytes(images), compress=False)
    put(tmp, file_name("labels"), labels_bytes(labels))
    return tmp, "train", path, ["named .gz but is not gzip data"]


def case_labels_named_gz_not_gzip(tmp):
    images, labels = make_examples()
    put(tmp, file_name("images", dotted=True), images_bytes(images))
    path = put(tmp, file_name("labels", dotted=True), labels_bytes(labels), compress=False)
    return tmp, "train", path, ["named .gz but is not gzip data"]


def case_dotted_spelling_wrong_magic(tmp):
    images, labels = make_examples()
    path, _ = write_split(
        tmp, images, labels, dotted=True, gz=False, images_raw=images_bytes(images, magic=0)
    )
    return tmp, "train", path, ["wrong magic number 0x00000000"]


def case_empty_split(tmp):
    images, labels = make_examples()
    path, _ = write_split(tmp, images[:0], labels[:0])
    return tmp, "train", path, ["holds no images"]


BAD_CASES = [
    pytest.param(case_missing_data_dir, id="missing_data_dir"),
    pytest.param(case_data_dir_is_a_file, id="data_dir_is_a_file"),
    pytest.param(case_missing_images_file, id="missing_images_file"),
    pytest.param(case_missing_labels_file, id="missing_labels_file"),
    pytest.param(case_missing_test_split, id="missing_test_split"),
    pytest.param(case_images_wrong_magic, id="images_wrong_magic"),
    pytest.param(case_labels_wrong_magic, id="labels_wrong_magic"),
    pytest.param(case_images_file_holds_labels, id="images_file_holds_labels"),
    pytest.param(case_images_truncated_plain, id="images_truncated_plain"),
    pytest.param(case_labels_truncated_plain, id="labels_truncated_plain"),
    pytest.param(case_images_header_too_short, id="images_header_too_short"),
    pytest.param(case_labels_empty_file, id="labels_empty_file"),
    pytest.param(case_images_truncated_gzip, id="images_truncated_gzip"),
    pytest.param(case_labels_truncated_gzip, id="labels_truncated_gzip"),
    pytest.param(case_images_corrupt_gzip, id="images_corrupt_gzip"),
    pytest.param(case_images_trailing_bytes, id="images_trailing_bytes"),
    pytest.param(case_labels_trailing_bytes, id="labels_trailing_bytes"),
    pytest.param(case_count_mismatch, id="count_mismatch"),
    pytest.param(case_image_size_27x28, id="image_size_27x28"),
    pytest.param(case_image_size_28x27, id="image_size_28x27"),
    pytest.param(case_label_10, id="label_10"),
    pytest.param(case_label_255, id="label_255"),
    pytest.param(case_images_named_gz_not_gzip, id="images_named_gz_not_gzip"),
    pytest.param(case_labels_named_gz_not_gzip, id="labels_named_gz_not_gzip"),
    pytest.param(case_dotted_spelling_wrong_magic, id="dotted_spelling_wrong_magic"),
    pytest.param(case_empty_split, id="empty_split"),
]


@pytest.mark.parametrize("build", BAD_CASES)
def test_bad_input_raises_data_error_naming_file_and_problem(tmp_path, build):
    data_dir, split, path, fragments = build(tmp_path)
    with pytest.raises(DataError) as excinfo:
        data.load_split(data_dir, split)
    message = str(excinfo.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message


def test_read_bytes_on_unreadable_path(tmp_path):
    with pytest.raises(DataError, match=f"^{tmp_path}: cannot read: "):
        data.read_bytes(tmp_path)  # a directory


def test_read_images_and_labels_directly_validate(tmp_path):
    images, labels = make_examples()
    images_path = put(tmp_path, "imgs", images_bytes(images))
    labels_path = put(tmp_path, "lbls.gz", labels_bytes(labels))
    np.testing.assert_array_equal(data.read_images(images_path), images)
    np.testing.assert_array_equal(data.read_labels(labels_path), labels)
    with pytest.raises(DataError, match=f"^{labels_path}: too short for an IDX images header"):
        data.read_images(labels_path)
    with pytest.raises(DataError, match=f"^{images_path}: wrong magic number 0x00000803"):
        data.read_labels(images_path)


# ---------------------------------------------------------------------------------------------
# The tf.data pipeline (eager iteration; the Estimator builds the same ops in a graph).


def _numpy_batches(ds):
    return [(f[INPUT_KEY].numpy(), y.numpy()) for f, y in ds]


@pytest.mark.parametrize("dotted", [False, True], ids=["idx3-ubyte", "dot-idx3-ubyte"])
@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_dataset_yields_normalized_images_and_int32_labels(tmp_path, gz, dotted):
    images, labels = make_examples(11)
    write_split(tmp_path, images, labels, gz=gz, dotted=dotted)
    split = data.load_split(tmp_path, "train")[0]
    ds = data.dataset(split)

    features_spec, label_spec = ds.element_spec
    assert set(features_spec) == {INPUT_KEY}
    assert features_spec[INPUT_KEY] == tf.TensorSpec([28, 28], tf.float32)
    assert label_spec == tf.TensorSpec([], tf.int32)

    elements = _numpy_batches(ds)
    assert len(elements) == len(images)
    got_images = np.stack([image for image, _ in elements])
    got_labels = np.array([label for _, label in elements])
    assert got_images.dtype == np.float32 and got_labels.dtype == np.int32
    assert got_images.min() == 0.0 and got_images.max() == 1.0
    np.testing.assert_allclose(got_images, images.astype(np.float32) / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(got_labels, labels)


def test_gzip_data_in_a_file_not_named_gz_is_rejected_or_read(tmp_path):
    """read_bytes() accepts gzip content whatever the name, so the pipeline must read it too.

    (Rejecting such a file up front with a DataError naming it would be a fine fix as well.)
    """
    images, labels = make_examples()
    for kind, raw in (("images", images_bytes(images)), ("labels", labels_bytes(labels))):
        put(tmp_path, file_name(kind, gz=False), raw, compress=True)
    try:
        split = data.load_split(tmp_path, "train")[0]
    except DataError as err:
        assert str(err).startswith(str(tmp_path / file_name("images", gz=False)))
        return
    got = _numpy_batches(data.dataset(split))
    np.testing.assert_allclose(np.stack([x for x, _ in got]), images / 255.0, atol=1e-7)
    np.testing.assert_array_equal([y for _, y in got], labels)


def _sized_split(tmp_path, n):
    """n examples whose image is filled with its own index, so pairs can be checked."""
    images = np.repeat(np.arange(n, dtype=np.uint8)[:, None, None] * 10, 28 * 28).reshape(n, 28, 28)
    labels = (np.arange(n) % 10).astype(np.uint8)
    write_split(tmp_path, images, labels)
    return data.load_split(tmp_path, "train")[0], images, labels


def test_train_input_fn_batches_shuffles_and_repeats(tmp_path):
    n, batch_size = 20, 8
    split, _, labels = _sized_split(tmp_path, n)
    ds = data.train_input_fn(split, batch_size, seed=1)
    features_spec, label_spec = ds.element_spec
    assert features_spec[INPUT_KEY] == tf.TensorSpec([None, 28, 28], tf.float32)
    assert label_spec == tf.TensorSpec([None], tf.int32)
    assert ds.cardinality().numpy() == tf.data.INFINITE_CARDINALITY

    epochs = 4
    batches = _numpy_batches(ds.take(3 * epochs))
    # Batched within each epoch, then repeated: 8, 8, 4 per pass over the 20 examples.
    assert [len(y) for _, y in batches] == [8, 8, 4] * epochs
    orders = []
    for e in range(epochs):
        epoch = batches[3 * e : 3 * e + 3]
        images = np.concatenate([x for x, _ in epoch])
        epoch_labels = np.concatenate([y for _, y in epoch])
        index = np.rint(images[:, 0, 0] * 255 / 10).astype(int)
        assert sorted(index) == list(range(n))  # every example exactly once per epoch
        np.testing.assert_array_equal(epoch_labels, labels[index])  # pairs stay together
        assert (images == images[:, :1, :1]).all()  # whole images, not mixed pixels
        orders.append(tuple(index))
    assert tuple(range(n)) not in orders, "training data is not shuffled"
    assert len(set(orders)) == epochs, "training data is not reshuffled each epoch"

    again = _numpy_batches(data.train_input_fn(split, batch_size, seed=1).take(3))
    for (x1, y1), (x2, y2) in zip(batches[:3], again, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_eval_input_fn_covers_the_split_once_in_order(tmp_path):
    n, batch_size = 20, 8
    split, images, labels = _sized_split(tmp_path, n)
    ds = data.eval_input_fn(split, batch_size)
    batches = _numpy_batches(ds)  # terminates: one pass, not repeated
    assert [len(y) for _, y in batches] == [8, 8, 4]
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), labels)
    np.testing.assert_allclose(
        np.concatenate([x for x, _ in batches]), images / np.float32(255), atol=1e-7
    )


def test_eval_input_fn_on_real_sized_split(small_data_dir, small_test_data):
    split = data.load_split(small_data_dir, "test")[0]
    images, labels = small_test_data
    batches = _numpy_batches(data.eval_input_fn(split, 128))
    assert [len(y) for _, y in batches] == [128, 128, 44]
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), labels)
    np.testing.assert_allclose(np.concatenate([x for x, _ in batches]), images / 255.0, atol=1e-7)


def test_input_fns_in_graph_mode_do_not_embed_the_data(tmp_path):
    """The Estimator calls input_fn in a graph: pixels are read by ops, not stored as constants."""
    n = 300
    images, labels = make_examples(n)
    write_split(tmp_path, images, labels)
    split = data.load_split(tmp_path, "train")[0]
    with tf.Graph().as_default() as graph:
        ds = data.eval_input_fn(split, 100)
        features, got_labels = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        assert graph.as_graph_def().ByteSize() < images.nbytes / 10
        with tf.compat.v1.Session() as session:
            x, y = session.run([features[INPUT_KEY], got_labels])
    assert x.shape == (100, 28, 28) and y.shape == (100,)
    np.testing.assert_allclose(x, images[:100] / 255.0, atol=1e-7)
    np.testing.assert_array_equal(y, labels[:100])


def test_predict_input_fn_normalizes_uint8_and_keeps_floats(tmp_path):
    images, _ = make_examples(5)
    ds = data.predict_input_fn(images, 2)
    assert ds.element_spec == {INPUT_KEY: tf.TensorSpec([None, 28, 28], tf.float32)}
    got = np.concatenate([b[INPUT_KEY].numpy() for b in ds])
    np.testing.assert_allclose(got, images / 255.0, atol=1e-7)

    floats = images.astype(np.float64) / 255.0
    got = np.concatenate([b[INPUT_KEY].numpy() for b in data.predict_input_fn(floats, 3)])
    np.testing.assert_allclose(got, floats, atol=1e-7)
