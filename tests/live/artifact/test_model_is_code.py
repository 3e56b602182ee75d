"""A model is code: a SavedModel with the contract's signature whose "probabilities" are not
probabilities is refused at load (SavedModelPredictor.warm_up checks its own answers), not
served. The serve-time count of such answers is tested over a fake backend
(tests/service/test_dataplane.py)."""

from __future__ import annotations

import pytest


def export_toy(path, scale: float) -> None:
    """A SavedModel with the contract's signature answering scale * softmax(mean pixel)."""
    import tensorflow as tf

    class Toy(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 28, 28], tf.float32)])
        def serve(self, image):
            logits = tf.tile(tf.reduce_mean(image, axis=[1, 2])[:, None], [1, 10])
            logits += tf.range(10, dtype=tf.float32)
            probabilities = tf.nn.softmax(logits) * scale
            return {"classes": tf.argmax(probabilities, axis=1), "probabilities": probabilities}

    toy = Toy()
    tf.saved_model.save(toy, str(path), signatures={"serving_default": toy.serve})


def test_a_model_whose_probabilities_are_not_probabilities_does_not_warm_up(tmp_path):
    from artifact.saved_model import SavedModelPredictor

    export_toy(tmp_path / "good", 1.0)
    assert SavedModelPredictor(tmp_path / "good").warm_up() == 0
    export_toy(tmp_path / "bad", 3.0)
    with pytest.raises(ValueError, match=r"zero image breaks the contract: probabilities outside"):
        SavedModelPredictor(tmp_path / "bad").warm_up()
