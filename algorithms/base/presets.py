"""Where the shipped presets are, and which file a preset name on the command line means.

    >>> from algorithms.base.presets import find_preset, presets_dir
    >>> find_preset("grpo_tiny.yaml").parent == presets_dir()
    True
    >>> find_preset("configs/grpo_tiny.yaml").name       # the checkout's spelling works anywhere
    'grpo_tiny.yaml'

The presets (the per-algorithm YAML files, the `base/` files they inherit from, the Accelerate
configs and the launch scripts) live in `configs/` at the top of a checkout, where users see
them. They ship inside the package as `algorithms/presets`: in the repository a link to
`../configs`, whose files setuptools copies into the wheel (pyproject.toml, package-data). So a
checkout, an editable install and a plain `pip install` all find them under the same package
path. Where a checkout has no links (git on Windows without symlink support), the `configs/`
folder beside the package is used.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PRESETS_PACKAGE_DIR = "presets"  # under the `algorithms` package
CHECKOUT_DIR = "configs"  # the same files at the top of a checkout


def presets_dir() -> Path:
    """The folder of the shipped presets (installed or in a checkout)."""
    shipped = Path(str(resources.files("algorithms"))) / PRESETS_PACKAGE_DIR
    if shipped.is_dir():
        return shipped
    return Path(__file__).resolve().parents[2] / CHECKOUT_DIR


def find_preset(name: str | os.PathLike) -> Path:
    """The file a `--config` value means: the path as given when it exists (relative to the working
    directory), else the shipped preset of that name: `grpo_tiny.yaml`, `base/tiny.yaml`, or
    `configs/grpo_tiny.yaml` as a checkout spells it. A name found nowhere comes back as given,
    for the loader to report (it names the file)."""
    path = Path(name)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == (CHECKOUT_DIR,) else path.parts
    shipped = presets_dir().joinpath(*parts) if parts else None
    return shipped if shipped is not None and shipped.exists() else path


__all__ = ["find_preset", "presets_dir"]
