"""Games for game_grpo.py: the record a game keeps, the replay its rubric scores, and textarena's single-player games
behind one adapter.

A game is a class whose instance plays one episode (TRL's environment_factory makes one per rollout):
- `reset(seed, **row) -> str` starts the episode the seed picks and returns its first observation, which TRL appends
  to the prompt's last message;
- its moves are public methods with a docstring and typed `Args:` (TRL's tools), each returning what the player sees;
- its record, which the rubric reads (rewards.py, games): `done` (the game ended the episode: won, lost, or no turns
  left), `won`, `turns` (moves made, invalid ones included), `max_turns`, `invalid_moves`, and `credits`, one
  turn-level credit in [0, 1] per turn where the game gives one (None where it gives none).

The rubric replays: TRL's async trainer hands reward functions no environment objects (an environment's
`get_reward()` gives it one number), so the rewards replay each episode's answered moves in a fresh game from the
row's seed. The trainer, async_grpo.py and evaluate.py score the same record that way, and a game must be
deterministic given its seed and moves (tests/test_game_grpo.py checks the games offered).
"""

import contextlib
import functools
import inspect
import io
import json
import re
import sys
import threading
from pathlib import Path

from grpo_recipes.refusal import Refusal

NOT_MOVES = ("reset", "get_reward")  # what TRL calls itself, never as a tool


def answered_moves(completion) -> list[tuple[str, object]]:
    """(tool name, arguments) of each call in the completion that a tool message answered, in order. A call with no
    answer was never run (past max_tool_calling_iterations) or its answer was dropped (past max_completion_length):
    the player saw nothing of it, and the replay leaves it out."""
    moves, pending = [], []
    for message in completion if isinstance(completion, list) else []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            calls = message.get("tool_calls")
            pending = [_call(call) for call in calls] if isinstance(calls, list) else []
        elif message.get("role") == "tool" and pending:
            moves.append(pending.pop(0))
    return moves


def unanswered_call(completion) -> bool:
    """Whether the completion ends on a tool call that nothing answered: the budget (turns of tool calls or tokens)
    cut the episode, the player did not stop."""
    messages = [m for m in completion if isinstance(m, dict)] if isinstance(completion, list) else []
    return bool(messages) and messages[-1].get("role") == "assistant" and bool(messages[-1].get("tool_calls"))


def _call(call) -> tuple[str, object]:
    function = call.get("function", call) if isinstance(call, dict) else {}
    function = function if isinstance(function, dict) else {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):  # a template that leaves them as JSON text: TRL's parser reads them the same
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return str(function.get("name")), arguments


def replay(new_game, seed: int, completion):
    """A fresh game from `new_game()`, reset with `seed`, after the completion's answered moves, each made as the live
    game made it (refereed: a move that raises is an invalid move that costs a turn, in play and here). A call TRL
    answered without calling the game (an unknown tool, arguments that are not an object: counted in TRL's
    tools/failure_frequency) changed nothing in the live game and changes nothing here."""
    game = _refereed_game(new_game)
    game.reset(seed=seed)
    for name, arguments in answered_moves(completion):
        move = getattr(game, name, None) if name not in NOT_MOVES and not name.startswith("_") else None
        if callable(move) and isinstance(arguments, dict):
            move(**arguments)
    return game


def refereed(new_game):
    """The factory of the same game whose every move, when it raises (arguments it does not take, a value it cannot
    read: guess("²")), is an invalid move that costs a turn instead, answered with the error; so the live game TRL
    plays and the rubric's replay take one path for every call. Pickles (TRL's async trainer spawns a process)."""
    return functools.partial(_refereed_game, new_game)


def _refereed_game(new_game):
    game = new_game()
    cls = type(game)
    if cls in _REFEREED.values():  # refereed already
        return game
    if cls not in _REFEREED:
        moves = {name: _refereed_move(move) for name, move in inspect.getmembers(cls, inspect.isfunction)
                 if name not in NOT_MOVES and not name.startswith("_")}
        _REFEREED[cls] = type(cls.__name__, (cls,), {**moves, "__module__": cls.__module__, "__doc__": cls.__doc__})
    game.__class__ = _REFEREED[cls]
    return game


_REFEREED: dict = {}  # each game class's refereed subclass, made once a process


