"""Which operations of a SavedModel's graph reach the file system, read before it is loaded.

A SavedModel is a program, and TensorFlow has ops that read and write files named by the
graph (`tf.io.read_file`, `tf.io.write_file`, checkpoint savers, file datasets, summary
writers...). A model whose signature calls one could answer a request with `/etc/passwd`, or
write during its warmup. `file_system_problems` walks what the service would run of a
version, from its saved_model.pb alone, before `tf.saved_model.load` runs any of it:

- its signatures (every request and the warmup go through one), and what loading runs: the
  init op (the `__saved_model_init_op` signature, or TF1's `saved_model_main_op` and
  `legacy_init_op` collections) and the functions of the object graph (TF2: a resource's
  initializer runs at load);
- from each root, every node it depends on (inputs and control inputs), every function a
  node calls (by its op name or a function-valued attribute: `PartitionedCall`'s `f`, `If`'s
  branches, `While`'s body, a dataset's map function...), and every node of those functions.

Each op found is checked against `FILE_SYSTEM_OPS`, a deny-list of the ops whose kernels
open a path the graph gives them at run time (as an input tensor or an attribute), or
configure the file systems; ops that take a path only through an attribute are refused only
when the attribute names a file (`PrintV2`'s `output_stream`, the proto codecs'
`descriptor_source`). The restore op a TF1 loader runs to read the variables
(`saver_def.restore_op_name`) is walked too, and there the checkpoint reads
(`RESTORE_OPS`) are what it is for; any other listed op there is refused. A lookup table
filled from a text file is allowed in the graph itself when the file is one of the version's
assets (an Estimator's vocabulary file: the loader feeds that tensor the path in `assets/`);
inside a function, where the path comes from is not followed, and it is refused. Ops a
kernel library adds (not TensorFlow's own) cannot be loaded by the service at all.

What the list cannot see: what an allowed op does with the data it is given, and a kernel's
own bugs. Serve models whose exporter you trust (docs/security.md, "Models are code").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from tensorflow.core.protobuf import saved_model_pb2

from artifact.repository import SAVED_MODEL_FILE

_READS = "reads files"
_WRITES = "writes files"
_READS_CHECKPOINTS = "reads checkpoint files"
_WRITES_CHECKPOINTS = "writes checkpoint files"

# op type -> what it does to the file system. Checked against TensorFlow's own op registry
# by the tests (tests/live/artifact/test_file_ops.py), so a misspelt name cannot hide.
FILE_SYSTEM_OPS: dict[str, str] = {
    # tf.io: whole files, and the file names a pattern matches.
    "ReadFile": _READS,
    "WriteFile": _WRITES,
    "MatchingFiles": "lists files",
    "ImmutableConst": "maps a file into memory",
    "FileSystemSetConfiguration": "configures the file systems",
    # Checkpoints (tf.train.Saver, tf.train.Checkpoint) and what reads them.
    "Save": _WRITES_CHECKPOINTS,
    "SaveSlices": _WRITES_CHECKPOINTS,
    "SaveV2": _WRITES_CHECKPOINTS,
    "MergeV2Checkpoints": _WRITES_CHECKPOINTS,
    "Restore": _READS_CHECKPOINTS,
    "RestoreSlice": _READS_CHECKPOINTS,
    "RestoreV2": _READS_CHECKPOINTS,
    "LoadAndRemapMatrix": _READS_CHECKPOINTS,
    "GenerateVocabRemapping": _READS,
    # Lookup tables filled from a text file.
    "InitializeTableFromTextFile": _READS,
    "InitializeTableFromTextFileV2": _READS,
    # tf.data: datasets that read files, list them, or write them.
    "TFRecordDataset": _READS,
    "TFRecordDatasetV2": _READS,
    "TextLineDataset": _READS,
    "FixedLengthRecordDataset": _READS,
    "FixedLengthRecordDatasetV2": _READS,
    "CSVDataset": _READS,
    "CSVDatasetV2": _READS,
    "ExperimentalCSVDataset": _READS,
    "LMDBDataset": _READS,
    "ExperimentalLMDBDataset": _READS,
    "SqlDataset": _READS,
    "ExperimentalSqlDataset": _READS,
    "MatchingFilesDataset": "lists files",
    "ExperimentalMatchingFilesDataset": "lists files",
    "RecordInput": _READS,
    "CacheDataset": _WRITES,
    "CacheDatasetV2": _WRITES,
    "SaveDataset": _WRITES,
    "SaveDatasetV2": _WRITES,
    "LoadDataset": _READS,
    "DistributedSave": _WRITES,
    "SnapshotDataset": _WRITES,
    "SnapshotDatasetV2": _WRITES,
    "SnapshotDatasetReader": _READS,
    "SnapshotNestedDatasetReader": _READS,
    "SnapshotChunkDataset": _READS,
    "ListSnapshotChunksDataset": "lists files",
    "DatasetToTFRecord": _WRITES,
    "ExperimentalDatasetToTFRecord": _WRITES,
    # TF1 readers (the file names come from a queue).
    "WholeFileReader": _READS,
    "WholeFileReaderV2": _READS,
    "TextLineReader": _READS,
    "TextLineReaderV2": _READS,
    "TFRecordReader": _READS,
    "TFRecordReaderV2": _READS,
    "FixedLengthRecordReader": _READS,
    "FixedLengthRecordReaderV2": _READS,
    "LMDBReader": _READS,
    # Summary writers (event files, or an SQLite database).
    "CreateSummaryFileWriter": _WRITES,
    "CreateSummaryDbWriter": _WRITES,
    # tfdbg: tensors dumped to a folder or URL named by an attribute.
    "DebugIdentity": _WRITES,
    "DebugIdentityV2": _WRITES,
    "DebugIdentityV3": _WRITES,
    "DebugNanCount": _WRITES,
    "DebugNumericSummary": _WRITES,
}
# Ops that touch files only when an attribute says so: (attribute, a value that does not).
_ATTRIBUTE_PATHS: dict[str, tuple[str, tuple[bytes, ...]]] = {
    # tf.print to `file://<path>` appends to that file; stderr and stdout are logs.
    "PrintV2": (
        "output_stream",
        (b"stderr", b"stdout", b"log(info)", b"log(warning)", b"log(error)"),
    ),  # fmt: skip
    # A descriptor set read from a file instead of the linked-in protos.
    "DecodeProtoV2": ("descriptor_source", (b"", b"local://")),
    "EncodeProto": ("descriptor_source", (b"", b"local://")),
}
# Lookup tables filled from a text file: allowed when the file is one of the SavedModel's own
# assets (a vocabulary file: TF1 loaders feed its tensor the version's assets/ path).
TABLE_FROM_FILE_OPS = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})
# Nodes that pass a tensor on unchanged, between an asset's tensor and the table reading it.
_PASS_THROUGH = frozenset({"Identity", "Snapshot", "StopGradient"})
# The TF1 collection of a SavedModel's assets (before MetaGraphDef.asset_file_def).
ASSETS_COLLECTION = "saved_model_assets"
# What the restore op a TF1 loader runs may read: the version's own variables.
RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
# The signature TF2 saves its init op as (not servable; run at load).
INIT_OP_SIGNATURE = "__saved_model_init_op"
# TF1's init ops, run at load (tf.compat.v1.saved_model.loader's MAIN_OP_KEY, LEGACY_INIT_OP_KEY).
INIT_OP_COLLECTIONS = ("saved_model_main_op", "legacy_init_op")


@dataclasses.dataclass(frozen=True)
class FileOp:
    """An op of the graph that reaches the file system, and where it was found."""

    op: str
    node: str  # the node's name, in its function when it is in one
    root: str  # what runs it: a signature, the init op, the restore op

    def describe(self) -> str:
        what = FILE_SYSTEM_OPS.get(self.op, "reaches files through an attribute")
        return f"{self.op} ({what}) at {self.node}, run by {self.root}"


def _node_name(tensor: str) -> str:
    """The node of a tensor name (`^name`, `name:0`, `name`)."""
    return tensor.lstrip("^").split(":", 1)[0]


def _called_functions(node, functions) -> Iterable[str]:
    """The library functions a node calls: by its op name, or in function-valued attributes."""
    if node.op in functions:
        yield node.op
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        if value.HasField("list"):
            yield from (func.name for func in value.list.func)


def _touches_files(node) -> bool:
    if node.op in FILE_SYSTEM_OPS:
        return True
    special = _ATTRIBUTE_PATHS.get(node.op)
    if special is None:
        return False
    attribute, harmless = special
    value = node.attr.get(attribute)
    return value is not None and value.s not in harmless


def _reads_an_asset(node, nodes, assets: frozenset[str]) -> bool:
    """A graph node filling a table from a file whose name is one of the assets' tensors."""
    if node.op not in TABLE_FROM_FILE_OPS or len(node.input) < 2:
        return False
    name = _node_name(node.input[1])
    for _ in range(16):  # a chain of pass-throughs, not a loop
        if name in assets:
            return True
        source = nodes.get(name)
        if source is None or source.op not in _PASS_THROUGH or not source.input:
            return False
        name = _node_name(source.input[0])
    return False


