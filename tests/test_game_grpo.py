"""game_grpo.py: the game, its record and replay, the rubric against every way of not playing, textarena's games
through the adapter, and (slow tier) real GRPO steps of a tiny model warm-started to play (offline.py --games): the
first observation in the prompt, the game's text masked, the turn limit and the token budget ending episodes cleanly.
"""

import functools
import json
import pickle
import subprocess
import sys

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.utils import get_json_schema

import game_grpo
import rewards
from conftest import ROOT
from grpo_recipes import games
from grpo_recipes.contract import environment_tools
from grpo_recipes.refusal import Refusal

GAME = functools.partial(game_grpo.GuessTheNumber, 100, 7)
WEIGHTS = list(game_grpo.REWARD_WEIGHTS.values())


def call(name: str, arguments) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}


def played(seed: int, moves: list, new_game=GAME, last: str | None = "Done.") -> list[dict]:
    """The completion TRL's loop builds when the policy makes these moves (each a guess, or (tool, arguments)), the
    game answering each, then a last reply (None: the episode ends on the last answer)."""
    game, completion = new_game(), []
    game.reset(seed=seed)
    for move in moves:
        name, arguments = move if isinstance(move, tuple) else ("guess", {"number": move})
        try:
            answer = str(getattr(game, name)(**arguments))
        except Exception as err:  # noqa: BLE001 - what TRL answers a call that raised
            answer = str({"error": str(err)})
        completion += [call(name, arguments), {"role": "tool", "name": name, "content": answer}]
    return completion + ([{"role": "assistant", "content": last}] if last is not None else [])


