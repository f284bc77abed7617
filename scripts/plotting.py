"""Shared by the scripts/plot_*.py scripts: matplotlib on the Agg backend, or a clear exit."""
import os
import sys


def import_pyplot():
    """Returns matplotlib.pyplot on the Agg backend, or exits 2 naming the package to install.

    python3-matplotlib installs into the system interpreter; when this script runs under another
    one (pyenv, a virtual environment) that lacks matplotlib, it re-runs itself once under
    /usr/bin/python3.
    """
    try:
        import matplotlib
    except ImportError:
        system = "/usr/bin/python3"
        if (os.path.exists(system) and not os.environ.get("BAGPIPE_PLOT_REEXEC")
                and os.path.realpath(sys.executable) != os.path.realpath(system)):
            os.environ["BAGPIPE_PLOT_REEXEC"] = "1"
            os.execv(system, [system, os.path.abspath(sys.argv[0])] + sys.argv[1:])
        print(f"{os.path.basename(sys.argv[0])}: matplotlib is not installed; install the Debian "
              "package python3-matplotlib (scripts/setup.sh --with-plots) or pip install "
              "matplotlib", file=sys.stderr)
        sys.exit(2)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
