"""Bad input on every input path: a named 4xx or a correct 200, never a 5xx, and the server carries on.

Paths: ``/v1/infer`` as JSON and as multipart, Open Inference Protocol v2 as
JSON and with binary tensor data, and OpenAI ``/v1/embeddings``. Each case is
an abstract input (a text, an encoded image, raw pixels, or a raw body) that
``_request`` spells in each protocol's own terms; a case that a protocol
cannot express (raw pixels in OpenAI's API) is left out for that protocol.
For every refusal the answer names its cause, ``mmserve_requests_total`` for
that status moves by exactly one, and the next ordinary request is served.
A 200 is checked against the model itself: the image is decoded with the
server's decoder and run through the tiny model directly.

Pillow modes: every mode an image file can carry (HSV, PA, La and RGBa exist
only in memory: no format writes them).
"""

from __future__ import annotations

import io
import json
import re
import socket
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from encoded_images import b64, encode, encoded_image, noise_image
from models.preprocessing import resize_to_model_input
from server.ingest.decoding import decode_image
from server.protocols.kserve_v2_codec import Tensor, V2InferRequest, encode_infer_request

PROTOCOLS = ("infer_json", "infer_multipart", "v2_json", "v2_binary", "openai")
V2_PATH = "/v2/models/tiny/infer"
TOLERANCE = 1e-4
OK = (200, None)


# -- inputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One abstract input; ``text_bytes`` overrides how a text travels where texts are bytes."""

    text: str | None = None
    image: bytes | None = None
    pixels: tuple[list[int], bytes] | None = None
    truncate: bool = False
    text_bytes: bytes | None = None


@dataclass(frozen=True)
class RawBody:
    """A body sent as is (with ``headers``), for malformations no well-formed item can carry."""

    content: bytes
    headers: dict[str, str]


