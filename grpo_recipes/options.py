"""A recipe's options: the command line over a `--config` YAML over the recipe's defaults, read by TRL's own parser.

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)

TrlParser reads the config file (its `env:` block too) and the command line; this module adds what a mistake needs: a
misspelled flag or YAML key (or one of another recipe) named with the nearest valid one, a missing, broken or misshapen
config file in one line, an option out of range, relative paths in a config file read relative to the file, and a short
`--help` with the recipe's own options.
"""

import ast
import difflib
import functools
import os
import re
import sys
from dataclasses import field, fields
from pathlib import Path

import yaml
from trl import ModelConfig, TrlParser

from grpo_recipes.console import logger, quiet_bars_when_redirected, quiet_noise
from grpo_recipes.output_dir import run_identity
from grpo_recipes.ranges import check_ranges
from grpo_recipes.refusal import Refusal

ROOT = Path(__file__).resolve().parent.parent  # where the scripts are (a notebook: its own folder)
# The configs `python offline.py` writes, and the flag that writes each (a hint when one is asked for before).
KIT_CONFIGS = {"gsm8k_grpo.yaml": "", "sft_warmstart.yaml": "", "tool_use_grpo.yaml": " --tools",
               "search_agent_grpo.yaml": " --search", "code_grpo.yaml": " --code", "mcp_grpo.yaml": ""}
# Options that name a path; in a config file, relative to the file. A model or a checkpoint may also be a Hub id or
# `last`: those are taken from the file's folder only when they exist there.
CONFIG_PATHS = ("dataset_path", "corpus_path", "rollouts", "output_dir", "index_dir")
CONFIG_PATHS_IF_THERE = ("model_name_or_path", "resume_from_checkpoint")
# Options that name a command the run starts with the user's rights (mcp_grpo.py's stdio server): a config file may set
# them only where nobody but the user could have written it (check_command_source).
COMMAND_OPTIONS = ("mcp_command",)


def arg(default, help: str, **metadata):
    """A dataclass field with its --help text (and any other HfArgumentParser metadata, e.g. choices), for a recipe's
    ScriptArguments."""
    return field(default=default, metadata={"help": help, **metadata})


def on_colab() -> bool:
    """Whether this runs in a Colab notebook: each recipe's config then takes its free-T4 values (`if ON_COLAB`)."""
    return "google.colab" in sys.modules


class RecipeParser(TrlParser):
    """TrlParser whose `--config` file is checked before it is read, its relative paths taken relative to it, its
    unknown keys named with a hint, and a few keys dropped where a trainer has no use for them (ignore_keys: key ->
    the reason logged)."""

    def __init__(self, dataclass_types, recipe: str, ignore_keys: dict[str, str] | None = None):
        super().__init__(dataclass_types, allow_abbrev=False)
        self.recipe, self.ignore_keys = recipe, ignore_keys or {}
        self.config_path: str | None = None
        self.config_keys: set[str] = set()

    def error(self, message):  # argparse's usage dump and exit, as one line
        raise Refusal(f"{message} (--help lists the options)")

    def set_defaults_with_config(self, **config) -> list[str]:
        if self.config_path is None:  # the recipe's own defaults
            return super().set_defaults_with_config(**config)
        config = config_paths(config, Path(self.config_path).parent)
        skipped = [key for key in self.ignore_keys if config.pop(key, None) is not None]
        if skipped:  # keys of the recipe's own config this trainer has no use for (async_grpo.py: the eval loop's)
            reasons = "; ".join(dict.fromkeys(self.ignore_keys[key] for key in skipped))
            logger.warning(f"ignoring {', '.join(skipped)} from {self.config_path}: {reasons}")
        known = self.option_names()
        unknown = [key for key in config if key not in known]
        if unknown:
            raise Refusal(f"unknown key(s) in {self.config_path}: " + ", ".join(
                unknown_hint(key, config[key], known, self.recipe) for key in unknown) + " (--help lists the options)")
        self.check_values(config)
        check_command_source(self.config_path, [key for key in COMMAND_OPTIONS if key in config])
        self.config_keys = set(config)
        return super().set_defaults_with_config(**config)

    def check_values(self, config: dict) -> None:
        """Each config value of the type its option takes, or one line: argparse converts a flag's text, but a YAML
        value reaches the run as YAML typed it (`max_steps: 4.5` a float, `lora_target_modules: q_proj, v_proj` one
        string), and would fail only after the model loaded."""
        actions = {action.dest: action for action in self._actions}
        for key, value in config.items():
            action = actions[key]
            if value is None:
                continue
            if action.nargs in ("+", "*"):
                if isinstance(value, str) and re.search(r"[,\s]", value.strip()):
                    parts = ", ".join(part for part in re.split(r"[,\s]+", value) if part)
                    raise Refusal(f"{key}: {value!r} in {self.config_path} is one string; write a YAML list, e.g. "
                                  f"{key}: [{parts}]")
                items = value if isinstance(value, list) else [value]
            elif isinstance(value, list):
                raise Refusal(f"{key}: {value!r} in {self.config_path} is a list; it takes one value")
            else:
                items = [value]
            for item in items:
                if not takes(action.type, item):
                    kind = {int: "a whole number", float: "a number"}.get(action.type, "true or false")
                    raise Refusal(f"{key}: {item!r} in {self.config_path} is not {kind}")

    def option_names(self) -> set[str]:
        return {action.dest for action in self._actions}


