"""raco train's thread settings: torch gets ``threads``, numpy's BLAS one thread."""

from __future__ import annotations

import subprocess
import sys


def test_numpy_blas_is_single_threaded_and_torch_keeps_its_threads():
    """In a fresh process (the limit is process-wide): after ``set_threads``, every OpenBLAS that
    numpy or scipy loaded runs one thread, and torch has the threads asked for (or its default)."""
    code = (
        "import numpy, torch\n"
        "from threadpoolctl import threadpool_info\n"
        "from raco_cli.run.train import set_threads\n"
        "default = torch.get_num_threads()\n"
        "set_threads(None)\n"
        "assert torch.get_num_threads() == default, torch.get_num_threads()\n"
        "blas = [i for i in threadpool_info() if i['internal_api'] == 'openblas' and 'torch' not in i['filepath']]\n"
        "assert blas and all(i['num_threads'] == 1 for i in blas), blas\n"
        "set_threads(1)\n"
        "assert torch.get_num_threads() == 1\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
