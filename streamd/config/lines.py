"""``streams[].lines`` — named, directed segments that tracks cross (``streamd.analytics.lines``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamd.config._fields import Invalid, Problems, describe, opt, read_section, required
from streamd.config.model import class_list, resolve_classes

LINE_NAME_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
_ASK = "two points [[x1, y1], [x2, y2]] in source pixels"


@dataclass(frozen=True)
class LineConfig:
    """A named, directed segment of one stream's picture; crossing it counts per direction."""

    name: str = required(
        "line name, unique within the stream; named in cross events and in the line counters",
        pattern=LINE_NAME_PATTERN,
        pattern_doc="1 to 64 characters from A-Z a-z 0-9 _ . -",
    )
    points: tuple[tuple[float, float], tuple[float, float]] = required(
        "two different points [x, y] in source pixels (>= 0): the segment, directed from the first to "
        "the second",
        ask=_ASK,
    )
    in_side: Literal["left", "right"] = opt(
        "left",
        "which side of the directed segment is 'in': left = on your left standing on the first point facing "
        "the second, as the picture is shown; crossing onto it is direction 'in', off it 'out'",
    )
    classes: tuple[int, ...] | None = opt(None, "class names or ids this line counts; default: every class")
    anchor: Literal["bottom_center", "center", "top_center", "bottom_left", "bottom_right"] = opt(
        "bottom_center", "the point of a box whose motion crosses the line"
    )
    margin_px: float = opt(
        8.0,
        "pixels the anchor must get past the line before a crossing counts (jitter on the line counts "
        "nothing)",
        gt=0,
    )


def check_line_points(value: object, path: str) -> tuple[tuple[float, float], tuple[float, float]]:
    if not isinstance(value, list) or len(value) != 2:
        raise Invalid(f"expected {_ASK}, got {describe(value)}", path)
    points = []
    for i, point in enumerate(value):
        here = f"{path}[{i}]"
        if (
            not isinstance(point, list)
            or len(point) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in point)
        ):
            raise Invalid(f"expected a point [x, y] of two numbers, got {describe(point)}", here)
        if min(point) < 0:
            raise Invalid(f"expected coordinates >= 0 (source pixels), got {point}", here)
        points.append((float(point[0]), float(point[1])))
    if points[0] == points[1]:
        raise Invalid(
            f"both points are {list(points[0])}; a line needs two different points (its ends)", path
        )
    return points[0], points[1]


def parse_lines(
    raw: object, path: str, problems: Problems, names: tuple[str, ...]
) -> tuple[LineConfig, ...] | None:
    """Check ``streams[i].lines``; report every problem; the valid lines (None: not a list at all)."""
    if not isinstance(raw, list) or not raw:
        problems.add(path, f"expected a list of lines, each {{name:, points: {_ASK}}}, got {describe(raw)}")
        return None
    lines: list[LineConfig] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(raw):
        here = f"{path}[{index}]"
        given = read_section(
            LineConfig,
            item,
            here,
            problems,
            special={
                "points": check_line_points,
                "classes": lambda v, p: resolve_classes(class_list(v, p), names, p),
            },
            what="a mapping with name: and points:",
        )
        if given is None:
            continue
        name = given.get("name")
        if name is not None:
            if name in seen:
                problems.add(
                    f"{here}.name",
                    f"duplicate line name {name!r} (already used by {path}[{seen[name]}]); "
                    "line names must be unique within a stream",
                )
            seen[name] = index
        if "name" in given and "points" in given:
            lines.append(LineConfig(**given))
    return tuple(lines)
