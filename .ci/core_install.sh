#!/usr/bin/env bash
# The core install as a user gets it: build the wheel, `pip install` it (no extras) into a fresh venv, then make and
# step every env that needs no extra (.ci/core_envs.py). Prints the installed size and package count.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
# The interpreter that builds the wheel and the fresh venv: the project's venv when it exists (make test built it).
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-core.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export RLVR_DATA_DIR=${RLVR_DATA_DIR:-$(cd .. && pwd)/shared/data}
export HF_HUB_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE

"$PY" -m pip wheel -q --no-deps -w "$WORK/dist" .
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --upgrade pip
"$WORK/venv/bin/python" -m pip install -q "$WORK"/dist/*.whl
echo "wheel: $(basename "$WORK"/dist/*.whl) ($(du -h "$WORK"/dist/*.whl | cut -f1))"
SITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "core install: $(du -sh "$SITE" | cut -f1) site-packages, $("$WORK/venv/bin/python" -m pip list --format=freeze | wc -l) packages"
echo "largest: $(cd "$SITE" && du -sm -- */ | sort -rn | head -6 | awk '{printf "%s %sM, ", $2, $1}')"
echo "packages: $("$WORK/venv/bin/python" -m pip list --format=freeze | cut -d= -f1 | tr '\n' ' ')"
# Run from outside the checkout so the installed wheel, not the working tree, is what gets imported.
(cd "$WORK" && "$WORK/venv/bin/python" "$REPO/.ci/core_envs.py")
