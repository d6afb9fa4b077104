"""grpo_recipes/preflight.py: the checks before a model loads, here the launch and tools across processes (the
template, option and source checks run through the recipes' entry points in test_mistakes.py and the recipes' tests)."""

import pytest

import gsm8k_grpo
from grpo_recipes import options, preflight
from grpo_recipes.refusal import Refusal


def parse_args(argv: list[str]):
    return options.parse_args(gsm8k_grpo.ScriptArguments, gsm8k_grpo.RECIPE_DEFAULTS, argv)


# ------------------------------------------------------------------------------------------------ processes, GPUs
def test_a_plain_python_run_on_several_gpus_exits_with_the_launch_command(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr("sys.argv", ["gsm8k_grpo.py", "--max_steps", "10"])
    with pytest.raises(Refusal, match=r"2 GPUs are visible to one process: .*`accelerate launch --config_file "
                       r"accelerate/multi_gpu.yaml --num_processes 2 gsm8k_grpo.py --max_steps 10`, or on one with "
                       r"`CUDA_VISIBLE_DEVICES=0 python gsm8k_grpo.py --max_steps 10`"):
        preflight.check_launch("gsm8k_grpo.py", gpus=2)
    preflight.check_launch("gsm8k_grpo.py", gpus=1)
    monkeypatch.setenv("WORLD_SIZE", "2")  # under accelerate launch: one GPU per process
    preflight.check_launch("gsm8k_grpo.py", gpus=2)


@pytest.mark.parametrize("launch, reason", [
    ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "DeepSpeed ZeRO-3"),
    ({"ACCELERATE_USE_FSDP": "true"}, "FSDP"),
    ({"server": True}, "vLLM server mode"),
    ({"tensor_parallel": 2}, "vLLM tensor parallel 2"),
])
def test_tools_across_processes_are_refused_where_a_turn_is_a_collective(monkeypatch, launch, reason):
    _, args, _ = parse_args([])
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name, value in launch.items():
        if name.isupper():
            monkeypatch.setenv(name, value)
    args.use_vllm = "server" in launch or "tensor_parallel" in launch  # what a GPU launch would have chosen
    args.vllm_mode = "server" if "server" in launch else "colocate"
    args.vllm_tensor_parallel_size = launch.get("tensor_parallel", 1)
    with pytest.raises(Refusal, match=rf"tools across 2 processes with {reason}.* can hang: .* Use DDP "):
        preflight.check_tools_across_processes(args, tools=[print])
    preflight.check_tools_across_processes(args, tools=None)  # no tools: every process generates once a step
    monkeypatch.setenv("WORLD_SIZE", "1")
    preflight.check_tools_across_processes(args, tools=[print])  # one process waits for nobody


def test_tools_with_ddp_and_colocated_vllm_run(monkeypatch):
    _, args, _ = parse_args([])
    monkeypatch.setenv("WORLD_SIZE", "2")
    args.use_vllm, args.vllm_mode, args.vllm_tensor_parallel_size = True, "colocate", 1
    preflight.check_tools_across_processes(args, tools=[print])
