#!/usr/bin/env bash
# Regenerate constraints.txt: the exact set CI and README command 2 install, for every test,
# optional and development dependency. Run it deliberately (a new torch, a new transformers),
# then run the suite on the new set (`bash .ci/run`) and commit both together.
#
#   bash scripts/lock.sh                 # newest releases of everything
#   bash scripts/lock.sh torch==2.15.0   # newest, with these requirements held
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
"$venv/bin/pip" install -q -e ".[test,dev,vision,hf,plot,trainer,lightning,bench,ray,trace]" "$@"
{
    echo "# The locked set: every test, optional and development dependency, as resolved by"
    echo "# 'bash scripts/lock.sh$( (($#)) && printf ' %s' "$@")' on $(date -u +%Y-%m-%d) with $("$venv/bin/python" -V)"
    echo "# on $(uname -sm). CI and README command 2 install with '-c constraints.txt'; the library"
    echo "# itself accepts any torch >= 2.4. The newest releases, unpinned: bash scripts/test_latest.sh"
    "$venv/bin/pip" freeze --exclude-editable
} > constraints.txt
rm -rf "$(dirname "$venv")"
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pins"
