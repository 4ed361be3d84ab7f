"""A generated image–text dataset with a learnable answer: shapes in colours, with their captions.

    write_shape_pairs(dir, num_images=180) -> dir/pairs.jsonl + dir/images/0000.png ...

Each image is one circle, square or triangle in red, green or blue, of a
random size and place on a plain light background; its caption names both
("a red circle"). Nine captions, so a mismatched caption is wrong about the
colour, the shape or both. Seeded: the same arguments write the same files.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from encoded_images import encode

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220)}
SHAPES = ("circle", "square", "triangle")


@dataclass(frozen=True)
class ShapeImage:
    path: Path
    colour: str
    shape: str

    @property
    def caption(self) -> str:
        return f"a {self.colour} {self.shape}"


def draw_shape(colour: str, shape: str, rng: random.Random, size_px: int = 64) -> Image.Image:
    background = tuple(rng.randint(225, 250) for _ in range(3))
    image = Image.new("RGB", (size_px, size_px), background)
    draw = ImageDraw.Draw(image)
    extent = rng.randint(size_px * 11 // 20, size_px * 17 // 20)
    left, top = rng.randint(0, size_px - extent), rng.randint(0, size_px - extent)
    box = (left, top, left + extent, top + extent)
    fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(left + extent / 2, top), (left, top + extent), (left + extent, top + extent)], fill=fill)
    return image


def write_shape_pairs(directory: Path, num_images: int = 180, seed: int = 0) -> tuple[Path, list[ShapeImage]]:
    """Images under ``directory/images`` and ``directory/pairs.jsonl`` (paths relative to it, no labels)."""
    directory = Path(directory)
    (directory / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    classes = [(colour, shape) for colour in COLOURS for shape in SHAPES]
    images = []
    for i in range(num_images):
        colour, shape = classes[i % len(classes)]
        path = directory / "images" / f"{i:04d}.png"
        path.write_bytes(encode(draw_shape(colour, shape, rng), "PNG"))
        images.append(ShapeImage(path, colour, shape))
    pairs_path = directory / "pairs.jsonl"
    pairs_path.write_text("".join(json.dumps({"image": f"images/{image.path.name}", "text": image.caption}) + "\n"
                                  for image in images))
    return pairs_path, images
