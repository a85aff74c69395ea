"""Does having Ray installed slow every vLLM server's start? vLLM imports `ray` whenever it can
(`make test` installs the `ray` extra, so every local server has it), and this times a server's
start from `vllm serve` (through the rig's entry) to /health 200, alternately with Ray
importable and with it hidden (a `ray` package first on PYTHONPATH whose import fails, as if
it were not installed). Prints each start, the means and their ratio, measured side by side.

    python benchmarks/ray_import_startup.py [--starts 3] [--model .cache/tiny-model/<hash>]
"""

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from rig.models.tiny_model import ensure_tiny_model
from rig.serve.plan import free_port

HIDDEN = 'raise ImportError("ray hidden by benchmarks/ray_import_startup.py")\n'


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def time_start(model: Path, hide_ray: Path | None, log: Path) -> float:
    """Seconds from the server's spawn to its first /health 200; the server is stopped after."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    if hide_ray is not None:
        env["PYTHONPATH"] = f"{hide_ray}{os.pathsep}{env.get('PYTHONPATH', '')}"
    argv = [
        sys.executable, "-m", "rig.serve.vllm_entry", "serve", str(model), "--host",
        "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "2048",
        "--enforce-eager",
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("wb") as out:
        server = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while not healthy(f"http://127.0.0.1:{port}"):
                if server.poll() is not None:
                    raise SystemExit(f"the server exited with {server.returncode}: see {log}")
                time.sleep(0.2)
            return time.monotonic() - started
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):  # the engine core may outlive it
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="starts of each kind")
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny model")
    args = parser.parse_args()
    model = args.model or ensure_tiny_model()
    with tempfile.TemporaryDirectory() as scratch:
        hidden = Path(scratch) / "hidden"
        (hidden / "ray").mkdir(parents=True)
        (hidden / "ray" / "__init__.py").write_text(HIDDEN)
        seconds: dict[str, list[float]] = {"ray importable": [], "ray hidden": []}
        for start in range(args.starts):
            for kind, hide in (("ray importable", None), ("ray hidden", hidden)):
                log = Path(scratch) / f"{kind.replace(' ', '-')}-{start}.log"
                seconds[kind].append(time_start(model, hide, log))
                print(f"{kind:15} start {start + 1}: {seconds[kind][-1]:.1f} s", flush=True)
    means = {kind: statistics.fmean(values) for kind, values in seconds.items()}
    for kind, mean in means.items():
        spread = f"{min(seconds[kind]):.1f}-{max(seconds[kind]):.1f}"
        print(f"{kind:15} mean {mean:.1f} s ({spread} s over {args.starts})")
    print(f"importable / hidden: {means['ray importable'] / means['ray hidden']:.3f}")


if __name__ == "__main__":
    main()
