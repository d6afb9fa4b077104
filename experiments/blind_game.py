"""game_grpo.py in a game that keeps its hints to itself: experiments/game_demo.py's ablation.

    python experiments/blind_game.py <game_grpo.py's flags>

Every wrong guess is answered "5 is wrong." where game_grpo.py's game says "5 is wrong: the number is higher.": the
same game, secret, turn limit, record and rubric (its replays play this game too), with nothing the player can learn
from the game's answers but that it has not won yet. Whatever GRPO gains here, it gains without what the environment
tells the policy.
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the recipes
import game_grpo  # noqa: E402
from grpo_recipes.refusal import run_script  # noqa: E402

HINT = re.compile(r": the number is (higher|lower)\.")


class BlindGuessTheNumber(game_grpo.GuessTheNumber):
    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: A whole number in the game's range.
        """
        return HINT.sub(".", super().guess(number))


if __name__ == "__main__":
    game_grpo.GuessTheNumber = BlindGuessTheNumber  # the game new_game() builds, for every rollout and every replay
    run_script(game_grpo.main)