def parse_args(script_arguments, defaults: dict, argv: list[str] | None = None, config_class=None,
               ignore_keys: dict[str, str] | None = None):
    """(script_args, training_args, model_args): the command line over a --config YAML over the recipe's defaults.

    A misspelled flag or YAML key (or one of another recipe), a bad or out-of-range value, a missing, broken or
    misshapen --config end in one line with the nearest valid name; flags are never matched by prefix (`--learning_rat`
    is not `--learning_rate`). A relative path in a config file is relative to that file (config_paths). --help shows
    the recipe's own options and the ones it sets; --help_all every option. ignore_keys: config keys this trainer
    drops, each with the reason it logs (async_grpo.py: the eval loop's). config_class: RecipeGRPOConfig unless
    given."""
    # Here, not at the top: a recipe imports this module for `arg` and `on_colab`, and evaluate.py imports a recipe
    # without torch (the config classes load it).
    from grpo_recipes.configs import RecipeGRPOConfig, apply_dependent_defaults

    config_class = config_class or RecipeGRPOConfig
    quiet_noise()  # the config classes warn while they are built
    recipe = recipe_name(script_arguments)
    parser = RecipeParser((script_arguments, config_class, ModelConfig), recipe, ignore_keys)
    parser.set_defaults_with_config(**defaults)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help_all" in argv:
        raise Refusal(parser.format_help(), exit_code=0)
    if "-h" in argv or "--help" in argv:
        raise Refusal(short_help(parser, script_arguments, defaults, recipe), exit_code=0)
    if (configs := sum(a == "--config" or a.startswith("--config=") for a in argv)) > 1:
        raise Refusal(f"--config given {configs} times: pass one YAML file (options on the command line override it)")
    argv = with_config_checked(argv)
    if "--config" in argv:
        parser.config_path = argv[argv.index("--config") + 1]
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as err:
        unknown = re.search(r"not used by the HfArgumentParser: (\[.*?\])", str(err))
        if unknown is None:
            raise
        names = [a.split("=")[0] for a in ast.literal_eval(unknown.group(1)) if a.startswith("--")]
        hints = [unknown_hint(name[2:], None, parser.option_names(), recipe, prefix="--") for name in names]
        raise Refusal(f"unknown option(s): {', '.join(hints)} (--help lists the options)") from None
    check_ranges(script_args)
    check_ranges(model_args)
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")} | parser.config_keys
    apply_dependent_defaults(training_args, model_args, given)
    quiet_bars_when_redirected(training_args, given)
    training_args.run_identity = run_identity(recipe, script_args, model_args, training_args)
    return script_args, training_args, model_args


def takes(kind, value) -> bool:
    """Whether an option whose argparse type is `kind` takes this YAML value as it is. Text always passes here:
    argparse converts it, or says in one line why it cannot (`learning_rate: fast`)."""
    if isinstance(value, str):
        return True
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if getattr(kind, "__name__", "") == "string_to_bool":
        return isinstance(value, bool)
    return True  # the rest: argparse and the config classes check them


def recipe_name(script_arguments) -> str:
    """The recipe's file name, without .py, from its ScriptArguments class (run as a script: from its file)."""
    module = script_arguments.__module__
    if module == "__main__":
        return Path(getattr(sys.modules["__main__"], "__file__", "recipe")).stem
    return module.rsplit(".", 1)[-1]