def halving(seed: int, max_number: int = 100) -> list[int]:
    """The guesses that halve what the hints allow until the secret."""
    secret, low, high, guesses = random_secret(seed, max_number), 1, max_number, []
    while True:
        guesses.append((low + high) // 2)
        if guesses[-1] == secret:
            return guesses
        low, high = (guesses[-1] + 1, high) if guesses[-1] < secret else (low, guesses[-1] - 1)


def random_secret(seed: int, max_number: int = 100) -> int:
    game = game_grpo.GuessTheNumber(max_number)
    game.reset(seed=seed)
    return game.secret


def total(completion, seed: int, new_game=GAME) -> float:
    scores = [func(completions=[completion], seed=[seed], new_game=new_game)[0] for func in game_grpo.REWARD_WEIGHTS]
    return sum(w * (s or 0.0) for w, s in zip(WEIGHTS, scores, strict=True))


def test_the_move_is_a_typed_documented_method_trl_describes():
    (tool,) = environment_tools(GAME())
    schema = get_json_schema(tool)["function"]
    assert schema["name"] == "guess" and schema["parameters"]["properties"]["number"]["type"] == "integer"
    assert schema["parameters"]["properties"]["number"]["description"] and schema["description"]


def test_the_first_observation_states_the_game_and_the_turn_limit():
    first = GAME().reset(seed=0)
    assert first.startswith("\n\n") and "from 1 to 100" in first and "7 guesses" in first


def test_held_out_games_are_seeds_training_never_plays():
    train = game_grpo.build_dataset("train", train_size=1000)
    test = game_grpo.build_dataset("test", test_size=200)
    assert not set(train["seed"]) & set(test["seed"]) and len(set(test["seed"])) == 200
    assert train[0]["prompt"][0]["content"] == game_grpo.SYSTEM_PROMPT


def test_the_turn_limit_ends_the_episode_as_a_loss_and_a_move_after_it_is_an_invalid_move():
    game = GAME()
    game.reset(seed=0)
    wrong = [n for n in range(1, 101) if n != game.secret][:7]
    answers = [game.guess(n) for n in wrong]
    assert "No guesses left" in answers[-1] and "Game over" in answers[-1] and game.done and not game.won
    assert "1 guess left." in answers[-2]
    assert game.guess(game.secret).startswith("Error: the game is over") and not game.won
    assert game.invalid_moves == 1 and game.turns == 7


def test_invalid_guesses_are_answered_counted_and_cost_a_turn():
    game = GAME()
    game.reset(seed=0)
    for bad in (0, 101, 2.5, "ten", True, None):
        assert game.guess(bad).startswith("Error: guess a whole number from 1 to 100")
    assert game.invalid_moves == 6 and game.turns == 6 and game.credits == [0.0] * 6
    assert game.guess("50").startswith(("50 is wrong", "Correct"))  # a quoted number is still a number


def test_the_replay_reproduces_the_live_games_record():
    """Live, TRL calls the refereed game's move (a call that raises is its invalid move and costs a turn), or answers
    an unknown tool itself without calling the game: the replay takes the same path for each."""
    for seed in range(20):
        moves = [50, "²", 50, ("guess", {"n": 3}), ("python", {"code": "1"}), 0, *halving(seed)][:9]
        live, completion = games.refereed(GAME)(), played(seed, moves)
        live.reset(seed=seed)
        for move in moves:
            name, arguments = move if isinstance(move, tuple) else ("guess", {"number": move})
            if name == "guess":
                live.guess(**arguments)  # never raises
        replayed = games.replay(GAME, seed, completion)
        record = ("done", "won", "turns", "invalid_moves", "credits")
        assert [getattr(replayed, k) for k in record] == [getattr(live, k) for k in record], seed
        assert replayed.turns == min(len(moves) - 1, 7) or replayed.won  # every call but the unknown tool is a turn


def test_a_move_that_raises_is_an_invalid_move_live_and_in_the_replay():
    """Issue 66: guess("²") raised ValueError live (no turn) while the replay charged a turn; after 7 such calls the
    replay still said done=False."""
    class Raising(game_grpo.GuessTheNumber):
        def guess(self, number: int) -> str:
            """Guess.

            Args:
                number: A number.
            """
            return super().guess(int(number))

    live = games.refereed(Raising)()
    live.reset(seed=3)
    assert live.max_turns == 7
    answers = [live.guess(number="²") for _ in range(7)]
    assert answers[0].startswith("Error: ValueError") and "That cost a turn" in answers[0]
    assert live.done and not live.won and live.turns == 7 and live.invalid_moves == 7 and "Game over" in answers[-1]
    replayed = games.replay(Raising, 3, played(3, [("guess", {"number": "²"})] * 7))
    assert (replayed.done, replayed.turns, replayed.invalid_moves) == (True, 7, 7)
    assert GAME().guess.__doc__ == games.refereed(GAME)().guess.__doc__  # TRL shows the model the same tool


def test_stopping_early_never_beats_playing_on():
    """Issue 66: one halving guess then stopping (0.265 on average) beat honest play that loses (0.124)."""
    stopped, lost = [], []
    for seed in range(40):
        first = halving(seed)[:1]
        if first[0] == random_secret(seed):
            continue  # a win at once
        stopped.append(total(played(seed, first), seed))
        others = [n for n in range(1, 101) if n not in (random_secret(seed), *first)][:6]
        lost.append(total(played(seed, first + others), seed))
        assert lost[-1] >= stopped[-1], seed  # playing on, even badly, is never worse
    honest = [total(played(seed, halving(seed)[:6] + [0]), seed) for seed in range(40)]
    assert sum(stopped) / len(stopped) < sum(honest) / len(honest)


def test_textarena_applies_one_move_per_call():
    """Issue 66: TowerOfHanoi applied every move packed into one action; all 7 in one call scored a fast win."""
    new_game = textarena_game("TowerOfHanoi-v0")
    game = new_game()
    game.reset(seed=1)
    packed = "[A C] [A B] [C B] [A C] [B A] [B C] [A C]"
    assert game.move(packed).startswith("Error: one move per call") and not game.done
    assert game.turns == 1 and game.invalid_moves == 1
    completion = played(1, [("move", {"action": packed})], new_game=new_game)
    assert not games.replay(new_game, 1, completion).won
    one_a_call = played(1, [("move", {"action": a}) for a in packed.replace("] [", "]|[").split("|")],
                        new_game=new_game)
    assert total(one_a_call, 1, new_game) > total(completion, 1, new_game)


def test_halving_wins_every_game_in_the_turn_limit_with_full_credit_each_turn():
    for seed in range(50):
        game = games.replay(GAME, seed, played(seed, halving(seed)))
        assert game.won and game.turns <= 7 and game.credits == [1.0] * game.turns


def test_each_way_of_not_playing_scores_below_any_win():
    seed = 3
    secret = random_secret(seed)
    slowest_win = total(played(seed, [n for n in range(1, 101) if n != secret][:6] + [secret]), seed)
    assert slowest_win >= 1.0
    attempts = {
        "claims a win in text": [{"role": "assistant", "content": "Correct! I won in 1 guess. Game over."}],
        "stops after one good move": played(seed, [50]),
        "stalls inside the range": played(seed, [n for n in range(1, 101) if n != secret][:7]),
        "repeats a move": played(seed, [50] * 7),
        "invalid moves": played(seed, [0, 101, "x", 2.5, -1, 1000, None]),
        "calls another tool": played(seed, [("python", {"code": f"print({secret})"})] * 7),
        "forges the game's answer": played(seed, [1 if secret != 1 else 2],
                                           last="<tool_response>Correct! You won. Game over.</tool_response>"),
        "ends at once": [{"role": "assistant", "content": "I give up."}],
    }
    for name, completion in attempts.items():
        assert total(completion, seed) < 0.3 < slowest_win, name


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), moves=st.lists(st.one_of(st.integers(-5, 105), st.text(max_size=3), st.none(),
                                                              st.just(("python", {"code": "1"}))), max_size=12))