def reachable_file_ops(
    graph_def, roots: Iterable[str], root: str, assets: frozenset[str] = frozenset()
) -> list[FileOp]:
    """The ops that reach files among what `roots` (node names of `graph_def`) run: the
    nodes they depend on, the functions those call, and everything in those functions.
    A table filled from one of `assets` (node names of the asset files' tensors) is not."""
    nodes = {node.name: node for node in graph_def.node}
    functions = {function.signature.name: function for function in graph_def.library.function}
    found: list[FileOp] = []
    seen_nodes: set[str] = set()
    pending_nodes = [name for name in roots if name in nodes]
    seen_functions: set[str] = set()
    pending_functions: list[str] = []
    while pending_nodes:
        name = pending_nodes.pop()
        if name in seen_nodes:
            continue
        seen_nodes.add(name)
        node = nodes[name]
        if _touches_files(node) and not _reads_an_asset(node, nodes, assets):
            found.append(FileOp(node.op, name, root))
        pending_functions += _called_functions(node, functions)
        pending_nodes += [_node_name(i) for i in node.input if _node_name(i) in nodes]
    while pending_functions:
        function_name = pending_functions.pop()
        if function_name in seen_functions or function_name not in functions:
            continue
        seen_functions.add(function_name)
        for node in functions[function_name].node_def:
            if _touches_files(node):
                found.append(FileOp(node.op, f"{function_name}/{node.name}", root))
            pending_functions += _called_functions(node, functions)
    return found