def with_config_checked(argv: list[str]) -> list[str]:
    """argv with `--config=path` written as TrlParser reads it (`--config path`), once the file is known to be a YAML
    mapping TrlParser can read: a missing file (naming the offline.py flag that writes a kit config), a folder, broken
    YAML, an empty file or a YAML that is not a mapping is one line."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 == len(argv):
            raise Refusal("--config needs a YAML file, e.g. --config offline/gsm8k_grpo.yaml")
        if arg == "--config" or arg.startswith("--config="):
            path = argv[i + 1] if arg == "--config" else arg.split("=", 1)[1]
            check_config_file(path)
            return argv[:i] + ["--config", path] + argv[i + (2 if arg == "--config" else 1):]
    return argv


def check_config_file(path: str) -> None:
    """One line for a --config that TrlParser could not read, or that holds nothing to read."""
    file = Path(path)
    if file.is_dir():
        inside = ", ".join(sorted(p.name for p in file.glob("*.y*ml"))) or "no YAML files"
        raise Refusal(f"--config {path} is a folder ({inside} in it): pass one YAML file")
    if not file.is_file():
        writer = KIT_CONFIGS.get(file.name)
        in_kit = writer is not None and file.parent.name == "offline"
        hint = f"; `python offline.py{writer}` writes it" if in_kit else ""
        raise Refusal(f"--config {path}: no such file{hint}")
    try:
        config = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise Refusal(f"--config {path}: not valid YAML: {' '.join(str(err).split())}") from None
    except UnicodeDecodeError:
        raise Refusal(f"--config {path}: not a text file; pass a YAML file of option: value lines") from None
    if config is None:  # the defaults would train the recipe's Hub model: not what a config file was passed for
        raise Refusal(f"--config {path} holds no options (empty, or only comments): add option: value lines "
                      "(e.g. `learning_rate: 1.0e-5`), or run without --config")
    if not isinstance(config, dict):
        raise Refusal(f"--config {path}: a YAML mapping of option: value lines is needed (e.g. `learning_rate: "
                      f"1.0e-5`), not a {type(config).__name__}")
    if not isinstance(config.get("env", {}), dict):
        raise Refusal(f"--config {path}: `env:` must be a mapping of variable: value")


def check_command_source(path: str, commands: list[str]) -> None:
    """One line where a config file that sets a command (COMMAND_OPTIONS) is not the user's alone: owned by another
    user, or writable by others, so that whoever could write it would choose what runs with the user's rights."""
    if not commands or not hasattr(os, "getuid"):
        return
    status = Path(path).stat()
    why = (f"is owned by user {status.st_uid}, not you" if status.st_uid != os.getuid()
           else "can be written by others" if status.st_mode & 0o022 else "")
    if why:
        raise Refusal(f"--config {path} sets {', '.join(commands)}, a command this run starts with your rights, but "
                      f"the file {why}: pass the command on the command line, or make the file yours alone (chmod "
                      "go-w)")


def config_paths(config: dict, folder: Path) -> dict:
    """The config with each relative path joined to the config file's folder (see CONFIG_PATHS)."""
    config = dict(config)
    for key in CONFIG_PATHS + CONFIG_PATHS_IF_THERE:
        value = config.get(key)
        if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
            continue
        joined = folder / value
        if key in CONFIG_PATHS or joined.exists():
            config[key] = os.path.normpath(joined)
    return config


def unknown_hint(name: str, value, known: set[str], recipe: str, prefix: str = "") -> str:
    """An unknown option or key, with its nearest known name, or the recipe it belongs to, or (a YAML section) how
    to write it."""
    if isinstance(value, dict):
        return (f"{name} (a section: options go at the top level of the file, `learning_rate: 1.0e-5`, not "
                f"under `{name}:`)")
    owners = [other for other, options in recipe_options().items() if other != recipe and name in options]
    if owners:
        return f"{prefix}{name} (an option of {' and '.join(o + '.py' for o in owners)}, not of {recipe}.py)"
    close = difflib.get_close_matches(name, sorted(known), 1, 0.75)
    return f"{prefix}{name}" + (f" (did you mean {prefix}{close[0]}?)" if close else "")


@functools.lru_cache(maxsize=1)
def recipe_options() -> dict[str, set[str]]:
    """Each script's own options (its ScriptArguments fields), read from the scripts in ROOT; none imported."""
    options = {}
    for path in sorted(ROOT.glob("*.py")):
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "ScriptArguments":
                options[path.stem] = {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)
                                      and isinstance(item.target, ast.Name)}
    return options


def short_help(parser, script_arguments, defaults: dict, recipe: str) -> str:
    """--help: the recipe's own options, then the ones it sets, each with its value and help; --help_all for all."""
    actions = {action.dest: action for action in parser._actions}
    own = [f.name for f in fields(script_arguments)]

    def lines(names, value_of) -> list[str]:
        out = []
        for name in names:
            help_text = " ".join(str(actions[name].help or "").split()) if name in actions else ""
            out.append(f"  --{name} {value_of(name)!r}" + (f": {help_text}" if help_text else ""))
        return [line if len(line) <= 118 else line[:117] + "…" for line in out]

    total = sum(1 for action in parser._actions if action.option_strings) - 1
    return "\n".join([f"usage: python {recipe}.py [--config FILE.yaml] [--option value ...]", "",
                      f"{recipe}.py's own options (default shown):",
                      *lines(own, lambda name: actions[name].default),
                      "", "TRL and transformers options this recipe sets (its value shown):",
                      *lines([name for name in defaults if name not in own], lambda name: defaults[name]), "",
                      f"--help_all lists all {total} options (TRL's config for this trainer and ModelConfig); each is "
                      "a flag or a --config YAML key."])
