"""Aerial scenes painted from a seed, as a drone or satellite sees them: textured farmland, a few asphalt roads with lane
marks, buildings, and 15-40 small vehicles (``car``, ``truck``, ``bus``) seen from above, mostly driving on or parked
beside the roads (:func:`scene`), with the roads and roofs the dense targets are drawn from (:func:`scene_layers`).
:mod:`yolo_ckpt.data.synthetic` makes the datasets of every task of them. All randomness comes from the generator a
scene is given: the same generator state paints the same bytes (for given numpy and OpenCV versions).
"""

from __future__ import annotations

import cv2
import numpy as np

__all__ = ["IMAGE_SIZE", "fixed", "line_ends", "scene", "scene_layers"]

IMAGE_SIZE = 1600  # square image side in pixels; large enough (>= 1536) to make checkpointing worthwhile
_MAX_OVERLAP = 0.1  # largest allowed intersection as a fraction of the smaller vehicle's area

# Colours are BGR because cv2 draws and encodes BGR.
_GROUND_PALETTE = np.array(
    [
        (62, 112, 66),  # grass
        (48, 92, 52),  # dark crop
        (80, 134, 104),  # young crop
        (70, 104, 134),  # bare soil
        (96, 150, 176),  # ripe wheat
        (84, 128, 118),  # dry grass
    ],
    dtype=np.float32,
)
_ROOF_PALETTE = np.array([(150, 150, 150), (60, 70, 150), (80, 100, 130), (190, 190, 185), (90, 90, 95)], np.float32)
_WHITE, _SILVER, _BLACK = (232, 234, 236), (176, 178, 180), (38, 36, 34)
_WINDSHIELD = (52, 44, 38)
# Per class: (length range px, width/length range, body colours, colour probabilities).
_VEHICLES = (
    ((14.0, 24.0), (0.42, 0.52), (_WHITE, _SILVER, _BLACK, (100, 100, 104), (40, 38, 178), (150, 82, 36), (60, 90, 40)),
     (0.25, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05)),
    ((28.0, 45.0), (0.32, 0.40), (_WHITE, (40, 40, 170), (150, 90, 40), (30, 120, 225), (60, 110, 50)),
     (0.35, 0.15, 0.15, 0.15, 0.2)),
    ((42.0, 60.0), (0.24, 0.30), ((30, 190, 230), _WHITE, (45, 45, 190), (160, 100, 40)), (0.35, 0.3, 0.2, 0.15)),
)
_CARGO_COLOURS = ((205, 208, 210), (150, 150, 150), (60, 100, 160))


