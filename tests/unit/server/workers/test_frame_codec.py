"""The control frames' codec: every message the engine and API processes exchange round-trips, nothing else does."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import socket

import msgpack
import numpy as np
import pytest
import torch

from cache.keys import Modality, SegmentKey, encoded_image_key
from models.loading.config import FusionConfig, ModelConfig, PreprocessConfig, TextConfig, VisionConfig
from models.loading.repository import ModelDescription
from models.served_facts import ServedModelFacts
from models.tokenizer import TokenizedText
from models.tokenizer_files import TokenizerFiles
from router.intake import IntakeItem, IntakeOutcome
from router.item_facts import ItemFacts
from router.joint_budget import JointTokens
from router.request import InferenceResult, Priority, Route
from router.segments import ImageContent
from router.faults import FaultPlan
from router.tracing import BatchTrace, SpanIds
from router.zero_shot import TokenizedTexts, ZeroShotOptions
from server.protocols.zero_shot_run import Pairing, ZeroShotScores, ZeroShotWork
from server.workers import frame_codec
from server.workers.frame_codec import DATACLASS, ENUM, NDARRAY, TUPLE, FrameDecodeError, decode, encode
from server.workers.frames import encode_frame, read_frame, read_frame_blocking


def _items() -> list[IntakeItem]:
    return [
        IntakeItem("r-1", text="a red bicycle", priority=Priority.HIGH, timeout_ms=250, truncate=True,
                   trace=SpanIds(2**127 + 5, 2**63 + 7), protocol="openai"),
        IntakeItem("r-2", images=(ImageContent(encoded=b"\xff\xd8\xff\xe0jpeg"),
                                  ImageContent(pixels=bytes(range(12)), shape=(2, 2, 3))),
                   priority=Priority.LOW, use_cache=False, images_as_list=True),
        IntakeItem("r-3", tokens=TokenizedText((2, 70, 71, 3), True, 9), images=(ImageContent(encoded=b"png"),)),
    ]


def _outcomes() -> list[IntakeOutcome]:
    text_facts = ItemFacts("native", "normal", num_text_tokens=5, is_text_truncated=False, num_joint_tokens=5)
    image_facts = ItemFacts("kserve_v2", "low", image_encodings=("jpeg", "raw"), image_pixels=(640 * 480, None),
                            image_bytes=(1234, 12), raw_shapes=((2, 2, 3),), num_images=2, image_encoding="mixed",
                            largest_image_pixels=640 * 480, num_joint_tokens=392)
    text = IntakeOutcome(
        InferenceResult(Route.TEXT, text_embedding=np.linspace(-1, 1, 32, dtype=np.float32), score=np.float32(0.25),
                        batch_size=3, stage_ns={"text": 120_000, "queue": 5_000}),
        TokenizedText((49406, 320, 736, 11652, 49407), False, 5), plan=None,  # type: ignore[arg-type]
        decode_ns=40_000, joint=JointTokens(0, 196, 5, 512), decode_started_ns=10**15, facts=text_facts,
        cache={"text": "miss"})
    images = IntakeOutcome(
        InferenceResult(Route.VISION, image_embeddings=(np.ones(16, np.float32), np.zeros(16, np.float32)),
                        fused_embedding=np.arange(8, dtype=np.float64), match_score=0.5),
        None, plan=None, decode_ns=2_000_000, facts=image_facts,  # type: ignore[arg-type]
        cache={"images": ["hit", "bypass"]})
    batch = BatchTrace(SpanIds(2**100 + 1, 9), Route.FUSION, "image", "cuda:0", num_requests=2, num_work_items=3,
                       padded_size=4, image_shape=(4, 224, 224, 3), text_shape=(4, 16), started_ns=10**15 + 7,
                       elapsed_ns=3_000_000, stage_ns=(("vision", 2_000_000), ("fusion", 1_000_000)),
                       links=(SpanIds(2**127 + 5, 2**63 + 7), SpanIds(3, 4)), num_failed=1)
    traced = IntakeOutcome(InferenceResult(Route.FUSION, fused_embedding=np.ones(4, np.float32), batch_trace=batch),
                           None, plan=None, decode_ns=1_000)  # type: ignore[arg-type]
    return [text, images, traced]


def _batch_of(outcome: IntakeOutcome) -> BatchTrace:
    assert outcome.result.batch_trace is not None
    return outcome.result.batch_trace


DRILLS = ((FaultPlan("decode", 150.0, 0.5, 60.0, only_encoding="png"), 59.75),
          (FaultPlan("vision", 20.0, 1.0, 5.0), 4.5))


def _same(left: object, right: object) -> bool:
    """Equal, arrays compared by dtype, shape and values (dataclass ``==`` cannot compare arrays)."""
    if isinstance(left, np.ndarray):
        return (isinstance(right, np.ndarray) and left.dtype == right.dtype and left.shape == right.shape
                and np.array_equal(left, right))
    if isinstance(left, np.generic):
        return type(left) is type(right) and left == right
    if dataclasses.is_dataclass(left):
        return type(left) is type(right) and all(
            _same(getattr(left, f.name), getattr(right, f.name)) for f in dataclasses.fields(left))
    if isinstance(left, (list, tuple)):
        return type(left) is type(right) and len(left) == len(right) and all(map(_same, left, right))
    if isinstance(left, dict):
        return type(right) is dict and left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    return type(left) is type(right) and left == right


KEY = encoded_image_key("fingerprint", "size=224", b"\xff\xd8jpeg")
ERROR = (422, "text_too_long", "text has 80 tokens; the limit is 77", "text", None)

MESSAGES = {
    # API process -> engine
    "peek": ("peek", 1, [KEY, None, SegmentKey(Modality.TEXT, b"\x01" * 32)]),
    "run": ("run", 2, _items(), 1_234_567_890_123, "psm_mmserve_1", [[], [3, None], [None]]),
    "cancel": ("cancel", 2),
    "status": ("status", 3),
    "clear_cache": ("clear_cache", 0),
    "metrics": ("metrics", 0),
    "describe": ("describe", 4),
    "watch_faults": ("watch_faults", 6),
    "batch_spans": ("batch_spans", 7, [_batch_of(_outcomes()[2])]),
    "zero_shot": ("zero_shot", 8, ZeroShotWork(
        (ImageContent(encoded=b"\xff\xd8jpeg"), ImageContent(pixels=bytes(range(12)), shape=(2, 2, 3))), (),
        TokenizedTexts((TokenizedText((2, 70, 3), False, 3), TokenizedText((2, 71, 3), True, 90)),
                       (SegmentKey(Modality.TEXT, b"\x02" * 32), SegmentKey(Modality.TEXT, b"\x03" * 32))),
        Pairing.CLASSIFY, "images[{}]", "labels[{}]",
        ZeroShotOptions("r-9", Priority.HIGH, 500, True, False, SpanIds(2**127 + 5, 2**63 + 7))),
        1_234_567_890_123, "psm_mmserve_1", [4, None]),
    "http": ("http", 5, "POST", "/v1/admin/faults", [("content-type", "application/json"), ("x-api-key", "k")],
             b'{"stage": "vision", "delay_ms": 50}', ("127.0.0.1", 51234)),
    # engine -> API process
    "ok_peek": ("ok", 1, [True, False, False]),
    "ok_run": ("ok", 2, _outcomes()),
    "error_row": ("error", 2, 1, ERROR),
    "error_call": ("error", 2, None, (503, "shutting_down", "the server is draining", None, 1.0)),
    "cancelled": ("cancelled", 2),
    "ok_zero_shot": ("ok", 8, ZeroShotScores(
        np.array([[0.25, 0.75]], np.float32), "softmax", tuple(_outcomes()[2:]), ("miss",),
        {"hit": 1, "miss": 1, "coalesced": 0, "bypass": 0}, 3, {"decode": 40_000, "vision": 9_000, "score": 700})),
    "ok_status": ("ok", 3, (True, True, False)),
    "ok_clear_cache": ("ok", 0, 17),
    "ok_metrics": ("ok", 0, ("# HELP mmserve_requests_total ...\nmmserve_requests_total 3.0\n",
                             {"window_s": 60.0, "series": [{"route": "text", "stage": "total",
                                                            "window": {"count": 2, "centroids": [[1.5, 1.0]]}}]},
                             [["mmserve_request_duration_seconds_bucket", {"route": "text", "le": "0.05"},
                               {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}, 0.031, 1764763200.5]])),
    "ok_watch_faults": ("ok", 6, None),
    "faults": ("faults", None, DRILLS),
    "faults_cleared": ("faults", None, ()),
    "ok_http": ("ok", 5, (200, [("content-type", "application/json"), ("x-request-id", "abc")], b'{"top": []}')),
    "ok_describe": ("ok", 4, (ServedModelFacts(
        ModelConfig("tiny", VisionConfig("vit_tiny", {"img_size": 32, "patch_size": 8}), TextConfig(hidden_size=32),
                    FusionConfig(rank=4), PreprocessConfig(input_size=32, resize_size=36, mean=(0.48, 0.46, 0.41))),
        ModelDescription("tiny", "ab12", "mmserve", None, True, "untrained"), "size=32;resize=36",
        num_image_tokens=17, image_embedding_dim=64, text_embedding_dim=32,
        max_text_tokens=16, device="cpu"),
        TokenizerFiles("transformers", {"tokenizer.json": b"{}", "tokenizer_config.json": b"{}"}, "{}", 16, False))),
}


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_every_message_kind_round_trips_with_its_types(kind):
    message = MESSAGES[kind]
    decoded = decode(encode(message))
    assert _same(message, decoded), (message, decoded)


def test_a_frame_round_trips_through_a_socket_and_an_asyncio_stream():
    message = MESSAGES["ok_run"]
    left, right = socket.socketpair()
    with left, right:
        left.sendall(encode_frame(message))
        assert _same(message, read_frame_blocking(right))

    async def read_async() -> tuple:
        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame(MESSAGES["run"]) + encode_frame(MESSAGES["cancel"]))
        reader.feed_eof()
        return await read_frame(reader), await read_frame(reader)

    run, cancel = asyncio.run(read_async())
    assert _same(MESSAGES["run"], run) and cancel == ("cancel", 2)


def test_types_survive_exactly():
    item, = decode(encode([_items()[0]]))
    assert type(item.priority) is Priority and item.priority is Priority.HIGH  # not the plain string "high"
    outcome = decode(encode(_outcomes()[0]))
    assert type(outcome.result.route) is Route
    assert outcome.joint.total == 5  # computed again by the receiver (not an init field)
    assert type(outcome.result.score) is np.float32
    assert decode(encode([2**127 + 5, -(2**100), 2**64 - 1, -(2**63)])) == [2**127 + 5, -(2**100), 2**64 - 1, -(2**63)]
    assert isinstance(decode(encode((1, 2))), tuple) and isinstance(decode(encode([1, 2])), list)
    embedding = outcome.result.text_embedding
    assert embedding.dtype == np.float32 and not embedding.flags.writeable  # a view of the frame's bytes


def test_a_dataclass_packs_its_init_fields_whatever_else_its_instance_holds():
    """Packed as its ``__dict__`` when that is its fields; an instance holding more sends its fields only."""
    item = _items()[0]
    plain = msgpack.unpackb(encode(item), raw=False, ext_hook=lambda code, data: None)
    assert sorted(plain[1]) == sorted(frame_codec._INIT_FIELDS[IntakeItem])
    object.__setattr__(item, "cached_here", 42)  # as a cached_property or a __post_init__ would leave it
    arrived = decode(encode(item))
    assert _same(arrived, _items()[0]) and not hasattr(arrived, "cached_here")


def test_a_non_contiguous_array_arrives_with_its_values():
    array = np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2]
    assert np.array_equal(decode(encode(array)), array)


class _Unregistered:
    pass


@dataclasses.dataclass(frozen=True)
class _UnregisteredDataclass:
    value: int


@pytest.mark.parametrize("value", [
    _Unregistered(), _UnregisteredDataclass(1), {1, 2}, ValueError("no"), torch.zeros(3),
    np.array(["text"], dtype=object), np.zeros(2, dtype=[("a", "i4")]), frozenset({1}),
])
def test_an_unregistered_type_refuses_to_encode(value):
    with pytest.raises(TypeError):
        encode(("ok", 1, value))


def _tagged(code: int, name: str, content: object) -> bytes:
    return msgpack.packb([msgpack.ExtType(code, name.encode()), content])


def test_an_unknown_extension_or_type_name_refuses_to_decode():
    with pytest.raises(FrameDecodeError, match="unknown extension type 42"):
        decode(msgpack.packb(msgpack.ExtType(42, b"")))
    for code, name in ((DATACLASS, "os.system"), (ENUM, "subprocess.Popen"), (DATACLASS, "builtins.eval")):
        with pytest.raises(FrameDecodeError, match="unknown type"):
            decode(_tagged(code, name, {}))
    object_array = msgpack.packb(msgpack.ExtType(NDARRAY, b"\x02|O\x01" + (1).to_bytes(8, "big") + bytes(8)))
    with pytest.raises(FrameDecodeError, match="dtype object"):
        decode(object_array)
    with pytest.raises(FrameDecodeError):
        decode(pickle.dumps(("ok", 1, [1.5])))  # the old payload is not a frame


def test_a_tag_anywhere_but_at_the_head_of_an_array_is_refused():
    tag = msgpack.ExtType(TUPLE, b"")
    for payload in ([1, tag], {"a": tag}, tag, [1, [msgpack.ExtType(DATACLASS, b"router.tracing.SpanIds")]]):
        with pytest.raises(FrameDecodeError, match="tag|parts"):
            decode(msgpack.packb(payload))


def test_a_dataclass_with_other_fields_than_the_receivers_fails_loudly():
    name = "router.tracing.SpanIds"
    assert decode(_tagged(DATACLASS, name, {"trace_id": 1, "span_id": 2})) == SpanIds(1, 2)
    with pytest.raises(FrameDecodeError, match="fields"):
        decode(_tagged(DATACLASS, name, {"trace_id": 1, "span_id": 2, "parent_id": 3}))  # a field added there
    with pytest.raises(FrameDecodeError, match="fields"):
        decode(_tagged(DATACLASS, name, {"trace_id": 1}))  # a field added here: no silent default
    with pytest.raises(FrameDecodeError, match="is not a dataclass"):  # an enum's name in a dataclass's tag
        decode(_tagged(DATACLASS, "router.request.Priority", {}))
    with pytest.raises(FrameDecodeError, match="not a valid Priority|malformed"):
        decode(_tagged(ENUM, "router.request.Priority", "urgent"))


def test_an_array_whose_bytes_do_not_match_its_shape_is_refused():
    data = frame_codec._array_bytes(np.zeros(4, np.float32))
    assert decode(msgpack.packb(msgpack.ExtType(NDARRAY, data))).shape == (4,)
    with pytest.raises(FrameDecodeError, match="with 12 bytes"):
        decode(msgpack.packb(msgpack.ExtType(NDARRAY, data[:-4])))


def test_a_batch_trace_arrives_with_its_stage_starts_laid_out_again():
    batch = decode(encode(_batch_of(_outcomes()[2])))
    assert batch.stage_started_ns("vision") == 10**15 + 7
    assert batch.stage_started_ns("fusion") == 10**15 + 7 + 2_000_000
    assert batch.stage_started_ns("text") is None


def test_a_portable_outcome_is_the_outcome_less_its_plan_and_segments_and_packs_as_one():
    """``portable`` copies without ``__init__``: what arrives is what ``dataclasses.replace`` would have sent,
    and the engine's own outcome keeps its plan and segments for the cache."""
    from server.workers.engine_answers import portable
    text = _outcomes()[0]
    plan, segment = object(), object()
    held = dataclasses.replace(text, plan=plan, result=dataclasses.replace(
        text.result, image_segments=(segment,), text_segment=segment))
    sent = portable(held)
    assert sent.plan is None and sent.result.image_segments == () and sent.result.text_segment is None
    assert held.plan is plan and held.result.text_segment is segment and held.result.image_segments == (segment,)
    assert _same(decode(encode(sent)), text)


