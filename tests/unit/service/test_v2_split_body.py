"""Inference-Header-Content-Length (service/codecs/v2_rest.py: split_body) of any length is a 400
naming the header: 5,000 digits once reached int()'s digit limit and answered 500."""

from __future__ import annotations

import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.helpers import error_message

from service.codecs.v2_rest import split_body
from service.errors import BadInput

HEADER = "Inference-Header-Content-Length"
BODY = b'{"inputs": []}'


@pytest.mark.parametrize("digits", [19, 4_301, 5_000], ids=lambda n: f"{n}-digits")
def test_a_header_length_of_many_digits_is_bad_input_naming_the_header(digits):
    with pytest.raises(BadInput) as caught:
        split_body(BODY, "9" * digits)
    start = "9" * min(digits, 20)
    assert caught.value.message == (
        f"{HEADER} is a number of {digits:,} digits ({start}...), but the whole "
        f"body has only {len(BODY)} bytes"
    )


def test_the_longest_number_still_read_is_compared_with_the_body():
    with pytest.raises(BadInput, match=f"{HEADER} is 999999999999999999 bytes"):
        split_body(BODY, "9" * 18)
    assert split_body(BODY, "0" * 17 + "3")[0] == b'{"i'


def test_over_http_it_is_a_400_not_a_500():
    with app_client(FakeBackend()) as client:
        response = client.post(
            f"/v2/models/{MODEL_NAME}/infer", content=BODY, headers={HEADER: "7" * 5000}
        )
    assert f"{HEADER} is a number of 5,000 digits" in error_message(response, 400)