def scene(rng: np.random.Generator, class_probs: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Render one aerial scene.

    Args:
        rng: The scene's private generator; all randomness comes from it.
        class_probs: Probability of car, truck, bus for each vehicle.

    Returns:
        image: (IMAGE_SIZE, IMAGE_SIZE, 3) uint8 BGR.
        corners: (N, 4, 2) float64 vehicle corners in pixels, cyclic, front-left and front-right first.
        classes: (N,) int64 class indices.
    """
    return scene_layers(rng, class_probs)[:3]


def scene_layers(rng: np.random.Generator, class_probs: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """:func:`scene`'s image, corners and classes, then its roads ((R, 5), as :func:`_roads` returns them) and
    buildings ((IMAGE_SIZE, IMAGE_SIZE) uint8 mask, 1 on roofs), which the dense targets are drawn from."""
    theta = rng.uniform(0, np.pi)  # field, road and building layout share one orientation, as in real parcels
    sun = rng.uniform(0, 2 * np.pi)
    shadow_dir = np.array([np.cos(sun), np.sin(sun)])  # one sun: all shadows fall the same way
    image = _ground(rng, theta)
    roads = _roads(image, rng, theta)
    buildings = _buildings(image, rng, theta, roads, shadow_dir)
    corners, classes = _place_vehicles(rng, class_probs, roads, buildings)
    for quad, cls in zip(corners, classes):
        _draw_vehicle(image, rng, quad, int(cls), shadow_dir * rng.uniform(2.0, 4.0))
    # Camera softness and sensor grain over everything, so vehicles are not unnaturally crisp. Uniform int8 grain
    # (std ~4.3) looks like Gaussian grain here and is several times cheaper to draw.
    grain = rng.integers(-7, 8, image.shape, dtype=np.int8)
    image = cv2.GaussianBlur(image, (3, 3), 0.6).astype(np.int16) + grain
    return np.clip(image, 0, 255).astype(np.uint8), corners, classes, roads, buildings


def _ground(rng: np.random.Generator, theta: float) -> np.ndarray:
    """Farmland texture: (IMAGE_SIZE, IMAGE_SIZE, 3) uint8 of parcels with crop rows, hedges and soft noise."""
    lo = IMAGE_SIZE // 2  # built at half resolution and upsampled: the texture is low-frequency anyway
    scale = IMAGE_SIZE / lo
    yy, xx = np.mgrid[0:lo, 0:lo].astype(np.float32) * scale
    u = xx * np.cos(theta) + yy * np.sin(theta)
    v = yy * np.cos(theta) - xx * np.sin(theta)
    cu, cv = rng.uniform(180, 420), rng.uniform(120, 320)  # parcel size in pixels
    k = 16  # parcel properties repeat every k parcels, too far apart to notice
    iu = np.floor(u / cu).astype(np.int64) % k
    iv = np.floor(v / cv).astype(np.int64) % k
    colour = _GROUND_PALETTE[rng.integers(0, len(_GROUND_PALETTE), (k, k))] + rng.normal(0, 8, (k, k, 3))
    rows = np.where(rng.random((k, k)) < 0.5, 0.12, 0.0)  # half the parcels show crop rows
    period = rng.uniform(8, 16, (k, k))
    stripes = 1 + rows[iu, iv] * np.sin(2 * np.pi * v / period[iu, iv])
    ground = colour.astype(np.float32)[iu, iv] * stripes.astype(np.float32)[..., None]
    hedge = ((u / cu) % 1 < 3 / cu) | ((v / cv) % 1 < 3 / cv)  # ~3 px dark borders between parcels
    ground[hedge] *= 0.75
    # Slow brightness changes (soil moisture, haze) with only a little hue drift, so fields keep plausible colours.
    noise = (rng.standard_normal((6, 6, 1)) + 0.3 * rng.standard_normal((6, 6, 3))).astype(np.float32)
    ground *= 1 + 0.07 * cv2.resize(noise, (lo, lo), interpolation=cv2.INTER_CUBIC)
    ground = cv2.resize(ground, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_LINEAR)
    return np.clip(ground, 0, 255).astype(np.uint8)


def _roads(image: np.ndarray, rng: np.random.Generator, theta: float) -> np.ndarray:
    """Draw 2-4 straight roads crossing the image in place.

    Returns:
        (R, 5) float64 rows ``px, py, dx, dy, width``: a point on the centre line, unit direction, width (pixels).
    """
    s = IMAGE_SIZE
    roads = []
    for _ in range(rng.integers(2, 5)):
        # Most roads follow the parcel grid (either axis); some cut across it.
        angle = theta + rng.integers(0, 2) * np.pi / 2 if rng.random() < 0.75 else rng.uniform(0, np.pi)
        p = rng.uniform(0.15 * s, 0.85 * s, 2)
        d = np.array([np.cos(angle), np.sin(angle)])
        roads.append((*p, *d, rng.uniform(40, 70)))
    roads = np.array(roads)
    # All asphalt first, then all marks, so a later road's asphalt does not erase an earlier road's marks.
    for px, py, dx, dy, w in roads:
        a, b = line_ends(px, py, dx, dy, 0.0)
        cv2.line(image, a, b, (92, 112, 118), int(w) + 8, cv2.LINE_AA)  # dirt shoulder
        grey = float(rng.uniform(88, 112))
        cv2.line(image, a, b, (grey, grey, grey + 3), int(w), cv2.LINE_AA)
    for px, py, dx, dy, w in roads:
        for side in (-1, 1):  # solid edge lines
            cv2.line(image, *line_ends(px, py, dx, dy, side * (w / 2 - 4)), (200, 205, 205), 2, cv2.LINE_AA)
        for t in np.arange(-1.5 * s, 1.5 * s, 40.0):  # dashed centre line: 20 px dash, 20 px gap
            a = (int(px + dx * t), int(py + dy * t))
            b = (int(px + dx * (t + 20)), int(py + dy * (t + 20)))
            cv2.line(image, a, b, (215, 220, 220), 2, cv2.LINE_AA)
    return roads


def line_ends(px: float, py: float, dx: float, dy: float, offset: float) -> tuple[tuple[int, int], ...]:
    """End points (pixels) of a line parallel to a road at signed ``offset``, long enough to cross the image."""
    ox, oy = px - dy * offset, py + dx * offset
    r = 2 * IMAGE_SIZE
    return (int(ox - dx * r), int(oy - dy * r)), (int(ox + dx * r), int(oy + dy * r))


def _road_distance(points: np.ndarray, roads: np.ndarray) -> np.ndarray:
    """(N, R) distance in pixels from (N, 2) pixel points to each road's centre line."""
    rel = points[:, None, :] - roads[None, :, :2]
    return np.abs(rel[..., 0] * roads[:, 3] - rel[..., 1] * roads[:, 2])


def _buildings(
    image: np.ndarray, rng: np.random.Generator, theta: float, roads: np.ndarray, shadow_dir: np.ndarray
) -> np.ndarray:
    """Draw 6-14 roofs with shadows (cast along unit ``shadow_dir``) in place, off the roads.

    Returns:
        (IMAGE_SIZE, IMAGE_SIZE) uint8 mask, 1 on roofs.
    """
    mask = np.zeros(image.shape[:2], np.uint8)
    placed: list[tuple[np.ndarray, float]] = []
    target = rng.integers(6, 15)
    for _ in range(10 * target):
        if len(placed) == target:
            break
        size = rng.uniform(40, 160, 2)
        centre = rng.uniform(0, IMAGE_SIZE, 2)
        radius = float(np.hypot(*size)) / 2
        if np.any(_road_distance(centre[None], roads)[0] < roads[:, 4] / 2 + radius + 6):
            continue
        if any(np.hypot(*(centre - c)) < 0.8 * (radius + r) for c, r in placed):
            continue
        placed.append((centre, radius))
        quad = _rectangle(centre, theta + rng.normal(0, 0.05), *size)
        shadow = quad + shadow_dir * 0.15 * size.min()  # taller (bigger) buildings cast longer shadows
        cv2.fillConvexPoly(image, fixed(shadow), (40, 48, 46), cv2.LINE_AA, 4)
        roof = _ROOF_PALETTE[rng.integers(0, len(_ROOF_PALETTE))] + rng.normal(0, 6, 3)
        cv2.fillConvexPoly(image, fixed(quad), roof.tolist(), cv2.LINE_AA, 4)
        ridge = (quad[0] + quad[3]) / 2, (quad[1] + quad[2]) / 2  # gable ridge through the roof centre
        cv2.line(image, fixed(ridge[0]), fixed(ridge[1]), (roof * 0.8).tolist(), 2, cv2.LINE_AA, 4)
        cv2.fillConvexPoly(mask, fixed(quad), 1, cv2.LINE_8, 4)
    return mask


def _place_vehicles(
    rng: np.random.Generator, class_probs: tuple[float, ...], roads: np.ndarray, buildings: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Choose 15-40 non-overlapping vehicles in lanes (75 %) or parked on road shoulders (25 %).

    Candidates whose centre falls outside the image or that hit a roof or another vehicle are dropped and redrawn,
    so fewer than the target remain only if the attempt budget runs out.

    Returns:
        corners: (N, 4, 2) float64 pixels, cyclic, front-left and front-right first; classes: (N,) int64.
    """
    target = rng.integers(15, 41)
    quads: list[np.ndarray] = []
    classes: list[int] = []
    for _ in range(30 * target):
        if len(quads) == target:
            break
        cls = int(rng.choice(len(class_probs), p=class_probs))
        (l_lo, l_hi), (a_lo, a_hi), _, _ = _VEHICLES[cls]
        length = rng.uniform(l_lo, l_hi)
        width = length * rng.uniform(a_lo, a_hi)
        px, py, dx, dy, road_w = roads[rng.integers(0, len(roads))]
        side = rng.choice((-1.0, 1.0))
        if rng.random() < 0.75:
            offset = side * rng.uniform(0.15, 0.32) * road_w
        else:
            offset = side * (road_w / 2 + 4 + width / 2 + rng.uniform(0, 8))
        t = rng.uniform(-1.5 * IMAGE_SIZE, 1.5 * IMAGE_SIZE)
        centre = np.array([px + dx * t - dy * offset, py + dy * t + dx * offset])
        if np.any(centre < 0) or np.any(centre >= IMAGE_SIZE):
            continue
        # Right-hand traffic (+offset is right of +d in image coordinates); jitter avoids perfect alignment.
        heading = np.arctan2(dy, dx) + (0.0 if side > 0 else np.pi) + rng.normal(0, 0.04)
        quad = _rectangle(centre, heading, length, width)
        inside = np.clip(np.vstack([quad, centre]).astype(np.int64), 0, IMAGE_SIZE - 1)
        if buildings[inside[:, 1], inside[:, 0]].any():
            continue
        if any(_overlaps(quad, other) for other in quads):
            continue
        quads.append(quad)
        classes.append(cls)
    return np.array(quads, np.float64).reshape(-1, 4, 2), np.array(classes, np.int64)


def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two (4, 2) pixel rectangles share more than ``_MAX_OVERLAP`` of the smaller one's area."""
    la, lb = np.hypot(*(a[0] - a[3])), np.hypot(*(b[0] - b[3]))
    if np.hypot(*(a.mean(0) - b.mean(0))) > (la + lb) / 2:  # cheap rejection: circumscribed circles apart
        return False
    area, _ = cv2.intersectConvexConvex(a.astype(np.float32), b.astype(np.float32))
    return area > _MAX_OVERLAP * min(cv2.contourArea(a.astype(np.float32)), cv2.contourArea(b.astype(np.float32)))


def _rectangle(centre: np.ndarray, heading: float, length: float, width: float) -> np.ndarray:
    """(4, 2) pixel corners of a rectangle facing ``heading`` (radians).

    Order: front-left, front-right, rear-right, rear-left (cyclic; "left" is +90 degrees from the heading).
    """
    d = np.array([np.cos(heading), np.sin(heading)]) * length / 2
    n = np.array([-np.sin(heading), np.cos(heading)]) * width / 2
    return np.array([centre + d + n, centre + d - n, centre - d - n, centre - d + n])


def _part(quad: np.ndarray, a0: float, a1: float, b: float) -> np.ndarray:
    """(4, 2) pixel sub-rectangle of a vehicle ``quad``.

    It spans ``a0`` to ``a1`` along the length (-0.5 rear .. 0.5 front) and ``b`` of the width to each side of the
    axis (0.5 = full width).
    """
    front, rear = (quad[0] + quad[1]) / 2, (quad[2] + quad[3]) / 2
    half = (quad[0] - quad[1]) * b
    p0, p1 = rear + (front - rear) * (a0 + 0.5), rear + (front - rear) * (a1 + 0.5)
    return np.array([p1 + half, p1 - half, p0 - half, p0 + half])


def fixed(points: np.ndarray) -> np.ndarray:
    """Pixel coordinates as int32 with 4 fractional bits, for cv2's sub-pixel ``shift=4`` drawing."""
    return np.round(np.asarray(points) * 16).astype(np.int32)


def _draw_vehicle(image: np.ndarray, rng: np.random.Generator, quad: np.ndarray, cls: int, shadow: np.ndarray) -> None:
    """Draw one vehicle (shadow, body, windows, roof details) in place; ``quad`` as from ``_rectangle``."""
    _, _, colours, probs = _VEHICLES[cls]
    body = np.array(colours[rng.choice(len(colours), p=probs)], np.float64) + rng.normal(0, 8, 3)
    body = np.clip(body, 0, 255)

    def fill(points: np.ndarray, colour) -> None:
        cv2.fillConvexPoly(image, fixed(points), np.asarray(colour, np.float64).tolist(), cv2.LINE_AA, 4)

    fill(quad + shadow, (30, 36, 36))
    if cls == 0:  # car: body, windshield at the front, smaller rear window
        fill(quad, body)
        fill(_part(quad, 0.10, 0.28, 0.42), _WINDSHIELD)
        fill(_part(quad, -0.40, -0.30, 0.40), _WINDSHIELD)
    elif cls == 1:  # truck: coloured cab in front, separate cargo box behind
        fill(_part(quad, 0.30, 0.5, 0.5), body)
        fill(_part(quad, 0.40, 0.47, 0.44), _WINDSHIELD)
        fill(_part(quad, -0.5, 0.27, 0.5), _CARGO_COLOURS[rng.integers(0, len(_CARGO_COLOURS))])
    else:  # bus: long body, narrow windshield, light roof-mounted AC units
        fill(quad, body)
        fill(_part(quad, 0.44, 0.49, 0.44), _WINDSHIELD)
        for a0 in (-0.2, 0.1):
            fill(_part(quad, a0, a0 + 0.12, 0.28), (215, 218, 220))
