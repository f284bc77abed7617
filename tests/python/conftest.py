"""Shared set-up of the Python suites (run by ctest through run_pytest.sh: PYTHONPATH holds the
built package, BAGPIPE_SOURCE_DIR the checkout, BAGPIPE_BINARY the bagpipe command, MPIEXEC
mpirun)."""

import importlib.util
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/setup.sh "
                                            "installs python3-torch)")
import bagpipe  # noqa: E402  (after the skip)

SOURCE_DIR = os.environ.get("BAGPIPE_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BAGPIPE_BINARY = os.environ.get("BAGPIPE_BINARY", os.path.join(SOURCE_DIR, "build", "bagpipe"))
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "dlrm_pytorch.py")


def load_example():
    spec = importlib.util.spec_from_file_location("dlrm_pytorch", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def example():
    return load_example()


def child_env():
    """The environment of a child Python process that imports bagpipe."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    return env


def zero_step(trainer):
    """Ends the trainer's iteration with a zero pooled gradient."""
    pooled = trainer.lookup_pooled()
    trainer.end_iteration(torch.zeros_like(pooled))