def file_ops(saved_model: saved_model_pb2.SavedModel) -> list[FileOp]:
    """Every op reaching files that serving or loading the SavedModel would run (above)."""
    found: list[FileOp] = []
    for meta_graph in saved_model.meta_graphs:
        graph = meta_graph.graph_def
        assets = _asset_tensors(meta_graph)
        for name, signature in sorted(meta_graph.signature_def.items()):
            tensors = [*signature.inputs.values(), *signature.outputs.values()]
            root = "the init op" if name == INIT_OP_SIGNATURE else f"signature {name!r}"
            roots = [_node_name(t.name) for t in tensors]
            found += reachable_file_ops(graph, roots, root, assets)
        for key in INIT_OP_COLLECTIONS:
            collection = meta_graph.collection_def.get(key)
            if collection is not None:
                roots = [_node_name(n) for n in collection.node_list.value]
                found += reachable_file_ops(graph, roots, "the init op", assets)
        # TF2: the functions objects carry; loading runs their resources' initializers.
        functions = list(meta_graph.object_graph_def.concrete_functions)
        if functions:
            found += _function_file_ops(graph, functions, "the model's functions")
        restore = meta_graph.saver_def.restore_op_name
        if restore:
            found += [
                op
                for op in reachable_file_ops(graph, [_node_name(restore)], "the restore op")
                if op.op not in RESTORE_OPS
            ]
    return found


def _asset_tensors(meta_graph) -> frozenset[str]:
    """The node names of the tensors a loader feeds with the paths of the version's assets."""
    names = {_node_name(asset.tensor_info.name) for asset in meta_graph.asset_file_def}
    collection = meta_graph.collection_def.get(ASSETS_COLLECTION)
    if collection is not None:
        from tensorflow.core.protobuf import meta_graph_pb2

        for packed in collection.any_list.value:
            asset = meta_graph_pb2.AssetFileDef()
            if packed.Unpack(asset):
                names.add(_node_name(asset.tensor_info.name))
    return frozenset(names)


def _function_file_ops(graph_def, names: list[str], root: str) -> list[FileOp]:
    """reachable_file_ops for library functions named directly (no graph node calls them)."""
    stand_in = type(graph_def)()
    stand_in.library.CopyFrom(graph_def.library)
    for number, name in enumerate(names):
        call = stand_in.node.add(name=f"call_{number}", op="PartitionedCall")
        call.attr["f"].func.name = name
    return reachable_file_ops(stand_in, [node.name for node in stand_in.node], root)


def file_system_problems(version_path: str | Path) -> list[str]:
    """Why a version must not serve because its graph reaches the file system; [] when it
    does not (one line per op type, with where it was first found)."""
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(version_path) / SAVED_MODEL_FILE).read_bytes())
    first: dict[str, FileOp] = {}
    for op in file_ops(saved):
        first.setdefault(op.op, op)
    return [op.describe() for _, op in sorted(first.items())]
