"""Finding a model: --model, then $MEMAGENT_MODEL, each a path or a registry name, then the
default; and one sentence when nothing is found."""

from __future__ import annotations

import importlib.util

import pytest

from memagent_cli import models
from memagent_cli.errors import ModelError


@pytest.mark.real_model  # needs the default model's package (no model is loaded)
def test_the_default_model_ships_in_a_package(monkeypatch):
    monkeypatch.delenv(models.ENV_VAR, raising=False)
    found = models.resolve(None)
    assert found.name == "smollm2-135m"
    assert found.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and found.path.is_file()


def test_option_beats_environment(monkeypatch, tmp_path):
    mine, theirs = tmp_path / "mine.gguf", tmp_path / "theirs.gguf"
    mine.write_bytes(b"GGUF")
    theirs.write_bytes(b"GGUF")
    monkeypatch.setenv(models.ENV_VAR, str(theirs))
    assert models.resolve(str(mine)).path == mine
    assert models.resolve(None).path == theirs


def test_nothing_found_names_what_was_tried_and_how_to_get_a_model(monkeypatch, tmp_path):
    monkeypatch.delenv(models.ENV_VAR, raising=False)
    monkeypatch.setattr(models.registry, "model_dirs", lambda: [tmp_path])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError) as error:
        models.resolve(None)
    message = error.value.message
    assert "no --model" in message and f"${models.ENV_VAR}" in message
    assert "smollm2-135m" in message and "make install" in message and "--model PATH" in message


def test_the_registry_names_the_memagent_models_on_the_hub():
    registry = models.registry.registry()
    assert registry["memagent-14b"]["hf"] == "BytedTsinghua-SIA/RL-MemoryAgent-14B:Q4_K_M"
    assert registry["memagent-7b"]["hf"] == "BytedTsinghua-SIA/RL-MemoryAgent-7B:Q4_K_M"
    # The small model that boxes the needle: Qwen's own GGUF, by name (docs/development.md's table).
    assert registry["qwen2.5-coder-1.5b"]["hf"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M"
    # Qwen publishes its Qwen3-1.7B GGUF as Q8_0 (docs/choosing-a-model.md).
    assert registry["qwen3-1.7b"]["hf"] == "Qwen/Qwen3-1.7B-GGUF:Q8_0"
    assert "not measured here" in str(registry["qwen3-1.7b"]["summary"])


def test_the_registry_names_each_models_reader():
    registry = models.registry.registry()
    assert registry["infmem-4b"]["hf"] == "ucmp137538/infmem-4B:Q4_K_M"
    assert registry["rememr1-7b"]["hf"] == "yrshi/ReMemR1-7B:Q4_K_M"
    assert models.registry.reader_for("infmem-4b") == "infmem"
    assert models.registry.reader_for("rememr1-7b") == "rememr1"
    assert registry["memreread-4b"]["hf"] == "iiiiGray/MemReread-4B:Q4_K_M"
    assert models.registry.reader_for("memreread-4b") == "memreread"
    assert registry["pi-mem-7b"]["hf"] == "JetLM/PI-Mem-7B:Q4_K_M"
    assert models.registry.reader_for("pi-mem-7b") == "pi-mem"
    # No `reader`: MemAgent's, as for a model the registry does not know.
    assert "reader" not in registry["memagent-7b"]
    assert models.registry.reader_for("memagent-7b") == "memagent"
    assert models.registry.reader_for("hf:someone/some-model") == "memagent"


def test_a_registry_entry_naming_an_unknown_reader_is_refused(monkeypatch, tmp_path):
    (tmp_path / "registry.toml").write_text('[odd]\nhf = "a/b:Q4_K_M"\nreader = "memagnet"\n')
    monkeypatch.setattr(models.registry, "_CHECKOUT_MODELS", tmp_path)
    with pytest.raises(ValueError, match="registry entry odd: There is no reader 'memagnet'"):
        models.registry.registry()


def test_a_hub_model_not_pulled_yet_says_how_to_pull_it(monkeypatch, tmp_path):
    monkeypatch.setattr(models.registry, "model_dirs", lambda: [tmp_path])
    with pytest.raises(ModelError) as error:
        models.resolve("qwen2.5-coder-1.5b")
    assert error.value.message == (
        "Model qwen2.5-coder-1.5b (Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M on the Hugging "
        "Face Hub) is not pulled yet; pull it with `memagent models pull qwen2.5-coder-1.5b`."
    )
