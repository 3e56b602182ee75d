"""The contract's pixel rules and the way a prediction is shown to a person."""

from __future__ import annotations

import numpy as np
import pytest

from artifact.contract import (
    DIGIT_LABELS,
    FASHION_MNIST_LABELS,
    PixelError,
    normalize_pixels,
    pixels_to_input,
    prediction_rows,
    resolve_labels,
    to_json,
)


def test_normalize_pixels_scales_to_unit_float32():
    out = normalize_pixels(np.array([[0, 51, 255]], np.uint8))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.0, 0.2, 1.0]])


@pytest.mark.parametrize(
    "array, expected",
    [
        pytest.param(np.full((2, 28, 28), 255, np.int64), 1.0, id="integers-are-0-255"),
        pytest.param(np.full((2, 28, 28), 0.5), 0.5, id="floats-are-already-scaled"),
    ],
)
def test_pixels_to_input(array, expected):
    images = pixels_to_input(array)
    assert images.dtype == np.float32
    np.testing.assert_allclose(images, expected)


@pytest.mark.parametrize(
    "bad, index, problem",
    [
        pytest.param(256, 1, "integer pixels must be 0-255", id="int-over"),
        pytest.param(-1, 1, "integer pixels must be 0-255", id="int-under"),
        pytest.param(1.5, 1, "float pixels must be in [0, 1]", id="float-over"),
        pytest.param(np.nan, 1, "values must be finite", id="nan"),
        pytest.param(np.inf, 1, "values must be finite", id="inf"),
    ],
)
def test_pixel_errors_name_the_first_bad_image(bad, index, problem):
    dtype = np.int64 if isinstance(bad, int) else np.float64
    array = np.zeros((3, 28, 28), dtype)
    array[index, 5, 5] = bad
    array[2, 0, 0] = bad
    with pytest.raises(PixelError) as excinfo:
        pixels_to_input(array)
    assert excinfo.value.index == index
    assert problem in excinfo.value.problem


def test_booleans_are_not_pixels():
    with pytest.raises(PixelError, match="expected integer or float pixels, got dtype bool"):
        pixels_to_input(np.zeros((1, 28, 28), bool))


def test_prediction_rows_and_their_json():
    probabilities = np.eye(10, dtype=np.float32)[[9, 0]]
    rows = list(prediction_rows(np.array([9, 0]), probabilities, FASHION_MNIST_LABELS))
    assert rows[0]["class_id"] == 9 and rows[0]["label"] == "Ankle boot"
    assert list(rows[1]["probabilities"]) == list(FASHION_MNIST_LABELS)
    assert to_json(rows[0]).startswith(b'{"class_id":9,"label":"Ankle boot","probabilities":{')


@pytest.mark.parametrize(
    "spec, data_dir, expected",
    [
        pytest.param("auto", "/usr/share/datasets/fashion-mnist", FASHION_MNIST_LABELS, id="auto-fashion"),
        pytest.param("auto", "/data/mnist", DIGIT_LABELS, id="auto-digits"),
        pytest.param("digits", None, DIGIT_LABELS, id="preset"),
        pytest.param("a,b,c,d,e,f,g,h,i,j", None, tuple("abcdefghij"), id="list"),
    ],
)  # fmt: skip
def test_resolve_labels(spec, data_dir, expected):
    assert resolve_labels(spec, data_dir) == expected


@pytest.mark.parametrize("spec", ["a,b", "a,a,b,c,d,e,f,g,h,i", "a,,c,d,e,f,g,h,i,j"])
def test_resolve_labels_refuses_wrong_lists(spec):
    with pytest.raises(ValueError, match="--labels"):
        resolve_labels(spec)


def test_output_problems_names_what_is_wrong():
    from artifact.contract import output_problems

    good = np.full((3, 10), 0.1, np.float32)
    classes = np.array([0, 4, 9])
    assert output_problems({"classes": classes, "probabilities": good}) == []
    cases = {
        "probabilities outside [0, 1]": good * 20,
        "not all finite": np.where(good > 0, np.nan, good),
        "sums to": good * 0.5,
    }
    for words, probabilities in cases.items():
        (problem,) = output_problems({"classes": classes, "probabilities": probabilities})
        assert words in problem, problem
    (problem,) = output_problems({"classes": classes + 1, "probabilities": good})
    assert problem == "classes outside 0-9"


def test_output_problems_can_leave_out_the_rows_of_non_finite_inputs():
    from artifact.contract import output_problems

    probabilities = np.full((2, 10), 0.1, np.float32)
    probabilities[1] = np.nan  # the answer to a NaN image, which TF Serving passes on
    outputs = {"classes": np.array([3, 0]), "probabilities": probabilities}
    assert output_problems(outputs) == ["probabilities are not all finite"]
    assert output_problems(outputs, finite_rows_only=True) == []
    outputs["probabilities"][0] *= 12
    assert "outside [0, 1]" in output_problems(outputs, finite_rows_only=True)[0]
