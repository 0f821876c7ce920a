"""A decoding configuration file: which models, token map and draft shape to decode with, as `frspec tune` picks
them, and what it predicted and measured for that choice.

    {"schema": "frspec-config", "version": 1,
     "target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct",
     "mtp": true,                                      # only instead of "draft": null: the target's own MTP layers
     "dtype": "bf16", "quant": "none", "draft_quant": null,
     "token_map": {"size": 32768, "path": "/root/.cache/frspec/token_maps/...-top32768.safetensors"},   # or null
     "tree": "chain-3",                                                   # decode/tree_shape.py syntax; null: vanilla
     "context_rows": null, "context_budget": null,                        # passed through to the drafter options
     "costs": {...},                                                      # decode/step_costs.py StepCosts, or null
     "predicted": {...}, "measured": {...}, "provenance": {...}}          # free-form records, never read back

`"mtp": true` (written only then) drafts with the MTP layers the target checkpoint carries (models/mtp.py), as
`--mtp` does; `draft` is then null, and the token map restricts the target's shared LM head (a pruned copy).

"auto" as the token map's size or as the tree hands that choice to the per-request controller
(decode/controller.py), which decides from `costs` (this machine's, as `frspec tune` measured them; without them
the engine measures its own once per machine and model pair).

`frspec generate --config`, `frspec bench --config` and the vLLM plugin (FRSPEC_CONFIG) read it with
`DecodeConfig.load`; explicit options override it. It lives in decode/ (not bench/) because the plugin and the
commands, which sit above decode, all read it. Every problem reading it is one FrspecError naming the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.vocab.context_vocab import BUDGETS
from frspec.io import atomic_path, read_text

SCHEMA = "frspec-config"
VERSION = 1
CONTEXT_BUDGETS = BUDGETS  # the context-aware vocabulary's budgets (vocab/context_vocab.py)
_KNOWN = {"schema", "version", "target", "draft", "mtp", "dtype", "quant", "draft_quant", "token_map", "tree",
          "context_rows", "context_budget", "costs", "predicted", "measured", "provenance"}
AUTO = "auto"


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding configuration. `tree` is the drafted shape's text (None: vanilla, no draft); `token_map_path`
    and `token_map_size` are both set (FR-Spec) or both None (the drafter's full vocabulary)."""

    target: str
    draft: str | None = None
    dtype: str = "auto"
    quant: str = "none"
    draft_quant: str | None = None
    token_map_size: int | str | None = None  # or "auto"
    token_map_path: str | None = None
    tree: str | None = None  # or "auto": chains of a length chosen per step
    context_rows: int | None = None
    context_budget: str | None = None
    costs: dict[str, Any] | None = None
    predicted: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    mtp: bool = False  # draft with the target checkpoint's own MTP layers (draft is then None)

    @property
    def drafts(self) -> bool:
        """A drafter is configured: a draft model or the target's MTP layers."""
        return self.draft is not None or self.mtp

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise FrspecError(f"decode config: {problem}")

    def _problem(self) -> str | None:
        if not isinstance(self.target, str) or not self.target:
            return "'target' must be a model name or path"
        if self.draft is not None and (not isinstance(self.draft, str) or not self.draft):
            return "'draft' must be a model name or path, or null"
        if not isinstance(self.mtp, bool):
            return f"'mtp' must be true or false, got {self.mtp!r}"
        if self.mtp and self.draft is not None:
            return "'mtp' drafts with the target's own MTP layers: 'draft' must be null"
        if self.drafts != (self.tree is not None):
            return "'tree' is set exactly when there is a 'draft' or 'mtp' (null for vanilla decoding)"
        if self.tree is not None and self.tree != AUTO:
            TreeShape.parse(self.tree, "decode config 'tree'")
        if (self.token_map_size is None) != (self.token_map_path is None):
            return "'token_map' needs both 'size' and 'path'"
        if self.token_map_size is not None:
            if not self.drafts:
                return "a 'token_map' restricts a draft's LM head: it needs a 'draft' (or 'mtp')"
            if self.token_map_size != AUTO and (isinstance(self.token_map_size, bool)
                                                or not isinstance(self.token_map_size, int) or self.token_map_size < 1):
                return f"'token_map' 'size' must be a positive integer or \"auto\", got {self.token_map_size!r}"
        if self.context_rows is not None and (isinstance(self.context_rows, bool)
                                              or not isinstance(self.context_rows, int) or self.context_rows < 0):
            return f"'context_rows' must be an integer >= 0 or null, got {self.context_rows!r}"
        if self.context_budget is not None and self.context_budget not in CONTEXT_BUDGETS:
            return f"'context_budget' must be one of {', '.join(CONTEXT_BUDGETS)} or null, got {self.context_budget!r}"
        if self.costs is not None:
            from frspec.decode.step_costs import StepCosts

            try:
                StepCosts.from_dict(self.costs, "'costs'")
            except FrspecError as e:
                return str(e)
        for name in ("dtype", "quant"):
            if not isinstance(getattr(self, name), str):
                return f"'{name}' must be a string"
        return None

    @property
    def shape(self) -> TreeShape | None:
        """The drafted shape (None for vanilla, and for "auto": no fixed shape)."""
        return None if self.tree in (None, AUTO) else TreeShape.parse(self.tree, "decode config 'tree'")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        size, path, mtp = d.pop("token_map_size"), d.pop("token_map_path"), d.pop("mtp")
        out = {"schema": SCHEMA, "version": VERSION}
        for key, value in d.items():
            out[key] = value
            if key == "draft" and mtp:
                out["mtp"] = True
            if key == "draft_quant":  # keep the file in reading order: models, then the map, then the shape
                out["token_map"] = None if size is None else {"size": size, "path": path}
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write the file atomically (a reader never sees half of it)."""
        path = Path(path)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, data: Any, where: str = "decode config") -> DecodeConfig:
        if not isinstance(data, dict):
            raise FrspecError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("schema") != SCHEMA:
            raise FrspecError(f"{where}: not an frspec config (its 'schema' must be {SCHEMA!r})")
        version = data.get("version")
        if version != VERSION:
            raise FrspecError(f"{where}: config version {version!r} is not supported (this frspec reads {VERSION})")
        unknown = sorted(set(data) - _KNOWN)
        if unknown:
            raise FrspecError(f"{where}: unknown keys {', '.join(unknown)}")
        if "target" not in data:
            raise FrspecError(f"{where}: missing 'target'")
        token_map = data.get("token_map")
        if token_map is not None and (not isinstance(token_map, dict) or set(token_map) - {"size", "path"}):
            raise FrspecError(f"{where}: 'token_map' must be null or an object with 'size' and 'path'")
        token_map = token_map or {}
        records = {}
        for name in ("predicted", "measured", "provenance"):
            value = data.get(name) or {}
            if not isinstance(value, dict):
                raise FrspecError(f"{where}: '{name}' must be an object")
            records[name] = value
        try:
            return cls(
                target=data["target"], draft=data.get("draft"), dtype=data.get("dtype", "auto"),
                quant=data.get("quant", "none"), draft_quant=data.get("draft_quant"),
                token_map_size=token_map.get("size"), token_map_path=token_map.get("path"), tree=data.get("tree"),
                context_rows=data.get("context_rows"), context_budget=data.get("context_budget"),
                costs=data.get("costs"), mtp=data.get("mtp", False), **records,
            )
        except FrspecError as e:
            raise FrspecError(f"{where}: {str(e).removeprefix('decode config: ')}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> DecodeConfig:
        """Read and check a config file; a missing file, bad JSON or a bad value is one FrspecError naming it.
        A relative token-map path is taken relative to the config file's directory."""
        path = Path(path)
        text = read_text(path, "config file")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise FrspecError(f"config file {path}: not valid JSON (line {e.lineno}: {e.msg})") from None
        config = cls.from_dict(data, f"config file {path}")
        if config.token_map_path is not None and not Path(config.token_map_path).is_absolute():
            from dataclasses import replace

            config = replace(config, token_map_path=str(path.parent / config.token_map_path))
        return config
