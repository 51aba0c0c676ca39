#!/usr/bin/env bash
# The wheels the lent GPU machine lacks (it has torch 2.11, anyio, h5py, prometheus-client,
# numpy, matplotlib, pytest, hypothesis; Python 3.12, no network), in the versions this
# project's .venv runs, into .whl/ (git-ignored via .git/info/exclude). Run here, in the
# repo root, before a device call that names `.whl` in carry (NavRL's checkpoint travels as
# tests/data/navrl_checkpoint.pt, a tracked file).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
WHEELS=(
  torchrl==0.14.1 tensordict==0.14.3 hoptorch==0.1.4 pyvers==0.2.3 orjson==3.13.0
  importlib_metadata==10.2.0 lazy-importer==0.1.0 zipp==4.1.2 lz4==4.4.5 structlog==26.1.0
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0 tqdm==4.70.1
)
for w in "${WHEELS[@]}"; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$w"
done
du -sh .whl
