"""`python -m training retrain`: a gated retrain, safe to run every night unattended.

    python -m training retrain --data-dir D --model-dir runs/fashion_mnist \\
        --export-dir models/fashion_mnist [--extra-data DIR ...] [--feedback-dir FEEDBACK_DIR] \\
        [--config models/models.config --publish canary]
    python -m training retrain --export-dir models/classification --model-dir runs/c \\
        [--csv classification.csv] [--extra-data more.csv ...] [--feedback-dir FEEDBACK_DIR]

Any model `train` makes retrains: the IDX image contract, a CSV model, an image-folder model
(training/kinds/; the serving version's report says which, and where its base data
is, unless --csv or --image-folder gives it again).

1. Data (training/sources.py): the base data's test split (held out) and train split, the
   `--extra-data` of the model's kind and the closed shards of the service's feedback store;
   an example seen before is counted once; the new data is split into trained and held out
   by a seeded hash of each example. Every source is streamed from its files (a scan, then
   tf.data), never loaded whole.
2. Baseline: the version serving now, the model config's `stable` label when it has one,
   else the newest version the config's policy serves (the newest on disk without a config).
3. Training, in a run folder of its own under --model-dir (named by a hash of everything
   that shapes the model: the same command on the same data resumes it after a kill),
   warm-started (tf.estimator.WarmStartSettings) from the checkpoint that produced the
   baseline, which its evaluation.json records; `--from-scratch` starts anew.
4. The candidate is exported into the run folder, never into the repository, and both it and
   the baseline are evaluated through their SavedModels on the same held-out set; the
   blessing (training/blessing.py: a classifier's accuracy and recalls, a regressor's errors)
   is printed and written as blessing.json.
5. Blessed: the candidate is published atomically as the next version (with its
   blessing.json), and `--publish canary|stable` moves the label with training.promote's
   `promote`. Not blessed: nothing under the model repository changes.
   With `--stage-to DIR` the retrain publishes nothing and only reads the repository: the
   blessed candidate is left in DIR for `python -m training publish`, the small step with
   write access (training/staging.py).

Exit codes: 0 published (or already published by an earlier run), 1 crash, 2 bad input,
3 not blessed, 75 another retrain holds the lock.

The package: `arguments` (the options, and RetrainConfig: what the code reads of them),
`command` (the run: locks, sources, training), `inputs` (the tf.data input and held-out set
over the sources' decisions), `start` (the run id, the serving version's checkpoint, kind,
layers and labels), `judge` (the verdict and what follows from it: publish, stage or
record).
"""

from training.retrain.arguments import DEFAULT_EPOCHS, RetrainConfig, add_arguments
from training.retrain.command import retrain
from training.staging import EXIT_LOCKED, EXIT_NOT_BLESSED

__all__ = [
    "DEFAULT_EPOCHS",
    "EXIT_LOCKED",
    "EXIT_NOT_BLESSED",
    "RetrainConfig",
    "add_arguments",
    "retrain",
]
