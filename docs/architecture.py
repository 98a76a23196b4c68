"""Draws docs/architecture.png: hicache-galahad's data path and module map in one picture.

    .venv/bin/python docs/architecture.py [OUTPUT.png]

Standalone: matplotlib only, nothing of the project is imported. The module map (the modules,
their packages, what each package may import) and the red outlines (modules where a check happens)
are read from the tables of docs/ARCHITECTURE.md, which tests/test_architecture.py checks
against the code, so the picture follows the code through that file. The data path on the left
is drawn from the constants below.

The canvas is 1600 pixels wide, one data unit per pixel, y growing downwards. Before saving,
the script measures every label and refuses (exit status 1, naming them) a picture in which two
labels overlap, a label crosses a box it does not belong to or an arrow, or leaves the canvas.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HERE = Path(__file__).resolve().parent
DOC = HERE / "ARCHITECTURE.md"
OUTPUT = HERE / "architecture.png"

WIDTH = 1600
DPI = 100
SANS = "DejaVu Sans"
MONO = "DejaVu Sans Mono"

# Colours: SGLang's parts, ours, the optional tier, Mooncake, the disk, checks, the two flows.
SGLANG = ("#eeeeee", "#7a7a7a")
OURS = ("#e8f0fb", "#3b6ea8")
OPTIONAL = ("#f4f8fd", "#3b6ea8")
MOONCAKE = ("#f3ecf8", "#7b4fa0")
DISK = ("#fdf6e3", "#a07800")
CHIP = ("#ffffff", "#8a9bb0")
CHIP_FONT, CHIP_HEIGHT, CHIP_GAP = 9.0, 21, 7
CHECK = "#b3261e"
BACKUP = "#d9730d"
PREFETCH = "#1f5fbf"
MUTED = "#555555"

GROUP_STYLE = {  # one colour per layer of packages
    "ops": ("#efefef", "#6b6b6b"),
    "serving": ("#e8f0fb", "#3b6ea8"),
    "warming": ("#fbeee4", "#b0602a"),
    "blaise": ("#f8ecf4", "#9c4a7c"),
    "tier": ("#f3ecf8", "#7b4fa0"),
    "store": ("#fdf6e3", "#a07800"),
    "config": ("#eaf5ea", "#3d8b3d"),
    "record": ("#eaf5ea", "#3d8b3d"),
    "telemetry": ("#eaf5ea", "#3d8b3d"),
    "top": ("#f4f4f4", "#6b6b6b"),
}
TOP_LEVEL = ("errors", "units", "(root)", "__main__")  # drawn in one box: hicache_galahad/*.py


# ----------------------------------------------------------------------------- the tables


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[1:]  # without the header row


def package_of(path: str) -> str:
    """hicache_galahad/store/reader.py -> store; hicache_galahad/errors.py -> errors;
    hicache_galahad/__init__.py -> (root); checkpoint/hits.py -> checkpoint (as
    tests/test_architecture.py names them)."""
    parts = path.removesuffix(".py").split("/")
    if parts[0] == "checkpoint":
        return "checkpoint"
    if parts == ["hicache_galahad", "__init__"]:
        return "(root)"
    return parts[1]


def read_doc() -> tuple[list[str], dict[str, tuple[str, str]], set[str]]:
    """Module paths; package -> (may import, torch/sglang); modules named in the
    'where each check happens' table."""
    text = DOC.read_text(encoding="utf-8")
    modules = [row[0].strip("`") for row in _rows(_section(text, "Modules"))]
    rules = {
        row[0].strip("`").rstrip("/").removesuffix(".py"): (row[2], row[3])
        for row in _rows(_section(text, "Packages"))
    }
    checked = set()
    for row in _rows(_section(text, "Where each check happens")):
        checked.update(re.findall(r"`([\w/]+\.py)`", row[1]))
    return modules, rules, checked


# ----------------------------------------------------------------------------- canvas


class Canvas:
    """Boxes, labels and arrows in pixel coordinates, with what each label belongs to."""

    def __init__(self, height: int = 2000):
        self.fig = plt.figure(figsize=(WIDTH / DPI, height / DPI), dpi=DPI)
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, WIDTH)
        self.ax.set_ylim(height, 0)
        self.ax.axis("off")
        self.renderer = self.fig.canvas.get_renderer()
        self.boxes: dict[str, tuple[float, float, float, float, str | None]] = {}
        self.labels: list[tuple[object, str | None]] = []
        self.arrows: list[tuple[float, float, float, float]] = []

    def measure(self, text: str, size: float, family: str = SANS, weight: str = "normal"):
        label = self.ax.text(0, 0, text, fontsize=size, family=family, fontweight=weight)
        extent = label.get_window_extent(self.renderer)
        label.remove()
        return extent.width, extent.height

    def box(self, name, x0, y0, x1, y1, colours, parent=None, style="-", linewidth=1.3, radius=7):
        """A rounded box; `parent` is the box it sits in (None: the canvas)."""
        face, edge = colours
        self.ax.add_patch(
            FancyBboxPatch(
                (x0, y0),
                x1 - x0,
                y1 - y0,
                boxstyle=f"round,pad=0,rounding_size={radius}",
                facecolor=face,
                edgecolor=edge,
                linewidth=linewidth,
                linestyle=style,
            )
        )
        self.boxes[name] = (x0, y0, x1, y1, parent)

    def text(self, x, y, text, owner=None, size=9.5, **style):
        style.setdefault("family", SANS)
        style.setdefault("ha", "left")
        style.setdefault("va", "top")
        label = self.ax.text(x, y, text, fontsize=size, **style)
        self.labels.append((label, owner))
        return label

    def arrow(self, x0, y0, x1, y1, colour, width=2.0, head=14):
        self.ax.add_patch(
            FancyArrowPatch(
                (x0, y0),
                (x1, y1),
                arrowstyle="-|>",
                mutation_scale=head,
                linewidth=width,
                color=colour,
                shrinkA=0,
                shrinkB=0,
            )
        )
        pad = head / 2
        self.arrows.append((min(x0, x1) - pad, min(y0, y1), max(x0, x1) + pad, max(y0, y1)))

    def flow(self, x0, x1, y, labels):
        """Where chips holding `labels` go, left to right, wrapping inside [x0, x1]:
        ([(label, x, y, width)], the bottom of the last row)."""
        places, x = [], x0
        for label in labels:
            width = self.measure(label, CHIP_FONT, MONO)[0] + 14
            if x > x0 and x + width > x1:
                x, y = x0, y + CHIP_HEIGHT + CHIP_GAP
            places.append((label, x, y, width))
            x += width + CHIP_GAP
        return places, y + CHIP_HEIGHT

    def chips(self, prefix, x0, x1, y, labels, parent, checked=frozenset()) -> float:
        """Chips of file names inside box `parent`, a heavy red outline on those in `checked`;
        returns the bottom of the last row."""
        places, bottom = self.flow(x0, x1, y, labels)
        for index, (label, x, top, width) in enumerate(places):
            name = f"{prefix}:{index}"
            red = label in checked
            colours = (CHIP[0], CHECK if red else CHIP[1])
            self.box(
                name,
                x,
                top,
                x + width,
                top + CHIP_HEIGHT,
                colours,
                parent,
                "-",
                2.0 if red else 1.0,
                4,
            )
            self.text(
                x + width / 2,
                top + CHIP_HEIGHT / 2,
                label,
                name,
                CHIP_FONT,
                family=MONO,
                ha="center",
                va="center",
            )
        return bottom

    # ------------------------------------------------------------------------- checks

    def _ancestors(self, name):
        while name is not None:
            yield name
            name = self.boxes[name][4]

    def problems(self, height: float) -> list[str]:
        self.fig.canvas.draw()
        to_data = self.ax.transData.inverted()
        extents = []
        for label, owner in self.labels:
            (x0, y1), (x1, y0) = to_data.transform(label.get_window_extent(self.renderer))
            extents.append((label.get_text(), owner, (x0, y0, x1, y1)))
        found = []

        def overlap(a, b, margin=0.0):
            return (
                a[0] < b[2] - margin
                and b[0] < a[2] - margin
                and a[1] < b[3] - margin
                and b[1] < a[3] - margin
            )

        def short(text):
            return repr(text[:40])

        boxes = list(self.boxes.items())
        for index, (name, (x0, y0, x1, y1, parent)) in enumerate(boxes):
            if parent is not None:
                px0, py0, px1, py1, _ = self.boxes[parent]
                if not (px0 <= x0 and x1 <= px1 and py0 <= y0 and y1 <= py1):
                    found.append(f"box {name} is not inside its box {parent}")
            for other, (ox0, oy0, ox1, oy1, other_parent) in boxes[index + 1 :]:
                if other_parent == parent and overlap((x0, y0, x1, y1), (ox0, oy0, ox1, oy1)):
                    found.append(f"boxes {name} and {other} overlap")
        for index, (text, owner, extent) in enumerate(extents):
            if extent[0] < 0 or extent[2] > WIDTH or extent[1] < 0 or extent[3] > height:
                found.append(f"{short(text)} leaves the canvas")
            allowed = set(self._ancestors(owner))
            for name, (x0, y0, x1, y1, _) in self.boxes.items():
                box = (x0, y0, x1, y1)
                inside = box[0] <= extent[0] and extent[2] <= box[2]
                inside = inside and box[1] <= extent[1] and extent[3] <= box[3]
                if name in allowed and not inside:
                    found.append(f"{short(text)} is not inside its box {name}")
                elif name not in allowed and overlap(extent, box):
                    found.append(f"{short(text)} crosses box {name}")
            for arrow in self.arrows:
                if overlap(extent, arrow):
                    found.append(f"{short(text)} crosses an arrow")
            for other_text, _, other in extents[index + 1 :]:
                if overlap(extent, other, margin=0.5):
                    found.append(f"{short(text)} overlaps {short(other_text)}")
        return found


# ----------------------------------------------------------------------------- data path

LEFT, RIGHT = 24, 950  # the data path's column
SPLIT = 628  # where the local side ends and the Mooncake side starts, in the lower rows
GAP = 44  # between two layers: the arrows and their labels


class Stack:
    """Lays out a box's lines top to bottom."""

    def __init__(self, canvas: Canvas, name: str, x0: float, x1: float, y: float):
        self.canvas, self.name, self.x0, self.x1 = canvas, name, x0, x1
        self.y = y + 9
        self.items = []

    def title(self, text: str, note: str = ""):
        self.items.append(("title", text, note))
        return self

    def line(self, text: str, colour: str = "#222222", family: str = SANS, size: float = 9.5):
        self.items.append(("line", text, (colour, family, size)))
        return self

    def chips(self, labels, checked=frozenset()):
        self.items.append(("chips", labels, checked))
        return self

    def check(self, text: str):
        self.items.append(("check", text, None))
        return self

    def draw(self, colours, style="-", parent=None) -> float:
        """Draws the box around its lines; returns its bottom."""
        canvas, y = self.canvas, self.y
        top = y - 9
        placed = []
        for kind, text, extra in self.items:
            if kind == "title":
                placed.append((kind, y, text, extra))
                y += 21
            elif kind == "line":
                placed.append((kind, y, text, extra))
                y += 15.5 if extra[2] < 9.5 else 16.5
            elif kind == "check":
                placed.append((kind, y, text, extra))
                y += 16
            else:
                placed.append((kind, y + 2, text, extra))
                y = canvas.flow(self.x0 + 12, self.x1 - 12, y + 2, text)[1] + 7
        bottom = y + 4
        canvas.box(self.name, self.x0, top, self.x1, bottom, colours, parent, style=style)
        for kind, line_y, text, extra in placed:
            x = self.x0 + 12
            if kind == "title":
                label = canvas.text(x, line_y, text, self.name, 11.5, fontweight="bold")
                if extra:
                    width = label.get_window_extent(canvas.renderer).width
                    canvas.text(x + width + 10, line_y + 2.5, extra, self.name, 9.0, color=MUTED)
            elif kind == "line":
                colour, family, size = extra
                canvas.text(x, line_y, text, self.name, size, color=colour, family=family)
            elif kind == "check":
                canvas.text(x, line_y, "✔ " + text, self.name, 9.0, color=CHECK)
            else:
                canvas.chips(self.name, x, self.x1 - 12, line_y, text, self.name, extra)
        return bottom


