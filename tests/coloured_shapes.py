"""A second generated dataset, unlike ``tests.shape_pairs``: full-size JPEG photos of a coloured shape on clutter.

    write_coloured_shapes(dir, num_images=120) -> dir/pairs.jsonl + dir/photos/000.jpg ...

Four colours by three shapes (twelve captions such as "a yellow disc"); each
image is 224 px square, JPEG-compressed, with a vertical gradient background
sprinkled with small grey speckles, and one shape, rotated at random, drawn
with a dark outline. ``tests.shape_pairs`` draws three colours by three shapes,
axis-aligned on a flat background, 64 px PNG: here the model sees the sizes,
compression and clutter of a camera image, and captions share more words
("a red disc" / "a red star"), so many sampled mismatches differ by one word.

``shuffled_captions`` keeps the images and the captions but pairs them at
random: a file with no signal for the head to find. Seeded throughout.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from encoded_images import encode

IMAGE_SIZE_PX = 224
COLOURS = {"red": (200, 35, 35), "green": (40, 150, 60), "blue": (35, 70, 200), "yellow": (235, 200, 30)}
SHAPES = ("disc", "star", "square")


@dataclass(frozen=True)
class ColouredShape:
    path: Path
    colour: str
    shape: str

    @property
    def caption(self) -> str:
        return f"a {self.colour} {self.shape}"


def _star(centre: tuple[float, float], radius: float, angle: float) -> list[tuple[float, float]]:
    points = []
    for i in range(10):
        r = radius if i % 2 == 0 else radius * 0.45
        a = angle + i * math.pi / 5
        points.append((centre[0] + r * math.cos(a), centre[1] + r * math.sin(a)))
    return points


def _square(centre: tuple[float, float], radius: float, angle: float) -> list[tuple[float, float]]:
    return [(centre[0] + radius * math.cos(angle + k * math.pi / 2), centre[1] + radius * math.sin(angle + k * math.pi / 2))
            for k in range(4)]


def draw_coloured_shape(colour: str, shape: str, rng: random.Random) -> Image.Image:
    size = IMAGE_SIZE_PX
    top, bottom = [rng.randint(150, 240) for _ in range(3)], [rng.randint(90, 200) for _ in range(3)]
    image = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(image)
    for y in range(size):  # a vertical gradient, like a wall meeting a floor
        t = y / (size - 1)
        draw.line([(0, y), (size, y)], fill=tuple(int(a + (b - a) * t) for a, b in zip(top, bottom)))
    for _ in range(60):  # grey speckles: clutter that is no colour of the captions
        x, y, r, g = rng.randrange(size), rng.randrange(size), rng.randint(1, 4), rng.randint(60, 200)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(g, g, g))
    radius = rng.uniform(0.22, 0.38) * size
    centre = (rng.uniform(radius, size - radius), rng.uniform(radius, size - radius))
    fill = tuple(min(255, max(0, c + rng.randint(-25, 25))) for c in COLOURS[colour])
    angle = rng.uniform(0, 2 * math.pi)
    if shape == "disc":
        draw.ellipse((centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius),
                     fill=fill, outline=(30, 30, 30), width=3)
    else:
        polygon = _star(centre, radius, angle) if shape == "star" else _square(centre, radius, angle)
        draw.polygon(polygon, fill=fill, outline=(30, 30, 30), width=3)
    return image


def write_coloured_shapes(directory: Path, num_images: int = 120, seed: int = 0) -> tuple[Path, list[ColouredShape]]:
    """JPEGs under ``directory/photos`` and ``directory/pairs.jsonl`` (one matching line per image, no labels)."""
    directory = Path(directory)
    (directory / "photos").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    classes = [(colour, shape) for colour in COLOURS for shape in SHAPES]
    images = []
    for i in range(num_images):
        colour, shape = classes[i % len(classes)]
        path = directory / "photos" / f"{i:03d}.jpg"
        path.write_bytes(encode(draw_coloured_shape(colour, shape, rng), "JPEG", quality=85))
        images.append(ColouredShape(path, colour, shape))
    pairs_path = directory / "pairs.jsonl"
    pairs_path.write_text("".join(json.dumps({"image": f"photos/{image.path.name}", "text": image.caption}) + "\n"
                                  for image in images))
    return pairs_path, images


def shuffled_captions(pairs_path: Path, out_path: Path, seed: int = 0) -> Path:
    """``pairs_path``'s images and captions, the captions paired with images at random: no signal."""
    records = [json.loads(line) for line in Path(pairs_path).read_text().splitlines() if line.strip()]
    captions = [record["text"] for record in records]
    random.Random(seed).shuffle(captions)
    image_dir = Path(pairs_path).parent.resolve()
    Path(out_path).write_text("".join(
        json.dumps({"image": str(image_dir / record["image"]), "text": caption}) + "\n"
        for record, caption in zip(records, captions)))
    return Path(out_path)
