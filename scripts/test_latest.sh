#!/usr/bin/env bash
# The suite on the newest release of every dependency (no constraints file), in its own venv
# (.venv-latest): run before each release and before regenerating constraints.txt. CI runs the
# locked set only, so that what lands does not depend on a release published during the session;
# this is how a new release that breaks flopscope is found before a user finds it.
#
#   bash scripts/test_latest.sh            # default tier
#   bash scripts/test_latest.sh -x -k llm  # extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-latest
.venv-latest/bin/pip install -q --upgrade -e '.[test]'
.venv-latest/bin/python -c "import torch, torchvision, transformers, timm; print('newest set:', 'torch', torch.__version__, '| torchvision', torchvision.__version__, '| transformers', transformers.__version__, '| timm', timm.__version__)"
.venv-latest/bin/python -m pytest "$@"
