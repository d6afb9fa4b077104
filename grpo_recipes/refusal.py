"""One error type for a refusal: a mistake the user can fix, or a machine the run cannot use, in one line naming the
fix.

Library code raises `Refusal`; only an entry point turns it into an exit (`run_script`: the line on stderr, exit status
1, or the refusal's own). In a notebook the cell shows the line, not a traceback. A real bug is any other exception and
keeps its traceback.
"""

import sys


class Refusal(Exception):
    """The run cannot go on, for a reason the message (one line) gives with its fix. exit_code: the status a script
    ends with (1; 0 for --help, whose text is the message; 130 after Ctrl-C)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class StopRun(BaseException):
    """A Refusal raised inside code that turns every Exception into data: TRL's tool loop answers the model with a
    tool's exception, so a tool whose service is gone (a sandbox that cannot start, an MCP server that exited) raises
    this BaseException instead, and the run stops with its line (run_script, as a Refusal's)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def run_script(main, *args):
    """A script's entry point: main(*args); a Refusal (or StopRun) ends the process with its line (stdout for exit
    status 0, stderr otherwise) and its exit status."""
    try:
        return main(*args)
    except (Refusal, StopRun) as refusal:
        print(refusal, file=sys.stdout if refusal.exit_code == 0 else sys.stderr, flush=True)
        raise SystemExit(refusal.exit_code) from None


def _one_line(shell, kind, refusal, traceback, tb_offset=None) -> list[str]:
    """IPython's handler for a Refusal raised in a cell: the cell stops (as with any error) and shows its line."""
    print(refusal, file=sys.stderr, flush=True)
    return [str(refusal)]


def show_refusals_as_one_line() -> None:
    """In IPython (a notebook, Colab): a cell that raises a Refusal shows its line, not a traceback."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        shell.set_custom_exc((Refusal, StopRun), _one_line)


show_refusals_as_one_line()  # importing the library in a notebook is enough: every recipe imports this module
