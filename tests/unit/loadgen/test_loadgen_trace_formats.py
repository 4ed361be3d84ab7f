"""Both trace formats parse to the same schedule; bad records fail naming their line or span."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.loadgen.cli import main
from benchmarks.loadgen.errors import TraceFormatError
from benchmarks.loadgen.request_spec import Modality, Priority
from benchmarks.loadgen.trace import image_key_for, load_trace, parse_trace_text, trace_arrivals

BASE_NS = 1_700_000_000_000_000_000

# (offset_ms, modality, image_id, text_chars), deliberately out of order.
REQUESTS: list[tuple[float, str, int | str | None, int | None]] = [
    (40.5, "fusion", 7, 33),
    (0.0, "text", None, 12),
    (12.25, "vision", "cat.jpg", None),
    (12.25, "vision", 7, None),
    (95.0, "fusion", "cat.jpg", 1),
]


def _jsonl(requests: list[tuple[float, str, int | str | None, int | None]]) -> str:
    lines = []
    for offset_ms, modality, image_id, text_chars in requests:
        record: dict[str, Any] = {"offset_ms": offset_ms, "modality": modality}
        if image_id is not None:
            record["image_id"] = image_id
        if text_chars is not None:
            record["text_chars"] = text_chars
        lines.append(json.dumps(record))
    return "\n".join(lines) + "\n\n"


def _otlp_attribute(key: str, value: int | str) -> dict[str, Any]:
    wrapped = {"intValue": str(value)} if isinstance(value, int) else {"stringValue": value}
    return {"key": key, "value": wrapped}


def _otlp_span(offset_ms: float, modality: str, image_id: int | str | None, text_chars: int | None) -> dict[str, Any]:
    attributes = [_otlp_attribute("mmserve.modality", modality)]
    if image_id is not None:
        attributes.append(_otlp_attribute("mmserve.image_id", image_id))
    if text_chars is not None:
        attributes.append(_otlp_attribute("mmserve.text_chars", text_chars))
    start_ns = BASE_NS + round(offset_ms * 1_000_000)
    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "POST /v1/infer",
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(start_ns + 5_000_000),
        "attributes": attributes,
    }


def _otlp_document(requests: list[tuple[float, str, int | str | None, int | None]]) -> dict[str, Any]:
    spans = [_otlp_span(*request) for request in requests]
    child = {"name": "vision", "startTimeUnixNano": str(BASE_NS - 10**9), "attributes": []}  # no modality: skipped
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_otlp_attribute("service.name", "gateway")]},
                "scopeSpans": [{"scope": {"name": "gateway"}, "spans": [*spans[:2], child]}],
            },
            {"resource": {}, "scopeSpans": [{"scope": {"name": "edge"}, "spans": spans[2:]}]},
        ]
    }


def _expected() -> list[tuple[float, Modality, int | None, int]]:
    first_ms = min(request[0] for request in REQUESTS)
    return sorted(
        (
            offset_ms - first_ms,
            Modality(modality),
            None if image_id is None else image_key_for(image_id),
            text_chars or 0,
        )
        for offset_ms, modality, image_id, text_chars in REQUESTS
    )


def _shape(records: list[Any]) -> list[tuple[float, Modality, int | None, int]]:
    return sorted((round(r.offset_ms, 6), r.spec.modality, r.spec.image_key, r.spec.num_text_chars) for r in records)


def test_jsonl_trace_parses_sorted_and_relative_to_the_first_record(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(_jsonl(REQUESTS))
    records = load_trace(path)
    assert _shape(records) == _expected()
    assert [r.offset_ms for r in records] == sorted(r.offset_ms for r in records)
    assert records[0].offset_ms == 0.0


def test_otlp_span_document_parses_to_the_same_schedule() -> None:
    records = parse_trace_text(json.dumps(_otlp_document(REQUESTS), indent=2))
    assert _shape(records) == _expected()


@pytest.mark.parametrize(
    "render",
    [
        lambda: json.dumps([_otlp_span(*request) for request in REQUESTS]),  # a bare list of spans
        lambda: json.dumps([_otlp_document(REQUESTS[:2]), _otlp_document(REQUESTS[2:])]),  # a list of documents
        lambda: "\n".join(json.dumps(_otlp_document([request])) for request in REQUESTS),  # collector JSON lines
    ],
    ids=["span-list", "document-list", "document-lines"],
)
def test_other_span_layouts_parse_to_the_same_schedule(render: Any) -> None:
    assert _shape(parse_trace_text(render())) == _expected()


def test_plain_attribute_objects_and_unprefixed_names_are_accepted() -> None:
    spans = [
        {"start_time_unix_nano": BASE_NS + 3_000_000, "attributes": {"modality": "text", "text_chars": 5}},
        {
            "startTimeUnixNano": BASE_NS,
            "attributes": {"mmserve.modality": "vision", "mmserve.image_id": 4, "mmserve.priority": "high"},
        },
    ]
    records = parse_trace_text(json.dumps(spans))
    assert [(r.offset_ms, r.spec.modality, r.spec.priority) for r in records] == [
        (0.0, Modality.VISION, Priority.HIGH),
        (3.0, Modality.TEXT, None),
    ]


def test_speed_scales_offsets_and_duration_cuts_the_schedule() -> None:
    records = parse_trace_text(_jsonl(REQUESTS))
    offsets_s = [record.offset_ms / 1000.0 for record in records]
    doubled = trace_arrivals(records, speed=2.0, duration_s=None)
    assert [a.intended_offset_s for a in doubled] == pytest.approx([o / 2 for o in offsets_s])
    cut = trace_arrivals(records, speed=1.0, duration_s=0.05)
    assert [a.intended_offset_s for a in cut] == pytest.approx([o for o in offsets_s if o < 0.05])


GOOD_LINE = '{"offset_ms": 0, "modality": "text", "text_chars": 4}'


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"offset_ms": 3, "modality": "text", "text_chars": 4', "not valid JSON"),
        ('{"modality": "text", "text_chars": 4}', "offset_ms"),
        ('{"offset_ms": "soon", "modality": "text", "text_chars": 4}', "offset_ms"),
        ('{"offset_ms": 3, "modality": "audio", "text_chars": 4}', "unknown modality 'audio'"),
        ('{"offset_ms": 3, "modality": "vision"}', "needs 'image_id'"),
        ('{"offset_ms": 3, "modality": "fusion", "image_id": 2}', "needs 'text_chars'"),
        ('{"offset_ms": 3, "modality": "text", "text_chars": 0}', "'text_chars' must be >= 1"),
        ('{"offset_ms": 3, "modality": "text", "text_chars": 4, "priority": "urgent"}', "unknown priority"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_a_bad_jsonl_line_is_named(bad_line: str, problem: str) -> None:
    text = "\n".join([GOOD_LINE, "", GOOD_LINE, bad_line, GOOD_LINE])
    with pytest.raises(TraceFormatError) as caught:
        parse_trace_text(text, source="replay.jsonl")
    assert caught.value.location == "line 4"
    assert str(caught.value).startswith("replay.jsonl: line 4: ")
    assert problem in str(caught.value)


def test_a_bad_span_is_named_by_its_path() -> None:
    document = _otlp_document(REQUESTS)
    del document["resourceSpans"][1]["scopeSpans"][0]["spans"][1]["attributes"][1]  # vision span loses image_id
    with pytest.raises(TraceFormatError) as caught:
        parse_trace_text(json.dumps(document))
    assert caught.value.location == "resourceSpans[1].scopeSpans[0].spans[1]"
    assert "needs 'image_id'" in str(caught.value)


def test_a_span_document_without_request_spans_is_refused() -> None:
    with pytest.raises(TraceFormatError, match=r"mmserve\.modality"):
        parse_trace_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}))


def test_cli_reports_a_bad_trace_line_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join([GOOD_LINE, '{"offset_ms": 1, "modality": "vision"}']) + "\n")
    code = main(["http://127.0.0.1:9", "--trace", str(path), "--no-progress"])
    assert code == 1
    assert f"{path}: line 2: modality vision needs 'image_id'" in capsys.readouterr().err
