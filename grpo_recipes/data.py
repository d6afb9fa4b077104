"""A recipe's data: one split of a Hub dataset or of local files (JSON Lines, JSON, parquet, CSV; one file, or a folder
of split files), and the train and held-out splits a run trains on, with every mistake in the data as one line (file
and line number) rather than a traceback."""

import json
import logging
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import datasets
import huggingface_hub
from datasets import Dataset, load_dataset
from datasets.data_files import EmptyDatasetError, get_data_patterns, resolve_pattern

from grpo_recipes import difficulty
from grpo_recipes.console import logger
from grpo_recipes.refusal import Refusal

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face Hub answers within 5 seconds (its client would retry for about a minute)."""
    try:
        huggingface_hub.utils.get_session().head(huggingface_hub.constants.ENDPOINT, timeout=5)
        return True
    except Exception:  # noqa: BLE001 - any failure to get an answer means: not reachable from here
        return False


def check_cache(path: str | Path, what: str, variable: str) -> None:
    """A cache folder the run writes (created if missing, as the library would), else one line naming the variable
    that put it there: HF_HOME=/read-only/place gave a 26-line traceback from inside `datasets`."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as err:
        chosen = next((f"{name}={os.environ[name]}" for name in (variable, "HF_HOME", "XDG_CACHE_HOME")
                       if os.environ.get(name)), "the default place")
        raise Refusal(f"the {what} cache {path} cannot be written ({err.strerror}; set by {chosen}): point "
                      f"{variable} or HF_HOME at a folder you can write") from None


def load_split(split: str, dataset_path: str | None, name: str | None = None, config: str | None = None) -> Dataset:
    """One split of local data (a JSON/JSONL/parquet/CSV file: train only; or a folder of split files) or, without
    dataset_path, of the Hub dataset `name` (`config`), as the recipe names it.

    Unreachable Hub data, a missing path, an unknown file type, an empty file and a malformed JSON line end in one
    line (file and 1-based line number)."""
    check_cache(datasets.config.HF_DATASETS_CACHE, "datasets", "HF_DATASETS_CACHE")  # every load writes there
    if dataset_path is None:
        return hub_split(split, name, config)
    files = split_files(split, dataset_path)
    formats = {LOCAL_FORMATS.get("".join(file.suffixes[-1:]).lower()) for file in files}
    if None in formats or len(formats) > 1:
        raise Refusal(f"{dataset_path}: {', '.join(f.name for f in files)}: one kind of data file is read, "
                      f"{', '.join(LOCAL_FORMATS)}")
    for file in files:
        if not file.read_bytes().strip():
            raise Refusal(f"{file}: empty; a {split} split needs at least one row")
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # local files load in a blink; their bars are noise
    datasets.logging.set_verbosity(logging.CRITICAL)  # a bad line is reported below, once
    try:
        return load_dataset(formats.pop(), data_files={split: [str(file) for file in files]}, split=split)
    except (ValueError, datasets.exceptions.DatasetGenerationError) as err:
        bad = first_bad_json_line(dataset_path) if LOCAL_FORMATS.get(files[0].suffix.lower()) == "json" else None
        raise Refusal(bad or f"{dataset_path}: cannot read its {split} data ({' '.join(str(err).split())[:300]})") \
            from None
    finally:
        if bars:
            datasets.enable_progress_bars()
        datasets.logging.set_verbosity(logging.WARNING)


def hub_split(split: str, name: str, config: str | None) -> Dataset:
    """One split of a Hub dataset; no network and no cached copy is one line, not a minute of retries."""
    if not huggingface_hub.constants.HF_HUB_OFFLINE and not hub_reachable():
        raise Refusal(f"cannot reach {huggingface_hub.constants.ENDPOINT} for the dataset {name} (no network?): run "
                      "with HF_HUB_OFFLINE=1 if it is cached, or pass --dataset_path local files")
    try:
        return load_dataset(name, config, split=split)
    except ConnectionError as err:  # offline and not cached
        raise Refusal(f"dataset {name}: {err}; download it once online, or pass --dataset_path local files") from None


