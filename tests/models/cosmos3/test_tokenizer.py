"""The tiny pipelines' tokenizer: byte-level, optionally with BPE merges learned on the captions a policy is called
with, and a pipeline built with such a tokenizer serving as upstream does after a save and a load."""

from __future__ import annotations

import pytest
import torch
from _cosmos3 import FPS, PROMPT, candidate_spec, policy, upstream_action, within_rule
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import (
    Cosmos3ActionModel,
    build_pipeline,
    build_tokenizer,
    tokenize_action_prompt,
)


def _caption() -> str:
    # The caption a policy call sends, as the byte-level tokenizer spells it (one token per byte, lossless).
    pipe = build_pipeline("tiny", seed=0)
    ids, _, _, _ = tokenize_action_prompt(pipe, PROMPT, None, policy(), FPS)
    return pipe.text_tokenizer.decode(ids)


def test_merges_learned_on_a_caption_spell_it_in_a_few_tokens_and_every_string_still_tokenizes():
    caption = _caption()
    byte_level, merged = build_tokenizer(), build_tokenizer([caption], 1024)
    assert len(byte_level) == 260
    spelled = byte_level(caption, add_special_tokens=False)["input_ids"]
    short = merged(caption, add_special_tokens=False)["input_ids"]
    assert len(spelled) > 250 and len(short) <= 16
    assert merged.decode(short) == caption and "<|im_start|>" in merged.convert_ids_to_tokens(short)
    for text in ("pick up the red cube", "Größe ∆ 10.5 fps", ""):
        assert merged.decode(merged(text, add_special_tokens=False)["input_ids"]) == text
    # The same captions give the same vocabulary: a pipeline's weights stay a function of its inputs.
    again = build_tokenizer([caption], 1024)
    assert again.backend_tokenizer.to_str() == merged.backend_tokenizer.to_str()
    # A smaller budget merges less.
    fewer = build_tokenizer([caption], 32)(caption, add_special_tokens=False)["input_ids"]
    assert len(short) < len(fewer) < len(spelled)


@pytest.mark.parametrize(("captions", "merges"), [((), 8), (("a caption",), -1)])
def test_merges_need_captions_and_a_count_of_at_least_zero(captions, merges):
    with pytest.raises(ValueError, match=f"merges={merges!r}"):
        build_tokenizer(captions, merges)


def test_a_pipeline_with_learned_merges_saves_loads_and_serves_its_candidates_as_upstream(tmp_path):
    tokenizer = build_tokenizer([_caption()], 1024)
    source = build_pipeline("tiny", seed=0, tokenizer=tokenizer)
    assert source.transformer.config.vocab_size == len(tokenizer)
    source.save_pretrained(tmp_path / "pipe", safe_serialization=True)
    loaded = Cosmos3OmniPipeline.from_pretrained(tmp_path / "pipe", enable_safety_checker=False)
    loaded.set_progress_bar_config(disable=True)
    ids, _, _, _ = tokenize_action_prompt(loaded, PROMPT, None, policy(), FPS)
    assert len(ids) <= 16  # the saved tokenizer keeps its merges
    result = Cosmos3ActionModel(loaded).generate(
        prompt=PROMPT, action=policy(), num_inference_steps=3, fps=FPS, base_seed=5, guidance_scale=1.0,
        spec=candidate_spec(3))
    for i, seed in enumerate(result.seeds):
        reference = upstream_action(seed, guidance_scale=1.0, pipe=loaded, key=("merged",))
        assert within_rule(result.candidates[i], reference)
    assert not torch.equal(result.candidates[0], upstream_action(result.seeds[0], guidance_scale=1.0))
