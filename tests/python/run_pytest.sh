#!/usr/bin/env bash
# Runs one pytest file of the Python package's suites for ctest.
# Usage: run_pytest.sh PYTHON BUILD_DIR SOURCE_DIR BAGPIPE_BINARY MPIEXEC TEST_FILE
# Exit 77 (ctest: skipped) with the reason when PyTorch or pytest is missing (CI installs both:
# scripts/setup.sh), and for test_cuda.py when there is no CUDA build or no GPU.
set -u
PYTHON=$1 BUILD=$2 SRC=$3
export BAGPIPE_SOURCE_DIR=$SRC BAGPIPE_BINARY=$4 MPIEXEC=$5
TEST=$6
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
for module in torch pytest numpy; do
  if ! "$PYTHON" -c "import $module" 2>/dev/null; then
    echo "SKIPPED: $PYTHON cannot import $module (scripts/setup.sh installs python3-torch, python3-pytest, python3-numpy)"
    exit 77
  fi
done
if [ "$TEST" = test_cuda.py ] && ! "$PYTHON" -c "import torch, bagpipe
assert bagpipe._core.cuda_compiled_in() and torch.cuda.is_available()" 2>/dev/null; then
  echo "SKIPPED: needs a CUDA build of bagpipe (-DBAGPIPE_CUDA=ON) and a GPU PyTorch can use"
  exit 77
fi
cd "$SRC/tests/python" || exit 1
exec "$PYTHON" -m pytest -q -p no:cacheprovider "$TEST"