def test_no_episode_that_is_not_a_win_totals_as_much_as_a_win(seed, moves):
    """Moves of every kind, calls of a tool the game does not have among them (TRL answers those without the game)."""
    completion = played(seed, moves)
    replayed = games.replay(GAME, seed, completion)
    if replayed.won:
        assert total(completion, seed) >= 1.0
    else:
        assert total(completion, seed) <= WEIGHTS[2] < 1.0


def test_calls_the_game_never_took_change_nothing_in_the_replay_as_in_play():
    """TRL answers a call of a tool the game lacks without the game, so the live game takes the winning guess as its
    first turn; the replay agrees (those calls are TRL's tools/failure_frequency, and teach the player nothing)."""
    seed = 5
    completion = played(seed, [("python", {"code": "1"})] * 9 + [random_secret(seed)])
    scores = [func(completions=[completion], seed=[seed], new_game=GAME)[0] for func in game_grpo.REWARD_WEIGHTS]
    assert scores[0] == 1.0 and games.replay(GAME, seed, completion).turns == 1


def test_a_faster_win_scores_more_than_a_slower_one():
    seed = 5
    secret = random_secret(seed)
    fast, slow = played(seed, [secret]), played(seed, [n for n in (1, 2, 3, 4) if n != secret][:3] + [secret])
    assert total(fast, seed) > total(slow, seed) >= 1.0


def test_a_cut_episode_is_unfinished_not_lost_and_logged_and_a_stopped_one_is_lost():
    seed, logged = 7, {}
    cut = played(seed, [50])[:-1] + [call("guess", {"number": 25})]  # the budget dropped this call's answer
    stopped = played(seed, [50])
    with pytest.warns(RuntimeWarning, match="game/unfinished"):
        won = rewards.game_won_reward([cut, stopped], seed=[seed, seed], new_game=GAME,
                                      log_metric=logged.__setitem__)
    assert won == [None, 0.0] and logged["game/unfinished"] == 0.5 and logged["game/turns"] == 1.0
    assert games.unanswered_call(cut) and not games.unanswered_call(stopped)


def test_turn_level_credit_is_logged_per_turn():
    logged, extra = {}, {}
    seed = 11
    rewards.game_progress_reward([played(seed, halving(seed))], seed=[seed], new_game=GAME,
                                 log_metric=logged.__setitem__, log_extra=extra.__setitem__)
    assert logged["game_progress/turn_1"] == 1.0 and extra["game_progress_per_turn"][0].startswith("1.00")


def test_fewer_turns_than_the_game_allows_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(Refusal, match="--max_tool_calling_iterations 3 is below --turn_limit 7"):
        game_grpo.main(["--max_tool_calling_iterations", "3", "--output_dir", str(tmp_path)])


def test_an_unknown_game_is_one_line():
    with pytest.raises(Refusal, match="--game chess: use guess_the_number or textarena:<GameId>"):
        game_grpo.setup(game_grpo.ScriptArguments(game="chess"))


# ---------------------------------------------------------------------------------------------------------- textarena

def textarena_game(game_id: str, max_turns: int = 12):
    return game_grpo.new_game(game_grpo.ScriptArguments(game=f"textarena:{game_id}", turn_limit=max_turns))


def test_textarenas_tower_of_hanoi_is_won_by_the_seven_moves_and_replays_alike():
    new_game = textarena_game("TowerOfHanoi-v0")
    game = new_game()
    first = game.reset(seed=1)
    assert "Tower of Hanoi with 3 disks" in first and "[A C]" in first
    solution = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]
    answers = [game.move(action) for action in solution]
    assert "You moved disk 1 from A to C" in answers[0] and "Game over: you won" in answers[-1]
    assert game.won and game.turns == 7 and game.invalid_moves == 0
    completion = played(1, [("move", {"action": a}) for a in solution], new_game=new_game)
    replayed = games.replay(new_game, 1, completion)
    assert replayed.won and replayed.turns == 7
    assert total(completion, 1, new_game) == pytest.approx(1.0 + 0.5 * 6 / 12)  # no turn-level credit: None


