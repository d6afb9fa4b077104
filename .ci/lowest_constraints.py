"""Print pip constraints that pin the core libraries at the lowest versions requirements.txt allows.

    python .ci/lowest_constraints.py > lowest.txt && pip install -r requirements-test.txt -c lowest.txt

The lowest-versions tier of .ci/run installs these and runs the default suite, so a lower bound in requirements.txt
is a version the suite has run on. torch is left out: the tier uses the one CPU wheel on this machine's disk.
"""

import re
import sys
from pathlib import Path

CORE = ["transformers", "trl", "peft", "accelerate", "datasets"]


def lowest(requirements: str) -> list[str]:
    pins = []
    for line in requirements.splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)", line)
        if match and match.group(1).lower() in CORE:
            pins.append(f"{match.group(1)}=={match.group(3)}")
    missing = set(CORE) - {pin.split("==")[0].lower() for pin in pins}
    if missing:
        sys.exit(f"requirements.txt gives no lower bound for {', '.join(sorted(missing))}")
    return pins


if __name__ == "__main__":
    print("\n".join(lowest((Path(__file__).resolve().parent.parent / "requirements.txt").read_text())))
