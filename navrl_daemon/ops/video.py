"""An evaluation as a short video: top-down and side view, the drones flying their first
episode and the dynamic obstacles moving (`eval --video`, and the report's animation).

Small and fast by construction: at most `max_frames` frames (the steps are subsampled),
640x320 pixels, the static scene drawn once and only the moving artists updated per frame
(matplotlib's Agg renderer, no display). GIF is written with Pillow (a matplotlib
dependency); MP4 (H.264) by piping the frames to ffmpeg: the one on PATH, else the binary
of the `imageio-ffmpeg` package (`pip install 'navrl-daemon[video]'`).
"""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle
from PIL import Image

from navrl_daemon.ops.plots import DYNAMIC_COLOUR, OUTCOME_COLOURS
from navrl_daemon.rl.evaluate import Trajectories

SIZE_PX = (640, 320)
DPI = 80
MAX_FRAMES = 120
FPS = 15
GIF_COLOURS = 32
PILLAR_GREY = "0.6"


class VideoError(OSError):
    """The video cannot be written here (no ffmpeg for MP4); the message says what to do."""


def frames(
    traj: Trajectories, title: str = "", max_frames: int = MAX_FRAMES
) -> Iterator[Image.Image]:
    """RGB frames of map 0's drones (as `trajectory_plot`), every k-th step so that there
    are at most `max_frames`, the last step always included."""
    outcomes = traj.outcomes()
    shown = [i for i in range(len(outcomes)) if int(traj.map_id[i]) == 0]
    steps = traj.positions.shape[0]  # T+1 rows: the start, then after each step
    stride = max(1, -(-steps // max_frames))
    rows = [*range(0, steps, stride)]
    if rows[-1] != steps - 1:
        rows.append(steps - 1)

    fig = Figure(figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI)
    canvas = FigureCanvasAgg(fig)
    top = fig.add_axes((0.06, 0.12, 0.42, 0.76))
    side = fig.add_axes((0.56, 0.12, 0.42, 0.76))
    _static_scene(top, side, traj, [traj.goal[i].numpy() for i in shown])
    positions = traj.positions.numpy()
    dynamic = traj.dynamic.numpy()
    last = traj.steps.numpy()
    colours = [OUTCOME_COLOURS[outcomes[i]] for i in shown]
    trails_top = [top.plot([], [], color=c, lw=1.2)[0] for c in colours]
    trails_side = [side.plot([], [], color=c, lw=1.2)[0] for c in colours]
    heads_top = top.scatter(np.zeros(len(shown)), np.zeros(len(shown)), s=14, c=colours, zorder=4)
    heads_side = side.scatter(np.zeros(len(shown)), np.zeros(len(shown)), s=14, c=colours, zorder=4)
    width = traj.dynamic_size.numpy()[:, 0] if dynamic.shape[1] else np.zeros(0)
    height = traj.dynamic_size.numpy()[:, 2] if dynamic.shape[1] else np.zeros(0)
    moving_top = [
        top.add_patch(Circle((0, 0), w / 2, color=DYNAMIC_COLOUR, alpha=0.6, lw=0)) for w in width
    ]
    moving_side = [
        side.add_patch(Rectangle((0, 0), w, h, color=DYNAMIC_COLOUR, alpha=0.3, lw=0))
        for w, h in zip(width, height, strict=True)
    ]
    label = fig.text(0.5, 0.955, "", ha="center", va="center", fontsize=9)
    prefix = f"{title} — " if title else ""
    for row in rows:
        for k, i in enumerate(shown):
            end = min(row, int(last[i])) + 1  # a finished drone stays where it ended
            path = positions[:end, i]
            trails_top[k].set_data(path[:, 0], path[:, 1])
            trails_side[k].set_data(path[:, 0], path[:, 2])
        ends = positions[np.minimum(row, last[shown]), shown] if shown else np.zeros((0, 3))
        heads_top.set_offsets(ends[:, :2])
        heads_side.set_offsets(ends[:, [0, 2]])
        for circle, patch, (x, y, z), w, h in zip(
            moving_top, moving_side, dynamic[row], width, height, strict=True
        ):
            circle.set_center((x, y))
            patch.set_xy((x - w / 2, z - h / 2))
        flying = int((last[shown] > row).sum()) if shown else 0
        label.set_text(f"{prefix}step {row}: {flying} of {len(shown)} drones flying")
        canvas.draw()
        yield Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba()).convert(
            "RGB"
        )


def gif_bytes(traj: Trajectories, title: str = "", max_frames: int = MAX_FRAMES) -> bytes:
    """The video as an animated GIF (looping), for `--video F.gif` and the report. One
    palette for every frame (taken from the last, which shows every path) and no
    dithering, so that the unchanged background stays the same bytes from frame to frame
    and compresses well; it is also quicker than a palette per frame."""
    return encode_gif(list(frames(traj, title, max_frames)))


def encode_gif(images: list[Image.Image]) -> bytes:
    """Rendered frames as a looping GIF with the last frame's palette, undithered."""
    palette = images[-1].quantize(
        colors=GIF_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    )
    indexed = [im.quantize(palette=palette, dither=Image.Dither.NONE) for im in images]
    buf = io.BytesIO()
    indexed[0].save(
        buf,
        format="GIF",
        save_all=True,
        append_images=indexed[1:],
        duration=round(1000 / FPS),
        loop=0,
    )
    return buf.getvalue()


def write_video(path: Path, traj: Trajectories, title: str = "") -> None:
    """`path` by its suffix: .gif (Pillow) or .mp4 (ffmpeg, H.264)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".gif":
        path.write_bytes(gif_bytes(traj, title))
    elif suffix == ".mp4":
        _write_mp4(path, frames(traj, title))
    else:
        raise ValueError(f"video format by suffix: .gif or .mp4, not {path.name}")


def ffmpeg_executable() -> str | None:
    """ffmpeg on PATH, else the one the `imageio-ffmpeg` package ships, else None."""
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg
    except ImportError:
        return None
    try:
        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except RuntimeError:
        return None


def _write_mp4(path: Path, images: Iterator[Image.Image]) -> None:
    exe = ffmpeg_executable()
    if exe is None:
        raise VideoError(
            f"{path}: MP4 needs ffmpeg: install it (apt-get install ffmpeg) or "
            "`pip install 'navrl-daemon[video]'`; or write a .gif"
        )
    width, height = SIZE_PX
    cmd = [
        exe, "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
        "-s", f"{width}x{height}", "-r", str(FPS), "-i", "-",
        "-c:v", "libx264", "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(path),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        for image in images:
            proc.stdin.write(image.tobytes())
    except BrokenPipeError:
        pass  # ffmpeg stopped early: its stderr below says why
    finally:
        proc.stdin.close()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        code = proc.wait()
    if code != 0:
        path.unlink(missing_ok=True)
        raise VideoError(f"{path}: ffmpeg failed (exit {code}): {err.strip()[-500:]}")


def _static_scene(top: Axes, side: Axes, traj: Trajectories, goals: list[np.ndarray]) -> None:
    """Field, pillars and goals, drawn once: top-down x-y, and from the side x-z."""
    half = traj.field_size / 2
    widest = float(traj.positions[..., :2].abs().max())
    reach = max(half, widest, float(traj.goal[:, :2].abs().max())) + 1
    ceiling = max(float(traj.positions[..., 2].max()), 3.0) + 0.5
    boxes = traj.pillars.numpy()
    top.set_xlim(-reach, reach)
    top.set_ylim(-reach, reach)
    top.set_aspect("equal", adjustable="box")
    top.set_title("from above (x, y), m", fontsize=8)
    top.add_patch(Rectangle((-half, -half), 2 * half, 2 * half, fill=False, ec="0.75", lw=0.6))
    side.set_xlim(-reach, reach)
    side.set_ylim(0, ceiling)
    side.set_title("from the side (x, z), m", fontsize=8)
    for ax in (top, side):
        ax.tick_params(labelsize=7)
    if len(boxes):
        top.add_collection(
            PatchCollection(
                [Rectangle((b[0], b[1]), b[2] - b[0], b[3] - b[1]) for b in boxes],
                facecolor=PILLAR_GREY,
                edgecolor="none",
            )
        )
        side.add_collection(  # pillars behind each other overlap: light, so depth shows
            PatchCollection(
                [Rectangle((b[0], 0), b[2] - b[0], b[4]) for b in boxes],
                facecolor=PILLAR_GREY,
                edgecolor="none",
                alpha=0.15,
            )
        )
    if goals:
        g = np.stack(goals)
        top.scatter(g[:, 0], g[:, 1], marker="*", s=40, c="k", zorder=5)
        side.scatter(g[:, 0], g[:, 2], marker="*", s=40, c="k", zorder=5)