def _refereed_move(move):
    @functools.wraps(move)
    def refereed_move(game, *args, **kwargs):
        try:
            return move(game, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the call's mistake: an invalid move, in play and in the replay
            return invalid_call(game, f"{type(err).__name__}: {err}"[:200])

    return refereed_move


def invalid_call(game, reason: str) -> str:
    """A move the game could not take: counted invalid and, before the game's end, a turn with no credit (the last
    turn ends the episode as a loss)."""
    game.invalid_moves += 1
    if game.done:
        return f"Error: {reason}; the game is over."
    game.turns += 1
    if game.credits is not None:
        game.credits.append(0.0)
    if game.turns >= getattr(game, "max_turns", float("inf")):
        game.done = True
        return f"Error: {reason}. No turns left: you lost. Game over."
    return f"Error: {reason}. That cost a turn."


# --------------------------------------------------------------------------------------------------------- textarena

TEXTARENA_PREFIX = "textarena:"
MOVE = re.compile(r"\[[^\[\]]*\]")  # a move in textarena's format: [A C], [up], [42]
_SEEDING = threading.Lock()  # textarena seeds Python's global random at reset: one reset at a time in a process


def open_textarena(game_id: str):
    """The game textarena registers as `game_id` (e.g. TowerOfHanoi-v0), made and reset once here as a check; one line
    naming why where it cannot run on this machine: unknown, a game for several players, a Python too old for its
    source, or data it downloads at first use (NLTK's) that could not be fetched."""
    try:
        import textarena
    except ImportError:
        raise Refusal("--game textarena:...: pip install textarena (requirements.txt lists it)") from None
    if game_id not in textarena.envs.registration.ENV_REGISTRY:
        raise Refusal(f"--game {TEXTARENA_PREFIX}{game_id}: textarena has no such game; its single-player ones "
                      "include GuessTheNumber-v0, TowerOfHanoi-v0, FrozenLake-v0, Sudoku-v0, Countdown-v0, "
                      "Minesweeper-v0, LightsOut-v0, Mastermind-v0")
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # NLTK's notes
            env = _base(textarena.make(game_id))
            with _SEEDING:
                env.reset(num_players=1, seed=0)
    except SyntaxError as err:
        where = "/".join(Path(err.filename or "?").parts[-4:])  # textarena/envs/<Game>/env.py
        raise Refusal(f"--game {TEXTARENA_PREFIX}{game_id}: its source needs a newer Python than this "
                      f"{sys.version_info.major}.{sys.version_info.minor} ({where}:{err.lineno}: {err.msg})") from None
    except LookupError as err:
        resource = str(err).split("Resource")[-1].split("not found")[0].strip(" \n*'\"") if "Resource" in str(err) \
            else str(err).strip()[:80]
        raise Refusal(f"--game {TEXTARENA_PREFIX}{game_id}: it needs NLTK's '{resource}' data, which it downloads at "
                      "first use, and this machine could not fetch it (python -m nltk.downloader "
                      f"{resource or 'all'} where a network is reachable)") from None
    except AssertionError as err:
        raise Refusal(f"--game {TEXTARENA_PREFIX}{game_id}: not a single-player game ({err})") from None
    return env


def _base(env):
    """The game under textarena's wrappers, whose observations are the new messages only."""
    while hasattr(env, "env"):
        env = env.env
    return env


class TextArenaGame:
    """One of textarena's single-player games as a game of this recipe: one tool, `move`, that passes the action to the
    game in the game's own format (its first observation says which, e.g. '[A C]'); textarena's rules (its invalid
    moves, its own turn limit) apply, and `--turn_limit` ends the episode as a loss when textarena's does not."""

    def __init__(self, game_id: str, max_turns: int):
        self.game_id, self.max_turns = game_id, max_turns
        self.env = None

    def reset(self, seed: int, **row) -> str:
        self.env = open_textarena(self.game_id) if self.env is None else self.env
        with _SEEDING:
            self.env.reset(num_players=1, seed=int(seed))
        self.turns = self.invalid_moves = 0
        self.done = self.won = False
        self.credits = None  # textarena gives no per-move credit
        return "\n\n" + self._observation()

    def move(self, action: str) -> str:
        """Make one move in the game.

        Args:
            action: The move, in the format the game asked for.
        """
        if self.done:  # an invalid move, not a turn: the game's record stays what it was at its end
            self.invalid_moves += 1
            return "Error: the game is over; stop calling move and reply in one line."
        if len(MOVE.findall(str(action))) > 1:  # textarena applies every bracketed move in an action: one a turn here
            return invalid_call(self, f"one move per call, not {len(MOVE.findall(str(action)))} ({str(action)[:60]})")
        self.turns += 1
        errors = self.env.state.error_count
        done, _ = self.env.step(str(action))
        text = self._observation()
        invalid = self.env.state.error_count > errors
        if done:
            rewards, info = self.env.close()
            self.done, self.won = True, rewards.get(0, 0.0) >= 1.0
            invalid = invalid or bool(info.get(0, {}).get("invalid_move"))
            text += f"\nGame over: {'you won' if self.won else 'you lost'} ({info.get(0, {}).get('reason', '')})."
        elif self.turns >= self.max_turns:
            self.done = True
            text += f"\nGame over: you lost (no turns left after {self.turns})."
        self.invalid_moves += invalid
        return text

    def _observation(self) -> str:
        """What the game said since the player's last move, its echo of the move left out."""
        import textarena

        _, messages = self.env.get_observation()
        return "\n".join(text for _, text, kind in messages if kind != textarena.ObservationType.PLAYER_ACTION)
