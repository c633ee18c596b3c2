"""Rewards: each returns a `RewardResult` with a scalar `score` and named `components`.

>>> from agent_envs.rewards import math_reward, qa_reward
>>> math_reward("<answer>\\\\boxed{0.5}</answer>", ["\\\\frac{1}{2}"]).score
1.0
>>> qa_reward("<answer>\\\\boxed{Paris}</answer>", ["Paris", "Paris, France"]).components["em"]
1.0
"""

from agent_envs.rewards.extract import extract_prediction, last_boxed
from agent_envs.rewards.judge import JudgeNotConfigured, JudgeVerdict, LLMJudge
from agent_envs.rewards.math import math_equal, math_reward
from agent_envs.rewards.qa import normalize_answer, qa_reward, token_f1
from agent_envs.rewards.recipe import RECIPES, RewardRecipe, correctness, make_reward

__all__ = [
    "RECIPES",
    "JudgeNotConfigured",
    "JudgeVerdict",
    "LLMJudge",
    "math_equal",
    "RewardRecipe",
    "correctness",
    "extract_prediction",
    "last_boxed",
    "make_reward",
    "math_reward",
    "normalize_answer",
    "qa_reward",
    "token_f1",
]
