"""What ``benchmarks.engines`` sends and reads back: Zipf-drawn image bodies for wrk, and the image cache's count.

The harness's wrk script posts its bodies in turn; a cache needs a popularity
law, so ``write_zipf_bodies`` adds a script that draws one body per request,
Zipf(s) by rank, from a generator seeded in the script (one seed, one
sequence: every server of a round is sent the same requests in the same
order). The images are the load generator's own, as ``data:`` URIs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.wrk_load import POSTING, WrkBodies, write_bodies
from benchmarks.loadgen.image_pool import ImageFormat, ImageSize, encode_image, render_image
from benchmarks.loadgen.server_metrics import CACHE_EVENTS, MetricsSnapshot
from benchmarks.photo_like import data_uri

EMBEDDINGS_PATH = "/v1/embeddings"
CACHE_BYTES = "mmserve_cache_bytes"
CACHE_ENTRIES = "mmserve_cache_entries"
IMAGE = "image"
_LOOKUPS = ("hit", "miss", "coalesced")  # what benchmarks.loadgen.server_metrics counts as a lookup

ZIPF_SCRIPT = """\
-- Posts, per request, one of the bodies named in BODY_FILES, drawn Zipf(exponent) by rank (the first file
-- the most often) from a generator seeded with seed: the same seed sends the same sequence.
""" + POSTING + """\
local cumulative, total = {}, 0
for rank = 1, #names do
  total = total + 1 / rank ^ exponent
  cumulative[rank] = total
end
local requests = {}
init = function(args)
  math.randomseed(seed)
  for index, name in ipairs(names) do
    local file = assert(io.open(name, "rb"))
    requests[index] = wrk.format(nil, nil, nil, file:read("*a"))
    file:close()
  end
end
request = function()
  local target, low, high = math.random() * total, 1, #cumulative
  while low < high do
    local middle = math.floor((low + high) / 2)
    if cumulative[middle] < target then low = middle + 1 else high = middle end
  end
  return requests[low]
end
"""


def zipf_script(exponent: float, seed: int) -> str:
    """``ZIPF_SCRIPT`` with its two constants set."""
    if not exponent >= 0 or seed < 0:
        raise ValueError(f"a Zipf script needs exponent >= 0 and seed >= 0, got {exponent}, {seed}")
    return f"local exponent, seed = {exponent!r}, {seed}\n" + ZIPF_SCRIPT


def write_zipf_bodies(directory: Path, name: str, path: str, bodies: Sequence[bytes], exponent: float,
                      seed: int) -> WrkBodies:
    """``bodies`` as ``write_bodies`` writes them, posted Zipf(``exponent``) by rank, the draws seeded with ``seed``."""
    written = write_bodies(directory, name, path, bodies)
    script = directory / f"zipf-{seed}.lua"
    script.write_text(zipf_script(exponent, seed), encoding="utf-8")
    return WrkBodies(written.path, written.files, script)


def image_bodies(num_images: int, size: ImageSize, seed: int = 0) -> list[bytes]:
    """``{"input": "data:image/jpeg;base64,..."}`` for keys 0..num_images-1 of the load generator's image pool."""
    return [json.dumps({"input": data_uri(encode_image(render_image(seed, key, size), ImageFormat.JPEG))}).encode()
            for key in range(num_images)]


@dataclass(frozen=True)
class CacheCount:
    """The image cache's lookups over some runs: hits and every lookup (hit, miss, coalesced)."""

    num_hits: float = 0.0
    num_lookups: float = 0.0

    def __add__(self, other: CacheCount) -> CacheCount:
        return CacheCount(self.num_hits + other.num_hits, self.num_lookups + other.num_lookups)

    @property
    def hit_rate(self) -> float | None:
        return self.num_hits / self.num_lookups if self.num_lookups > 0 else None


def image_cache_count(before: MetricsSnapshot, after: MetricsSnapshot) -> CacheCount:
    """The image lookups between two scrapes, summed over every series (and so over engines, labelled or not)."""
    hits = lookups = 0.0
    for labels, value in after.select(CACHE_EVENTS, modality=IMAGE):
        event = labels.get("event", "")
        if event not in _LOOKUPS:
            continue
        growth = value - before.values.get((CACHE_EVENTS, frozenset(labels.items())), 0.0)
        lookups += growth
        hits += growth if event == "hit" else 0.0
    return CacheCount(hits, lookups)


def bytes_per_image_entry(snapshot: MetricsSnapshot) -> float | None:
    """The image cache's bytes over its entries, over every engine's series; ``None`` while it holds none."""
    num_bytes = sum(value for _, value in snapshot.select(CACHE_BYTES, modality=IMAGE))
    num_entries = sum(value for _, value in snapshot.select(CACHE_ENTRIES, modality=IMAGE))
    return num_bytes / num_entries if num_entries > 0 else None


def cache_bytes_for(num_images: int, entry_bytes: float) -> int:
    """``cache_image_bytes`` that holds ``num_images`` entries of ``entry_bytes`` (rounded up to a whole byte)."""
    return int(-(-num_images * entry_bytes // 1))
