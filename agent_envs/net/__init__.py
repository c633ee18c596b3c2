"""Low-level HTTP: pooled aiohttp sessions, retried requests and their error classes (`http`).

It imports nothing of ours, so every package that calls a service over HTTP stands on it: the
LLM judge (`rewards`), the search backends (`retrieval`), the browse and search tools, the remote
env client (`remote`) and the OpenAI-compatible rollout engine.
"""
