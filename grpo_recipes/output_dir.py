"""The output folder's life cycle: never lose work, resume only what can be resumed.

`prepare_output_dir` runs before the model loads: it finds an unwritable folder now (not at the first save), holds a
lock on it for the run's life (a second run into it is one line), resolves `--resume_from_checkpoint last` to the newest
complete checkpoint, refuses a resume of another recipe, model or data, and refuses to start over on checkpoints or a
trained model unless --overwrite_output_dir asks for it. It records what the run trains (RUN_FILE) for the next resume.
"""

import fcntl
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from grpo_recipes.refusal import Refusal

logger = logging.getLogger("grpo-recipes")
RUN_FILE = "recipe_run.json"  # what the run in a folder trains: check_resume compares a resume with it
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
_LOCKS: dict[str, int] = {}  # output folder -> the descriptor whose lock this process holds
LAST = ("last", "latest", "true")  # --resume_from_checkpoint values that mean the newest complete checkpoint


def run_identity(recipe: str, script_args, model_args, training_args=None) -> dict:
    """What a checkpoint of this run must match to be resumed (check_resume): the recipe, the model, the data (a local
    path, resolved; else a recipe's --dataset_name, or None: its Hub dataset), LoRA or a full fine-tune, and the
    learning rate and its schedule (a resume restores the saved scheduler, whose rate wins over a new one: a resume
    at --learning_rate 1e-3 trained on at 1.9e-6)."""
    model = model_args.model_name_or_path
    path, name = getattr(script_args, "dataset_path", None), getattr(script_args, "dataset_name", None)
    schedule = {} if training_args is None else {"learning_rate": training_args.learning_rate,
                                                 "lr_scheduler_type": getattr(training_args.lr_scheduler_type, "value",
                                                                      training_args.lr_scheduler_type)}
    return {"recipe": recipe,
            "model": str(Path(model).expanduser().resolve()) if Path(model).expanduser().exists() else model,
            "data": str(Path(path).resolve()) if path else name,
            "use_peft": bool(model_args.use_peft), **schedule}


def checkpoints_in(output: Path) -> list[Path]:
    """checkpoint-* folders in output, oldest step first."""
    return sorted(output.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]) if
                  p.name.split("-")[-1].isdigit() else -1) if output.is_dir() else []


