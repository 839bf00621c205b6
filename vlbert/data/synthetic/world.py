"""The synthetic world: scenes of coloured shapes, their rendering, and the world's "lore".

Every data set of the embedded default is drawn from this one world, so that the words that
only the image can resolve (colour, size, shape of a referenced region) and the facts that only
the text corpus states (what a colour feels like, how many corners a shape has) are shared
across pre-training and fine-tuning, as in the real study.

Scenes are deterministic functions of a numpy Generator; nothing here touches the disk except
`save_image`.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

SHAPES = ("circle", "square", "triangle", "diamond", "star", "cross")
COLOURS = {
    "red": (220, 40, 40),
    "orange": (245, 140, 20),
    "yellow": (240, 225, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 230),
    "purple": (150, 60, 200),
    "white": (245, 245, 245),
}
SIZES = ("small", "large")
# P(number of shapes in a scene), for 1, 2, 3, ... shapes: every data set's images but RefCOCO+'s
# (whose referred objects come with twins) and the detector's are drawn so. Mostly simple scenes,
# as the salient objects of a web photo: a colour, size or shape word is often resolvable by one
# look, which is what lets masked language modelling with visual clues learn to read the regions
# at all, and the tasks then ask for the read that pre-training can teach (reports/reference/mini/README.md).
SCENE_SIZES = (0.35, 0.30, 0.15, 0.10, 0.10)

# Lore: facts the text corpus states and VCR rationales rely on. The images never show them,
# so only a model that read the corpus (pre-training setting d and full) has seen them often.
TEMPERATURE = {  # what a colour feels like
    "red": "hot",
    "orange": "warm",
    "yellow": "warm",
    "green": "cool",
    "blue": "cold",
    "purple": "cool",
    "white": "cold",
}
TEMPERATURES = ("hot", "warm", "cool", "cold")
CORNERS = {
    "circle": "no",
    "square": "four",
    "triangle": "three",
    "diamond": "four",
    "star": "ten",
    "cross": "twelve",
}
WEIGHT = {"small": "light", "large": "heavy"}

# Fraction of a grid cell that a shape's radius may take, per size.
RADIUS = {"small": (0.22, 0.28), "large": (0.38, 0.46)}


def stable_seed(seed: int, *names: str) -> list[int]:
    """Seed material for np.random.default_rng that depends on names but not on PYTHONHASHSEED."""
    return [seed] + [zlib.crc32(name.encode()) for name in names]


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    cx: float
    cy: float
    radius: float

    @property
    def box(self) -> tuple[float, float, float, float]:
        """Tight (x1, y1, x2, y2) box of the rendered polygon, in pixels."""
        xs, ys = zip(*self.polygon())
        return (min(xs), min(ys), max(xs), max(ys))

    def polygon(self) -> list[tuple[float, float]]:
        r, cx, cy = self.radius, self.cx, self.cy
        if self.shape == "circle":
            angles = np.linspace(0, 2 * math.pi, 24, endpoint=False)
            return [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in angles]
        if self.shape == "square":
            h = r * 0.85
            return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
        if self.shape == "triangle":
            return [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
        if self.shape == "diamond":
            return [(cx, cy - r), (cx + 0.7 * r, cy), (cx, cy + r), (cx - 0.7 * r, cy)]
        if self.shape == "star":
            points = []
            for k in range(10):
                rr = r if k % 2 == 0 else r * 0.45
                a = -math.pi / 2 + k * math.pi / 5
                points.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
            return points
        if self.shape == "cross":
            t = r * 0.35
            return [
                (cx - t, cy - r),
                (cx + t, cy - r),
                (cx + t, cy - t),
                (cx + r, cy - t),
                (cx + r, cy + t),
                (cx + t, cy + t),
                (cx + t, cy + r),
                (cx - t, cy + r),
                (cx - t, cy + t),
                (cx - r, cy + t),
                (cx - r, cy - t),
                (cx - t, cy - t),
            ]
        raise ValueError(f"unknown shape {self.shape!r}")

    def phrase(self, with_size: bool = True, with_colour: bool = True) -> str:
        words = ([self.size] if with_size else []) + ([self.colour] if with_colour else [])
        return " ".join(words + [self.shape])


@dataclass(frozen=True)
class Scene:
    width: int
    height: int
    background: tuple[int, int, int]
    objects: tuple[SceneObject, ...]


def scene_size(rng: np.random.Generator) -> int:
    return 1 + int(rng.choice(len(SCENE_SIZES), p=SCENE_SIZES))


def sample_scene(
    rng: np.random.Generator, image_size: int, n_objects: int, grid: int = 3, forced: list[dict] | None = None
) -> Scene:
    """Place `n_objects` shapes in distinct cells of a grid x grid layout (so they never overlap).

    `forced` fixes attributes of the first objects (e.g. two circles for a RefCOCO+ testA image).
    """
    if not 1 <= n_objects <= grid * grid:
        raise ValueError(f"n_objects must be in 1..{grid * grid}, got {n_objects}")
    cell = image_size / grid
    cells = rng.choice(grid * grid, size=n_objects, replace=False)
    objects = []
    for i, c in enumerate(cells):
        attrs = dict(forced[i]) if forced and i < len(forced) else {}
        shape = attrs.get("shape") or SHAPES[rng.integers(len(SHAPES))]
        colour = attrs.get("colour") or list(COLOURS)[rng.integers(len(COLOURS))]
        size = attrs.get("size") or SIZES[rng.integers(len(SIZES))]
        lo, hi = RADIUS[size]
        radius = cell * rng.uniform(lo, hi)
        slack = cell / 2 - radius - 1
        row, col = divmod(int(c), grid)
        cx = (col + 0.5) * cell + rng.uniform(-slack, slack)
        cy = (row + 0.5) * cell + rng.uniform(-slack, slack)
        objects.append(SceneObject(shape, colour, size, float(cx), float(cy), float(radius)))
    grey = int(rng.integers(50, 90))
    background = (grey, grey + int(rng.integers(-8, 9)), grey + int(rng.integers(-8, 9)))
    return Scene(image_size, image_size, background, tuple(objects))


def render(scene: Scene, rng: np.random.Generator) -> Image.Image:
    """Draw the scene with mild per-pixel noise, so that no two crops are pixel-identical."""
    image = Image.new("RGB", (scene.width, scene.height), scene.background)
    draw = ImageDraw.Draw(image)
    for obj in scene.objects:
        draw.polygon(obj.polygon(), fill=COLOURS[obj.colour])
    pixels = np.asarray(image, dtype=np.int16)
    noise = rng.integers(-6, 7, size=pixels.shape, dtype=np.int16)
    return Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8))


def save_image(image: Image.Image, path) -> None:
    # JPEG, as the real data sets ship; fixed quality and no optimiser passes keep it byte-stable.
    image.save(path, format="JPEG", quality=95, subsampling=0)


def relation(a: SceneObject, b: SceneObject) -> str:
    """Spatial relation of a to b, for captions (never used in RefCOCO+ expressions)."""
    dx, dy = a.cx - b.cx, a.cy - b.cy
    if abs(dx) >= abs(dy):
        return "to the left of" if dx < 0 else "to the right of"
    return "above" if dy < 0 else "below"


def coco_bbox(obj: SceneObject) -> list[float]:
    x1, y1, x2, y2 = obj.box
    return [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)]


def coco_polygon(obj: SceneObject) -> list[list[float]]:
    return [[round(v, 2) for point in obj.polygon() for v in point]]


def coco_area(polygons: list[list[float]], width: int, height: int) -> int:
    """The area of a COCO polygon segmentation as COCO gives it: the pixels of its mask, which
    pycocotools rasterises from the polygons (as `loadRes` does for segmentations), not its box."""
    return int(mask_utils.area(mask_utils.merge(mask_utils.frPyObjects(polygons, height, width))))
