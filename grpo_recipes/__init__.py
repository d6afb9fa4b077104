"""The library the recipes share: small modules, one job each. A recipe imports the ones it uses; nothing is imported
here, so a notebook carries only the modules its recipe imports (notebooks/build.py).

- `options`: the command line over a `--config` YAML over the recipe's defaults (TRL's parser), one line per mistake
- `configs`: GRPOConfig with this machine's defaults (precision, vLLM) and the defaults that depend on other options
- `ranges`: option values in range, batches TRL would accept
- `data`: a split of a Hub dataset or of local files, and a run's train and held-out splits
- `contract`: what a recipe offers the scripts that run it (`setup(script_args)` returns a `Setup`), the list of recipes
- `preflight`: the checks before a model loads: launch, model options and source, LoRA targets, loggers, chat template
- `memory`: the GPU memory a run needs, and the check that it fits
- `output_dir`: the output folder: a lock, never losing work, resuming only what can be resumed
- `training`: before the trainer (`prepare`) and after it (`run`: compact logs, Ctrl-C, an atomic save, the curves)
- `logs`: log lines, the compact step line, completions as text, training_curves.png
- `notebook`: a notebook's look at a run and at the trained model
- `trl_patches`: the patches of TRL's and transformers' private code, each for a named version
- `answers`: the answer in a completion, and whether it equals the gold one (`answers_match`)
- `math_verify_process`: math-verify in a child process that can be killed
- `judge`: an LLM judge as a reward (one completion a call, or a group a call), and the verdicts it reads
- `console`: the log's format and what it leaves out (other libraries' noise, progress bars into a file)
- `sandbox`: the trainer's side of the sandboxed interpreter; `zygote_launch` starts its fork server in an engine,
  `call_pipes` reads and writes a call's own pipes
- `zygote`, `confinement`: inside the sandbox: the fork server, and the kernel mechanisms that confine each call
- `function_tester`, `plain_data`: a function's tests run against it across the sandbox boundary, with plain data
  between
- `refusal`: `Refusal`, the one error for a mistake the user can fix; `run_script`, which turns it into one line
"""
