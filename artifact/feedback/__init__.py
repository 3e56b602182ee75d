"""Labeled feedback from production, stored as tf.Example records in TFRecord shards.

The format is the contract between the service, which writes it (`POST
/v1/models/{name}/feedback`, FEEDBACK_DIR), and the retrain job, which reads it
(`python -m training retrain --feedback-dir`). No TensorFlow here: both sides import it, and
the service writes the TFRecord framing and the tf.Examples itself (artifact/tfrecord.py,
artifact/tf_example.py).

    <FEEDBACK_DIR>/<model name>/
        shard-<closed at, UTC>-<writer>-<n>/    a closed shard: complete, never written again
            examples.tfrecord                   one tf.Example per labeled instance: each input
                                                of the signature under its name (its values
                                                flattened: float_list, int64_list or
                                                bytes_list by its dtype), and the label under
                                                `feedback/label` (a class id, int64, or a
                                                regressed value, float)
            committed.txt                       how many examples the shard holds
            versions.txt                        one line per example: the model version that
                                                answered it, empty when the client did not say
            provenance.txt                      one line per example: `<received at> <sender>`,
                                                the time in UTC (ISO 8601, seconds) and the
                                                sender's name (a token's name, never the
                                                token; `anonymous` without tokens)
            compacted-from.txt                  in a compacted shard: the shard it replaces
        .open-<writer>/                         a writer's current shard (the same files)
        .compact-<name>/, .gone-<name>/         a compacted shard being written, a removed one
                                                being deleted

Shards of the versions before tf.Example (28x28 images only) are MNIST-format folders
instead: train-images-idx3-ubyte and train-labels-idx1-ubyte (IDX, the class ids), with the
same versions.txt and provenance.txt (absent in shards older than provenance: their images
read with the sender `unknown` and no time). They are still read, recovered, expired and
compacted; nothing writes new ones.

Each writer (one per service process; several replicas may share the folder) appends to its
own open shard and renames it to a closed shard every `shard_examples` examples; the rename
is atomic, so a reader never sees half a shard. An append is durable before it is
acknowledged: the framed records, the versions and the provenance lines are written past the
committed end and fsynced, then the count in committed.txt is raised and fsynced: that count
is the commit (in an MNIST-format shard, the two IDX headers' counts). After a crash, a writer
cuts the shard back to the smallest of the committed count, the whole records (their CRCs
checked) and the lines, so a crash loses at most the request being written. A writer holds an
exclusive flock on its open shard's examples (or images) file while it lives; a writer that
finds another writer's open shard unlocked (its process died) recovers it and closes it. The
folder must be on a filesystem with working locks (local disks, NFSv4, CephFS, EFS).

Old examples are expired (`expire`, below; `python -m training expire-feedback`): a shard
whose examples are all too old is renamed away (`.gone-`) and deleted; a shard with some is
compacted: a new shard is written under a `.compact-` name, its files and folder fsynced,
renamed into place (its compacted-from.txt names the shard it replaces, which readers then
skip), and only then is the old one removed. A crash at any point loses no kept example and
leaves no half shard under a `shard-` name; the next expiry finishes or undoes the rest. A
retrain reading the store holds a shared flock on `.expire.lock` (when it exists), which
expiry takes exclusively: shards do not vanish under a retrain streaming them.

The package, one module per side of the store: `layout` (names, constants, errors, the
low-level reads and writes), `records` (a request as tf.Example bytes), `read` (closed shards,
the retrain's lock), `share` (bytes and examples per sender), `write` (the service's writer),
`expiry` (expiry and compaction). Import what they offer from here.
"""

from artifact.feedback.expiry import Expired, closed_at, expire, received_times
from artifact.feedback.layout import (
    ANONYMOUS,
    CLOSED_PREFIX,
    COMMITTED_DIGITS,
    COMMITTED_FILE,
    COMPACT_PREFIX,
    COMPACTED_FROM_FILE,
    EXAMPLES_FILE,
    EXAMPLES_FORMAT,
    EXPIRE_LOCK_FILE,
    GONE_PREFIX,
    IDX_FORMAT,
    IMAGE_BYTES,
    IMAGES_FILE,
    IMAGES_HEADER,
    IMAGES_MAGIC,
    LABEL_FEATURE,
    LABELS_FILE,
    LABELS_HEADER,
    LABELS_MAGIC,
    NEW_PREFIX,
    NO_SPACE_ERRNOS,
    OPEN_PREFIX,
    PROVENANCE_FILE,
    REMEASURE_SECONDS,
    SENDER_IMAGE_BYTES,
    SENDER_PATTERN,
    STALE_NEW_SECONDS,
    UNKNOWN_SENDER,
    VERSIONS_FILE,
    FeedbackFormatError,
    FeedbackStoreFull,
    FeedbackWriteError,
    SenderShareFull,
    encode_versions,
    store_dir,
    writer_id,
)
from artifact.feedback.read import (
    Shard,
    ShardInfo,
    closed_shards,
    provenance_line,
    read_examples,
    read_info,
    read_records,
    read_shard,
    reading,
    shard_format,
)
from artifact.feedback.records import feedback_examples, image_examples
from artifact.feedback.share import SenderTally, sender_tally, store_bytes
from artifact.feedback.write import Appended, FeedbackWriter, check_writable_dir

__all__ = [
    "ANONYMOUS",
    "Appended",
    "CLOSED_PREFIX",
    "COMMITTED_DIGITS",
    "COMMITTED_FILE",
    "COMPACTED_FROM_FILE",
    "COMPACT_PREFIX",
    "EXAMPLES_FILE",
    "EXAMPLES_FORMAT",
    "EXPIRE_LOCK_FILE",
    "Expired",
    "FeedbackFormatError",
    "FeedbackStoreFull",
    "FeedbackWriteError",
    "FeedbackWriter",
    "GONE_PREFIX",
    "IDX_FORMAT",
    "IMAGES_FILE",
    "IMAGES_HEADER",
    "IMAGES_MAGIC",
    "IMAGE_BYTES",
    "LABELS_FILE",
    "LABELS_HEADER",
    "LABELS_MAGIC",
    "LABEL_FEATURE",
    "NEW_PREFIX",
    "NO_SPACE_ERRNOS",
    "OPEN_PREFIX",
    "PROVENANCE_FILE",
    "REMEASURE_SECONDS",
    "SENDER_IMAGE_BYTES",
    "SENDER_PATTERN",
    "STALE_NEW_SECONDS",
    "SenderShareFull",
    "SenderTally",
    "Shard",
    "ShardInfo",
    "UNKNOWN_SENDER",
    "VERSIONS_FILE",
    "check_writable_dir",
    "closed_at",
    "closed_shards",
    "encode_versions",
    "expire",
    "feedback_examples",
    "image_examples",
    "provenance_line",
    "read_examples",
    "read_info",
    "read_records",
    "read_shard",
    "reading",
    "received_times",
    "sender_tally",
    "shard_format",
    "store_bytes",
    "store_dir",
    "writer_id",
]
