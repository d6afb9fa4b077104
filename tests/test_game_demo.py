"""game_demo.py: its teacher loses only where its off-by-one repeats a guess, the blind game is the same game without
its hints, and SFT, RL and held-out games never share a seed."""

import functools
import json

import blind_game
import game_demo
import game_grpo
import offline
import rewards
from grpo_recipes import games


def episode_record(conversation: dict, seed: int, game_class=game_grpo.GuessTheNumber):
    return games.replay(functools.partial(game_class, 8, 4), seed, conversation["messages"][2:])


def guesses(conversation: dict) -> list[int]:
    return [arguments["number"] for _, arguments in games.answered_moves(conversation["messages"][2:])]


def test_the_teacher_loses_only_where_its_off_by_one_makes_it_guess_the_same_number_again():
    seeds = range(400)
    flawed = offline.game_conversations(seeds, 8, 4, off_by_one=1.0)
    right = offline.game_conversations(seeds, 8, 4)
    secrets = [game_grpo.GuessTheNumber(8, 4) for _ in seeds]
    for game, seed in zip(secrets, seeds, strict=True):
        game.reset(seed=seed)
    lost = {game.secret for game, c, seed in zip(secrets, flawed, seeds, strict=True)
            if not episode_record(c, seed).won}
    assert lost == {3, 5, 8}  # halving 1..8 with `low = guess` after "higher": 3 of the 8 secrets
    assert all(len(set(guesses(c))) < len(guesses(c)) for game, c in zip(secrets, flawed, strict=True)
               if game.secret in lost)
    assert all(episode_record(c, seed).won for c, seed in zip(right, seeds, strict=True))
    mixed = offline.game_conversations(seeds, 8, 4, off_by_one=game_demo.TEACHER_ERROR, seed=1)
    won = sum(episode_record(c, seed).won for c, seed in zip(mixed, seeds, strict=True)) / len(seeds)
    assert 0.625 < won < 1.0  # between the always-wrong teacher and halving


def test_the_blind_game_is_the_same_game_without_its_hints():
    for seed in range(50):
        seen, blind = game_grpo.GuessTheNumber(8, 4), blind_game.BlindGuessTheNumber(8, 4)
        assert seen.reset(seed=seed) == blind.reset(seed=seed)
        for number in (4, 4, 9, 6, 7, 8):
            answer, hidden = seen.guess(number), blind.guess(number)
            assert "higher" not in hidden and "lower" not in hidden
            assert hidden == answer.replace(": the number is higher.", ".").replace(": the number is lower.", ".")
        assert (seen.won, seen.turns, seen.invalid_moves, seen.credits) == (
            blind.won, blind.turns, blind.invalid_moves, blind.credits)
    assert blind_game.BlindGuessTheNumber.guess.__doc__ == game_grpo.GuessTheNumber.guess.__doc__


def test_sft_rl_and_held_out_games_never_share_a_seed_and_the_teacher_is_scored_by_the_rubric(tmp_path):
    args = game_demo.parse_args(["--n_sft", "200", "--n_test", "50", "--grpo_steps", "5"])
    teacher_win_rate = game_demo.write_data(tmp_path, 0, args)
    read = lambda name: [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    test, train, teacher = read("rl/test.jsonl"), read("rl/train.jsonl"), read("teacher.jsonl")
    assert (len(test), len(train), len(teacher)) == (50, 20, 200)
    test_seeds, train_seeds = {row["seed"] for row in test}, {row["seed"] for row in train}
    sft_seeds = {row["seed"] for row in teacher}
    assert (len(test_seeds), len(train_seeds), len(sft_seeds)) == (50, 20, 200)
    assert not test_seeds & train_seeds and not sft_seeds & (test_seeds | train_seeds)
    assert [row["example"] for row in teacher] == list(range(200))  # sft_warmstart keeps one episode per game
    assert {rewards.reward_name(f) for f in game_grpo.REWARD_WEIGHTS} == set(teacher[0]["scores"])
    won = [row["scores"]["game_won_reward"] for row in teacher]
    assert teacher_win_rate == sum(won) / len(won) and 0.6 < teacher_win_rate < 1.0
    assert (tmp_path / "tiny" / "config.json").exists()