def heading(canvas: Canvas, x: float, y: float, title: str, note: str) -> None:
    label = canvas.text(x, y, title, None, 14, fontweight="bold")
    width = label.get_window_extent(canvas.renderer).width
    canvas.text(x + width + 12, y + 4, note, None, 10, color=MUTED)


def flows(canvas: Canvas, top: float, items) -> float:
    """One gap between layers: (x, 'down' | 'up', label) arrows; returns the next layer's top."""
    bottom = top + GAP
    for x, direction, label in items:
        colour = BACKUP if direction == "down" else PREFETCH
        start, end = (top + 5, bottom - 5) if direction == "down" else (bottom - 5, top + 5)
        canvas.arrow(x, start, x, end, colour)
        canvas.text(x + 11, (top + bottom) / 2, label, None, 9.0, color=colour, va="center")
    return bottom


def data_path(canvas: Canvas, y: float, checked: set[str]) -> float:
    c = canvas
    heading(
        c, LEFT, y, "Data path", "one rank; a prefetch reads upwards, a backup writes downwards"
    )
    y += 34

    y = (
        Stack(c, "gpu", LEFT, RIGHT, y)
        .title("SGLang device KV cache", "L1 · GPU memory · SGLang's radix tree of pages")
        .line("a prefix found here never reaches storage")
        .draw(SGLANG)
    )
    y = flows(
        c,
        y,
        [
            (70, "down", "write-through to host memory (SGLang)"),
            (520, "up", "load back to the device (SGLang)"),
        ],
    )
    y = (
        Stack(c, "host", LEFT, RIGHT, y)
        .title("SGLang host pool", "L2 · pinned CPU memory · HiCacheController")
        .line(
            "its prefetch and backup threads call the backend with batches of page hashes and "
            "the host slots of those pages"
        )
        .draw(SGLANG)
    )
    y = flows(
        c,
        y,
        [
            (70, "down", "backup: batch_set_v1 / batch_set_v2"),
            (520, "up", "prefetch: batch_exists(_v2), batch_get_v1 / batch_get_v2"),
        ],
    )
    y = (
        Stack(c, "adapter", LEFT, RIGHT, y)
        .title("GalahadStorage", "adapter.py · one per rank · called by both SGLang threads")
        .chips(
            ["adapter.py", "binding.py", "namespace.py", "transfer.py", "pages.py"]
            + ["checkpoint/hits.py", "exporter.py"],
            checked,
        )
        .check("adapter.py: any exception, even from a malformed argument, is a miss or a False")
        .check(
            "binding.py + namespace.py: each host pool keyed to its namespace (tenant, model "
            "fingerprint, geometry, ranks, dtypes)"
        )
        .check("transfer.py: host indices must name whole, aligned pages inside the pool")
        .check(
            "checkpoint/hits.py: a hybrid prefix counts only where every pool's hit policy holds "
            "(trailing states verified)"
        )
        .draw(OURS)
    )
    y = flows(
        c,
        y,
        [(70, "down", "put_many"), (520, "up", "leading_run, get_many_into, verify")],
    )
    y = (
        Stack(c, "tiered", LEFT, RIGHT, y)
        .title(
            "TieredStore",
            "tiered.py · only with the mooncake option (else the adapter calls RecordStore)",
        )
        .line(
            "reads: local disk first, then Mooncake for what it missed; a verified value is "
            "copied into the page and written to disk"
        )
        .line("writes: local disk first, then each record published there is queued to Mooncake")
        .check(
            "tiered.py: a Mooncake value is a whole record, checked V1-V16 by reader.decode_value; "
            "a bad one is a miss, removed"
        )
        .draw(OPTIONAL, style="--")
    )
    y = flows(
        c,
        y,
        [
            (70, "down", "put_many"),
            (300, "up", "get_many_into, leading_run"),
            (SPLIT + 30, "down", "put_async"),
            (SPLIT + 150, "up", "get_many, exists_many"),
        ],
    )
    store_bottom = (
        Stack(c, "store", LEFT, SPLIT - 12, y)
        .title("RecordStore", "record_store.py · data path (admin.py: operator); parts:")
        .chips(
            ["reader.py", "writer.py", "budget.py", "quarantine.py", "checker.py", "flusher.py"]
            + ["ledger.py", "layout.py", "codec.py", "eviction_order.py", "lifetime.py"],
            checked,
        )
        .check("reader.py: V0-V16 on every read (rules in format.py)")
        .check("checker.py: the same rules, for galahad verify")
        .check("writer.py: the record already there (V1-V12) before a put")
        .check("budget.py: max_bytes and min_free_bytes, before a temp file")
        .check("ledger.py: bytes of every process; recounted when in doubt")
        .draw(OURS)
    )
    tier_bottom = (
        Stack(c, "tier", SPLIT + 12, RIGHT, y)
        .title("MooncakeTier", "tier/mooncake/tier.py")
        .line("joins the cluster once its master answers")
        .line("reads: one worker, at most timeout_s each")
        .line("writes: a byte-bounded queue, one writer")
        .line("never raises, never blocks the caller")
        .line("options: config/mooncake.py")
        .draw(MOONCAKE)
    )
    y = max(store_bottom, tier_bottom)
    y = flows(
        c,
        y,
        [
            (70, "down", "writer: temp file, link(2)"),
            (300, "up", "reader: preadv into host memory"),
            (SPLIT + 30, "down", "batch_put_from"),
            (SPLIT + 150, "up", "batch_get_into"),
        ],
    )
    disk_bottom = (
        Stack(c, "disk", LEFT, SPLIT - 12, y)
        .title("Local disk", "<root>, laid out by layout.py")
        .line("ns/<namespace>/<key>.rec        one record per page", family=MONO, size=9.0)
        .line("ns/<namespace>/namespace.json   whose records these are", family=MONO, size=9.0)
        .line("ns/<namespace>/.tmp-*.part      writes in flight", family=MONO, size=9.0)
        .line("ledger, procs/<token>.lock      bytes of all processes", family=MONO, size=9.0)
        .line("stats/  quarantine/  blaise/    counters, damage, text", family=MONO, size=9.0)
        .draw(DISK)
    )
    cluster_bottom = (
        Stack(c, "cluster", SPLIT + 12, RIGHT, y)
        .title("Mooncake Store cluster")
        .line("shared by many servers")
        .line("key: galahad/<namespace>/<key>")
        .line("value: the whole record, as on disk")
        .line("a cache: any value may vanish")
        .line("a key keeps its first value")
        .draw(MOONCAKE)
    )
    return max(disk_bottom, cluster_bottom)


