"""What the console shows: the project's logger (our lines on rank 0), library notices a user can do nothing about
filtered, and no progress-bar frames where the output goes to a file. Light to import: evaluate.py and every script's
--help use it before anything heavy loads."""

import logging
import os
import re
import sys
import warnings

logger = logging.getLogger("grpo-recipes")


def setup_logging() -> None:
    """Our INFO lines on rank 0 only; library warnings that repeat the same internal notice every run, filtered."""
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(name)s: %(message)s")
    quiet_noise()
    for handler in logging.getLogger("transformers").handlers:  # where every transformers.* logger writes
        handler.addFilter(lambda record: not any(re.search(noise, record.getMessage()) for noise in NOISE))


# Notices a user can do nothing about, repeated every run: TRL and transformers calling each other's deprecated
# names (TRL's own default sets the old `gradient_checkpointing`), and the checkpoint rotation's note on file times.
NOISE = [r"`is_gradient_checkpointing` is deprecated", r"`gradient_checkpointing(_kwargs)?` is deprecated",
         r"mtime may not be reliable",
         # TRL's async trainer adds two StepIntervalCallbacks on purpose (weight sync, metrics); transformers warns
         r"StepIntervalCallback'> to the callbacks of this Trainer, but there is already one"]


def quiet_noise() -> None:
    for noise in NOISE:
        warnings.filterwarnings("ignore", message=noise)
    # datasets cannot hash a recipe's lambda for its cache key, and says so at length, every run
    logging.getLogger("datasets.fingerprint").setLevel(logging.ERROR)
    for client in ("httpx", "httpx2"):  # the openai client's HTTP library: a line per judge or reader request
        logging.getLogger(client).setLevel(logging.WARNING)


def redirected() -> bool:
    """Whether stderr goes to a file or a pipe, not a terminal nor a notebook: progress bars there are escape codes."""
    return not sys.stderr.isatty() and "ipykernel" not in sys.modules


def quiet_bars_when_redirected(training_args=None, given: set[str] = frozenset()) -> None:
    """Redirected: no progress bars from datasets, transformers or the Hub, and the trainer prints one compact line
    per logging step instead of its bar (unless --disable_tqdm was given)."""
    if not redirected():
        return
    import datasets  # here: a script that loads no data (evaluate.py's --help) need not import them
    import huggingface_hub
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    if training_args is not None and "disable_tqdm" not in given:
        training_args.disable_tqdm = True
