"""`navrl-daemon dataset synth|info`: multimodal HDF5 datasets (design §6).

- `synth OUT`: a layout A or B file of any size, HWC or CHW images, seeded; its actions
  come from a known policy of the observations (offline/dataset_synth.py), so behaviour
  cloning on it has an exact target.
- `info FILE...`: checks each file (layout, shapes, lengths, finite actions) and loads
  its low-dimensional data; exit 65 naming file, key, expected and found when one is bad.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from navrl_daemon.commands.common import config_args, json_arg, print_fields, print_json
from navrl_daemon.config import Config
from navrl_daemon.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("dataset", help="write synthetic or check multimodal HDF5 datasets")
    actions = p.add_subparsers(dest="dataset_command", required=True, metavar="ACTION")

    syn = actions.add_parser("synth", help="write a synthetic layout A/B dataset")
    config_args(syn, overrides=False)
    json_arg(syn)
    syn.add_argument("out", type=Path, help="HDF5 file to write (replaced if it exists)")
    size = syn.add_mutually_exclusive_group()
    size.add_argument("--samples", type=int, help="transitions N (default 100)")
    size.add_argument("--gib", type=float, help="size in GiB instead of --samples")
    syn.add_argument("--layout", choices=["A", "B"], default="A")
    syn.add_argument("--image-format", choices=["HWC", "CHW"], default="HWC")
    syn.add_argument(
        "--image-size",
        type=int,
        nargs="+",
        default=[256],
        metavar="PX",
        help="H, or H W (default 256)",
    )
    syn.add_argument(
        "--wrist-aliases",
        action="store_true",
        help="name cameras left_wrist_image / right_wrist_image",
    )
    syn.add_argument(
        "--chunk-rows",
        type=int,
        default=1,
        help="image rows per HDF5 chunk, 0 for contiguous (default 1)",
    )
    syn.add_argument("--compression", choices=["none", "lzf", "gzip"], default="none")
    syn.add_argument("--seed", type=int, default=0)
    syn.set_defaults(handler=handle_synth)

    info = actions.add_parser("info", help="check files and summarise them; exit 65 if bad")
    config_args(info, overrides=False)
    json_arg(info)
    info.add_argument("files", nargs="+", type=Path, help="dataset files, in order")
    info.add_argument("--layout", choices=["auto", "A", "B"], default="auto")
    info.add_argument("--max-samples", type=int, help="default: offline.max_samples (0: all)")
    info.set_defaults(handler=handle_info)


def handle_synth(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.offline.dataset_synth import SynthSpec, samples_for_bytes, write_synth

    if len(args.image_size) > 2 or min(args.image_size) < 1:
        raise UsageError(f"--image-size: H or H W, positive, got {args.image_size}")
    height, width = (args.image_size * 2)[:2]
    if args.gib is not None:
        if args.gib <= 0:
            raise UsageError(f"--gib: positive, got {args.gib}")
        samples = samples_for_bytes(int(args.gib * (1 << 30)), height, width)
    else:
        samples = 100 if args.samples is None else args.samples
    if samples < 1 or args.chunk_rows < 0:
        raise UsageError("--samples must be >= 1 and --chunk-rows >= 0")
    spec = SynthSpec(
        samples=samples,
        layout=args.layout,
        image_format=args.image_format,
        height=height,
        width=width,
        wrist_aliases=args.wrist_aliases,
        chunk_rows=args.chunk_rows,
        compression=args.compression,
        seed=args.seed,
    )
    summary = write_synth(args.out, spec)
    if args.json:
        print_json(summary)
    else:
        print_fields(summary)
    return 0


def handle_info(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.offline.datasets import MultimodalDataset

    limit = cfg.offline.max_samples if args.max_samples is None else args.max_samples
    data = MultimodalDataset.load(args.files, layout=args.layout, max_samples=limit)
    doc = {
        "transitions": len(data),
        "image_bytes": data.image_bytes,
        "action_mean": data.action_mean.tolist(),
        "action_std": data.action_std.tolist(),
        "files": [
            {
                "path": str(df.path),
                "layout": df.layout,
                "transitions": df.transitions,
                "joint_dim": df.joint_dim,
                "action_dim": df.action_dim,
                "cameras": {
                    c.name: {"key": c.path, "format": c.format, "size": [c.height, c.width]}
                    for c in df.cameras
                },
            }
            for df in data.files
        ],
    }
    if args.json:
        print_json(doc)
    else:
        for f in doc["files"]:
            cams = ", ".join(
                f"{c['key']} {c['format']} {c['size'][0]}x{c['size'][1]}"
                for c in f["cameras"].values()
            )
            print(f"{f['path']}: layout {f['layout']}, {f['transitions']} transitions; {cams}")
        print(f"{doc['transitions']} transitions loaded, {doc['image_bytes']} bytes of images")
    return 0