def complete(checkpoint: Path) -> bool:
    """Whether a checkpoint was saved to the end: the Trainer writes trainer_state.json last, so a run stopped while
    saving (Ctrl-C, a kill, a full disk) leaves it missing or cut short; earlier checkpoints are untouched."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
        return True
    except (OSError, ValueError):
        return False


def prepare_output_dir(training_args) -> None:
    """Ready the output folder before the model loads (the module docstring says what each step guards against); sets
    training_args.resume_from_checkpoint to the checkpoint a `last` resume takes."""
    output = Path(training_args.output_dir)
    ensure_writable(output)
    each_node = getattr(training_args, "save_on_each_node", False)
    writes = os.environ.get("LOCAL_RANK" if each_node else "RANK", "0") == "0"  # the processes that save
    if writes:
        lock_output_dir(output)
    identity = getattr(training_args, "run_identity", None)
    resume = resolve_resume(training_args.resume_from_checkpoint, output)
    training_args.resume_from_checkpoint = resume
    if resume:
        check_resume(Path(resume), identity)
        logger.info(f"resuming from {resume}")
        return
    clear_for_a_new_run(output, identity, training_args.overwrite_output_dir, deletes=writes)
    if writes and identity:
        (output / RUN_FILE).write_text(json.dumps(identity, indent=1) + "\n")


def ensure_writable(output: Path) -> None:
    try:
        output.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=output).close()
    except OSError as err:
        raise Refusal(f"--output_dir {output}: cannot write there ({err.strerror}); pass a writable --output_dir") \
            from None


def resolve_resume(resume, output: Path) -> str | None:
    """The checkpoint folder to resume from (None: a new run): `last` is the newest complete checkpoint in output; a
    folder named must exist and be complete."""
    checkpoints = checkpoints_in(output)
    if isinstance(resume, str) and resume.lower() in LAST:
        saved = [p for p in checkpoints if complete(p)]  # the newest complete checkpoint is the one to resume
        if not saved:
            raise Refusal(f"--resume_from_checkpoint {resume}: {output} holds no complete checkpoint "
                          f"({', '.join(p.name for p in checkpoints) or 'none'}); start without it")
        incomplete = checkpoints[checkpoints.index(saved[-1]) + 1:]
        if incomplete:
            logger.warning(f"skipping {', '.join(p.name for p in incomplete)}: its trainer_state.json is missing or "
                           "cut short (the run stopped while saving it)")
        return str(saved[-1])
    if resume and not Path(resume).is_dir():
        found = ", ".join(p.name for p in checkpoints) or "none"
        raise Refusal(f"--resume_from_checkpoint {resume}: no such folder (checkpoints in {output}: {found}; "
                      "`--resume_from_checkpoint last` takes the newest)")
    if resume and not complete(Path(resume)):
        saved = [p.name for p in checkpoints_in(Path(resume).parent) if complete(p)]
        raise Refusal(f"--resume_from_checkpoint {resume}: not a complete checkpoint (no readable trainer_state.json: "
                      f"a run stopped while saving it, or not a checkpoint); "
                      + (f"the newest complete one is {saved[-1]}, or pass `last`" if saved else "start without it"))
    return resume or None


def clear_for_a_new_run(output: Path, identity: dict | None, overwrite: bool, deletes: bool) -> None:
    """A new run in a folder that holds checkpoints or a trained model: refused (naming another run's differences, or
    how to resume), unless --overwrite_output_dir, when one process deletes them."""
    checkpoints = checkpoints_in(output)
    finished = [name for name in MODEL_FILES if (output / name).is_file()]
    if not (checkpoints or finished):
        return
    held = ", ".join([p.name for p in checkpoints] + (["a trained model"] if finished else []))
    if not overwrite:
        recorded = read_run(output)
        other_run = differences(recorded, identity) if recorded and identity else []
        if other_run:
            raise Refusal(f"{output} already holds {held} of another run ({'; '.join(other_run)}): pass another "
                          "--output_dir, or --overwrite_output_dir to delete them")
        resume_hint = "continue with --resume_from_checkpoint last, or " if checkpoints else ""
        raise Refusal(f"{output} already holds {held}: {resume_hint}pass another --output_dir, or start over with "
                      "--overwrite_output_dir (deletes them)")
    if deletes:  # one process deletes: two racing over the same files crash the one that loses
        for checkpoint in checkpoints:  # asked for: --overwrite_output_dir
            shutil.rmtree(checkpoint)
        for name in finished:
            (output / name).unlink()
        logger.warning(f"--overwrite_output_dir: deleted {held} in {output}")


def lock_output_dir(output: Path) -> None:
    """Hold a lock on the output folder itself until the run has saved (release_output_dir) or its process ends: a
    second run into the same folder, started at the same time, would write the same checkpoint-N and final model
    files. Leaves no file behind."""
    key = str(output.resolve())
    if key in _LOCKS:  # this process's earlier run (a notebook cell run again, a test): it has finished
        return
    descriptor = os.open(output, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        raise Refusal(f"--output_dir {output}: another run is writing there ({lock_holder(output)}); wait for it to "
                      "end, or pass another --output_dir") from None
    _LOCKS[key] = descriptor


def release_output_dir(output: Path) -> None:
    """Let another process use output once this run has saved (a notebook's kernel lives on after its run)."""
    descriptor = _LOCKS.pop(str(Path(output).resolve()), None)
    if descriptor is not None:
        os.close(descriptor)  # closing the descriptor drops its flock


def lock_holder(folder: Path) -> str:
    """'pid N: its command line' of the process holding a flock on folder, read from /proc/locks (Linux)."""
    inode = os.stat(folder).st_ino
    try:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "FLOCK" in fields and fields[-3].rsplit(":", 1)[-1] == str(inode):
                pid = fields[-4]
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return f"pid {pid}: {command.strip()}"
    except (OSError, IndexError):
        pass
    return "another process holds its lock"


def read_run(folder: Path) -> dict | None:
    try:
        return json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None


SCHEDULE = {"learning_rate": "learning rate", "lr_scheduler_type": "schedule"}  # what a resume cannot change


def differences(recorded: dict, identity: dict) -> list[str]:
    """What differs between the run recorded in a folder and this one, in words ('model runs/a, not runs/b')."""
    words = {"recipe": "recipe", "model": "model", "data": "data", "use_peft": "LoRA", **SCHEDULE}
    shown = {"data": lambda v: v or "the recipe's Hub dataset", "recipe": lambda v: f"{v}.py",
             "use_peft": lambda v: "on" if v else "off"}
    return [f"{words[key]} {shown.get(key, str)(recorded.get(key))}, not {shown.get(key, str)(identity[key])}"
            for key in words if key in recorded and recorded.get(key) != identity.get(key)]


def check_resume(checkpoint: Path, identity: dict | None) -> None:
    """Resume means resume: the checkpoint's run (RUN_FILE beside it) must have this run's recipe, model, data, LoRA
    choice, learning rate and schedule; otherwise one line says what differs and how to start a new run from the
    checkpoint's weights."""
    recorded = read_run(checkpoint.parent) or read_run(checkpoint)
    if identity is None:
        return
    if recorded is None:
        logger.warning(f"{checkpoint}: no {RUN_FILE} beside it (a run before this check, or another program's): "
                       "resuming without checking that its recipe, model and data are this run's")
        return
    different = differences(recorded, identity)
    if different and all(d.startswith(tuple(SCHEDULE.values())) for d in different):
        raise Refusal(f"--resume_from_checkpoint {checkpoint} continues a run at {'; '.join(different)}: a resume "
                      "restores that run's optimizer and schedule, so the new value would not apply; resume without "
                      f"changing it, or train from its weights in a new run: --model_name_or_path {checkpoint} (and "
                      "another --output_dir) without --resume_from_checkpoint")
    if different:
        raise Refusal(f"--resume_from_checkpoint {checkpoint} continues a run of {'; '.join(different)}: to train "
                      f"from its weights in a new run, pass --model_name_or_path {checkpoint} (and another "
                      "--output_dir) without --resume_from_checkpoint")
