"""``--decode-device cuda`` through the real intake: which images the device decoder gets, and the answers.

A real router on the tiny model, the real ``DeviceJpegDecoder`` with
``device="cpu"`` (torchvision's ``decode_jpeg`` runs there too, with libjpeg
where the GPU has nvJPEG), and a Pillow CPU decoder that counts its calls.
The routing is the same on a GPU; the GPU-only equality (cosine 0.9999 of the
final embeddings with nvJPEG) is ``benchmarks/gpu/real_model.py``'s.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from encoded_images import encode, gradient_image

from models.jpeg_decode import DeviceJpegDecoder
from router.errors import ImageItemError, IntakeItemError
from router.intake import IntakeItem, IntakeTools, RequestIntake
from router.router import Router
from router.segments import ImageContent

MIN_COSINE = 0.999  # libjpeg vs Pillow's IDCT rounding and torch's vs Pillow's resampling, on a random tiny model


class CountingDeviceDecoder(DeviceJpegDecoder):
    """The real device decoder, remembering each batch it was handed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.batches: list[list[bytes]] = []

    def decode_to_input(self, images: Sequence[bytes]) -> list[np.ndarray | None]:
        self.batches.append(list(images))
        return super().decode_to_input(images)


class PillowDecoder:
    """The CPU decoder the server passes (Pillow, EXIF orientation, RGB), counting what it decoded."""

    def __init__(self) -> None:
        self.decoded: list[bytes] = []
        self._lock = threading.Lock()

    def __call__(self, data: bytes) -> Image.Image:
        with self._lock:
            self.decoded.append(data)
        with Image.open(io.BytesIO(data)) as opened:
            return ImageOps.exif_transpose(opened).convert("RGB")


def _jpeg(shift: int = 0, size: tuple[int, int] = (96, 64), **kwargs: object) -> bytes:
    return encode(gradient_image(size, shift), "JPEG", quality=95, **kwargs)


def _rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees: Pillow applies it, nvJPEG would not
    return _jpeg(shift=7, exif=exif.tobytes())


def _item(name: str, *images: bytes, text: str | None = None, as_list: bool = False) -> IntakeItem:
    return IntakeItem(request_id=name, text=text, images=tuple(ImageContent(encoded=data) for data in images),
                      images_as_list=as_list)


def _intakes(router: Router, pool: ThreadPoolExecutor) -> tuple[RequestIntake, CountingDeviceDecoder, PillowDecoder]:
    tools = IntakeTools.of(router.bundle, router.budget)
    device = CountingDeviceDecoder(torch.device("cpu"), tools.preprocess, max_pixels=1 << 20)
    cpu = PillowDecoder()
    return RequestIntake(router, tools, cpu, pool, device_decoder=device), device, cpu


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture
def intake_max_batch_size() -> int:
    """Batches of four, so a call's JPEGs can share one vision batch."""
    return 4


def test_one_call_sends_its_jpegs_to_the_device_in_one_batch_and_the_rest_to_the_cpu(make_router, pool):
    """KServe-like call: JPEG, PNG, EXIF-rotated JPEG, text-only, and a JPEG pair; answers as the CPU path's."""
    jpeg_a, jpeg_b, jpeg_c = _jpeg(0), _jpeg(40), _jpeg(80)
    png, rotated = encode(gradient_image((80, 80), shift=20), "PNG"), _rotated_jpeg()
    items = [_item("jpeg", jpeg_a), _item("png", png), _item("rotated", rotated), _item("text", text="a square"),
             _item("pair", jpeg_b, jpeg_c, text="two squares", as_list=True)]
    intake, device, cpu = _intakes(make_router(), pool)
    outcomes = asyncio.run(intake.run(items, time.perf_counter_ns()))

    assert device.batches == [[jpeg_a, rotated, jpeg_b, jpeg_c]]  # every JPEG of the call, in one batch
    assert device.num_device_decoded == 3 and device.num_left_to_caller == 1  # the rotated one is Pillow's
    assert sorted(cpu.decoded) == sorted([png, rotated])
    assert all(outcome.decode_ns > 0 for outcome in outcomes)  # the decode stage is still timed

    reference_router = make_router()
    reference_intake = RequestIntake(reference_router, IntakeTools.of(reference_router.bundle, reference_router.budget),
                                     PillowDecoder(), pool)  # --decode-device cpu
    reference = asyncio.run(reference_intake.run(items, time.perf_counter_ns()))
    for got, want in zip(outcomes, reference, strict=True):
        assert len(got.result.image_embeddings) == len(want.result.image_embeddings)
        for ours, theirs in zip(got.result.image_embeddings, want.result.image_embeddings, strict=True):
            assert _cosine(ours, theirs) >= MIN_COSINE
        if want.result.fused_embedding is not None:
            assert _cosine(got.result.fused_embedding, want.result.fused_embedding) >= MIN_COSINE
    for index in (1, 2):  # Pillow decoded these on both paths: the very same answer
        np.testing.assert_array_equal(outcomes[index].result.image_embeddings[0],
                                      reference[index].result.image_embeddings[0])