def legend(canvas: Canvas, y: float) -> float:
    c = canvas
    x = LEFT
    c.arrow(x + 6, y + 18, x + 6, y + 2, PREFETCH)
    c.text(x + 18, y + 10, "prefetch (read)", None, 9.5, color=PREFETCH, va="center")
    x += 140
    c.arrow(x + 6, y + 2, x + 6, y + 18, BACKUP)
    c.text(x + 18, y + 10, "backup (write)", None, 9.5, color=BACKUP, va="center")
    x += 132
    c.text(x, y + 10, "✔ a check, where it happens", None, 9.5, color=CHECK, va="center")
    x += 208
    for name, colours, style, label in (
        ("legend:sglang", SGLANG, "-", "SGLang"),
        ("legend:ours", OURS, "-", "hicache-galahad"),
        ("legend:optional", OPTIONAL, "--", "optional"),
        ("legend:mooncake", MOONCAKE, "-", "Mooncake"),
    ):
        width, _ = c.measure(label, 9.0)
        c.box(name, x, y + 1, x + width + 16, y + 19, colours, style=style, radius=4)
        c.text(x + 8, y + 10, label, name, 9.0, va="center")
        x += width + 16 + 8
    return y + 20


# ----------------------------------------------------------------------------- module map

MAP_LEFT, MAP_RIGHT = 982, 1578
MAP_SPLIT = 1258  # serving on the left, ops and Blaise on the right


