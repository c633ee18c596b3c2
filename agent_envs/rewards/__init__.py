"""Rewards: each returns a `RewardResult` with a scalar `score` and named `components`."""

from agent_envs.rewards.base import RewardResult
from agent_envs.rewards.extract import extract_prediction, last_boxed
from agent_envs.rewards.format import arpo_format_check
from agent_envs.rewards.math import math_reward
from agent_envs.rewards.qa import normalize_answer, qa_reward, token_f1
from agent_envs.rewards.recipe import RECIPES, RewardRecipe, correctness, make_reward

__all__ = [
    "RECIPES",
    "RewardRecipe",
    "RewardResult",
    "arpo_format_check",
    "correctness",
    "extract_prediction",
    "last_boxed",
    "make_reward",
    "math_reward",
    "normalize_answer",
    "qa_reward",
    "token_f1",
]