def test_a_cached_image_skips_the_device_decode(make_router, pool):
    router = make_router()
    intake, device, _ = _intakes(router, pool)
    jpeg = _jpeg(3)

    async def twice():
        first = await intake.run_one(_item("a", jpeg), time.perf_counter_ns())
        second = await intake.run_one(_item("b", jpeg), time.perf_counter_ns())
        return first, second

    first, second = asyncio.run(twice())
    assert first.plan.statuses() == {"image": "miss"} and second.plan.statuses() == {"image": "hit"}
    assert device.batches == [[jpeg]] and device.num_device_decoded == 1
    np.testing.assert_array_equal(first.result.image_embeddings[0], second.result.image_embeddings[0])


def test_a_bad_jpeg_fails_only_its_item_with_the_cpu_decoders_error(make_router, pool):
    """nvJPEG (here libjpeg) refuses a truncated JPEG: Pillow then reports it, naming the item and the image."""
    router = make_router()
    intake, device, cpu = _intakes(router, pool)
    good, truncated = _jpeg(5), _jpeg(9)[:400]
    with pytest.raises(IntakeItemError) as caught:
        asyncio.run(intake.run([_item("good", good), _item("bad", good, truncated, as_list=True)],
                               time.perf_counter_ns()))
    assert caught.value.item_index == 1
    image_error = caught.value.error
    assert isinstance(image_error, ImageItemError) and image_error.image_index == 1
    assert isinstance(image_error.error, OSError)  # Pillow's own error, as on the CPU path
    assert cpu.decoded == [truncated]
    assert router.cache.num_in_flight == 0  # every claim given back

    # The good image was not poisoned: alone it is answered, and from the device.
    outcome = asyncio.run(intake.run_one(_item("again", good), time.perf_counter_ns()))
    assert outcome.result.image_embeddings[0].shape == (router.bundle.model.vision.embedding_dim,)


def test_an_item_refused_before_decoding_does_not_keep_its_neighbours_waiting(make_router, pool):
    """A too-long text is refused at tokenizing, before the device round: the round must not wait for it."""
    router = make_router()
    intake, device, _ = _intakes(router, pool)
    too_long = " ".join(["word"] * (4 * router.bundle.tokenizer.max_tokens))

    async def call():
        return await asyncio.wait_for(
            intake.run([_item("jpeg", _jpeg(11)), _item("long", text=too_long)], time.perf_counter_ns()), 30)

    with pytest.raises(IntakeItemError) as caught:
        asyncio.run(call())
    assert caught.value.item_index == 1
    assert router.cache.num_in_flight == 0


def test_a_caller_cancelled_while_its_device_batch_runs_gives_its_claim_back(make_router, pool):
    """The client went away while its JPEG was in the device decoder: its claim is abandoned, the batch
    finishes in the pool, and the next caller computes the image afresh (nothing half-done was published)."""
    router = make_router()
    tools = IntakeTools.of(router.bundle, router.budget)
    entered, release = threading.Event(), threading.Event()

    class HeldDecoder(CountingDeviceDecoder):
        def decode_to_input(self, images):
            entered.set()
            assert release.wait(30), "never released"
            return super().decode_to_input(images)

    device = HeldDecoder(torch.device("cpu"), tools.preprocess)
    intake = RequestIntake(router, tools, PillowDecoder(), pool, device_decoder=device)
    jpeg = _jpeg(21)

    async def scenario():
        task = asyncio.ensure_future(intake.run_one(_item("gone", jpeg), time.perf_counter_ns()))
        while not entered.is_set():  # the round's batch is in the pool, held
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        while router.cache.num_in_flight:  # the claim given back by the cancelled caller
            await asyncio.sleep(0.01)
        return await intake.run_one(_item("again", jpeg), time.perf_counter_ns())

    outcome = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert outcome.plan.statuses() == {"image": "miss"}  # nothing was published for the cancelled caller
    assert len(device.batches) == 2 and router.cache.num_in_flight == 0
