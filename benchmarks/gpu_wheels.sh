#!/usr/bin/env bash
# Wheels for benchmarks/gpu_check.py on a machine without a package index (the lent H200
# has torch, transformers, peft and accelerate, and nothing else of ours). Run here, where
# pip reaches PyPI; then carry benchmarks/gpu_wheels to that machine (about 3 MB; the
# check unpacks the wheels that fit its Python into a temporary folder).
#
#     bash benchmarks/gpu_wheels.sh [folder]        # default: benchmarks/gpu_wheels
#
# What the trainer, the env and the LLM user import beyond torch, transformers, peft and
# accelerate: gymnasium, jsonschema and omegaconf, and their own requirements. All are pure
# Python but rpds-py (jsonschema -> referencing), fetched for CPython 3.10 to 3.14 on
# x86-64 Linux. Versions: those the test suite runs with.
set -euo pipefail
DEST="${1:-benchmarks/gpu_wheels}"
mkdir -p "$DEST"
PIP="${PIP:-python -m pip}"
$PIP download --quiet --no-deps --only-binary=:all: --dest "$DEST" \
    gymnasium==1.4.0 cloudpickle==3.1.3 farama-notifications==0.0.6 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 attrs==26.1.0 \
    omegaconf==2.4.0 typing-extensions==4.16.0
for version in 3.10 3.11 3.12 3.13 3.14; do
    for rpds in 2026.9.1 0.30.0; do      # the newest has no CPython 3.10 wheel
        if $PIP download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
                --python-version "$version" --dest "$DEST" "rpds-py==$rpds" 2>/dev/null; then
            break
        fi
        echo "no rpds-py $rpds wheel for Python $version" >&2
    done
done
ls -1 "$DEST"
du -sh "$DEST"