def chip_label(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def wrap(canvas, words: list[str], width: float, first: str) -> list[str]:
    """`first` followed by the words, comma-separated, in lines no wider than `width`."""
    lines, line = [], first
    for index, word in enumerate(words):
        piece = word + ("," if index < len(words) - 1 else "")
        trial = f"{line} {piece}".strip()
        if canvas.measure(trial, 9.0)[0] > width and line.strip():
            lines.append(line)
            line = "  " + piece
        else:
            line = trial
    lines.append(line)
    return lines


def rule_notes(canvas, package, rules, width) -> list[str]:
    may_import, heavy = rules[package]
    words = [] if may_import == "(nothing)" else [w.strip("`") for w in may_import.split(", ")]
    notes = wrap(canvas, words, width, "may import") if words else ["imports no other package"]
    notes.append("torch and sglang allowed" if heavy == "yes" else "never torch or sglang")
    return notes


def package_box(canvas, key, x0, x1, y, paths, notes, title, checked, nested=None) -> float:
    """One package of the module map; `nested` = (title, paths) drawn in a box inside it."""
    c = canvas
    face, edge = GROUP_STYLE[key]
    name = f"package:{key}"
    every = paths + (nested[1] if nested else [])
    red = {
        chip_label(path)
        for path in every
        if any(path == name or path.endswith("/" + name) for name in checked)
    }
    plain = [chip_label(path) for path in paths]
    chips_y = y + 9 + 21 + 16 * len(notes) + 5
    bottom = c.flow(x0 + 12, x1 - 12, chips_y, plain)[1] if plain else chips_y - 5
    sub_top = sub_bottom = bottom
    if nested:
        sub_top = bottom + 8
        sub_bottom = c.flow(x0 + 24, x1 - 24, sub_top + 30, [chip_label(p) for p in nested[1]])[1]
        sub_bottom += 9
    box_bottom = sub_bottom + 9
    c.box(name, x0, y, x1, box_bottom, (face, edge), linewidth=1.5)
    c.text(x0 + 12, y + 9, title, name, 11, fontweight="bold", color=edge)
    for index, note in enumerate(notes):
        c.text(x0 + 12, y + 30 + 16 * index, note, name, 9.0, color=MUTED)
    if plain:
        c.chips(name, x0 + 12, x1 - 12, chips_y, plain, name, red)
    if nested:
        sub = f"{name}:nested"
        c.box(sub, x0 + 12, sub_top, x1 - 12, sub_bottom, ("#ffffff", edge), name, style="--")
        c.text(x0 + 24, sub_top + 7, nested[0], sub, 9.0, color=edge)
        c.chips(sub, x0 + 24, x1 - 24, sub_top + 30, [chip_label(p) for p in nested[1]], sub, red)
    return box_bottom


def module_map(canvas: Canvas, y: float, modules, rules, checked) -> float:
    c = canvas
    heading(c, MAP_LEFT, y, "Module map", "one box per package; imports flow down, never up")
    y += 34
    by_package: dict[str, list[str]] = {}
    for path in modules:
        if path.endswith("/__init__.py") and path != "hicache_galahad/__init__.py":
            continue  # a package's own docstring
        by_package.setdefault(package_of(path), []).append(path)
    for package in by_package:
        if package not in rules and package != "(root)":
            raise SystemExit(f"{DOC}: package {package!r} has no row in 'Packages'")

    def box(key, x0, x1, top, nested_prefix=None, nested_title=None, title=None):
        paths = by_package.get(key, [])
        nested = None
        if nested_prefix:
            inner = [p for p in paths if p.startswith(nested_prefix)]
            paths = [p for p in paths if not p.startswith(nested_prefix)]
            if key == "serving":
                inner = by_package.get("checkpoint", [])
            nested = (nested_title, inner)
        notes = rule_notes(c, key, rules, x1 - x0 - 24)
        return package_box(c, key, x0, x1, top, paths, notes, title or f"{key}/", checked, nested)

    def imports_arrow(x, top, bottom):
        c.arrow(x, top + 5, x, bottom - 5, "#6b6b6b")
        c.text(x + 12, (top + bottom) / 2, "imports", None, 9.0, color=MUTED, va="center")

    gap = 40
    ops_bottom = box("ops", MAP_SPLIT + 10, MAP_RIGHT, y)
    warming_top = ops_bottom + gap
    imports_arrow(MAP_SPLIT + 40, ops_bottom, warming_top)
    warming_bottom = box("warming", MAP_SPLIT + 10, MAP_RIGHT, warming_top)
    blaise_top = warming_bottom + gap
    imports_arrow(MAP_SPLIT + 40, warming_bottom, blaise_top)
    blaise_bottom = box("blaise", MAP_SPLIT + 10, MAP_RIGHT, blaise_top)
    serving_bottom = box(
        "serving",
        MAP_LEFT,
        MAP_SPLIT - 10,
        y,
        nested_prefix="checkpoint/",
        nested_title="checkpoint/  (a package of its own)",
    )
    upper = max(blaise_bottom, serving_bottom)
    tier_top = upper + gap
    imports_arrow(MAP_LEFT + 30, upper, tier_top)
    tier_bottom = box(
        "tier", MAP_LEFT, MAP_RIGHT, tier_top, "hicache_galahad/tier/mooncake/", "mooncake/"
    )
    store_top = tier_bottom + gap
    imports_arrow(MAP_LEFT + 30, tier_bottom, store_top)
    store_bottom = box("store", MAP_LEFT, MAP_RIGHT, store_top)
    low_top = store_bottom + gap
    imports_arrow(MAP_LEFT + 30, store_bottom, low_top)
    config_bottom = box("config", MAP_LEFT, MAP_SPLIT - 10, low_top)
    record_bottom = box("record", MAP_SPLIT + 10, MAP_RIGHT, low_top)
    last_top = max(config_bottom, record_bottom) + 16
    telemetry_bottom = box("telemetry", MAP_LEFT, MAP_SPLIT - 10, last_top)
    top_paths = [p for key in TOP_LEVEL for p in by_package.get(key, [])]
    top_bottom = package_box(
        c,
        "top",
        MAP_SPLIT + 10,
        MAP_RIGHT,
        last_top,
        top_paths,
        [
            "errors, units: import nothing",
            "__init__: imports on first use",
            "never torch or sglang",
        ],
        "hicache_galahad/*.py",
        checked,
    )
    y = max(telemetry_bottom, top_bottom) + 14
    c.box(
        "map:legend", MAP_LEFT, y, MAP_LEFT + 22, y + 18, (CHIP[0], CHECK), linewidth=2.0, radius=4
    )
    c.text(
        MAP_LEFT + 32,
        y + 9,
        "a check happens here (docs/ARCHITECTURE.md, 'Where each check happens')",
        None,
        9.0,
        va="center",
    )
    y += 18 + 22
    return (
        Stack(c, "start", MAP_LEFT, MAP_RIGHT, y)
        .title("Checked once, at start", "a failure is a ConfigError: the server does not start")
        .check("config/options.py + config/mooncake.py: every option (an unknown key, a bad value)")
        .check("crypto.py: the master key file is 32 bytes, readable by its owner only")
        .check("fingerprint.py: the identity of the weights, unless model_fingerprint is given")
        .check("layout.py: the root is a real directory; min_free_bytes fits its filesystem")
        .check("binding.py, as pools register: max_bytes holds a page; fp8 needs server args")
        .draw(("#ffffff", "#b9b9b9"))
    )


# ----------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    output = Path(argv[1]) if len(argv) > 1 else OUTPUT
    modules, rules, checked = read_doc()
    canvas = Canvas()
    top = 16
    canvas.text(
        LEFT, top, "hicache-galahad: the data path and the module map", None, 17, fontweight="bold"
    )
    top += 44
    left_bottom = legend(canvas, data_path(canvas, top, checked) + 16)
    right_bottom = module_map(canvas, top, modules, rules, checked)
    height = int(max(left_bottom, right_bottom) + 18)
    canvas.fig.set_size_inches(WIDTH / DPI, height / DPI)
    canvas.ax.set_ylim(height, 0)
    found = canvas.problems(height)
    if found:
        print(f"{Path(__file__).name}: the picture is not clean:", file=sys.stderr)
        for problem in found:
            print("  " + problem, file=sys.stderr)
        return 1
    canvas.fig.savefig(output, dpi=DPI, facecolor="white")
    print(f"wrote {output} ({WIDTH} x {height} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