def _in_mode(mode: str, seed: int) -> Image.Image:
    rgb = noise_image(seed, (20, 14))
    if mode == "I":
        return Image.fromarray(np.asarray(rgb.convert("L"), dtype=np.int32) * 100)
    if mode == "F":
        return Image.fromarray(np.asarray(rgb.convert("L"), dtype=np.float32) / 3)
    if mode == "I;16":
        return Image.fromarray(np.asarray(rgb.convert("L"), dtype=np.uint16) * 257)
    if mode == "P-transparent":
        image = rgb.convert("P")
        image.info["transparency"] = 0
        return image
    return rgb.convert(mode)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` RGB pixels and carries almost none."""
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _png_chunk(b"IEND", b""))


def _gif_bomb() -> bytes:
    """A GIF whose screen and frame claim 65535 x 65535 pixels, in a few dozen bytes."""
    screen = struct.pack("<HHBBB", 65535, 65535, 0, 0, 0)
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 65535, 65535, 0) + b"\x08\x01\x00\x00"
    return b"GIF89a" + screen + frame + b"\x3b"


def _bmp_bomb() -> bytes:
    """A BMP header for 30000 x 30000 24-bit pixels, with none of them."""
    info = struct.pack("<IiiHHIIiiII", 40, 30000, 30000, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + 30000 * 30000 * 3, 0, 0, 14 + 40) + info


def _animated(fmt: str, seed: int) -> tuple[bytes, Image.Image]:
    frames = [noise_image(seed + offset, (24, 18)) for offset in range(3)]
    options: dict[str, object] = {"save_all": True, "append_images": frames[1:], "duration": 100, "loop": 0}
    if fmt == "WEBP":
        options["lossless"] = True
    data = encode(frames[0].convert("P") if fmt == "GIF" else frames[0], fmt, **options)
    return data, Image.open(io.BytesIO(data))  # the server's first frame is Pillow's frame 0


# -- one item in each protocol ---------------------------------------------------------------------


def _v2_json_body(item: Item) -> RawBody:
    """The JSON form, written by hand so a text travels as written (a lone surrogate as its JSON escape)."""
    inputs: list[dict] = []
    if item.text is not None:
        inputs.append({"name": "text", "datatype": "BYTES", "shape": [1], "data": [item.text]})
    if item.image is not None:
        inputs.append({"name": "image", "datatype": "BYTES", "shape": [1], "data": [b64(item.image)]})
    if item.pixels is not None:
        shape, data = item.pixels
        inputs.append({"name": "image_uint8", "datatype": "UINT8", "shape": [1, *shape], "data": list(data)})
    document: dict = {"inputs": inputs}
    if item.truncate:
        document["parameters"] = {"truncate": True}
    return RawBody(json.dumps(document).encode(), {"content-type": "application/json"})


def _v2_binary_body(item: Item) -> RawBody:
    """Binary tensor data, through the codec tritonclient's format is tested against."""
    tensors = []
    if item.text is not None or item.text_bytes is not None:
        element = item.text_bytes if item.text_bytes is not None else item.text.encode()
        tensors.append(Tensor("text", "BYTES", (1,), np.array([element], dtype=object), is_binary=True))
    if item.image is not None:
        tensors.append(Tensor("image", "BYTES", (1,), np.array([item.image], dtype=object), is_binary=True))
    if item.pixels is not None:
        shape, data = item.pixels
        tensors.append(Tensor("image_uint8", "UINT8", (1, *shape), np.frombuffer(data, dtype=np.uint8),
                              is_binary=True))
    parameters = {"truncate": True} if item.truncate else {}
    encoded = encode_infer_request(V2InferRequest(tuple(tensors), parameters=parameters))
    headers = {"content-type": "application/octet-stream"}
    if encoded.header_length is not None:
        headers["Inference-Header-Content-Length"] = str(encoded.header_length)
    return RawBody(encoded.body, headers)


def _request(protocol: str, item: Item | RawBody) -> tuple[str, dict] | None:
    """(path, httpx keyword arguments) for ``item`` in ``protocol``; ``None`` if it cannot be said there."""
    path = {"v2_json": V2_PATH, "v2_binary": V2_PATH, "openai": "/v1/embeddings"}.get(protocol, "/v1/infer")
    if isinstance(item, RawBody):
        return path, {"content": item.content, "headers": item.headers}
    if protocol == "infer_json":
        body: dict = {}
        if item.text is not None:
            body["text"] = item.text
        if item.image is not None:
            body["image"] = {"b64": b64(item.image)}
        if item.pixels is not None:
            body["image"] = {"uint8": {"shape": item.pixels[0], "b64": b64(item.pixels[1])}}
        if item.truncate:
            body["truncate"] = True
        # ensure_ascii keeps lone surrogates as \ud800 escapes, as a JSON client would send them
        return path, {"content": json.dumps(body).encode(), "headers": {"content-type": "application/json"}}
    if protocol == "infer_multipart":
        if item.pixels is not None:
            return None
        files = {"image": ("upload", item.image, "application/octet-stream")} if item.image is not None else {}
        text = item.text_bytes if item.text_bytes is not None else item.text
        if text is not None:
            files["text"] = (None, text)  # type: ignore[assignment]
        if item.truncate:
            files["truncate"] = (None, "true")  # type: ignore[assignment]
        return path, {"files": files or {"priority": (None, "normal")}}
    if protocol in ("v2_json", "v2_binary"):
        body = _v2_json_body(item) if protocol == "v2_json" else _v2_binary_body(item)
        return path, {"content": body.content, "headers": body.headers}
    if item.pixels is not None:
        return None  # OpenAI's API has no raw pixels
    inputs = [] if item.text is None else [item.text]
    if item.image is not None:
        inputs.append(f"data:image/png;base64,{b64(item.image)}")
    document: dict = {"input": inputs, "model": "tiny"}
    if item.truncate:
        document["truncate"] = True  # mmserve's extension field
    return path, {"content": json.dumps(document).encode(), "headers": {"content-type": "application/json"}}


def _error_code(response: httpx.Response) -> str:
    error = response.json()["error"]
    return error.split(":", 1)[0] if isinstance(error, str) else error["code"]


def _error_message(response: httpx.Response) -> str:
    error = response.json()["error"]
    return error if isinstance(error, str) else error["message"]


def _embedding(protocol: str, response: httpx.Response, name: str) -> np.ndarray:
    body = response.json()
    if protocol in ("v2_json", "v2_binary"):
        (output,) = [output for output in body["outputs"] if output["name"] == name]
        return np.asarray(output["data"], dtype=np.float32)
    if protocol == "openai":
        index = 0 if name == "text_embedding" or len(body["data"]) == 1 else 1
        return np.asarray(body["data"][index]["embedding"], dtype=np.float32)
    return np.asarray(body[name], dtype=np.float32)


def _requests_total(client: httpx.Client, code: int) -> float:
    text = client.get("/metrics").text
    return sum(float(value) for value in
               re.findall(rf'^mmserve_requests_total\{{[^}}]*code="{code}"[^}}]*\}} (\S+)$', text, re.M))


def _send_and_check(client: httpx.Client, protocol: str, item: Item | RawBody,
                    expected: tuple[int, str | None]) -> httpx.Response:
    """Send and check the status; for a refusal also its code, the counter, and that an ordinary request is served."""
    request = _request(protocol, item)
    assert request is not None, f"{protocol} cannot express this input"
    path, arguments = request
    status, code = expected
    if status == 200:
        response = client.post(path, **arguments)
        assert response.status_code == 200, response.text[:300]
        return response
    before = _requests_total(client, status)
    response = client.post(path, **arguments)
    assert response.status_code == status, response.text[:300]
    assert response.status_code < 500
    assert _error_code(response) == code, response.text[:300]
    assert _requests_total(client, status) == before + 1
    ordinary = _request(protocol, Item(text="an ordinary request"))
    assert ordinary is not None
    assert client.post(ordinary[0], **ordinary[1]).status_code == 200
    return response


# -- the refusal matrix -------------------------------------------------------------------------------


def _refusals() -> list[tuple[str, str, Item | RawBody, tuple[int, str | None]]]:
    json_type = {"content-type": "application/json"}
    truncated_png = encoded_image(1)[:60]
    truncated_jpeg = (lambda data: data[: len(data) // 2])(encoded_image(2, (64, 48), "JPEG"))
    cases: list[tuple[str, str, Item | RawBody, tuple[int, str | None]]] = []

    def add(name: str, item_for: Callable[[str], Item | RawBody | None], expected_for: Callable[[str], tuple]) -> None:
        for protocol in PROTOCOLS:
            item = item_for(protocol)
            if item is not None and _request(protocol, item) is not None:
                cases.append((name, protocol, item, expected_for(protocol)))

    def v2_error(protocol: str, v2_status: int, v2_code: str, status: int, code: str) -> tuple[int, str]:
        return (v2_status, v2_code) if protocol.startswith("v2") else (status, code)

    # -- malformed bodies
    add("invalid_json", lambda p: {
        "infer_json": RawBody(b'{"text": ', json_type),
        "infer_multipart": RawBody(b"--b\r\nContent-Disposition: form-data\r\n\r\nx",
                                   {"content-type": "multipart/form-data"}),
        "v2_json": RawBody(b'{"inputs": [', json_type),
        "v2_binary": RawBody(b'{"inp' + b"\x00" * 8, {"Inference-Header-Content-Length": "5"}),
        "openai": RawBody(b'{"input": ', json_type),
    }[p], lambda p: (400, "invalid_multipart" if p == "infer_multipart" else "invalid_json"))
    add("not_an_object", lambda p: None if p == "infer_multipart" else RawBody(b"[1, 2]", json_type),
        lambda p: v2_error(p, 400, "invalid_request", 422, "invalid_request"))
    add("wrong_type", lambda p: {
        "infer_json": RawBody(b'{"text": 5}', json_type),
        "infer_multipart": RawBody(b'--b\r\nContent-Disposition: form-data; name="text"; filename="t.txt"\r\n'
                                   b"Content-Type: text/plain\r\n\r\nhello\r\n--b--\r\n",
                                   {"content-type": "multipart/form-data; boundary=b"}),  # a text as a file
        "v2_json": RawBody(b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [5]}]}',
                           json_type),
        "v2_binary": _v2_body_with(b'{"inputs": [{"name": "text", "datatype": "INT32", "shape": [1], '
                                   b'"parameters": {"binary_data_size": 4}}]}', b"\x00" * 4),
        "openai": RawBody(b'{"input": 5}', json_type),
    }[p], lambda p: {"v2_json": (400, "invalid_tensor_data"), "v2_binary": (400, "invalid_datatype")}.get(
        p, (422, "invalid_request")))
    add("missing_fields", lambda p: {
        "infer_json": RawBody(b"{}", json_type),
        "infer_multipart": Item(),
        "v2_json": RawBody(b'{"inputs": []}', json_type),
        "v2_binary": _v2_body_with(b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}]}', b""),
        "openai": RawBody(b'{"model": "tiny"}', json_type),
    }[p], lambda p: {"infer_json": (422, "empty_request"), "infer_multipart": (422, "empty_request"),
                     "openai": (422, "invalid_request")}.get(p, (400, "invalid_request")))
    # -- texts
    add("empty_text", lambda p: Item(text=""), lambda p: (422, "empty_text"))
    add("whitespace_text", lambda p: Item(text=" \n\t\u3000 "), lambda p: (422, "empty_text"))
    add("text_over_max_chars", lambda p: Item(text="word " * 20_001), lambda p: (422, "text_too_long"))
    add("text_over_the_token_limit", lambda p: Item(text="x" * 600), lambda p: (422, "text_too_long"))
    add("lone_surrogate", lambda p: Item(text="a\ud800b", text_bytes=b"a\xed\xa0\x80b" if p == "v2_binary" else None)
        if p != "infer_multipart" else None, lambda p: (400, "invalid_text_encoding"))
    # -- encoded images
    add("invalid_base64", lambda p: {
        "infer_json": RawBody(b'{"image": {"b64": "not base64!"}}', json_type),
        "v2_json": RawBody(b'{"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], '
                           b'"data": ["not base64!"]}]}', json_type),
        "openai": RawBody(b'{"input": ["data:image/png;base64,not base64!"]}', json_type),
    }.get(p), lambda p: (400, "invalid_base64"))
    add("empty_image", lambda p: {
        "infer_json": RawBody(b'{"image": {"b64": ""}}', json_type),
        "v2_json": RawBody(b'{"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [""]}]}',
                           json_type),
        "openai": RawBody(b'{"input": ["data:image/png;base64,"]}', json_type),
    }.get(p, Item(image=b"")), lambda p: (422, "invalid_request") if p == "infer_json" else (400, "empty_image"))
    add("not_an_image", lambda p: Item(image=b"plain text, not an image"), lambda p: (415, "unsupported_image_format"))
    add("truncated_png", lambda p: Item(image=truncated_png), lambda p: (400, "corrupt_image"))
    add("truncated_jpeg", lambda p: Item(image=truncated_jpeg), lambda p: (400, "corrupt_image"))
    add("header_only_png", lambda p: Item(image=_png_header_only(64, 64)), lambda p: (400, "corrupt_image"))
    add("png_bomb", lambda p: Item(image=_png_header_only(20_000, 20_000)), lambda p: (413, "image_too_large"))
    add("gif_bomb", lambda p: Item(image=_gif_bomb()), lambda p: (413, "image_too_large"))
    add("bmp_bomb", lambda p: Item(image=_bmp_bomb()), lambda p: (413, "image_too_large"))
    # -- raw uint8 pixels (``/v1/infer`` JSON and v2 only)
    add("pixels_wrong_channels", lambda p: Item(pixels=([2, 2, 4], bytes(16))),
        lambda p: v2_error(p, 400, "invalid_tensor_shape", 422, "invalid_tensor_shape"))
    add("pixels_wrong_length", lambda p: Item(pixels=([2, 2, 3], bytes(11))) if p == "infer_json" else {
        "v2_json": RawBody(b'{"inputs": [{"name": "image_uint8", "datatype": "UINT8", "shape": [1, 2, 2, 3], '
                           b'"data": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}]}', json_type),
        "v2_binary": _v2_body_with(b'{"inputs": [{"name": "image_uint8", "datatype": "UINT8", "shape": [1, 2, 2, 3],'
                                   b' "parameters": {"binary_data_size": 11}}]}', bytes(11)),
    }.get(p), lambda p: v2_error(p, 400, "invalid_tensor_data", 422, "invalid_tensor_length"))
    add("pixels_zero_side", lambda p: Item(pixels=([0, 4, 3], b"")) if p != "infer_json" else
        RawBody(b'{"image": {"uint8": {"shape": [0, 4, 3], "b64": "AA=="}}}', json_type),
        lambda p: (422, "invalid_image_size"))
    add("pixels_huge_shape", lambda p: Item(pixels=([100_000, 100_000, 3], bytes(12))) if p == "infer_json" else {
        "v2_json": RawBody(b'{"inputs": [{"name": "image_uint8", "datatype": "UINT8", '
                           b'"shape": [1, 100000, 100000, 3], "data": [1, 2, 3]}]}', json_type),
        "v2_binary": _v2_body_with(b'{"inputs": [{"name": "image_uint8", "datatype": "UINT8", '
                                   b'"shape": [1, 100000, 100000, 3], "parameters": {"binary_data_size": 12}}]}',
                                   bytes(12)),
    }.get(p), lambda p: v2_error(p, 400, "invalid_tensor_data", 413, "image_too_large"))
    add("pixels_out_of_range", lambda p: RawBody(
        b'{"inputs": [{"name": "image_uint8", "datatype": "UINT8", "shape": [1, 1, 1, 3], "data": [0, 300, -1]}]}',
        json_type) if p == "v2_json" else None, lambda p: (400, "invalid_tensor_data"))
    # -- wrong content types
    add("wrong_content_type", lambda p: None if p in ("infer_multipart", "v2_binary") else
        RawBody(b'{"text": "hi"}', {"content-type": "text/plain"}), lambda p: (415, "unsupported_media_type"))
    add("no_content_type", lambda p: RawBody(b"text=hi", {}) if p == "infer_json" else None,
        lambda p: (415, "unsupported_media_type"))
    add("form_to_a_json_protocol", lambda p: RawBody(b"input=hi", {"content-type": "application/x-www-form-urlencoded"})
        if p in ("openai", "v2_json") else None, lambda p: (415, "unsupported_media_type"))
    return cases


def _v2_body_with(header: bytes, binary: bytes) -> RawBody:
    return RawBody(header + binary, {"Inference-Header-Content-Length": str(len(header))})


REFUSALS = _refusals()


@pytest.mark.parametrize(("name", "protocol", "item", "expected"), REFUSALS,
                         ids=[f"{protocol}-{name}" for name, protocol, _, _ in REFUSALS])
def test_bad_input_is_refused_by_name(tiny_server, name, protocol, item, expected):
    with tiny_server.client() as client:
        _send_and_check(client, protocol, item, expected)


def test_the_matrix_covers_every_path_and_every_kind_of_bad_input():
    by_protocol = {protocol: {name for name, p, _, _ in REFUSALS if p == protocol} for protocol in PROTOCOLS}
    shared = {"invalid_json", "wrong_type", "missing_fields", "empty_text", "whitespace_text", "empty_image",
              "not_an_image", "truncated_png", "truncated_jpeg", "header_only_png", "png_bomb", "gif_bomb",
              "bmp_bomb", "text_over_the_token_limit", "text_over_max_chars"}
    for protocol, names in by_protocol.items():
        assert shared <= names, (protocol, shared - names)
    for protocol in ("infer_json", "v2_json", "v2_binary"):
        assert {"pixels_wrong_channels", "pixels_wrong_length", "pixels_zero_side", "pixels_huge_shape"} <= \
            by_protocol[protocol]


# -- inputs that must be served, and served right ----------------------------------------------------


MODES = (("1", "PNG"), ("L", "PNG"), ("LA", "PNG"), ("P", "PNG"), ("P-transparent", "PNG"), ("RGB", "PNG"),
         ("RGBA", "PNG"), ("I;16", "PNG"), ("I", "TIFF"), ("F", "TIFF"), ("CMYK", "JPEG"), ("CMYK", "TIFF"),
         ("YCbCr", "JPEG"), ("LAB", "TIFF"), ("RGBX", "TIFF"), ("RGBA", "WEBP"), ("P", "GIF"), ("1", "BMP"),
         ("RGB", "PPM"), ("RGBA", "ICO"))


SIZES = ((1, 1), (1, 3000), (3000, 1), (2, 1500))
ANIMATED_FORMATS = ("GIF", "PNG", "WEBP")


def _served_images(seed: int) -> list[tuple[str, bytes, bytes]]:
    """(name, bytes sent, bytes whose decoding is the expected input): every mode, size and animation."""
    images = []
    for index, (mode, fmt) in enumerate(MODES):
        data = encode(_in_mode(mode, seed + index), fmt)
        images.append((f"{mode}-{fmt}", data, data))
    for index, size in enumerate(SIZES):
        data = encoded_image(seed + 100 + index, size)
        images.append((f"{size[0]}x{size[1]}", data, data))
    for index, fmt in enumerate(ANIMATED_FORMATS):
        data, opened = _animated(fmt, seed + 200 + 10 * index)
        assert getattr(opened, "n_frames", 1) == 3
        opened.seek(0)
        images.append((f"animated-{fmt}", data, encode(opened.convert("RGB"), "PNG")))  # the first frame
    return images


def _direct_image_embeddings(bundle, sources: list[bytes]) -> np.ndarray:
    """What the model says for each image, decoded by the server's own decoder: (N, D)."""
    inputs = [resize_to_model_input(decode_image(data, 10**8), bundle.config.preprocess) for data in sources]
    pixels = torch.from_numpy(np.stack(inputs))  # (N, S, S, 3) uint8
    return np.stack([segment.pooled.numpy() for segment in bundle.model.encode_images(pixels)])


def _many_images_request(protocol: str, images: list[bytes]) -> tuple[str, dict]:
    """Every image as one row (v2) or one input item (OpenAI) of a single request."""
    if protocol == "openai":
        body = {"input": [f"data:image/png;base64,{b64(data)}" for data in images], "model": "tiny"}
        return "/v1/embeddings", {"json": body}
    if protocol == "v2_json":
        body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [len(images)],
                            "data": [b64(data) for data in images]}]}
        return V2_PATH, {"json": body}
    tensor = Tensor("image", "BYTES", (len(images),), np.array(images, dtype=object), is_binary=True)
    encoded = encode_infer_request(V2InferRequest((tensor,)))
    return V2_PATH, {"content": encoded.body,
                     "headers": {"Inference-Header-Content-Length": str(encoded.header_length)}}


def _many_embeddings(protocol: str, response: httpx.Response, num_images: int) -> np.ndarray:
    body = response.json()
    if protocol == "openai":
        return np.asarray([item["embedding"] for item in body["data"]], dtype=np.float32)
    (output,) = [output for output in body["outputs"] if output["name"] == "image_embedding"]
    return np.asarray(output["data"], dtype=np.float32).reshape(num_images, -1)  # (N, D)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_pillow_mode_size_and_animation_is_served_right(tiny_server, tiny_bundle, protocol):
    """Every mode becomes RGB, 1x1 and 1x3000 images are resized, an animation gives its first frame."""
    images = _served_images(seed=1000 * (PROTOCOLS.index(protocol) + 1))  # distinct bytes: no cache hits
    expected = _direct_image_embeddings(tiny_bundle, [source for _, _, source in images])
    with tiny_server.client() as client:
        if protocol in ("infer_json", "infer_multipart"):
            got = []
            for name, data, _ in images:
                request = _request(protocol, Item(image=data))
                assert request is not None
                response = client.post(request[0], **request[1])
                assert response.status_code == 200, (name, response.text[:300])
                got.append(np.asarray(response.json()["image_embedding"], dtype=np.float32))
            embeddings = np.stack(got)
        else:  # one request, one row per image: batch decoding and row order are checked too
            path, arguments = _many_images_request(protocol, [data for _, data, _ in images])
            response = client.post(path, **arguments)
            assert response.status_code == 200, response.text[:300]
            embeddings = _many_embeddings(protocol, response, len(images))
    for (name, _, _), got_row, want_row in zip(images, embeddings, expected, strict=True):
        np.testing.assert_allclose(got_row, want_row, rtol=0, atol=TOLERANCE, err_msg=name)


UNICODE_TEXTS = {
    "nul": "before\x00after",
    "rtl": "\u202e\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd",
    "emoji": "family \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 party \U0001f389",
    "combining": "e\u0301\u0301\u0301 a\u0308\u0323 Z\u0335\u0321\u0322",
    "bom_and_zero_width": "\ufeffword\u200bjoiner\u200d",
    "cjk": "\u6f22\u5b57\u304b\u306a\u30ab\u30ca",
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", sorted(UNICODE_TEXTS))
def test_unicode_edge_cases_are_embedded_as_the_model_says(tiny_server, tiny_bundle, protocol, name):
    text = UNICODE_TEXTS[name]
    with tiny_server.client() as client:
        response = _send_and_check(client, protocol, Item(text=text), OK)
    token_ids = tiny_bundle.tokenizer.encode(text, truncate=False).token_ids
    expected = tiny_bundle.model.encode_texts([token_ids])[0].pooled.numpy()
    np.testing.assert_allclose(_embedding(protocol, response, "text_embedding"), expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_text_over_the_token_limit_is_cut_when_truncate_is_set(tiny_server, tiny_bundle, protocol):
    text = "y" * (tiny_bundle.tokenizer.max_tokens + 40)
    with tiny_server.client() as client:
        response = _send_and_check(client, protocol, Item(text=text, truncate=True), OK)
    token_ids = tiny_bundle.tokenizer.encode(text, truncate=True).token_ids
    assert len(token_ids) == tiny_bundle.tokenizer.max_tokens
    expected = tiny_bundle.model.encode_texts([token_ids])[0].pooled.numpy()
    np.testing.assert_allclose(_embedding(protocol, response, "text_embedding"), expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize(("protocol", "hint"), [
    ("infer_json", 'send "truncate": true'), ("infer_multipart", 'send "truncate": true'),
    ("v2_json", "set parameters.truncate to true"), ("v2_binary", "set parameters.truncate to true"),
    ("openai", 'send "truncate": true'),
])
def test_a_text_over_the_token_limit_is_told_how_its_own_protocol_cuts_it(tiny_server, protocol, hint):
    with tiny_server.client() as client:
        response = _send_and_check(client, protocol, Item(text="z" * 600), (422, "text_too_long"))
    message = _error_message(response)
    assert hint in message
    assert protocol.startswith("v2") == ('"truncate"' not in message)


# -- bodies no JSON parser should recurse into, and content types -----------------------------------------


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _too_deep_requests() -> list[tuple[str, str, bytes, dict[str, str]]]:
    json_type = {"content-type": "application/json"}
    deep = _nested(1030)
    header = b'{"inputs": ' + deep + b"}"
    return [
        ("infer", "/v1/infer", b'{"text": ' + deep + b"}", json_type),
        ("openai", "/v1/embeddings", b'{"input": ' + deep + b"}", json_type),
        ("v2_json", V2_PATH, header, json_type),
        ("v2_binary", V2_PATH, header + b"\x00" * 4,
         {"content-type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}),
        ("classify", "/v1/classify", b'{"labels": ' + deep + b"}", json_type),
        ("rank", "/v1/rank", b'{"query": "a cat", "candidates": ' + deep + b"}", json_type),
    ]


TOO_DEEP = _too_deep_requests()


@pytest.mark.parametrize(("path", "content", "headers"), [case[1:] for case in TOO_DEEP],
                         ids=[case[0] for case in TOO_DEEP])
def test_json_nested_past_the_limit_is_invalid_json_naming_the_limit_on_every_json_route(tiny_server, path, content,
                                                                                          headers):
    with tiny_server.client() as client:
        before = _requests_total(client, 400)
        response = client.post(path, content=content, headers=headers)
        assert response.status_code == 400, response.text[:300]
        assert _error_code(response) == "invalid_json"
        assert "the limit of 1024 levels" in _error_message(response)
        assert _requests_total(client, 400) == before + 1
        shallow = content.replace(b"[" * 1030, b"[" * 3).replace(b"]" * 1030, b"]" * 3)
        assert client.post(path, content=shallow, headers=headers).status_code != 500


@pytest.mark.parametrize("path", ["/v1/classify", "/v1/rank"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/x-www-form-urlencoded", None])
def test_classify_and_rank_refuse_what_is_not_declared_json_as_infer_does(tiny_server, path, content_type):
    body = json.dumps({"image": {"b64": b64(encoded_image(3))}, "labels": ["cat"]} if path == "/v1/classify" else
                      {"query": "a cat", "candidates": [{"b64": b64(encoded_image(3))}]}).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    with tiny_server.client() as client:
        before = _requests_total(client, 415)
        response = client.post(path, content=body, headers=headers)
        assert response.status_code == 415, response.text[:300]
        error = response.json()["error"]
        assert (error["code"], error["field"]) == ("unsupported_media_type", "content-type")
        assert repr(content_type or "(none)") in error["message"] and "application/json" in error["message"]
        assert _requests_total(client, 415) == before + 1
        infer = client.post("/v1/infer", content=b'{"text": "hi"}', headers=headers)
        assert infer.status_code == 415  # what /v1/infer answers the same body and type


def test_the_protocol_routes_read_a_body_without_content_type_as_their_own_servers_do(tiny_server):
    """Triton reads a body whatever its type (tritonclient sends none); FastAPI-based OpenAI servers read a body
    without one as JSON. A declared type that is not theirs is still refused."""
    v2_body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}).encode()
    with tiny_server.client() as client:
        assert client.post("/v1/embeddings", content=b'{"input": "hi"}').status_code == 200
        assert client.post(V2_PATH, content=v2_body).status_code == 200
        assert client.post("/v1/embeddings", content=b'{"input": "hi"}',
                           headers={"content-type": "text/plain"}).status_code == 415


# -- multipart texts -------------------------------------------------------------------------------------------


def _multipart(*parts: tuple[str, bytes], closed: bool = True) -> RawBody:
    body = b"".join(b'--b\r\nContent-Disposition: form-data; name="' + name.encode() + b'"\r\n\r\n' + value + b"\r\n"
                    for name, value in parts)
    return RawBody(body + (b"--b--\r\n" if closed else b""), {"content-type": "multipart/form-data; boundary=b"})


@pytest.mark.parametrize(("name", "body", "code"), [
    ("latin-1 text", _multipart(("text", "caf\u00e9".encode("latin-1"))), "invalid_text_encoding"),
    ("invalid utf-8 in an option", _multipart(("text", b"hi"), ("priority", b"\xff")), "invalid_text_encoding"),
    ("two texts", _multipart(("text", b"first"), ("text", b"second")), "duplicate_field"),
    ("no closing boundary", _multipart(("text", b"hi"), closed=False), "invalid_multipart"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_multipart_text_is_utf8_said_once_in_a_closed_body(tiny_server, name, body, code):
    with tiny_server.client() as client:
        response = _send_and_check(client, "infer_multipart", body, (400, code))
    field = response.json()["error"]["field"]
    assert field == {"invalid utf-8 in an option": "priority", "no closing boundary": "body"}.get(name, "text")


def test_a_multipart_text_in_utf8_is_embedded_as_its_json_twin(tiny_server):
    with tiny_server.client() as client:
        multipart = _send_and_check(client, "infer_multipart", _multipart(("text", "caf\u00e9".encode())), OK)
        as_json = client.post("/v1/infer", json={"text": "caf\u00e9"})
    np.testing.assert_allclose(multipart.json()["text_embedding"], as_json.json()["text_embedding"], rtol=0,
                               atol=TOLERANCE)


# -- errors that name the field and its limit ------------------------------------------------------------------


@pytest.mark.parametrize(("uint8", "field"), [
    ({"shape": [1, 3], "b64": "AAAA"}, "image.uint8.shape"),
    ({"shape": "1,1,3", "b64": "AAAA"}, "image.uint8.shape"),
    ({"shape": [1, 1, 3], "b64": "AAAA", "dtype": "u8"}, "image.uint8.dtype"),
    ({"b64": "AAAA"}, "image.uint8.shape"),
])
def test_a_bad_raw_pixels_object_is_refused_for_what_is_wrong_inside_it(tiny_server, uint8, field):
    with tiny_server.client() as client:
        for body, named in (({"image": {"uint8": uint8}}, field),
                            ({"images": [{"b64": b64(encoded_image(4))}, {"uint8": uint8}]},
                             field.replace("image.", "images[1].", 1))):
            response = client.post("/v1/infer", json=body)
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert (error["code"], error["field"]) == ("invalid_request", named)
            assert error["message"].startswith(f"{named}: ")


def test_raw_pixels_whose_shape_is_past_64_bits_are_refused_by_the_pixel_limit(tiny_server):
    limit = tiny_server.app.state.mmserve.settings.max_image_pixels
    with tiny_server.client() as client:
        response = client.post("/v1/infer", content=b'{"image": {"uint8": {"shape": [' + b"1" + b"0" * 30 +
                               b', 1, 3], "b64": "AAAA"}}}', headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("image_too_large", "image.uint8")
    assert f"the limit is {limit}" in error["message"]


@pytest.mark.parametrize("timeout_ms", [b"100000000000000000000", b"1e20", b"3600001"])
def test_a_timeout_past_the_limit_is_refused_naming_the_limit(tiny_server, timeout_ms):
    with tiny_server.client() as client:
        for path, body in (("/v1/infer", b'{"text": "hi", "timeout_ms": ' + timeout_ms + b"}"),
                           ("/v1/classify", b'{"image": {"b64": "' + b64(encoded_image(4)).encode() +
                            b'"}, "labels": ["cat"], "timeout_ms": ' + timeout_ms + b"}")):
            response = client.post(path, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["field"] == "timeout_ms" and "3600000" in error["message"], error


@pytest.mark.parametrize("name", ["png_bomb", "gif_bomb", "bmp_bomb"])
def test_an_image_past_pillows_own_limit_is_refused_in_mmserves_words(tiny_server, name):
    data = {"png_bomb": _png_header_only(20_000, 20_000), "gif_bomb": _gif_bomb(), "bmp_bomb": _bmp_bomb()}[name]
    limit = tiny_server.app.state.mmserve.settings.max_image_pixels
    with tiny_server.client() as client:
        response = client.post("/v1/infer", json={"image": {"b64": b64(data)}})
    assert response.status_code == 413
    message = response.json()["error"]["message"]
    assert message.startswith("image is ") and message.endswith(f"; the limit is {limit} (MMSERVE_MAX_IMAGE_PIXELS)")
    assert "decompression bomb" not in message and "178956970" not in message
    if name == "png_bomb":
        assert message.startswith("image is 20000x20000 = 400000000 pixels")


def test_a_wrong_method_gets_mmserves_error_shape_and_allow(tiny_server):
    with tiny_server.client() as client:
        response = client.get("/v1/infer")
    assert response.status_code == 405
    assert "POST" in response.headers["allow"]
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("method_not_allowed", "method") and "POST" in error["message"]


# -- bodies over the size limit --------------------------------------------------------------------------


def _raw_post_head(path: str, content_type: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: mmserve\r\nContent-Type: {content_type}\r\n{extra}\r\n").encode()


@pytest.mark.parametrize(("protocol", "path", "content_type"), [
    ("infer_json", "/v1/infer", "application/json"),
    ("infer_multipart", "/v1/infer", "multipart/form-data; boundary=b"),
    ("v2", V2_PATH, "application/json"),
    ("openai", "/v1/embeddings", "application/json"),
])
def test_a_declared_oversized_body_is_refused_before_it_is_sent(tiny_server, protocol, path, content_type):
    limit_bytes = tiny_server.app.state.mmserve.settings.max_body_bytes
    with tiny_server.client() as client:
        before = _requests_total(client, 413)
        host, port = tiny_server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            # Only the head and 1 KiB are ever sent of a body declared 1 GiB long.
            sock.sendall(_raw_post_head(path, content_type, f"Content-Length: {1024**3}\r\n") + b"x" * 1024)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert f"{limit_bytes}".encode() in answer and b"body_too_large" in answer
        assert _requests_total(client, 413) == before + 1
        assert client.post("/v1/infer", json={"text": "after a refusal"}).status_code == 200


def test_a_streamed_body_is_cut_off_at_the_limit_on_every_path(live_server_factory):
    with live_server_factory(max_body_bytes=4096) as server, server.client() as client:
        multipart_head = b'--b\r\nContent-Disposition: form-data; name="text"\r\n\r\n'
        for path, headers, first in (("/v1/infer", {"content-type": "application/json"}, b'{"text": "'),
                                     ("/v1/infer", {"content-type": "multipart/form-data; boundary=b"},
                                      multipart_head),
                                     (V2_PATH, {}, b'{"inputs": [{"name": "'),
                                     ("/v1/embeddings", {"content-type": "application/json"}, b'{"input": "')):
            before = _requests_total(client, 413)
            response = client.post(path, content=iter([first] + [b"y" * 1000] * 20), headers=headers)
            assert response.status_code == 413, (path, response.text)
            assert _requests_total(client, 413) == before + 1
            assert client.post("/v1/infer", json={"text": "fine"}).status_code == 200