def split_files(split: str, dataset_path: str) -> list[Path]:
    """The files of one split: a folder's files for that split (each split alone: a folder's splits may differ in
    their columns), or one file, which is the train split."""
    path = Path(dataset_path)
    if not path.exists():
        raise Refusal(f"{dataset_path}: no such file or folder")
    if not path.is_dir():
        if split != "train":
            raise Refusal(f"{dataset_path} is one file, read as the train split: for a {split!r} split, point "
                          f"--dataset_path at a folder with train.jsonl and {split}.jsonl")
        return [path]
    try:
        patterns = {str(name): files for name, files in get_data_patterns(dataset_path).items()}
    except EmptyDatasetError:
        raise Refusal(f"{dataset_path}: no data files there; put {split}.jsonl (or .json, .parquet, .csv) in it") \
            from None
    if split not in patterns:
        raise Refusal(f"{dataset_path}: no {split!r} split there (it has {', '.join(patterns) or 'none'}); name "
                      f"the files {split}.jsonl")
    return [Path(file) for file in data_files(patterns[split], dataset_path)]


def data_files(patterns: list[str], folder: str) -> list[str]:
    """The files of a folder that datasets' split patterns match (as load_dataset would read them)."""
    files = set()
    for pattern in patterns:
        try:
            files.update(resolve_pattern(pattern, folder))
        except FileNotFoundError:  # a pattern that matches nothing
            pass
    return sorted(files)


def first_bad_json_line(dataset_path: str) -> str | None:
    """'<file> line <n>: <why>' for the first line of a JSON Lines file under dataset_path that is not a JSON object."""
    files = sorted(Path(dataset_path).glob("*.json*")) if Path(dataset_path).is_dir() else [Path(dataset_path)]
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                return f"{path} line {number}: not valid JSON ({err.msg}, column {err.colno})"
            if not isinstance(row, dict):
                return f"{path} line {number}: a JSON Lines row must be an object, not {type(row).__name__}"
    return None


def load_splits(build, training_args, dataset_path: str | None,
                num_eval_examples: int) -> tuple[Dataset, Dataset | None]:
    """`build("train", dataset_path)`, and `build("test", dataset_path)` cut to num_eval_examples when evaluating; a
    missing path, a one-file dataset asked to evaluate, or a missing column or split exits in one line."""
    evaluate = training_args.eval_strategy != "no"
    if dataset_path and not Path(dataset_path).exists():
        raise Refusal(f"--dataset_path {dataset_path}: no such file or folder")
    if evaluate and dataset_path and not Path(dataset_path).is_dir():
        raise Refusal(f"{dataset_path} is one file, so it has no held-out split: pass --eval_strategy no, or point "
                      "--dataset_path at a folder with train.jsonl and test.jsonl.")
    train_dataset = build_split(build, "train", dataset_path)
    eval_dataset = build_split(build, "test", dataset_path) if evaluate else None
    for split, dataset in (("train", train_dataset), ("test", eval_dataset)):
        if dataset is not None:
            check_rows(dataset, split, dataset_path)
    if training_args.pass_rates:  # the prompts a model solved always or never teach nothing: dropped
        train_dataset = difficulty.keep_by_pass_rate(train_dataset, training_args.pass_rates,
                                                     training_args.keep_pass_rate_between)
    if eval_dataset is not None:
        eval_dataset = eval_dataset.select(range(min(num_eval_examples, len(eval_dataset))))
    return train_dataset, eval_dataset


def build_split(build, split: str, dataset_path: str | None) -> Dataset:
    """A recipe's `build_dataset(split, dataset_path)`; a missing path, column or split exits in one line (a recipe's
    build_dataset raises ValueError for what its data lacks)."""
    if dataset_path and not Path(dataset_path).exists():
        raise Refusal(f"--dataset_path {dataset_path}: no such file or folder")
    try:
        return build(split, dataset_path)
    except ValueError as err:  # a missing column or split: one line, not a traceback
        raise Refusal(str(err)) from None


def check_rows(dataset: Dataset, split: str, dataset_path: str | None) -> None:
    """A split with no rows, or whose gold answers (the recipe's parsed `answer` column) are all unreadable, is
    refused: every completion would score 0 on correctness and the run would learn nothing. Some unreadable: logged."""
    source = dataset_path or "the recipe's dataset"
    if len(dataset) == 0:
        raise Refusal(f"{source}: its {split} split has no rows")
    if "answer" not in dataset.column_names:
        return
    unreadable = sum(1 for answer in dataset["answer"] if answer is None or not str(answer).strip())
    if unreadable == len(dataset):
        raise Refusal(f"{source}: none of the {len(dataset)} {split} rows has a gold answer the recipe can read (GSM8K "
                      "form ends its answer with '#### <number>'): every completion would score 0 on correctness")
    if unreadable:
        logger.warning(f"{source}: {unreadable} of {len(dataset)} {split} rows ({unreadable / len(dataset):.0%}) have "
                       "no gold answer the recipe can read: they score 0 on correctness for every completion")

