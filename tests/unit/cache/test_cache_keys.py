"""Key derivation: determinism, sensitivity to every field, framing, digest length."""

from __future__ import annotations

import hashlib

import pytest

from cache import (
    InvalidKeyInputError,
    Modality,
    SegmentKey,
    encoded_image_key,
    pixels_key,
    token_ids_key,
)
from cache.keys import MIN_DIGEST_SIZE_BYTES, _framed_digest

FP = "vit-l16@3f2a"
PRE = "resize224-bicubic-imagenet"
PIXELS_2x2 = bytes(range(12))  # (2, 2, 3) uint8


def test_same_content_gives_equal_hashable_keys() -> None:
    a = pixels_key(FP, PRE, bytearray(PIXELS_2x2), (2, 2, 3))
    b = pixels_key(FP, PRE, memoryview(PIXELS_2x2), [2, 2, 3])
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    # A 3-D buffer (as an HxWx3 array exposes itself) keys like its flat bytes.
    assert pixels_key(FP, PRE, memoryview(PIXELS_2x2).cast("B", (2, 2, 3)), (2, 2, 3)) == a
    assert token_ids_key(FP, "tok", [5, 7, 9]) == token_ids_key(FP, "tok", (5, 7, 9))
    assert encoded_image_key(FP, PRE, b"\x89PNG..") == encoded_image_key(FP, PRE, b"\x89PNG..")


def test_key_is_frozen() -> None:
    key = token_ids_key(FP, "tok", [1])
    with pytest.raises(AttributeError):
        key.digest = b"\x00" * 32  # type: ignore[misc]


def test_digest_is_full_blake2b_and_at_least_16_bytes() -> None:
    key = encoded_image_key(FP, PRE, b"jpeg bytes")
    assert len(key.digest) == 32
    assert len(key.digest) >= MIN_DIGEST_SIZE_BYTES
    assert key.hex == key.digest.hex()
    with pytest.raises(InvalidKeyInputError):
        SegmentKey(Modality.IMAGE, b"\x01" * 8)


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(lambda: pixels_key("vit-l16@9999", PRE, PIXELS_2x2, (2, 2, 3)), id="fingerprint"),
        pytest.param(lambda: pixels_key(FP, PRE + "-v2", PIXELS_2x2, (2, 2, 3)), id="preprocess-id"),
        pytest.param(lambda: pixels_key(FP, PRE, bytes([1]) + PIXELS_2x2[1:], (2, 2, 3)), id="content"),
        pytest.param(lambda: pixels_key(FP, PRE, PIXELS_2x2, (1, 4, 3)), id="shape"),
        pytest.param(lambda: pixels_key(FP, PRE, PIXELS_2x2, (2, 6)), id="ndim"),
        pytest.param(lambda: encoded_image_key(FP, PRE, PIXELS_2x2), id="content-kind"),
    ],
)
def test_any_field_change_changes_the_pixel_key(changed) -> None:
    base = pixels_key(FP, PRE, PIXELS_2x2, (2, 2, 3))
    assert changed() != base
    assert changed().digest != base.digest


def test_text_key_depends_on_fingerprint_preprocess_and_ids() -> None:
    base = token_ids_key(FP, "tok", [1, 2, 3])
    assert token_ids_key("other-fp", "tok", [1, 2, 3]) != base
    assert token_ids_key(FP, "tok-v2", [1, 2, 3]) != base
    assert token_ids_key(FP, "tok", [1, 2, 4]) != base
    assert token_ids_key(FP, "tok", [1, 2, 3, 0]) != base
    assert token_ids_key(FP, "tok", [1 << 40, 2, 3]) != base


def test_modality_is_part_of_the_digest() -> None:
    # The same 16 bytes as token ids (two int64) and as an encoded image.
    ids = [1, 2]
    as_bytes = (1).to_bytes(8, "little") + (2).to_bytes(8, "little")
    text = token_ids_key(FP, PRE, ids)
    image = encoded_image_key(FP, PRE, as_bytes)
    assert text.modality is Modality.TEXT
    assert image.modality is Modality.IMAGE
    assert text.digest != image.digest


def test_framing_separates_field_splits() -> None:
    assert _framed_digest([b"ab", b"c"]) != _framed_digest([b"a", b"bc"])
    assert _framed_digest([b"abc", b""]) != _framed_digest([b"abc"])
    # Through the public builders: the boundary between fingerprint and preprocessing id.
    assert encoded_image_key("ab", "c", b"x") != encoded_image_key("a", "bc", b"x")
    assert token_ids_key("fp", "ab", [1]) != token_ids_key("fpa", "b", [1])


def test_framing_matches_an_independent_length_prefixed_digest() -> None:
    expected = hashlib.blake2b(digest_size=32, person=b"mmserve.seg.v1")
    for field in (b"ab", b"c"):
        expected.update(len(field).to_bytes(8, "big") + field)
    assert _framed_digest([b"ab", b"c"]) == expected.digest()


def test_new_fingerprint_never_meets_an_old_key() -> None:
    fingerprints = [f"model@{i}" for i in range(50)]
    keys = {encoded_image_key(fp, PRE, b"same upload") for fp in fingerprints}
    assert len(keys) == len(fingerprints)


def test_pixels_must_match_shape() -> None:
    with pytest.raises(InvalidKeyInputError):
        pixels_key(FP, PRE, PIXELS_2x2, (2, 2, 2))
    with pytest.raises(InvalidKeyInputError):
        pixels_key(FP, PRE, PIXELS_2x2, ())
    with pytest.raises(InvalidKeyInputError):
        token_ids_key(FP, "tok", [1 << 70])
    strided = memoryview(bytes(24))[::2]  # 12 bytes, not C-contiguous
    with pytest.raises(InvalidKeyInputError):
        pixels_key(FP, PRE, strided, (2, 2, 3))
