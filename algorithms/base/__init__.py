"""The ground floor of the learners: typed config machinery (`config`) and the one derivation of
seeds and ids (`seeds`). Both `rollout/` and `core/` stand on it; it imports nothing of ours."""