def test_textarenas_invalid_moves_are_answered_and_counted():
    new_game = textarena_game("TowerOfHanoi-v0")
    game = new_game()
    game.reset(seed=1)
    assert "invalid move" in game.move("hello") and game.invalid_moves == 1 and not game.done
    game.move("[A C]")
    assert "larger disk on a smaller" in game.move("[A C]") and game.invalid_moves == 2


def test_textarenas_guess_the_number_ends_at_the_recipes_turn_limit_or_its_own():
    new_game = textarena_game("GuessTheNumber-v0", max_turns=3)
    game = new_game()
    assert "[5]" in game.reset(seed=2)
    answers = [game.move(f"[{n}]") for n in (1, 2, 3)]
    assert game.done and (game.won or "you lost" in answers[-1])
    completion = played(2, [("move", {"action": f"[{n}]"}) for n in (1, 2, 3)], new_game=new_game)
    assert rewards.game_won_reward([completion], seed=[2], new_game=new_game) == [float(game.won)]


@pytest.mark.parametrize(("game_id", "why"), [
    ("TicTacToe-v0", "not a single-player game"),
    ("NoSuchGame-v0", "textarena has no such game"),
    pytest.param("Chess-v0", r"its source needs a newer Python than this 3\.11 \(textarena/envs/Chess/env.py:62",
                 marks=pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 reads its f-strings")),
])
def test_a_textarena_game_that_cannot_be_played_here_is_one_line(game_id, why):
    with pytest.raises(Refusal, match=why) as refusal:
        textarena_game(game_id)
    assert "\n" not in str(refusal.value)


def test_a_textarena_game_needing_data_this_machine_cannot_download_is_one_line():
    try:
        import nltk

        nltk.data.find("corpora/words")
        pytest.skip("NLTK's words are installed here: Wordle runs")
    except LookupError:
        pass
    with pytest.raises(Refusal, match="needs NLTK's 'words' data") as refusal:
        textarena_game("Wordle-v0")
    assert "\n" not in str(refusal.value)


def test_the_games_survive_pickling_into_a_spawned_process():
    """TRL's async trainer pickles the factory and the rubric into a spawned process: both must arrive and play."""
    task = game_grpo.setup(game_grpo.ScriptArguments(max_number=6, turn_limit=2))
    hanoi = game_grpo.setup(game_grpo.ScriptArguments(game="textarena:TowerOfHanoi-v0"))
    probe = ("import pickle, sys, json\nsys.path.insert(0, sys.argv[1])\n"
             "(factory, funcs), hanoi = pickle.loads(sys.stdin.buffer.read())\n"
             "game = factory()\nfirst = game.reset(seed=1)\n"
             "call = {'type': 'function', 'function': {'name': 'guess', 'arguments': {'number': game.secret}}}\n"
             "won = [{'role': 'assistant', 'content': '', 'tool_calls': [call]}, {'role': 'tool', 'content': 'x'}]\n"
             "other = hanoi()\nprint(json.dumps([first, [f(completions=[won], seed=[1])[0] for f in funcs],"
             " other.reset(seed=1)[:40]]))\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(ROOT)], capture_output=True, timeout=120,
                          input=pickle.dumps(((task.environment_factory, task.reward_funcs),
                                              hanoi.environment_factory)))
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    first, scores, other = json.loads(proc.stdout.decode().splitlines()[-1])
    assert "from 1 to 6. You have 2 guesses" in first and scores[:2] == [1.0, 1.0] and "Tower of Hanoi" in other


# -------------------------------------------------------------------------------------------- real GRPO steps (slow)

@pytest.fixture(scope="module")
def trained(game_kit, tmp_path_factory):
    """Two real GRPO steps of the recipe, in process, through its own entry point, completions logged."""
    out = tmp_path_factory.mktemp("game_run")
    trainer = game_grpo.main(["--config", str(game_kit / "game_grpo.yaml"), "--output_dir", str(out),
                              "--max_steps", "2", "--save_steps", "2", "--eval_strategy", "no", "--log_completions"])
    return trainer, out


def logged_rows(out) -> pd.DataFrame:
    return pd.concat(pd.read_parquet(f) for f in sorted((out / "completions").glob("*.parquet")))


@pytest.mark.slow
def test_the_policy_sees_the_first_observation_and_plays_through_the_tool(trained):
    """trl#6067: an environment's first observation that never reaches the policy makes every reward 0."""
    trainer, out = trained
    rows = logged_rows(out)
    assert all("I am thinking of a whole number from 1 to 8" in row["prompt"][-1]["content"]
               for _, row in rows.iterrows())
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert len(steps) == 2 and all(log["tools/call_frequency"] > 0 for log in steps)
    assert all({"game/turns", "game/invalid_moves", "game/unfinished"} <= log.keys() for log in steps)
    assert any(log["rewards/game_won_reward/mean"] > 0 for log in steps)


@pytest.mark.slow
def test_the_games_text_is_masked_from_the_loss(trained):
    trainer, _ = trained
    example = game_grpo.build_dataset("train", train_size=1)[0]
    batch = trainer._generate_and_score_completions([example] * trainer.args.num_generations)
    tokenizer, masked = trainer.processing_class, 0
    for ids, tool_mask, mask in zip(batch["completion_ids"], batch["tool_mask"], batch["completion_mask"], strict=True):
        ids, tool_mask = ids[mask.bool()], tool_mask[mask.bool()]
        hidden, trained_text = tokenizer.decode(ids[tool_mask == 0]), tokenizer.decode(ids[tool_mask == 1])
        if tool_mask.min() == 0:
            masked += 1
            assert "is wrong" in hidden or "Correct!" in hidden
        assert "is wrong: the number is" not in trained_text and "Correct!" not in trained_text
    assert masked, "no episode in the batch made a move"


@pytest.mark.slow
def test_the_turn_limit_and_the_token_budget_end_episodes_cleanly(game_kit, tmp_path):
    """The game's own limit (1 turn) ends every episode it reaches as a loss; a budget too small for one turn and its
    answer cuts them, counted as unfinished: neither crashes, both are logged."""
    common = ["--config", str(game_kit / "game_grpo.yaml"), "--max_steps", "1", "--eval_strategy", "no",
              "--save_strategy", "no", "--log_completions"]
    game_grpo.main([*common, "--turn_limit", "1", "--output_dir", str(tmp_path / "turns")])
    for _, row in logged_rows(tmp_path / "turns").iterrows():
        answers = [m["content"] for m in row["completion"] if m["role"] == "tool"]
        assert not answers or "Game over" in answers[0], answers
        assert all(answer.startswith("Error: the game is over") for answer in answers[1:]), answers
    with pytest.warns(RuntimeWarning, match="game/unfinished"):
        cut = game_grpo.main([*common, "--max_completion_length", "24", "--output_dir", str(tmp_path / "tokens")])
    step = [log for log in cut.state.log_history if "loss" in log][0]
    assert step["game/unfinished"] > 0.25 and step["completions/max_length"] <= 24


@pytest.mark.slow
def test_evaluate_plays_the_game_then_sft_on_its_wins_then_grpo(game_kit, tmp_path, capsys):
    """The workflow against a real OpenAI-compatible server: the served model plays through the tools API, with the
    game's first observation in its prompt; its won episodes are the SFT data; GRPO starts from the result."""
    import evaluate
    import sft_warmstart
    from conftest import serve

    served = serve(str(game_kit / "tiny-qwen2-games"))
    base_url, model = next(served)
    try:
        out = tmp_path / "rollouts.jsonl"
        evaluate.main(["game_grpo", "--base_url", base_url, "--model", model, "-n", "6", "-r", "2", "--max_tokens",
                       "48", "--max_number", "8", "--turn_limit", "4", "--out", str(out)])
    finally:
        served.close()
    saved = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(row["error"] is None for row in saved), saved[0]["error"]
    assert all("I am thinking of a whole number from 1 to 8" in row["prompt"][-1]["content"] for row in saved)
    answers = [m["content"] for row in saved for m in row["completion"] if m["role"] == "tool"]
    assert any("is wrong: the number is" in a or a.startswith("Correct!") for a in answers), answers[:4]
    for row in saved:  # the rubric's record is the game's: a won episode's last answer says so
        won = any(m["role"] == "tool" and m["content"].startswith("Correct!") for m in row["completion"])
        assert row["scores"]["game_won_reward"] == float(won)
    assert any(row["strict"] for row in saved), "the warm-started model won no game"
    sft = sft_warmstart.main(["--recipe", "game_grpo", "--source", "rollouts", "--rollouts", str(out),
                              "--min_reward", "1.0", "--model_name_or_path", model, "--output_dir",
                              str(tmp_path / "sft"), "--max_steps", "2", "--use_cpu", "--gradient_checkpointing",
                              "false"])
    trainer = game_grpo.main(["--config", str(game_kit / "game_grpo.yaml"), "--model_name_or_path", str(sft),
                              "--max_steps", "1", "--eval_strategy", "no", "--output_dir", str(tmp_path / "grpo")])
    assert trainer.state.global_step == 1
