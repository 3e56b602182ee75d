"""A SavedModel whose graph reads or writes files is found from its saved_model.pb alone
(artifact/file_ops.py), wherever in what serving or loading runs the op hides: a signature,
a branch of a `tf.cond`, a loop's body, a dataset, the init op, a `tf.print` to a file. A
vocabulary table filled from the version's own asset, the restore of its variables and the
project's own exports are not refused. The service refusing such a version at load:
tests/live/service/test_file_ops_refused.py."""

from __future__ import annotations

import sys

import pytest
import tensorflow as tf

from artifact.file_ops import _ATTRIBUTE_PATHS, FILE_SYSTEM_OPS, RESTORE_OPS, file_system_problems


def save(module: tf.Module, path, function) -> str:
    tf.saved_model.save(module, str(path), signatures={"serving_default": function})
    return str(path)


STRING = tf.TensorSpec([None], tf.string)


class ReadsInItsSignature(tf.Module):
    """The review's model: a predict client names a file and gets its contents."""

    @tf.function(input_signature=[STRING])
    def serve(self, path):
        return {"contents": tf.map_fn(tf.io.read_file, path)}


class WritesInABranch(tf.Module):
    @tf.function(input_signature=[STRING])
    def serve(self, text):
        def write():
            tf.io.write_file("/tmp/never-written", text[0])
            return tf.constant(1)

        done = tf.cond(tf.size(text) > 0, write, lambda: tf.constant(0))
        return {"done": done}


class ReadsInALoop(tf.Module):
    @tf.function(input_signature=[STRING])
    def serve(self, paths):
        total = tf.constant(0)
        for i in tf.range(tf.size(paths)):
            total += tf.strings.length(tf.io.read_file(paths[i]))
        return {"total": total}


class ReadsThroughADataset(tf.Module):
    @tf.function(input_signature=[STRING])
    def serve(self, paths):
        lines = tf.data.TextLineDataset(paths).reduce(tf.constant(0), lambda n, _: n + 1)
        return {"lines": lines}


class PrintsToAFile(tf.Module):
    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    @tf.function(input_signature=[STRING])
    def serve(self, text):
        tf.print(text, output_stream=self.stream)
        return {"text": tf.identity(text)}


class Harmless(tf.Module):
    """Variables (restored at load through checkpoint reads) and a table from its values."""

    def __init__(self):
        super().__init__()
        self.scale = tf.Variable(2.0)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], [1, 2]), default_value=0
        )

    @tf.function(input_signature=[STRING])
    def serve(self, keys):
        return {"value": tf.cast(self.table.lookup(keys), tf.float32) * self.scale}


@pytest.mark.parametrize(
    "module, op, where",
    [
        pytest.param(ReadsInItsSignature(), "ReadFile", "signature 'serving_default'", id="read"),
        pytest.param(WritesInABranch(), "WriteFile", "signature 'serving_default'", id="cond"),
        pytest.param(ReadsInALoop(), "ReadFile", "signature 'serving_default'", id="while"),
        pytest.param(ReadsThroughADataset(), "TextLineDataset", "signature", id="dataset"),
        pytest.param(PrintsToAFile("file:///tmp/printed"), "PrintV2", "signature", id="print"),
    ],
)
def test_an_op_that_reaches_files_is_found_wherever_it_hides(tmp_path, module, op, where):
    problems = file_system_problems(save(module, tmp_path / "1", module.serve))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{op} (") and where in problems[0]


def test_a_model_that_reaches_no_file_passes(tmp_path):
    for number, module in enumerate((Harmless(), PrintsToAFile(sys.stderr))):
        assert file_system_problems(save(module, tmp_path / str(number), module.serve)) == []


def v1_export(path, build) -> str:
    """A TF1 SavedModel (as Estimators export): `build(keys)` makes the graph in a session and
    returns (signature outputs, init op or None); its ASSET_FILEPATHS are the assets."""
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        keys = tf.compat.v1.placeholder(tf.string, [None], name="keys")
        outputs, init_op = build(keys)
        session.run(tf.compat.v1.global_variables_initializer())
        if init_op is not None:
            session.run(init_op)
        builder = tf.compat.v1.saved_model.Builder(str(path))
        signature = tf.compat.v1.saved_model.predict_signature_def({"keys": keys}, outputs)
        builder.add_meta_graph_and_variables(
            session,
            ["serve"],
            signature_def_map={"serving_default": signature},
            main_op=init_op,
            assets_collection=tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
        )
        builder.save()
    return str(path)


def test_a_read_in_the_init_op_of_a_tf1_export_is_found(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret")

    def build(keys):
        stolen = tf.compat.v1.Variable("", name="stolen")
        init = tf.group(stolen.assign(tf.io.read_file(str(secret))))
        return {"echo": tf.identity(keys) + stolen}, init

    (problem,) = file_system_problems(v1_export(tmp_path / "1", build))
    assert problem.startswith("ReadFile (reads files)") and problem.endswith("the init op")


def test_a_vocabulary_is_read_from_the_versions_own_asset_and_nowhere_else(tmp_path):
    vocabulary = tmp_path / "vocabulary.txt"
    vocabulary.write_text("a\nb\n")

    def build(asset: bool):
        def graph(keys):
            if asset:  # a constant: TextFileInitializer makes it an asset, copied to assets/
                path = tf.constant(str(vocabulary), name="vocabulary_path")
            else:  # a path the graph computes: any file the server can read
                path = tf.strings.join([str(vocabulary.parent), "/", vocabulary.name])
            initializer = tf.lookup.TextFileInitializer(
                path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
            )  # fmt: skip
            table = tf.lookup.StaticHashTable(initializer, default_value=-1)
            init = tf.compat.v1.tables_initializer()
            return {"ids": table.lookup(keys)}, init

        return graph

    own = v1_export(tmp_path / "1", build(asset=True))
    assert (tmp_path / "1" / "assets" / "vocabulary.txt").is_file()
    assert file_system_problems(own) == [], "the version's own vocabulary"
    (problem,) = file_system_problems(v1_export(tmp_path / "2", build(asset=False)))
    assert problem.startswith("InitializeTableFromTextFileV2 (reads files)")


def test_every_listed_op_is_one_of_tensorflows():
    """A misspelt name would let its op through unseen."""
    listed = set(FILE_SYSTEM_OPS) | set(_ATTRIBUTE_PATHS) | RESTORE_OPS
    unknown = sorted(name for name in listed if not hasattr(tf.raw_ops, name))
    assert unknown == []
