"""`navrl-daemon archive list|info|verify`: what the rollout archive holds, and whether it
decodes. Files are the state dir's `archive/rollouts-*.h5`, or the paths given.

A file a kill -9 left incomplete is listed as such and read up to its last whole segment;
a file that is not a readable archive (truncated, corrupt, foreign) exits 65 naming it.

`verify` checks each index row against its row checksum, then decodes every segment
against its blob checksum. Files written before index checksums existed have none: there
a changed offset, size, blob checksum or length still fails a blob check, but a changed
iteration, env, policy_version or raw_bytes cannot be noticed; such files are reported
with `index_checked: false`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from navrl_daemon.commands.common import config_args, json_arg, print_json, state_dir, state_dir_arg
from navrl_daemon.config import Config
from navrl_daemon.errors import DataError

UNCHECKED_INDEX = (
    "index not checksummed (written before index checksums): its iteration, env, "
    "policy_version and raw_bytes columns cannot be checked; offsets, sizes and lengths "
    "were, through the blobs"
)


def register(sub: Any) -> None:
    p = sub.add_parser("archive", help="list, describe or verify rollout archive files")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (
        ("list", "one line per archive file"),
        ("info", "totals over the archive: segments, frames, bytes, iterations, keys"),
        ("verify", "decode every segment, check checksums and shapes; exit 65 on a bad file"),
    ):
        a = actions.add_parser(name, help=help_text)
        config_args(a, overrides=False)
        state_dir_arg(a)
        json_arg(a)
        a.add_argument(
            "files", nargs="*", type=Path, help="archive files (default: the state dir's)"
        )
        a.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.storage.archive import archive_files  # h5py and torch: only when used

    paths = list(args.files) or archive_files(state_dir(cfg, args) / "archive")
    entries = [_entry(path, verify=args.action == "verify") for path in paths]
    doc = _totals(entries)
    if args.action == "info":
        doc["keys"] = next((e["keys"] for e in entries if "keys" in e), [])
    for e in entries:
        e.pop("keys", None)
    if args.json:
        print_json(doc)
    else:
        _print(doc, args.action)
    bad = [e for e in entries if "error" in e]
    if bad:
        raise DataError("; ".join(e["error"] for e in bad))
    return 0


def _entry(path: Path, *, verify: bool) -> dict[str, Any]:
    from navrl_daemon.storage.archive import ArchiveFile

    try:
        with ArchiveFile.open(path) as f:
            if verify:
                f.verify()
            rows = f.rows
            entry: dict[str, Any] = {
                "path": str(path),
                "complete": f.complete,
                "segments": f.segments,
                "frames": f.frames,
                "raw_bytes": int(rows["raw_bytes"].sum()),
                "stored_bytes": int(rows["stored_bytes"].sum()),
                "file_bytes": path.stat().st_size,
                "iterations": _span(rows["iteration"]),
                "policy_versions": _span(rows["policy_version"]),
                "format_version": f.schema.version,
                "mode": f.schema.mode,
                "level": f.schema.level,
                "keys": [k.to_json() for k in f.schema.keys],
                "index_checked": f.index_checked,
            }
            if f.torn:
                entry["torn_segments"] = f.torn
            if f.bad_rows:  # left out of segments, frames and bytes
                entry["bad_index_rows"] = len(f.bad_rows)
            if verify:
                entry["verified"] = True
            return entry
    except DataError as e:
        return {"path": str(path), "error": str(e)}


def _span(values: Any) -> list[int] | None:
    return [int(values.min()), int(values.max())] if len(values) else None


def _totals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    good = [e for e in entries if "error" not in e]
    spans = {
        name: [s for e in good if (s := e[name]) is not None]
        for name in ("iterations", "policy_versions")
    }
    return {
        "files": entries,
        "segments": sum(e["segments"] for e in good),
        "frames": sum(e["frames"] for e in good),
        "raw_bytes": sum(e["raw_bytes"] for e in good),
        "stored_bytes": sum(e["stored_bytes"] for e in good),
        "incomplete_files": sum(not e["complete"] for e in good),
        "bad_files": len(entries) - len(good),
        "unchecked_index_files": sum(not e["index_checked"] for e in good),
        **{
            name: [min(s[0] for s in v), max(s[1] for s in v)] if v else None
            for name, v in spans.items()
        },
    }


def _print(doc: dict[str, Any], action: str) -> None:
    for e in doc["files"]:
        if "error" in e:
            print(f"BAD  {e['error']}")
            continue
        state = "complete" if e["complete"] else "INCOMPLETE"
        ratio = e["raw_bytes"] / e["stored_bytes"] if e["stored_bytes"] else 0.0
        ok = "ok   " if action == "verify" else ""
        print(
            f"{ok}{e['path']}  {state}  segments={e['segments']} frames={e['frames']} "
            f"iterations={e['iterations']} ratio={ratio:.2f}"
        )
        if action == "verify" and not e["index_checked"]:
            print(f"     {UNCHECKED_INDEX}")
    if action != "list":
        ratio = doc["raw_bytes"] / doc["stored_bytes"] if doc["stored_bytes"] else 0.0
        print(
            f"files={len(doc['files'])} segments={doc['segments']} frames={doc['frames']} "
            f"raw_bytes={doc['raw_bytes']} stored_bytes={doc['stored_bytes']} ratio={ratio:.2f} "
            f"iterations={doc['iterations']} policy_versions={doc['policy_versions']}"
        )
    for k in doc.get("keys", []):
        print(f"  {k['path']:<42} {k['dtype']:<5} {k['shape']!s:<14} {k['filter']}")