def test_an_answer_leaves_out_the_token_ids_its_item_brought_and_the_api_process_puts_them_back():
    from server.workers.engine_answers import portable_of_item
    from server.workers.engine_client import CallInFlight

    text = _outcomes()[0]
    item = IntakeItem("r-1", tokens=text.text)
    sent = decode(encode(portable_of_item(text, item)))
    assert sent.text is None, "the engine ran the ids the API process sent: they do not travel back"
    assert sent.joint is None and sent.facts is None, "the API process derives them from its items"
    assert len(encode(portable_of_item(text, item))) < len(encode(portable_of_item(text, IntakeItem("r-1"))))
    other = IntakeItem("r-1", tokens=TokenizedText(text.text.token_ids, False, 5))  # equal, not the ones run
    assert _same(decode(encode(portable_of_item(text, other))).text, text.text)

    class Client:
        is_draining, num_in_flight = False, 0

    with CallInFlight(Client()) as call:  # type: ignore[arg-type]
        pass
    assert call.counted(sent, item.tokens).text is item.tokens
    back = call.counted(sent, item.tokens, text.joint, text.facts)
    assert back.joint == text.joint and back.facts == text.facts
    images = _outcomes()[1]
    assert call.counted(decode(encode(portable_of_item(images, IntakeItem("r-2")))), None).text is None
